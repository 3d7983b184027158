"""The built comparison page in a real headless browser (Debian's chromium).

The site is served from localhost by a thread; the server records every request, so the test
knows that the browser actually fetched the plots, and that nothing was fetched from anywhere
else (the site must work offline). Skipped when no chromium is installed.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from policykit.docsgen import comparisons

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
BROWSER = next((b for b in map(shutil.which, BROWSERS) if b), None)
pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason="no chromium on PATH (Debian: apt-get install chromium); .ci/run installs it",
)


class _RecordingHandler(SimpleHTTPRequestHandler):
    log: list[tuple[str, int]]

    def log_request(self, code="-", size="-") -> None:
        self.log.append((self.path, int(code) if str(code).isdigit() else 0))

    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@pytest.fixture(scope="module")
def served_site(built_site: Path) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    log: list[tuple[str, int]] = []
    handler = functools.partial(
        type("Handler", (_RecordingHandler,), {"log": log}), directory=str(built_site / "site")
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", log
    finally:
        server.shutdown()
        server.server_close()


def dump_dom(url: str, profile: Path) -> str:
    proc = subprocess.run(
        [
            str(BROWSER),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_comparison_page_renders_its_table_and_plots(served_site, example_registry, tmp_path):
    base, log = served_site
    dom = dump_dom(f"{base}/generated/comparisons/", tmp_path / "profile")

    verdicts = dom.split('id="formal-verdicts"', 1)[1].split('id="scenario-replays"', 1)[0]
    rows = verdicts.split("<tbody>", 1)[1].split("</tbody>", 1)[0].count("<tr>")
    assert rows == len(comparisons.registered_combos(example_registry))

    plots = re.findall(r'<img [^>]*src="(plots/[^"]+\.svg)"', dom)
    assert len(plots) >= 4  # three scenario replays + the bench plots
    fetched = {path: code for path, code in log}
    for plot in plots:
        assert fetched.get(f"/generated/comparisons/{plot}") == 200, plot

    # offline: every script and stylesheet the page uses is on this server
    external = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', dom)
    assert [u for u in external if not u.startswith(base)] == []
