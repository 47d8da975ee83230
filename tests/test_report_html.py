import base64
import json
from html.parser import HTMLParser

import pytest
from report_run import results_dict, train_records, write_run

from headprobe.cli import main
from headprobe.report.html import fmt, render_report, write_report
from headprobe.report.plots import Plot


class Page(HTMLParser):
    """Tags with their attributes, and the text of every table row (header and data cells)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(" ".join(" ".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def row(self, first: str) -> list[str]:
        """The first row whose first cell starts with the word `first` (a metric's name may carry its n)."""
        return next(r for r in self.rows if r and r[0].split(" ")[0] == first)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run_dir = write_run(tmp_path_factory.mktemp("run") / "r")
    path = write_report(run_dir)
    return path, Page(path.read_text())


def test_report_embeds_every_figure_and_links_nothing_outside(report):
    path, page = report
    images = [attrs for tag, attrs in page.tags if tag == "img"]
    assert len(images) == len(list((path.parent / "plots").glob("*.png"))) == 10
    for attrs in images:
        assert attrs["src"].startswith("data:image/png;base64,") and attrs["alt"]
        assert base64.b64decode(attrs["src"].split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    for tag, attrs in page.tags:
        assert tag not in ("script", "link", "iframe")
        for name in ("src", "href"):
            assert "http" not in attrs.get(name, ""), (tag, attrs)
            assert attrs.get(name, "#").startswith(("#", "data:image/png;base64,")), (tag, attrs)


def test_report_tables_hold_every_metric_at_every_tap_and_the_evidence(report):
    _, page = report
    results = results_dict()
    taps = list(results["taps"])
    assert page.row("metric")[:3] == ["metric", "before the head", "mlp head"]
    for metric in results["taps"]["backbone"]["metrics"]:
        cells = page.row(metric)[1:]
        assert len(cells) == len(taps)
        for cell, tap in zip(cells, taps, strict=True):
            assert cell.split()[0] == fmt(results["taps"][tap]["metrics"][metric])
    assert page.row("linear.acc")[3].split() == ["0.8100", "-0.1400", "✓"]  # mlp output, its drop, the claim's way
    assert page.row("rankme")[1:3] == ["180.00", "120.00 -60.00"]
    assert page.row("evidence") == ["evidence", "backbone", "head", "margin", "claim"]
    assert ["align", "0.4000", "0.4300", "-0.0300", "head more invariant"] in page.rows
    assert page.row("lambda_min")[1] == "-1.2e-07" and page.row("estimator.method")[1] == "lanczos"
    assert page.row("total")[1] == "151.0 s"
    assert page.row("lr")[1] == "0.001"


def test_text_is_escaped():
    results = results_dict()
    results["recipe"]["name"] = "<script>alert('x')</script>"
    results["buffer"]["<b>head</b>"] = results["buffer"].pop("mlp")
    text = render_report(results, [Plot("x", "a <figure> & more", "metrics", error="bad <img src=x>")])
    assert "<script>" not in text and "<b>head</b>" not in text and "<img src=x>" not in text
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in text and "&lt;b&gt;head&lt;/b&gt;" in text
    assert "a &lt;figure&gt; &amp; more" in text


def test_a_metric_or_head_named_like_markup_is_text_everywhere_it_is_shown():
    """Names come from recipes and plug-ins: a head or metric called `<script>...` is shown as text in the summary,
    the metric table and its tooltips, training, the buffer cards and the glossary, never run as markup."""
    bad = "<script>alert('x')</script>"
    results = json.loads(json.dumps(results_dict()).replace('"mlp', '"' + bad + 'mlp'))
    for tap in results["taps"].values():
        tap["metrics"][bad] = 1.0
    records = json.loads(json.dumps(train_records()).replace('"mlp', '"' + bad + 'mlp'))
    text = render_report(results, [], records)
    assert "<script" not in text.lower()
    escaped = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"
    page = Page(text)
    assert page.row(escaped.replace("&lt;", "<").replace("&gt;", ">").replace("&#39;", "'") + "mlp")  # training
    for section in ("metrics", "training", "buffer", "glossary"):
        body = text.split(f"<section id='{section}'>")[1].split("</section>")[0]
        assert escaped in body, section
    assert f"title='{escaped}: not in the glossary" in text  # the tooltip attribute is escaped too


def test_a_broken_section_or_figure_is_noted_and_the_page_still_written():
    results = results_dict()
    results["buffer"] = {"mlp": "not a verdict"}
    text = render_report(results, [Plot("hessian_density", "Hessian density", "geometry",
                                        error="ValueError: grid has 3 points")])
    page = Page(text)
    assert "Buffer verdicts</h2><p class='error'>This section could not be rendered: AttributeError" in text
    assert "Figure “Hessian density” could not be drawn: ValueError: grid has 3 points" in text
    assert "<li>Hessian density: ValueError: grid has 3 points</li>" in text
    assert page.row("linear.acc")[1].startswith("0.9500")  # the other sections are intact


def test_orbit_section_says_which_d_inter_is_the_papers():
    results = results_dict()
    assert "orbit.d_inter" not in render_report(results, [])  # no orbit metrics, no legend
    results["taps"]["backbone"]["metrics"] |= {"rotation360.orbit.d_ratio": 2.0, "rotation360.orbit.d_ratio_image": 3.0}
    text = render_report(results, [])
    assert "&lt;sweep&gt;.orbit.d_inter and .d_ratio are the paper's D_inter and D_inter / D_intra" in text
    assert ".d_inter_image and .d_ratio_image compare the centroids of single images' orbits" in text


def test_a_failed_run_shows_its_error():
    results = results_dict() | {"status": "failed",
                                "error": {"stage": "running probe 'knn' on tap 'mlp'", "message": "OOM"}}
    text = render_report(results, [])
    assert "failed while running probe &#39;knn&#39; on tap &#39;mlp&#39;: OOM" in text
    assert "<span class='badge failed'>failed</span>" in text


def test_report_command_rebuilds_html_and_plots_from_the_run_files(tmp_path, capsys):
    results = results_dict()
    results.update(heads={}, buffer={}, orbits=None)  # two figures only: keeps the test quick
    for tap in results["taps"].values():
        tap["protocol"] = {}
    run_dir = write_run(tmp_path / "r", results, records=[])
    assert main(["report", str(run_dir)]) == 0
    assert "linear.acc" in capsys.readouterr().out
    assert sorted(p.name for p in (run_dir / "plots").iterdir()) == ["metric_bars.png", "tap_heatmap.png"]
    assert Page((run_dir / "report.html").read_text()).row("linear.acc")[1] == "0.9500"
    results["taps"]["backbone"]["metrics"]["linear.acc"] = 0.5
    (run_dir / "results.json").write_text(json.dumps(results))
    (run_dir / "plots" / "tap_heatmap.png").unlink()
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "plots" / "tap_heatmap.png").is_file()
    assert Page((run_dir / "report.html").read_text()).row("linear.acc")[1] == "0.5000"
    (run_dir / "results.json").write_text("{ torn")
    assert main(["report", str(run_dir)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
