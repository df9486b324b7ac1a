"""Tekton step programs of the model-packaging pipeline.

Each step module runs as a standalone script (its sibling package `lib/` is importable because the
script's directory is on sys.path); `embed.step_script(name)` inlines the step and the lib modules it
imports into the one script text that the Pulumi component puts into the Tekton step.
"""
