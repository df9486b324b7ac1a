#!/usr/bin/env python3
from inpod.home.page import main  # ships beside this launcher (inpod.SHIPPED)
raise SystemExit(main())
