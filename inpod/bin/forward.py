#!/usr/bin/env python3
from inpod.lib.forward import main  # ships beside this launcher (inpod.SHIPPED)
raise SystemExit(main())
