"""The home page in a real browser: Debian's headless chromium driven through chromium-driver (Selenium).

Nothing is downloaded at run time: Selenium gets the driver's path and the browser binary, so Selenium
Manager is never run. The test checks what the state implies (an
idle environment shows its stop time, a failed gate is red, a busy GPU shows busy after a refresh that
is not a reload), that the console logged no error, and that a `<script>` in a command line is text.
It saves the screenshot the docs show (docs/img/home-page.png, and the failed gate's curve as
docs/img/fabric-gate.svg) when ML_DEV_WRITE_SCREENSHOTS=1 (`make screenshots`), else the screenshot goes
under the test's temporary directory.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.home.conftest import INJECTED, Environment

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
SCREENSHOT = ROOT / "docs" / "img" / "home-page.png"
APPS = "apps.example.test"  # a cluster's apps domain; the Routes are <app>-<server>-<namespace>.<apps domain>

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver (make system-deps installs them as root)"
)


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # The driver's path in the Service skips Selenium Manager altogether (selenium
    # webdriver/common/driver_finder.py, DriverFinder._binary_paths); SE_OFFLINE would keep it offline anyway.
    monkeypatch.setenv("SE_OFFLINE", "true")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    # the page's Route host resolves to the loopback server: the IDE links are derived from it as on a cluster
    resolve = f"--host-resolver-rules=MAP *.{APPS} 127.0.0.1"
    for arg in (
        "--headless=new",
        "--disable-gpu",
        "--no-first-run",
        "--window-size=1280,1250",
        f"--user-data-dir={tmp_path / 'profile'}",
        resolve,
    ):
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # chromium refuses to run as root with its sandbox
    options.set_capability("goog:loggingOptions", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(DRIVER), log_output=str(tmp_path / "driver.log")))
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: Any, ok: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.2)
    raise AssertionError(f"the page never showed {what}:\n{driver.find_element('id', 'live').text}")


# The live part is swapped every second: read it in one script call, never through a kept element reference.
def js(driver: Any, body: str, *args: Any) -> Any:
    return driver.execute_script(body, *args)


def text_of(driver: Any, element_id: str) -> str:
    return str(js(driver, "var e = document.getElementById(arguments[0]); return e ? e.innerText : '';", element_id))


def style_of(driver: Any, selector: str, prop: str) -> str:
    return str(
        js(driver, "var e = document.querySelector(arguments[0]); return e ? getComputedStyle(e)[arguments[1]] : '';", selector, prop)
    )


def test_home_page_in_chromium(environment: Environment, browser: Any, tmp_path: Path) -> None:
    env = environment
    browser.get(env.start().replace("127.0.0.1", f"ml-dev-env-home-nccl-test.{APPS}"))
    wait(browser, lambda: "idle: stops at" in text_of(browser, "idle-state") and "ml-dev-env-1" in text_of(browser, "pods"), "idle")
    browser.execute_script("window.__notReloaded = true;")
    assert "FAIL" in text_of(browser, "fabric-status")
    assert style_of(browser, "#fabric-status", "color") == "rgb(176, 0, 32)", "a failed gate shows red"
    curve = "var c = document.getElementById('fabric-curve'); return !!c && c.complete && c.naturalWidth > 0;"
    wait(browser, lambda: bool(js(browser, curve)), "the curve")

    env.busy()
    # the GPU table follows the page's own sampling, the idle state pod 0's agent's next round: wait for both
    wait(
        browser,
        lambda: (
            "GPU 0: 87% busy" in text_of(browser, "pods")
            and "train.py" in text_of(browser, "live")
            and "in use" in text_of(browser, "idle-state")
        ),
        "busy",
    )
    assert browser.execute_script("return window.__notReloaded === true;"), "the page refreshed by a full reload"
    assert style_of(browser, "#pods .gpu.busy", "backgroundColor") == "rgb(30, 142, 62)", "a busy GPU shows busy (green)"
    runs = js(browser, "return Array.from(document.querySelectorAll('li.run code')).map(function (c) { return c.textContent; });")
    assert any(INJECTED in r for r in runs), runs
    assert browser.execute_script("return window.__xss;") is None, "the injected script ran"
    assert not browser.find_elements("xpath", "//script[contains(., '__xss')]"), "the injected script became an element"
    wait(browser, lambda: js(browser, "return document.querySelectorAll('#pods svg polyline').length;") >= 2, "the utilisation plots")
    # links to the IDEs: their Routes, siblings of this page's own
    hrefs = js(browser, "return Array.from(document.querySelectorAll('a.ide')).map(function (a) { return a.getAttribute('href'); });")
    assert hrefs == [f"http://ml-dev-env-{server}-nccl-test.{APPS}/" for server in ("vscode", "jupyter", "tensorboard")], hrefs

    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, errors
    write = os.environ.get("ML_DEV_WRITE_SCREENSHOTS") == "1"
    shot = SCREENSHOT if write else tmp_path / "home-page.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    if write:  # the docs' fabric-check page shows the curve this failed gate drew
        curve = env.workspace / ".ml-dev-env" / "fabric" / "latest.svg"
        (SCREENSHOT.parent / "fabric-gate.svg").write_text(curve.read_text())
