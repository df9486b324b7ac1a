"""The built documentation site in a real browser (Debian's headless chromium, tests/inpod/home/browser.py): the
architecture diagrams are pictures (the SVGs `make docs-generate` draws with Graphviz), not diagram source, and
the pages load nothing from elsewhere: every host name fails to resolve in this browser, so any fetch from the
internet would be a console error. The site is served as `mkdocs build` wrote it, over HTTP on 127.0.0.1 (port 0:
the socket is bound before anyone connects; Material's search runs in a web worker, which file:// forbids).

The pictures read (issue 36 items 4 and 5): opened from the built site (file://) at 1280 x 800, every diagram label
lies inside its node's shape and every text inside the picture's view box, measured with the fonts this chromium
draws with; text is at least 12 px as the page shows the picture; a plot's legend never overlaps its plotting
rectangle."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import ROOT, STACKS
from tests.inpod.home.browser import CHROMIUM, DRIVER, NO_BROWSER, js, open_browser
from tools import diagram

pytestmark = [pytest.mark.skipif(not (CHROMIUM and DRIVER), reason=NO_BROWSER), pytest.mark.timeout(180)]
IMAGES = (
    "return Array.from(document.querySelectorAll('article img'))"
    ".map(function (i) { return [i.getAttribute('src'), i.complete && i.naturalWidth > 0]; });"
)


class QuietHandler(SimpleHTTPRequestHandler):
    """Serves the built site without a log line per request (log_message is looked up on the handler's class:
    an attribute set on the functools.partial that builds it would never be read)."""

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`mkdocs build --strict` into a temporary directory (what `make docs` builds), once for this module."""
    site = tmp_path_factory.mktemp("docs") / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    return site


def architecture_pictures() -> list[str]:
    """The pictures the architecture page shows, in order: per stack, its flow pictures, then its components."""
    return [f"../img/architecture/{stem}.svg" for stack in STACKS for stem in diagram.pictures(stack)]


def test_built_site_shows_the_architecture_diagrams_offline(site: Path, tmp_path: Path) -> None:
    handler = functools.partial(QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = open_browser(tmp_path / "profile", tmp_path / "driver.log", resolve="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
    try:
        for page in ("ref/architecture.html", "index.html", "operate/prerequisites.html"):
            browser.get(base + page)
            assert browser.title, page
            errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
            assert not errors, (page, errors)
            if page == "ref/architecture.html":
                images = js(browser, IMAGES)
                assert [src for src, _ in images] == architecture_pictures(), images
                assert all(shown for _, shown in images), f"a diagram is not shown: {images}"
                assert not browser.find_elements("css selector", "pre.mermaid, code.language-mermaid, .mermaid")
                assert "flowchart" not in browser.find_element("css selector", "article").text
    finally:
        browser.quit()
        server.shutdown()
        server.server_close()


# Per picture on a page: its address, the width the page draws it at and its view box width.
SHOWN = """
return Array.from(document.querySelectorAll('article img')).filter(function (i) { return /\\.svg$/.test(i.src); })
  .map(function (i) { return [i.getAttribute('src'), i.src, i.getBoundingClientRect().width]; });
"""
# In an SVG opened on its own: boxes in the picture's own units (its view box), for every text, each diagram node's
# shape and texts, each plot's plotting rectangle and legend.
MEASURE = """
var svg = document.documentElement, r = svg.getBoundingClientRect(), vb = svg.viewBox.baseVal, k = r.width / vb.width;
function box(e) { var b = e.getBoundingClientRect();
  return [(b.left - r.left) / k + vb.x, (b.top - r.top) / k + vb.y, (b.right - r.left) / k + vb.x, (b.bottom - r.top) / k + vb.y]; }
function size(t) { var m = t.getScreenCTM(); return parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b) / k; }
return {
  view: [vb.x, vb.y, vb.x + vb.width, vb.y + vb.height],
  texts: Array.from(document.querySelectorAll('text')).map(function (t) { return [t.textContent, box(t), size(t)]; }),
  nodes: Array.from(document.querySelectorAll('g.node')).map(function (g) {
    var shape = g.querySelector('polygon, path, ellipse');
    return [g.querySelector('title').textContent, box(shape),
            Array.from(g.querySelectorAll('text')).map(function (t) { return [t.textContent, box(t)]; })]; }),
  plots: Array.from(document.querySelectorAll('svg')).filter(function (s) { return s.querySelector(':scope > rect.plot-area'); })
    .map(function (s) { return [box(s.querySelector(':scope > rect.plot-area')),
                                Array.from(s.querySelectorAll(':scope > g.legend > *')).map(box)]; })
};
"""
EPS = 0.5  # picture units: rounding of the boxes the browser reports


def inside(inner: list[float], outer: list[float]) -> bool:
    return inner[0] >= outer[0] - EPS and inner[1] >= outer[1] - EPS and inner[2] <= outer[2] + EPS and inner[3] <= outer[3] + EPS


def overlaps(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] - EPS and b[0] < a[2] - EPS and a[1] < b[3] - EPS and b[1] < a[3] - EPS


def test_pictures_read_on_the_built_site_at_1280_by_800(site: Path, tmp_path: Path) -> None:
    """Every picture of the architecture page (flows and components per stack), the benchmarks' plots and the fabric
    gate's curve, as the built site shows them at a 1280 x 800 window."""
    browser = open_browser(tmp_path / "profile", tmp_path / "driver.log", resolve="MAP * ~NOTFOUND")
    try:
        browser.set_window_size(1280, 800)
        shown: list[tuple[str, str, float]] = []
        for page in ("ref/architecture.html", "models/benchmarks.html", "operate/fabric-check.html"):
            browser.get((site / page).as_uri())
            assert js(browser, "return window.innerWidth;") == 1280, "the window's width"
            pictures = js(browser, SHOWN)
            assert pictures, page
            shown += [(page, url, width) for _, url, width in pictures]
        srcs = [url.rsplit("/img/", 1)[1] for _, url, _ in shown]
        assert srcs[: len(architecture_pictures())] == [a.rsplit("/img/", 1)[1] for a in architecture_pictures()]
        assert {"bench-package.svg", "bench-launch.svg", "fabric-gate.svg"} <= set(srcs)
        problems: list[str] = []
        for page, url, width in shown:
            name = url.rsplit("/img/", 1)[1]
            browser.get(url)
            m = js(browser, MEASURE)
            view = m["view"]
            scale = width / (view[2] - view[0])  # CSS px on the page per picture unit
            for text, box, size in m["texts"]:
                if not text.strip():
                    continue
                if not inside(box, view):
                    problems.append(f"{name}: {text!r} {box} is outside the view box {view}")
                if size * scale < 12 - 0.05:
                    problems.append(f"{name} on {page}: {text!r} is drawn {size * scale:.1f} px high (< 12 px)")
            for node, shape, texts in m["nodes"]:
                problems += [
                    f"{name}: {t!r} {b} sticks out of node {node}'s shape {shape}" for t, b in texts if t.strip() and not inside(b, shape)
                ]
            for plot, legend in m["plots"]:
                problems += [f"{name}: a legend entry {b} overlaps the plotting rectangle {plot}" for b in legend if overlaps(b, plot)]
            if name.startswith("architecture/"):
                assert m["nodes"] and not m["plots"], name
            else:
                assert m["plots"] and all(legend for _, legend in m["plots"]), f"{name}: a plot with its legend"
        assert not problems, "\n".join(problems[:40])
    finally:
        browser.quit()


SCREENSHOTS = (
    "return Array.from(document.querySelectorAll('article img')).filter(function (i) { return /\\.png$/.test(i.src); })"
    ".map(function (i) { return [i.getAttribute('src'), i.naturalWidth, i.getBoundingClientRect().width]; });"
)


def test_screenshots_are_shown_at_their_own_size(site: Path, tmp_path: Path) -> None:
    """The home page's screenshot on the pages that show it, at a 1280 x 800 window: drawn at its own width (its text
    as the page draws it, >= 12 px), not shrunk to the article's column (issue 48: it was drawn at 54 %)."""
    browser = open_browser(tmp_path / "profile", tmp_path / "driver.log", resolve="MAP * ~NOTFOUND")
    try:
        browser.set_window_size(1280, 800)
        seen = []
        for page in ("index.html", "use/home-page.html"):
            browser.get((site / page).as_uri())
            assert js(browser, "return window.innerWidth;") == 1280, "the window's width"
            for src, natural, drawn in js(browser, SCREENSHOTS):
                seen.append(src)
                assert natural > 0 and drawn >= natural - 0.5, f"{page}: {src} is drawn {drawn:.0f} px wide of its {natural} px"
        assert [s.rsplit("/", 1)[1] for s in seen] == ["home-page.png", "home-page.png"], seen
    finally:
        browser.quit()
