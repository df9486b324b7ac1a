"""The home page in a real browser, on simulated pods started from the barcelona render (tests/inpod/home/pods.py).

The page runs where the render runs it: startup.sh starts it on pod 0 (127.0.0.1:8090, behind the home OAuth
proxy), with the real idle agents of both pods, the real `fabric_check.py gate` and a real `ml-dev run`.
Debian's headless chromium, driven through chromium-driver (Selenium), runs inside pod 0's network namespace
(tests/podsim/netns.py) and opens the page on the pod's loopback, the way the OAuth proxy sidecar reaches it.
Nothing is downloaded at run time: Selenium gets the driver's path and the browser binary, so Selenium
Manager is never run.

The test checks what the state implies (an idle environment shows its stop time, a failed gate is red, a
busy GPU shows busy after a refresh that is not a reload), that the console logged no error, and that a
`<script>` in a command line is text. It saves the screenshot the docs show (docs/img/home-page.png, and the
failed gate's curve as docs/img/fabric-gate.svg) when ML_DEV_WRITE_SCREENSHOTS=1 (`make screenshots`), else
the screenshot goes under the test's temporary directory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.inpod.home.browser import APPS, CHROMIUM, DRIVER, NO_BROWSER, js, open_browser
from tests.inpod.home.pods import HOME_PORT, INJECTED, HomePods
from tests.podsim.netns import in_netns
from tests.podsim.pods import leftovers, missing_requirements

SCREENSHOT = ROOT / "docs" / "img" / "home-page.png"
REASON = missing_requirements()

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not (CHROMIUM and DRIVER), reason=NO_BROWSER),
    pytest.mark.skipif(REASON is not None, reason=f"simulated pods: {REASON}"),
    pytest.mark.timeout(300),
]


@pytest.fixture
def pods() -> Iterator[HomePods]:
    sim = HomePods()
    try:
        yield sim.start()
    finally:
        sim.stop()
    # other simulations may run beside this one (other sessions of the suite): only this one's names count
    assert not [x for x in leftovers() if sim.run_id in x], "the simulation left namespaces or directories behind"


def wait(driver: Any, ok: Callable[[], bool], what: str, pods: HomePods, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.2)
    live = js(driver, "var e = document.getElementById('live'); return e ? e.innerText : document.body.innerHTML;")
    raise AssertionError(f"the page never showed {what}:\n{live}\n--- home.log:\n{pods.log_of(0, 'home')}")


# The live part is swapped every second: read it in one script call (js), never through a kept element reference.
def text_of(driver: Any, element_id: str) -> str:
    return str(js(driver, "var e = document.getElementById(arguments[0]); return e ? e.innerText : '';", element_id))


def style_of(driver: Any, selector: str, prop: str) -> str:
    return str(
        js(driver, "var e = document.querySelector(arguments[0]); return e ? getComputedStyle(e)[arguments[1]] : '';", selector, prop)
    )


def test_home_page_in_chromium_on_the_rendered_pods(pods: HomePods, tmp_path: Path) -> None:
    result = pods.gate()  # the real gate on pod 0: slow everywhere, so it fails and localises
    assert result["status"] == "fail" and result["plateauBusbw"] < result["expectation"]["pass_busbw_gbs"], result
    latest_svg = pods.pods[0].path("/workspace/.ml-dev-env/fabric/latest.svg").read_text()
    assert latest_svg.lstrip().startswith("<svg") and result["sizes"], "the gate wrote its curve next to its JSON"
    url = f"http://{pods.app}-home-{pods.namespace}.{APPS}:{HOME_PORT}/"
    procs: list[Any] = []

    def browse() -> None:
        browser = open_browser(tmp_path / "profile", tmp_path / "driver.log")
        try:
            check(browser)
        finally:
            browser.quit()

    def check(browser: Any) -> None:
        browser.get(url)
        wait(
            browser,
            lambda: "idle: stops at" in text_of(browser, "idle-state") and f"{pods.app}-1" in text_of(browser, "pods"),
            "both pods, idle",
            pods,
        )
        browser.execute_script("window.__notReloaded = true;")
        assert "FAIL" in text_of(browser, "fabric-status")
        assert style_of(browser, "#fabric-status", "color") == "rgb(176, 0, 32)", "a failed gate shows red"
        curve = "var c = document.getElementById('fabric-curve'); return !!c && c.complete && c.naturalWidth > 0;"
        wait(browser, lambda: bool(js(browser, curve)), "the curve", pods)
        # the curve shown is the one the gate drew beside its JSON (state dir and workspace hold the same)
        fetch = "var done = arguments[0]; fetch('fabric.svg').then(function (r) { return r.text(); }).then(done);"
        shown = browser.execute_async_script(fetch)
        assert shown == latest_svg, "the page shows another curve than the gate's latest.svg"

        # busy: GPU 0 of pod 0 at 87 %, a real `ml-dev run` on both pods whose command line carries a script,
        # an SSH session into pod 0 (from pod 1, over the SSH fabric: its ForceCommand records it)
        pods.gpu(0, 87)
        procs.append(pods.run("python3", "train.py", INJECTED))
        procs.append(pods.popen(1, f"exec ssh {pods.app}-0 'sleep 120'"))
        wait(
            browser,
            lambda: (
                "GPU 0: 87% busy" in text_of(browser, "pods")
                and "train.py" in text_of(browser, "live")
                and "in use" in text_of(browser, "idle-state")
                and js(browser, "return document.querySelectorAll('li.ssh').length;") == 1
            ),
            "busy",
            pods,
        )
        assert browser.execute_script("return window.__notReloaded === true;"), "the page refreshed by a full reload"
        assert style_of(browser, "#pods .gpu.busy", "backgroundColor") == "rgb(30, 142, 62)", "a busy GPU shows busy (green)"
        runs = js(browser, "return Array.from(document.querySelectorAll('li.run code')).map(function (c) { return c.textContent; });")
        assert any(INJECTED in r for r in runs), runs
        assert browser.execute_script("return window.__xss;") is None, "the injected script ran"
        assert not browser.find_elements("xpath", "//script[contains(., '__xss')]"), "the injected script became an element"
        plots = "return document.querySelectorAll('#pods svg polyline').length;"
        wait(browser, lambda: js(browser, plots) >= 2, "the utilisation plots", pods)
        # links to the IDEs: their Routes, siblings of this page's own
        hrefs = js(browser, "return Array.from(document.querySelectorAll('a.ide')).map(function (a) { return a.getAttribute('href'); });")
        expected = [f"http://{pods.app}-{server}-{pods.namespace}.{APPS}/" for server in ("vscode", "jupyter", "tensorboard")]
        assert hrefs == expected, hrefs

        errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
        write = os.environ.get("ML_DEV_WRITE_SCREENSHOTS") == "1"
        shot = SCREENSHOT if write else tmp_path / "home-page.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        if write:  # the docs' fabric-check page shows the curve this failed gate drew
            (SCREENSHOT.parent / "fabric-gate.svg").write_text(latest_svg)

    try:
        in_netns(f"/run/netns/{pods.pods[0].netns}", browse, timeout=240)
    finally:
        for proc in procs:
            pods.interrupt(proc)
            try:
                proc.communicate(timeout=30)
            except Exception:
                proc.kill()
                proc.communicate(timeout=30)
