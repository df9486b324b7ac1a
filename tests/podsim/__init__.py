"""Pods as the render makes them (issue 22): the one pod simulation, built only from a stack's rendered objects.

API (root; tests skip with `pods.missing_requirements()` as the reason otherwise):
    from tests.podsim.pods import PodSim, leftovers
    sim = PodSim(run_result, count=2)         # any RunResult: a committed stack or a variant (onDeploy, idleStop, ...)
    sim.start()                                # network + DNS + pods, each until its rendered readiness probe passes
                                               # (start(wait=False) + wait_ready(i) for pods that must not turn Ready)
    sim.exec(i, "cmd", cwd=, env=, input=)     # `oc exec`: PID 1's namespaces and root, container identity, caps,
    sim.popen(i, "cmd") / sim.command(i, ...)  #   rlimits and env, outside PID 1's tree
    sim.pods[i].ip / .netns / .pid / .name     # pod IP, network namespace (`ip -n`, `nsenter --net=/run/netns/...`),
    sim.pods[i].path("/tmp/ml-dev-env")        #   PID 1 as this machine numbers it, a pod path seen from here
    sim.swap_configmap(name, data=None)        # a ConfigMap/Secret update: new ..<timestamp> dir, ..data swapped
    sim.delete_secret(name)                    # `oc delete secret`: an optional volume empties (PodSim(namespace_secrets=
                                               #   {name: {key: value}}): Secrets that exist without the stack rendering them)
    sim.add_interfaces(i, {"net5": "10.0.9.1/24"})  # extra interfaces (netK of every pod share one bridge)
    sim.terminate(i, grace=None)               # preStop exec, SIGTERM to PID 1, SIGKILL after the grace
    sim.restart(i)                             # the kubelet's container restart (volumes and sandbox kept)
    sim.volume_dir(i, "/workspace")            # this machine's directory behind a PVC/emptyDir mount (outlives the pod)
    sim.probe(i), sim.sshd_log(i), sim.identity, sim.keys (user/stranger/host/client ed25519 keys)
    sim.stop()                                 # kills every process, deletes namespaces and directories
    leftovers()                                # podsim-* network namespaces and directories still here

Platform rules (everything a pod gets is a rendered field or one of these), with their upstream source:

* Env (`render.container_env`): the image's ENV (images/base.Containerfile ENV lines; the base image's PATH is
  the Debian default), then the rendered env in order: fieldRefs (metadata.name/namespace, status.podIP,
  spec.nodeName), secretKeyRefs from the test's values, `$(VAR)` from EARLIER variables, `$$` a literal `$`,
  an undefined `$(VAR)` kept (kubernetes third_party/forked/golang/expansion/expand.go Expand;
  pkg/kubelet/kubelet_pods.go makeEnvironmentVariables); HOSTNAME = pod name (the runtime), the
  `kubernetes` Service's KUBERNETES_* links and, with `enableServiceLinks` unset or true, those of every Service of
  the render with a ClusterIP (`render.service_links`: pkg/kubelet/envvars/envvars.go FromServices,
  pkg/kubelet/kubelet_pods.go getServiceEnvVarMap; a rendered name wins); the device plugins'
  env for the requested extended resources: PCIDEVICE_OPENSHIFT_IO_<NAME> = a VF's PCI address per SR-IOV
  resource (k8snetworkplumbingwg/sriov-network-device-plugin pkg/resources/server.go getEnvs) and
  NVIDIA_VISIBLE_DEVICES = the GPUs' UUIDs for nvidia.com/gpu (NVIDIA/k8s-device-plugin, envvar strategy).
* ConfigMap/Secret volumes (`layout.AtomicVolume`): `<key> -> ..data/<key>`, `..data -> ..<UTC timestamp>.<random>`
  (a different directory on every pod); an update writes a new directory and renames `..data_tmp` over `..data`
  (pkg/volume/util/atomic_writer.go AtomicWriter.Write, newTimestampDir, createUserVisibleFiles). Modes: the
  rendered defaultMode (0644 default); with an fsGroup the files' group is it and the read-only volume's
  roMask 0440 is ORed into their mode (pkg/volume/volume_linux.go SetVolumeOwnership, changeFilePermission). Secrets
  that exist in the namespace without the render: `PodSim(namespace_secrets=...)`; an absent `optional` one is empty.
  The service-account token volume at /var/run/secrets/kubernetes.io/serviceaccount
  (token, ca.crt, namespace: test values; plugin/pkg/admission/serviceaccount). PVCs: a fresh root-owned 0755
  directory, with an fsGroup 2775 group fsGroup (SetVolumeOwnership); one per pod for volumeClaimTemplates,
  shared for a named claim. emptyDir: 0777 (pkg/volume/emptydir/empty_dir.go), medium Memory a tmpfs.
* Identity (`admission.admit`): an SCC the stack creates and grants `use` of to the pod's service account gives
  CRI-O's default capabilities (cri-o internal/config/capabilities/capabilities_linux.go Default()) + `add`
  - `drop` - its requiredDropCapabilities (openshift/apiserver-library-go pkg/securitycontextconstraints/
  capabilities/mustrunas.go Generate adds required drops to the drop list); UID from runAsUser. Otherwise
  restricted-v2: the namespace range's first UID (user/mustrunasrange.go), GID 0, fsGroup = the first
  supplemental group (group/mustrunas.go) as supplementary group, drop ALL, no_new_privs. For UID 0 the
  capabilities are bounding = permitted = effective (execve of root); inheritable and ambient are empty
  (CRI-O since CVE-2022-27652). A capability this machine's own bounding set lacks cannot be given
  (`sim.missing_capabilities`, warned about; in a container that is often SYS_RESOURCE): a test of what needs one
  calls `sim.require_capabilities(...)`, which skips it, saying so. RLIMIT_MEMLOCK = 8 MiB, the kernel's
  default since Linux 5.16 (mm: MLOCK_LIMIT), for PID 1 and `oc exec` alike.
* Namespaces: own PID namespace with the rendered command (+args) as PID 1 (signals, reaping, /proc/1/limits),
  own UTS (hostname = pod name), mount and IPC namespaces; root = an overlay of this machine's root (the
  image layer) with a tmpfs as the container's writable layer; /proc, read-only /sys, a tmpfs /dev with the OCI
  default devices (null zero full random urandom tty, devpts, mqueue: runtime-spec config-linux.md "Default
  Devices"); /tmp, /var/tmp, /run: the image's empty directories (tmpfs). WORKDIR from the Containerfile.
* Network: own network namespace per pod, eth0 = one end of a veth pair whose other end is on a bridge in a
  namespace the simulation creates (nothing is routed anywhere else); pod IPs 10.128.0.(10+i)/14 (OpenShift's
  clusterNetwork), gateway 10.128.0.1, cluster DNS 172.30.0.10 (the DNS Service address). Multus networks
  of `k8s.v1.cni.cncf.io/networks` become net1..netN (veths on one bridge per name, 10.0.(103+k).(10+i)/24).
* DNS (`dns.py`, a stub CoreDNS): A records for `<pod>.<headless>.<ns>.svc.cluster.local` and the headless
  name (publishNotReadyAddresses); NXDOMAIN otherwise (coredns plugin/kubernetes). resolv.conf as the kubelet
  writes it for ClusterFirst: `search <ns>.svc.cluster.local svc.cluster.local cluster.local`, `options ndots:5`
  (pkg/kubelet/network/dns/dns.go GetPodDNS; no node search domains). StatefulSet pods: hostname = pod name,
  subdomain = serviceName (pkg/controller/statefulset/stateful_set_utils.go updateIdentity).
* /etc/hosts as the kubelet writes it: the localhost lines and only the pod itself,
  `<ip>\t<pod>.<subdomain>.<ns>.svc.cluster.local\t<pod>` (pkg/kubelet/kubelet_pods.go managedHostsFileContent).
* Readiness: the rendered exec probe run through the `oc exec` path (every 0.2 s here, not periodSeconds).
  `oc exec`: runc exec joins PID 1's namespaces with the container's env, identity and rlimits, as a process
  outside PID 1's tree. Termination: preStop exec, SIGTERM, SIGKILL after terminationGracePeriodSeconds
  (pkg/kubelet/kuberuntime/kuberuntime_container.go killContainer).
* Image assumptions (images/base.Containerfile): /etc/passwd GID 0 and g=u, no image SSH host keys,
  /workspace GID 0 g=u, `/usr/local/bin/ml-dev` (the same two-line wrapper), /etc/profile.d/ml-dev-env.sh,
  its hook line at the end of /etc/bash.bashrc, /etc/security/limits.d/99-ml-dev-env-memlock.conf,
  /home/ml-dev/.local/bin (GID 0 g=u);
  sshd, its privsep user `sshd`, ssh, rsync, pdsh, git and python3 as this machine (Debian) has them.
  Node tools as stubs: nvidia-smi (the NVIDIA container toolkit's; GPUs = the nvidia.com/gpu limit; the node's
  stub of tests/podsim/nodetool.py, idle GPUs unless a `Node` says otherwise) and ibv_devinfo (the HCAs of
  NCCL_IB_HCA).
* The image's programs this machine lacks (`PodSim(..., image_programs={path: script})`): the dev servers of
  images/base.Containerfile (code-server at /usr/local/bin/code-server -> /opt/code-server, jupyter and
  tensorboard from the system pip at /usr/local/bin) as stubs installed 0755 at those paths before PID 1 runs;
  they record into /run/podsim-image (1777), a directory only the stubs use (tests/inpod/sh/test_startup.py).
* Container restart (`sim.restart(i)`): the pod sandbox stays (network namespace, IP, /etc/hosts, volumes:
  PVCs, emptyDirs, ConfigMaps), the container gets a fresh writable layer, /tmp and PID namespace
  (pkg/kubelet/kuberuntime/kuberuntime_manager.go computePodActions: containers are restarted inside the
  kept sandbox).
* The node (`nodetools.Node`, `PodSim(..., node=Node())`; formats and sources in tests/inpod/fabric/data/SOURCES.md):
  nvidia-smi, ibv_devinfo (rdma-core libibverbs/examples/devinfo.c), ibstat (infiniband-diags ibstat.c),
  ib_write_bw (perftest; server and client meet over TCP on the address given, as perftest's out-of-band exchange
  does; the client tries once, as perftest's ethernet_client_connect) and all_reduce_perf (nccl-tests
  src/common.cu report; its ranks are started by the REAL Open MPI mpirun over the pods' real sshd and meet in a
  directory all pods share, the switch fabric) as stubs printing the real
  formats from the node's state (/run/podsim-node/node.json; the test changes it while pods run: `Node.gpu` sets
  the GPUs' utilisation, memory, compute processes and model, a failing or hung nvidia-smi, or a real capture
  replayed verbatim (tests/data/tool_output/nvidia-smi-h200: the layout nodetool.py is held to); `HostNode` gives
  the same nvidia-smi to a program run in the test's own process). `ip`, `ssh`,
  `mpirun`/`orted` are real. The VFs' sysfs over the pod's read-only /sys (an overlay keeps the rest): per SR-IOV
  resource the VF's PCI function /sys/bus/pci/devices/<PCIDEVICE_* address>/{infiniband/<hca>,net/<netK>,
  iommu_group/type} and /sys/class/infiniband/<hca>/{device -> that function, ports/1/gids/<i>,
  ports/1/gid_attrs/types/<i>} (Linux Documentation/ABI/stable/sysfs-class-infiniband, drivers/infiniband/core/
  sysfs.c and cache.c gid_type_str, drivers/iommu/iommu.c iommu_group_show_type; RDMA netns exclusive mode: a pod
  sees only its own devices). net1..netN get the NetworkAttachmentDefinition's rendered mtu (else fabric.json's).
* NetworkPolicy (`netpol.py`, opt-in: `with netpol.Enforcement(sim) as net: net.add_peer(...); net.apply()`): the
  rendered policies evaluated on their own (podSelector/namespaceSelector/ipBlock, ports/endPort, policyTypes) into
  iptables INPUT rules on eth0 of each selected pod: admitted sources and ports, replies (conntrack), the node
  (gateway 10.128.0.1) always, the rest dropped; net1..N not covered (ovn-kubernetes go-controller/pkg/ovn/
  base_network_controller_policy.go addAllowACLFromNode, arpAllowPolicyMatch; allow-related ACLs). Peers: non-stack
  "pods" (own netns on the same bridge, a namespace and labels of their own) as sources.
* The idle stop (`idlestop.IdleSim`, the harness of the idle and stop tests): the idle settings' ConfigMap edited
  before the pods start or swapped while they run, and an API stand-in (a test's FakeApiServer handler) over HTTPS
  at the `kubernetes` Service address (172.30.0.1:443) from before the pods start, the pods' service-account
  token and CA its own.
* Not simulated: seccomp, SELinux, cgroups/resources, the sidecar containers, init containers, the API server (the
  idle harness's stand-in answers the idle agent's requests only).
"""
