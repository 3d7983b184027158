"""The built comparison and trace pages in a real headless browser (Debian's chromium).

The site is served from localhost by a thread. The server records every request, so the test
knows that the browser fetched the plots and nothing from anywhere else (the site must work
offline), and it appends a small probe script to every HTML page: after the page has loaded,
the probe measures what a reader would see at 1280 px, a laptop screen (horizontal overflow of
the page and of every table, which images decoded, which admonitions show) and writes it into
the DOM, which ``--dump-dom`` returns. Skipped when no chromium is installed.
"""

from __future__ import annotations

import functools
import html
import io
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from policykit.docsgen import comparisons, results

from .conftest import FIXTURES

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
BROWSER = next((b for b in map(shutil.which, BROWSERS) if b), None)
pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason="no chromium on PATH (Debian: apt-get install chromium); .ci/run installs it",
)
WIDTH = 1280

PROBE = """<script>
window.addEventListener("load", () => {
  const wide = (e) => e.scrollWidth > e.clientWidth + 1;
  const boxes = [...document.querySelectorAll(".md-typeset__scrollwrap, .md-typeset table")];
  const probe = {
    viewport: window.innerWidth,
    page_width: document.documentElement.scrollWidth,
    overflowing: boxes.filter(wide).map((e) => e.textContent.trim().slice(0, 80)),
    images: [...document.images].map((i) => ({
      src: i.getAttribute("src"), ok: i.complete && i.naturalWidth > 0,
    })),
    failures: [...document.querySelectorAll(".admonition.failure > .admonition-title")]
      .map((e) => e.textContent.trim()),
    successes: document.querySelectorAll(".admonition.success").length,
  };
  const out = document.createElement("pre");
  out.id = "pk-probe";
  out.textContent = JSON.stringify(probe);
  document.body.appendChild(out);
});
</script>"""


class _ProbingHandler(SimpleHTTPRequestHandler):
    log: list[tuple[str, int]]

    def send_head(self):
        """HTML pages get the probe appended; everything else is served as is."""
        path = Path(self.translate_path(self.path))
        if path.is_dir():
            path = path / "index.html"
        if path.suffix != ".html" or not path.is_file():
            return super().send_head()
        body = path.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>", 1)
        data = body.encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        return io.BytesIO(data)

    def log_request(self, code="-", size="-") -> None:
        self.log.append((self.path, int(code) if str(code).isdigit() else 0))

    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@pytest.fixture(scope="module")
def served_site(built_site: Path) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    log: list[tuple[str, int]] = []
    handler = functools.partial(
        type("Handler", (_ProbingHandler,), {"log": log}), directory=str(built_site / "site")
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
            "--hide-scrollbars",
            f"--window-size={WIDTH},1000",
            "--virtual-time-budget=15000",
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


def probe(dom: str) -> dict:
    found = re.search(r'<pre id="pk-probe">(.*?)</pre>', dom, re.S)
    assert found, "the probe did not run (the page never finished loading)"
    return json.loads(html.unescape(found.group(1)))


def assert_readable_at_1280_px(seen: dict) -> None:
    assert seen["viewport"] == WIDTH
    assert seen["page_width"] <= WIDTH, "the page scrolls sideways"
    assert seen["overflowing"] == [], "tables that scroll sideways"
    assert seen["images"], "no images"
    assert [i["src"] for i in seen["images"] if not i["ok"]] == [], "images that did not load"


def test_comparison_page_fits_1280_px_with_every_plot_loaded(
    served_site, example_registry, tmp_path
):
    base, log = served_site
    dom = dump_dom(f"{base}/generated/comparisons/", tmp_path / "profile")
    seen = probe(dom)
    assert_readable_at_1280_px(seen)

    verdicts = dom.split('id="formal-verdicts"', 1)[1].split('id="scenario-replays"', 1)[0]
    cells = verdicts.count('<span class="pk-cell">')
    assert cells == len(comparisons.registered_combos(example_registry))

    plots = re.findall(r'<img [^>]*src="(plots/[^"]+\.svg)"', dom)
    assert len(plots) >= 4  # three scenario replays + the bench plots
    fetched = {path: code for path, code in log}
    for plot in plots:
        assert fetched.get(f"/generated/comparisons/{plot}") == 200, plot

    # offline: every script and stylesheet the page uses is on this server
    external = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', dom)
    assert [u for u in external if not u.startswith(base)] == []


def test_every_trace_page_opens_with_its_failure_and_never_shows_success(served_site, tmp_path):
    base, _ = served_site
    check = next(r for r in results.load_results_dir(FIXTURES / "results") if r.kind == "check")
    violated = [v for v in check.verdicts if v.verdict == "violated"]
    assert violated
    for v in violated:
        slug = comparisons.trace_slug(v)
        seen = probe(dump_dom(f"{base}/generated/comparisons/traces/{slug}/", tmp_path / slug))
        assert seen["page_width"] <= WIDTH, slug
        assert seen["overflowing"] == [], f"{slug}: tables that scroll sideways"
        assert seen["failures"], f"{slug}: no failure banner"
        assert seen["failures"][0].startswith(f"Property broken: {v.property}"), slug
        assert seen["successes"] == 0, f"{slug}: a success box on a counterexample page"


def test_load_sweep_chart_shows_each_verdict_in_its_colour(served_site, tmp_path):
    """A screenshot of the trace's load-sweep chart as the browser draws it: every verdict
    the sweep has (completes, starves, out of memory) is there in its colour, and the chart
    is an image the comparison page loaded."""
    from matplotlib.image import imread

    from policykit.docsgen.plots import SWEEP_COLOURS

    base, _ = served_site
    name = "trace-mooncake-conversation-load-sweep.svg"
    seen = probe(dump_dom(f"{base}/generated/comparisons/", tmp_path / "profile"))
    assert [i["ok"] for i in seen["images"] if i["src"].endswith(name)] == [True]
    shot = tmp_path / "sweep.png"
    proc = subprocess.run(
        [
            str(BROWSER),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'shot-profile'}",
            "--window-size=1200,800",
            f"--screenshot={shot}",
            f"{base}/generated/comparisons/plots/{name}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    pixels = (imread(shot)[..., :3] * 255).round().astype(int).reshape(-1, 3)
    sweep = json.loads((FIXTURES / "results" / "sweep-mooncake-conversation.json").read_text())
    verdicts = {p["verdict"] for points in sweep["combos"].values() for p in points}
    for verdict in verdicts:
        hex_colour = SWEEP_COLOURS[verdict][0]
        rgb = [int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]
        hits = (abs(pixels - rgb).sum(axis=1) <= 6).sum()
        assert hits > 500, f"the {verdict!r} cells are not drawn ({hits} pixels)"
