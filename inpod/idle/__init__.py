"""The idle agent (`idle_agent.py` in the pod, inpod/bin): probes, the decider and the HTTP server of pod 0.

Standard library only, Python 3.8+.
"""
