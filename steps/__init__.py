"""Tekton step programs of the model-packaging pipeline, a package like `inpod/`.

Each step is a module with a `main`, run by its launcher in `bin/` (shipped at the root of the tools image's tree,
beside this package); the code the steps share lives in `lib/`, one concern per module. Inside the package every
import is relative. `embed` lays the files out for the tools image (`shipped`) or inlines a step and the lib
modules it imports into one script (`step_script`) for a step that runs before that image exists.
"""
