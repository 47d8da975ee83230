"""report.html in a real browser: headless Chromium (Debian's `chromium`, installed by .ci/run) loads the page
from disk with the network off and must find every image decoded and every table laid out, and a real run's page
must fit a 1,400-px window: nothing wider than the window, a wide table scrolling in its own box with its last
column reachable, the summary above the metric table."""

import html
import json
import re
import shutil
import subprocess

import pytest
from report_run import real_run, write_run
from timeouts import HANG_TIMEOUT_S

from headprobe.report.html import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (apt-get install -y chromium; .ci/run does it)")]

# Injected into a copy of the report only: the report itself carries no script.
PROBE = """<script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  const b = document.body;
  b.dataset.images = imgs.length;
  b.dataset.decoded = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  b.dataset.shown = imgs.filter(i => i.getBoundingClientRect().width > 300).length;
  b.dataset.tables = document.querySelectorAll("table").length;
  b.dataset.metricRows = document.querySelectorAll("table.metrics tbody tr").length;
  b.dataset.sections = document.querySelectorAll("section h2").length;
});
</script>"""


def _chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=HANG_TIMEOUT_S, check=True)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return write_report(write_run(tmp_path_factory.mktemp("run") / "r"))


def test_chromium_loads_the_report_with_its_images_and_tables(report, tmp_path):
    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    dom = _chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()).stdout
    body = dict(re.findall(r'data-([a-z-]+)="(\d+)"', re.search(r"<body[^>]*>", dom).group(0)))
    assert body["images"] == body["decoded"] == body["shown"] == "10"
    # 5 measured metrics + 3 protocol values (linear.val_acc, linear.C, mi.infonce.ceiling) in their own table;
    # 11 sections: the summary, the answers to the paper's questions in full (#26), then the nine it had before
    assert int(body["tables"]) >= 10 and body["metric-rows"] == "8" and body["sections"] == "11"
    assert "headprobe report: synthetic" in dom


def test_chromium_screenshot_is_not_blank(report, tmp_path):
    from PIL import Image

    shot = tmp_path / "report.png"
    _chromium(tmp_path, "--window-size=1280,2400", f"--screenshot={shot}", report.as_uri())
    with Image.open(shot) as image:
        assert image.size == (1280, 2400)
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is None or len(colors) > 200  # text, tables and figures, not an empty or error page


# The layout at a window's width, with every <details> opened (a folded table takes no room until it is opened).
LAYOUT = """<script>
window.addEventListener("load", () => {
  document.querySelectorAll("details").forEach(d => { d.open = true; });
  const width = window.innerWidth, out = {width, scrollWidth: document.documentElement.scrollWidth, tables: []};
  for (const table of document.querySelectorAll("table")) {
    const box = table.getBoundingClientRect(), row = table.querySelector("tr");
    const scrolls = table.scrollWidth > table.clientWidth;
    table.scrollLeft = table.scrollWidth;  // scrolled to its end: the last column must come into the window
    const last = row.lastElementChild.getBoundingClientRect(), first = row.firstElementChild.getBoundingClientRect();
    out.tables.push({cls: table.className, left: box.left, right: box.right, scrolls,
                     overflow: getComputedStyle(table).overflowX, lastRight: last.right, lastLeft: last.left,
                     firstLeft: first.left, top: box.top});
  }
  out.summary = document.getElementById("summary").getBoundingClientRect().top;
  out.metrics = document.querySelector("table.metrics").getBoundingClientRect().top;
  const pre = document.createElement("pre");
  pre.id = "layout";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""

# Three heads three layers deep: ten taps, a metric table wider than the page's column.
WIDE_HEADS = [{"name": f"h{k}", "width": 16, "depth": 3, "act": "gelu"} for k in range(3)]


@pytest.fixture(scope="module")
def real_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HEADPROBE_CACHE", str(root / "cache"))
        env.setenv("HF_HUB_OFFLINE", "1")
        env.setenv("HF_DATASETS_OFFLINE", "1")
        run_dir, _ = real_run(root / "run", heads=WIDE_HEADS)
    return write_report(run_dir)


def test_a_real_report_fits_a_1400_px_window_with_the_summary_first(real_report, tmp_path):
    probed = tmp_path / "layout.html"
    probed.write_text(real_report.read_text().replace("</body>", LAYOUT + "</body>"))
    dom = _chromium(tmp_path, "--window-size=1400,1000", "--virtual-time-budget=10000", "--dump-dom",
                    probed.as_uri()).stdout
    layout = json.loads(html.unescape(re.search(r'<pre id="layout">(.*?)</pre>', dom, re.S).group(1)))
    assert layout["width"] == 1400 and layout["scrollWidth"] <= 1400
    metrics = [t for t in layout["tables"] if t["cls"] == "metrics"]
    assert metrics and metrics[0]["scrolls"], "ten taps should not fit the column: the test would not test scrolling"
    for table in layout["tables"]:
        assert 0 <= table["left"] and table["right"] <= 1400, table
        assert table["lastRight"] <= 1400 and table["lastLeft"] >= table["left"], table  # the last column readable
        if table["scrolls"]:
            assert table["overflow"] in ("auto", "scroll"), table
            assert abs(table["firstLeft"] - table["left"]) <= 2, table  # the first column held while scrolled
    assert layout["summary"] < layout["metrics"]
