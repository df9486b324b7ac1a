"""The built documentation site in a real browser (Debian's headless chromium, tests/inpod/home/browser.py): the
architecture diagrams are pictures (the SVGs `make docs-generate` draws with Graphviz), not diagram source, and
the pages load nothing from elsewhere: every host name fails to resolve in this browser, so any fetch from the
internet would be a console error. The site is served as `mkdocs build` wrote it, over HTTP on 127.0.0.1 (port 0:
the socket is bound before anyone connects; Material's search runs in a web worker, which file:// forbids)."""

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


def test_built_site_shows_the_architecture_diagrams_offline(tmp_path: Path) -> None:
    site = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
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
                assert [src for src, _ in images] == [f"../img/architecture/{stack}.svg" for stack in STACKS], images
                assert all(shown for _, shown in images), f"a diagram is not shown: {images}"
                assert not browser.find_elements("css selector", "pre.mermaid, code.language-mermaid, .mermaid")
                assert "flowchart" not in browser.find_element("css selector", "article").text
    finally:
        browser.quit()
        server.shutdown()
        server.server_close()
