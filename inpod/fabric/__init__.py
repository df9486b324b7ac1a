"""The fabric check (`fabric_check.py` in the pod, inpod/bin): preflight, the all-reduce gate, the localisation, the report.

Layers inside the family: parse and util at the bottom, allreduce above them, localise, gate, preflight and report
above those, check (the command line) on top. Standard library only, Python 3.8+.
"""
