"""Repository gates: layout, layers, locks, docs, workflows, the Makefile, what the suite runs."""
