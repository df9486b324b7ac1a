"""The home page in a real browser, on simulated pods started from the barcelona render (tests/inpod/home/pods.py).

The page runs where the render runs it: startup.sh starts it on pod 0 (127.0.0.1:8090, behind the home OAuth
proxy), with the real idle agents of both pods, the real `fabric_check.py gate` and a real `ml-dev run`.
Debian's headless chromium, driven through chromium-driver (Selenium), runs inside pod 0's network namespace
(tests/podsim/netns.py) and opens the page on the pod's loopback, the way the OAuth proxy sidecar reaches it.
Nothing is downloaded at run time: Selenium gets the driver's path and the browser binary, so Selenium
Manager is never run.

The test checks what the state implies (an idle environment shows its stop time, a failed gate is red, a
busy GPU shows busy after a refresh that is not a reload), that the console logged no error, and that a
`<script>` in a command line is text. Every number on the page is enumerated and checked (tests/inpod/home/truth.py).
When a connection closes and the run ends, the page must show it by its second refresh that starts after both
(its refreshes counted in the browser, `REFRESHES`; the page's settings are the render's: every 10 s); the
wall-clock bound on that wait only guards against a hang. With ML_DEV_WRITE_SCREENSHOTS=1 (`make screenshots`) it
saves the failed gate's curve the docs show (docs/img/fabric-gate.svg). The docs' screenshot (docs/img/home-page.png)
is a case of its own, a realistic state rather than this test's probes (`test_hero_screenshot_of_a_training_environment`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from inpod.lib.pod import clock
from tests.conftest import ROOT
from tests.inpod.home.browser import APPS, CHROMIUM, DRIVER, NO_BROWSER, js, open_browser
from tests.inpod.home.numbers import shown
from tests.inpod.home.pods import FAST_BUSBW, HOME_PORT, INJECTED, HomePods
from tests.inpod.home.truth import PageTruth
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


FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
# The page's refreshes, counted from outside it (installed before its script runs: DevTools
# Page.addScriptToEvaluateOnNewDocument): each `fetch` of its `fragment` is numbered as it starts (`started`); when
# its text is read, the live part the page's script then swaps in (`replaceWith`, in the same task) is kept with that
# number (`shown`, the last 20); a refresh whose answer is refused or not OK is `failed`. The page's own code is not
# changed: fetch is wrapped, the swap observed (MutationObserver).
REFRESHES = """
(function () {
  var t = window.__refreshes = {started: 0, current: 0, shown: [], failed: []};
  var original = window.fetch;
  window.fetch = function (input) {
    var answer = original.apply(this, arguments);
    if (!/(^|\\/)fragment([?#]|$)/.test(String(input && input.url ? input.url : input))) { return answer; }
    var n = ++t.started;
    return answer.then(function (r) {
      if (!r.ok) { t.failed.push(n); return r; }
      var text = r.text.bind(r);
      r.text = function () { return text().then(function (body) { t.current = n; return body; }); };
      return r;
    }, function (err) { t.failed.push(n); throw err; });
  };
  new MutationObserver(function (records) {
    records.forEach(function (m) {
      m.addedNodes.forEach(function (node) {
        if (node.id === 'live' && t.current) { t.shown = t.shown.slice(-19).concat([[t.current, node.outerHTML]]); }
      });
    });
  }).observe(document, {childList: true, subtree: true});
})();
"""
MIN_DRAWN = 11
"""The smallest text drawn on the screen, in CSS px at the viewport's scale: in an SVG (inline or an image) the font
size times the scale the picture is drawn at, at 1280 px and at 390 px."""
LAYOUT = (
    f"var MIN_DRAWN = {MIN_DRAWN};\n"
    + r"""
var out = {overflow: [], small: [], boxes: {}, viewport: [window.innerWidth, window.innerHeight]};
document.querySelectorAll('body *').forEach(function (e) {
  if (e.closest('svg') && e.tagName.toLowerCase() !== 'text') { return; }
  if (['script', 'style', 'title'].indexOf(e.tagName.toLowerCase()) >= 0) { return; }
  var name = e.tagName.toLowerCase() + (e.id ? '#' + e.id : '');
  if (e.scrollWidth !== undefined && e.scrollWidth > e.clientWidth && getComputedStyle(e).display !== 'inline') {
    out.overflow.push(name + ' ' + e.scrollWidth + '>' + e.clientWidth);
  }
  var text = Array.from(e.childNodes).some(function (n) { return n.nodeType === 3 && n.textContent.trim(); });
  if (text && parseFloat(getComputedStyle(e).fontSize) < 12) { out.small.push(name + ' ' + getComputedStyle(e).fontSize); }
});
// drawn text: an SVG text's font size times the scale its screen matrix applies (getScreenCTM), inline or inside an
// <img> (its document read again and scaled by the image's drawn width over the SVG's own)
out.drawn = [];
function drawn(where, text, px) {
  if (px < MIN_DRAWN) { out.drawn.push(where + ' "' + text.trim().slice(0, 40) + '" ' + px.toFixed(1) + 'px'); }
}
document.querySelectorAll('svg text').forEach(function (t) {
  var m = t.getScreenCTM();
  if (!t.textContent.trim() || !m) { return; }
  drawn('svg', t.textContent, parseFloat(getComputedStyle(t).fontSize) * Math.sqrt(m.a * m.a + m.b * m.b));
});
document.querySelectorAll('img').forEach(function (img) {
  var src = img.currentSrc || img.src;
  var box = img.getBoundingClientRect();
  if (!/\.svg(\?|$)/.test(src) || !box.width) { return; }
  var x = new XMLHttpRequest();
  x.open('GET', src, false);
  x.send();
  var svg = new DOMParser().parseFromString(x.responseText, 'image/svg+xml').documentElement;
  var own = (svg.viewBox && svg.viewBox.baseVal && svg.viewBox.baseVal.width) || parseFloat(svg.getAttribute('width'));
  svg.querySelectorAll('text').forEach(function (t) {
    var sized = t.closest('[font-size]');
    var size = parseFloat((sized && sized.getAttribute('font-size')) || '16');
    if (t.textContent.trim()) { drawn('img#' + img.id, t.textContent, size * box.width / own); }
  });
});
['card-idle', 'pods', 'fabric-curve'].forEach(function (id) {
  var r = document.getElementById(id).getBoundingClientRect();
  out.boxes[id] = [r.left, r.top, r.right, r.bottom];
});
return out;
"""
)


def viewport(browser: Any, width: int, height: int, mobile: bool = False) -> None:
    """The page's viewport exactly (Chrome DevTools Protocol Emulation.setDeviceMetricsOverride), not the window's."""
    metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)


def layout_problems(browser: Any, first_screen: bool) -> list[str]:
    """Elements wider than their box, text under 12 px, text drawn under MIN_DRAWN px (SVG text and images included),
    and (first screen) the idle card, the pods table and the whole fabric curve outside the viewport."""
    found = js(browser, LAYOUT)
    problems = [f"wider than its box: {found['overflow']}"] if found["overflow"] else []
    problems += [f"text under 12 px: {found['small']}"] if found["small"] else []
    problems += [f"text drawn under {MIN_DRAWN} px: {found['drawn']}"] if found["drawn"] else []
    width, height = found["viewport"]
    for name, (left, top, right, bottom) in found["boxes"].items() if first_screen else ():
        if left < 0 or top < 0 or right > width or bottom > height:
            problems.append(f"{name} at {left:.0f},{top:.0f}-{right:.0f},{bottom:.0f} is not in the first {width}x{height} screen")
    return problems


def test_home_page_in_chromium_on_the_rendered_pods(pods: HomePods, tmp_path: Path) -> None:
    result = pods.gate()  # the real gate on pod 0: slow everywhere, so it fails and localises
    assert result["status"] == "fail" and result["plateauBusbw"] < result["expectation"]["pass_busbw_gbs"], result
    latest_svg = pods.records(0, "fabric/latest.svg").read_text()
    assert latest_svg.lstrip().startswith("<svg") and result["sizes"], "the gate wrote its curve next to its JSON"
    # the API where the pods reach it, under the render's RBAC of the pods' ServiceAccount, with a usage record
    truth = PageTruth(pods, result)
    api = truth.serve_usage(tmp_path)
    url = f"http://{pods.app}-home-{pods.namespace}.{APPS}:{HOME_PORT}/"
    procs: list[Any] = []

    def browse() -> None:
        browser = open_browser(tmp_path / "profile", tmp_path / "driver.log")
        try:
            look(browser)
        finally:
            browser.quit()

    def settle(browser: Any, make: Callable[[], dict[str, Any]], what: str) -> None:
        truth.settle(lambda: str(js(browser, "return document.documentElement.outerHTML;")), make, what)

    def look(browser: Any) -> None:
        viewport(browser, 1280, 800)
        browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": REFRESHES})
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
        shown_svg = browser.execute_async_script(fetch)
        assert shown_svg == latest_svg, "the page shows another curve than the gate's latest.svg"

        # busy: GPU 0 of pod 0 at 87 %, of pod 1 at 40 %; a real `ml-dev run` on both pods whose command line carries
        # a script; two people's SSH connections into pod 0 (from pod 1) and one into pod 1 (from pod 0), over the
        # SSH fabric (its ForceCommand records them)
        pods.gpu(0, 87)
        pods.gpu(1, 40)
        procs.append(pods.run("python3", "train.py", INJECTED))
        # (`cat` of the channel's stdin, held open here: it ends with the connection; a command that reads nothing
        # outlives it, sshd ends no process of a session without a terminal)
        people = [pods.popen(1 - (k == 2), f"exec ssh {pods.app}-{int(k == 2)} cat < <(exec sleep 300)") for k in range(3)]
        procs.extend(people)
        ip = [p.ip for p in pods.pods]

        def busy() -> dict[int, list[tuple[str, str]]]:
            login = {s["user"] for i in (0, 1) for s in pods.sessions(i)}  # the pods' login user: people and ml-dev log in as it
            user = login.pop() if len(login) == 1 else f"one login user, not {login}"
            return {0: [(user, ip[1]), (user, ip[1])], 1: [(user, ip[0])]}

        settle(browser, lambda: truth.expected(busy(), {0: 1, 1: 1}, {0: 87, 1: 40}), "two connections into pod 0, one into pod 1, one run")
        assert browser.execute_script("return window.__notReloaded === true;"), "the page refreshed by a full reload"
        assert style_of(browser, "#pods .gpu.busy", "backgroundColor") == "rgb(30, 142, 62)", "a busy GPU shows busy (green)"
        runs = js(browser, "return Array.from(document.querySelectorAll('li.run code')).map(function (c) { return c.textContent; });")
        assert any(INJECTED in r for r in runs), runs
        assert browser.execute_script("return window.__xss;") is None, "the injected script ran"
        assert not browser.find_elements("xpath", "//script[contains(., '__xss')]"), "the injected script became an element"
        assert api.denied == [], f"the render's RBAC refused the pods' reads: {api.denied}"
        # links to the IDEs: their Routes, siblings of this page's own
        hrefs = js(browser, "return Array.from(document.querySelectorAll('a.ide')).map(function (a) { return a.getAttribute('href'); });")
        expected = [f"http://{pods.app}-{server}-{pods.namespace}.{APPS}/" for server in ("vscode", "jupyter", "tensorboard")]
        assert hrefs == expected, hrefs
        # the first screen at 1280x800: idle state, pods, the whole fabric curve; nothing overflows, no text under 12 px
        assert not (problems := layout_problems(browser, first_screen=True)), problems
        shot = tmp_path / "home-page.png"  # the docs' picture is the realistic state's (test_hero_screenshot)
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        if os.environ.get("ML_DEV_WRITE_SCREENSHOTS") == "1":  # the docs' fabric-check page shows this failed gate's curve
            (SCREENSHOT.parent / "fabric-gate.svg").write_text(latest_svg)
        viewport(browser, 390, 844, mobile=True)
        assert not (problems := layout_problems(browser, first_screen=False)), problems
        viewport(browser, 1280, 800)

        errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors

        # the page's server restarts mid-run: the plots keep the samples it held (the same "since")
        before = {p.name: shown(str(js(browser, "return document.documentElement.outerHTML;")))[0][f"since:{p.name}"] for p in pods.pods}
        restart_page()
        wait(browser, lambda: "idle-state" in str(js(browser, "return document.body.innerHTML;")), "the restarted page", pods)
        kept = {f"since:{name}": value for name, value in before.items()}
        settle(browser, lambda: {**truth.expected(busy(), {0: 1, 1: 1}, {0: 87, 1: 40}), **kept}, "the restarted page")

        # one connection closes, the run ends: the page shows it by the second refresh that starts after both
        pods.interrupt(people[0])
        people[0].communicate(timeout=30)
        pods.interrupt(procs[0])
        procs[0].communicate(timeout=60)
        after = int(js(browser, "return window.__refreshes.started;"))
        follows(browser, after + 2, lambda: truth.expected({0: busy()[0][1:], 1: busy()[1]}, {0: 0, 1: 0}, {0: 87, 1: 40}))
        # while the server restarted, the page's refresh was refused (and said so): nothing else
        errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert all(e["message"].endswith("/fragment - Failed to load resource: net::ERR_CONNECTION_REFUSED") for e in errors), errors

    def follows(browser: Any, refresh: int, make: Callable[[], dict[str, Any]]) -> None:
        """The live part that refresh number `refresh` swapped in shows the truth `make()` (checked once: no later
        refresh counts); the wait for that refresh is only a guard against a hang."""
        seen: list[dict[str, Any]] = []  # pod 0's agent's decisions meanwhile: the page shows the one it sampled
        guard = time.monotonic() + 3 * int(js(browser, "return document.body.getAttribute('data-refresh');")) + 60
        while True:
            seen.append(truth.decision())
            state = js(browser, "return window.__refreshes;")
            if refresh in state["failed"] or any(n >= refresh for n, _ in state["shown"]):
                break
            assert time.monotonic() < guard, f"hang guard: refresh {refresh} never came (the page's refreshes: {state['started']})"
            time.sleep(0.2)
        mine = [html for n, html in state["shown"] if n == refresh]
        numbers = [n for n, _ in state["shown"]]
        assert mine, f"refresh {refresh} (the 2nd after the change) showed nothing: failed {state['failed']}, shown {numbers}"
        if problems := truth.problems(mine[0], make, seen):
            truth.fail(f"one closed, the run ended, at refresh {refresh} (the 2nd after)", problems, mine[0])

    def restart_page() -> None:
        procs.append(pods.restart_page())

    try:
        in_netns(f"/run/netns/{pods.pods[0].netns}", browse, timeout=280)
    finally:
        truth.close()
        for proc in procs:
            if proc.poll() is None:
                pods.interrupt(proc)
            try:
                proc.communicate(timeout=30)
            except Exception:
                proc.kill()
                proc.communicate(timeout=30)


HERO_WIDTH = 680
"""The docs' screenshot's width in CSS px: the column the README and the site draw it in (the site's article at a
1280 px window, about 690 px), so it is shown at its own size, its text as the page draws it (>= 12 px)."""
HERO_GPU = (95, 92)
"""Each pod's GPUs' utilisation while the run trains."""


def hour_of_history(now: float, gpus: int, level: int) -> list[list[Any]]:
    """An hour of a training run's GPU utilisation as the page samples it (every 30 s): a start-up ramp, steady
    work around `level` %, a checkpoint's dip 35 minutes ago."""
    samples = []
    for k in range(120):
        t = now - 3600 + 30 * (k + 1)
        base = min(level, 8 * k) if k < 12 else (30 if 48 <= k < 51 else level)
        utils = [max(0, min(100, base - 3 + (3 * k + 5 * g) % 7)) for g in range(gpus)]
        samples.append([t, utils])
    return samples


def test_hero_screenshot_of_a_training_environment(tmp_path: Path) -> None:
    """The docs' screenshot (docs/img/home-page.png with ML_DEV_WRITE_SCREENSHOTS=1): what a user sees an hour into a
    run, the page as the render starts it: a passing fabric gate, `python3 train.py` through `ml-dev run` on both
    pods with their GPUs busy, one person's SSH connection, an hour of GPU history (the page's own file, as the
    page keeps it across a restart)."""
    sim = HomePods(busbw=FAST_BUSBW)
    procs: list[Any] = []
    truth: PageTruth | None = None
    try:
        pods = sim.start()
        result = pods.gate(passes=True)
        assert result["status"] == "pass", result
        truth = PageTruth(pods, result)
        truth.serve_usage(tmp_path)
        history = pods.records(0, "home/history.json")
        samples = {p.name: hour_of_history(time.time(), pods.node.state(pods, i)["gpus"], HERO_GPU[i]) for i, p in enumerate(pods.pods)}

        for i, util in enumerate(HERO_GPU):  # busy before the restarted page's first round: no dip at "now"
            pods.node.gpu(pods, i, util=util)
        procs.append(pods.restart_page(lambda: history.write_text(json.dumps({"samples": samples}))))
        procs.append(pods.run("python3", "train.py", "--config", "configs/llama-8b.yaml"))
        procs.append(pods.popen(1, f"exec ssh {pods.app}-0 cat < <(exec sleep 300)"))
        url = f"http://{pods.app}-home-{pods.namespace}.{APPS}:{HOME_PORT}/"

        def browse() -> None:
            browser = open_browser(tmp_path / "profile", tmp_path / "driver.log")
            try:
                look(browser)
            finally:
                browser.quit()

        def look(browser: Any) -> None:
            viewport(browser, HERO_WIDTH, 900)
            browser.get(url)
            ready = (
                "var r = document.querySelector('li.run code'), c = document.getElementById('fabric-curve');"
                "return !!r && r.textContent.indexOf('train.py') >= 0 && !!c && c.complete && c.naturalWidth > 0"
                " && document.querySelectorAll('#live svg').length >= 2;"
            )
            wait(browser, lambda: bool(js(browser, ready)), "the run, the curve and both pods' plots", pods)
            assert "PASS" in text_of(browser, "fabric-status"), text_of(browser, "fabric-status")
            since = shown(str(js(browser, "return document.documentElement.outerHTML;")))[0]
            for name, series in samples.items():  # the plots span the hour of history
                assert since[f"since:{name}"] == [clock(series[0][0])], (name, since)
            assert not (problems := layout_problems(browser, first_screen=False)), problems
            height = int(js(browser, "return document.documentElement.scrollHeight;"))
            viewport(browser, HERO_WIDTH, height)
            js(browser, "document.documentElement.style.overflow = 'hidden';")  # the window's scrollbar: not the page's
            write = os.environ.get("ML_DEV_WRITE_SCREENSHOTS") == "1"
            shot = SCREENSHOT if write else tmp_path / "home-page.png"
            shot.parent.mkdir(parents=True, exist_ok=True)
            assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
            errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
            assert not errors, errors

        in_netns(f"/run/netns/{pods.pods[0].netns}", browse, timeout=200)
    finally:
        if truth is not None:
            truth.close()
        for proc in procs:
            if proc.poll() is None:
                sim.interrupt(proc)
            try:
                proc.communicate(timeout=30)
            except Exception:
                proc.kill()
                proc.communicate(timeout=30)
        sim.stop()
    assert not [x for x in leftovers() if sim.run_id in x], "the simulation left namespaces or directories behind"
