#!/usr/bin/env python3
from inpod.usage import main  # ships beside this launcher (inpod.SHIPPED)
raise SystemExit(main())
