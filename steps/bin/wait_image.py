#!/usr/bin/env python3
from steps.wait_image import main  # ships beside this launcher (steps.embed.SHIPPED_DIRS)
from steps.lib.runtime import run_step
run_step(main)
