#!/usr/bin/env python3
from inpod.fabric.check import main  # ships beside this launcher (inpod.SHIPPED)
raise SystemExit(main())
