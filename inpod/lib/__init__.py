"""Helpers every in-pod family shares, each written once: pod (env, state dir, log, run, rank.env), ssh (the
command builder), kube (the in-cluster API client), http (listen addresses, fetch_json).

Standard library only, Python 3.8+.
"""
