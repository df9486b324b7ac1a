"""Pods as the render makes them (issue 22): the start of the one pod simulation, built from rendered objects.

This first part is what needs no root: an independent reading of a rendered StatefulSet and the kubelet's
layout of ConfigMap/Secret volumes. Platform rules, each with its upstream source:

* Env expansion (`render.container_env`): the kubelet resolves `fieldRef`s (metadata.name/namespace,
  status.podIP, spec.nodeName) and `secretKeyRef`s, then expands `$(VAR)` from variables defined EARLIER in
  the list; `$$(VAR)` is a literal `$(VAR)`, an undefined `$(VAR)` stays as written
  (kubernetes third_party/forked/golang/expansion/expand.go Expand; pkg/kubelet/kubelet_pods.go makeEnvironmentVariables).
  The runtime adds HOSTNAME (the pod name) and the kubelet the KUBERNETES_SERVICE_* variables of the
  default Service (enableServiceLinks adds the namespace's Services; `KUBERNETES_ADDED` lists what we add).
* ConfigMap/Secret volumes (`layout.AtomicVolume`): each key is a symlink `<key> -> ..data/<key>`, `..data` a
  symlink to a `..<UTC timestamp>.<random>` directory that differs on every pod, and an update writes a new
  directory and renames a `..data_tmp` symlink over `..data` (pkg/volume/util/atomic_writer.go
  AtomicWriter.Write, newTimestampDir, createUserVisibleFiles). File modes are the rendered
  defaultMode/items mode (default 0644); with an fsGroup the files' group is it
  (pkg/volume/volume_linux.go SetVolumeOwnership).

Still to come (see the report of issue 22): the namespaces (PID/UTS/mount/net with veth pairs and pod IPs,
stub DNS with the kubelet's search path and ndots:5, /etc/hosts as the kubelet writes it), capabilities as
SCC admission and CRI-O give them, the rendered readiness probe, `oc exec`, termination.
"""
