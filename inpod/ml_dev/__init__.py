"""`ml-dev` (inpod/bin/ml-dev in the pod's PATH): sync, launch, status. common holds the pods (Cluster) and the
environment rule; main is the command line. Standard library only, Python 3.8+.
"""
