"""Debian's headless chromium driven through chromium-driver (Selenium), as the browser tests use it.

Nothing is downloaded at run time: Selenium gets the driver's path and the browser binary, so Selenium
Manager is never run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
APPS = "apps.example.test"  # a cluster's apps domain; the Routes are <app>-<server>-<namespace>.<apps domain>
NO_BROWSER = "needs Debian's chromium and chromium-driver (make system-deps installs them as root)"


def js(driver: Any, body: str, *args: Any) -> Any:
    return driver.execute_script(body, *args)


def open_browser(profile: Path, log: Path, resolve: str = f"MAP *.{APPS} 127.0.0.1") -> Any:
    """A headless chromium; `resolve`: its --host-resolver-rules (by default a cluster's apps domain is this
    network namespace's loopback)."""
    # The driver's path in the Service skips Selenium Manager altogether (selenium
    # webdriver/common/driver_finder.py, DriverFinder._binary_paths); SE_OFFLINE would keep it offline anyway.
    os.environ["SE_OFFLINE"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    # the page's Route host resolves to the pod's loopback: the IDE links are derived from it as on a cluster
    for arg in (
        "--headless=new",
        "--disable-gpu",
        "--no-first-run",
        "--window-size=1280,1250",
        f"--user-data-dir={profile}",
        f"--host-resolver-rules={resolve}",
    ):
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # chromium refuses to run as root with its sandbox
    options.set_capability("goog:loggingOptions", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(DRIVER), log_output=str(log)))
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    return driver
