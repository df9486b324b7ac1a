"""The home page of pod 0 (`home_page.py` in the pod, inpod/bin) and the SVG plots it and the fabric gate draw.

Standard library only, Python 3.8+.
"""
