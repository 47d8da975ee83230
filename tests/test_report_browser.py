"""report.html in a real browser: headless Chromium (Debian's `chromium`, installed by .ci/run) loads the page
from disk with the network off and must find every image decoded and every table laid out."""

import re
import shutil
import subprocess

import pytest
from report_run import write_run
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
    # 10 sections: the answers to the paper's questions open the report (#26), then the nine it had before
    assert int(body["tables"]) >= 10 and body["metric-rows"] == "8" and body["sections"] == "10"
    assert "headprobe report: synthetic" in dom


def test_chromium_screenshot_is_not_blank(report, tmp_path):
    from PIL import Image

    shot = tmp_path / "report.png"
    _chromium(tmp_path, "--window-size=1280,2400", f"--screenshot={shot}", report.as_uri())
    with Image.open(shot) as image:
        assert image.size == (1280, 2400)
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is None or len(colors) > 200  # text, tables and figures, not an empty or error page
