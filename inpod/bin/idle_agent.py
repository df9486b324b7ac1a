#!/usr/bin/env python3
from inpod.idle.agent import main  # ships beside this launcher (inpod.SHIPPED)
raise SystemExit(main())
