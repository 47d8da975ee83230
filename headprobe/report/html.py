"""``report.html``: one self-contained page per run (inline CSS, figures embedded as base64, no scripts, no network),
rendered from the Jinja2 templates in ``templates/`` with autoescaping (`markup.render`).

Sections: a short summary (the answer to each question of the paper per head with its change and 95% interval, and
the older buffer verdicts in one line), the answers in full with whether each head trained (`claims`), every metric
at every tap (`metric_table`, folded: the summary comes first), training curves, the buffer verdicts with their
evidence, geometry (the collapse table of claim 4, `collapse`), orbits, a glossary of the run's metrics, backbone and
data with their protocol knobs, the recipe, timings. Built from ``results.json`` + ``metrics.jsonl`` alone, so
``headprobe report RUN_DIR`` can rebuild it at any time; a run still marked "running" (killed) says where it stopped
and shows what it recorded. A section or figure that fails to render is replaced by a note saying why; the page
itself is always written.

>>> write_report("runs/quickstart-20250101-120000")  # doctest: +SKIP
PosixPath('runs/quickstart-20250101-120000/report.html')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from markupsafe import Markup

from headprobe.stats.saddle_grid import GRID_COLUMNS, grid_cells, recorded_grid

from .claims import BADGE, answer_lines, answers_section
from .claims_table import claims_rows, paper_cell
from .collapse import collapse_rows, summarise_collapse
from .glossary import describe_metric
from .markup import flatten, fmt, render
from .metric_table import metrics_section
from .plots import Plot, metric_names, read_records, render_plots, train_history
from .training import stopped_note, training_section
from .verdicts import buffer_section

__all__ = ["Report", "fmt", "render_report", "write_report"]

# Reading order: the short answer first, then the numbers, then how they were obtained.
SECTIONS = (("summary", "Summary"), ("answers", "Answers to the paper's questions"),
            ("metrics", "Metrics at every tap"), ("training", "Training"), ("buffer", "Buffer verdicts"),
            ("geometry", "Geometry"), ("orbits", "Orbits"), ("glossary", "What the metrics mean"),
            ("setup", "Backbone, data and protocol"), ("recipe", "Recipe"), ("timing", "Timings"))


@dataclass(frozen=True)
class Report:
    """What a page is built from: results.json, the drawn figures, the training records per head
    (`plots.train_history`) and the collapse summary of claim 4 (`collapse.summarise_collapse`)."""

    results: dict
    plots: Sequence[Plot] = ()
    history: dict[str, list[dict]] = field(default_factory=dict)
    collapse: dict = field(default_factory=dict)


def _context(results: dict) -> str:
    data, recipe = results.get("data", {}), results.get("recipe", {})
    heads = list(results.get("heads", {})) or [h.get("name", "?") for h in recipe.get("heads") or []]
    objective = (recipe.get("objective") or {}).get("name")
    parts = [f"{fmt(data.get('n_train'))} train / {fmt(data.get('n_test'))} test images, "
             f"{fmt(data.get('n_classes'))} classes", f"pooling {recipe.get('backbone', {}).get('pooling', '?')}"]
    configs = {h.get("name"): h for h in recipe.get("heads") or [] if isinstance(h, dict)}
    nulls = [h for h in heads if (configs.get(h) or {}).get("init_of") is not None]
    heads = [h for h in heads if h not in nulls]
    if heads:
        parts.append(f"{len(heads)} head{'s' if len(heads) > 1 else ''} ({', '.join(heads)})"
                     + (f" trained with {objective}" if objective else ""))
    if nulls:
        parts.append(f"{len(nulls)} null head{'s' if len(nulls) > 1 else ''}, never trained ({', '.join(nulls)})")
    return " · ".join(parts)


def _header(report: Report) -> Markup:
    results = report.results
    error = results.get("error")
    return render("header.html.j2", recipe=results.get("recipe", {}), backbone=results.get("backbone", {}),
                  data=results.get("data", {}), status=results.get("status", "unknown"),
                  version=results.get("headprobe_version", "?"), context=_context(results),
                  error=error if isinstance(error, dict) else None,
                  note=stopped_note(results, report.history), sections=SECTIONS)


def _summary(report: Report) -> Markup:
    results = report.results
    rows = claims_rows({"run": results}) if results.get("claims") else []
    claims = [{"question": r["question"], "head": r["head"], "measure": r["measure"], "cell": paper_cell(r),
               "answer": r.get("answer") or "—", "badge": BADGE.get(r.get("answer"), "")} for r in rows]
    verdicts = [f"{head} → {v.get('verdict')} ({v.get('support', 0)} for, {v.get('against', 0)} against, "
                f"{v.get('unresolved', 0)} unresolved)" for head, v in (results.get("buffer") or {}).items()]
    return render("sections/summary.html.j2", lines=answer_lines(results, report.history), claims=claims,
                  verdicts=verdicts)


def _setup(report: Report) -> Markup:
    results = report.results
    data = dict(results.get("data", {}))
    names = data.pop("class_names", None)
    if names:
        data["classes"] = ", ".join(map(str, names[:30])) + (f", … ({len(names)} classes)" if len(names) > 30 else "")
    protocol = {k: v for k, v in results.get("protocol", {}).items() if isinstance(v, dict)}
    return render("sections/setup.html.j2", backbone=results.get("backbone", {}), data=data, protocol=protocol,
                  probes=_probe_protocol(results.get("taps", {})))


def _probe_protocol(taps: dict) -> dict[str, list[tuple[str, str]]]:
    """Each probe's knobs: one value when every tap used the same, otherwise one per tap."""
    probes: list[str] = []
    for tap in taps.values():
        probes += [p for p in tap.get("protocol", {}) if p not in probes]
    out = {}
    for probe in probes:
        per_tap = {t: flatten(tap.get("protocol", {}).get(probe, {})) for t, tap in taps.items()}
        knobs = list(dict.fromkeys(k for knobs in per_tap.values() for k in knobs))
        rows = []
        for knob in knobs:
            values = {t: p.get(knob) for t, p in per_tap.items() if knob in p}
            same = len({repr(v) for v in values.values()}) == 1
            rows.append((knob, fmt(next(iter(values.values())), plain=True) if same
                         else "; ".join(f"{t}: {fmt(v, plain=True)}" for t, v in values.items())))
        out[probe] = rows
    return out


def _recipe(report: Report) -> Markup:
    import yaml

    text = yaml.safe_dump(report.results.get("recipe", {}), sort_keys=False, allow_unicode=True)
    return render("sections/recipe.html.j2", text=text)


def _glossary(report: Report) -> Markup:
    names = metric_names(report.results.get("taps", {}))
    n_classes = report.results.get("data", {}).get("n_classes")
    return render("sections/glossary.html.j2", names=names, n_classes=n_classes,
                  entries=[(m, describe_metric(m, n_classes)) for m in names])


def _geometry(report: Report) -> Markup:
    heads = {}
    for name, head in report.results.get("heads", {}).items():
        if head.get("geometry"):
            heads[name] = {k: (f"{len(v)} values (plotted)" if isinstance(v, list) and len(v) > 8 else v)
                           for k, v in flatten(head["geometry"]).items()}
    header, rows = collapse_rows(report.collapse)
    grid = [grid_cells(row) for row in recorded_grid(report.results)]
    return render("sections/geometry.html.j2", heads=heads, plots=report.plots, collapse_header=header,
                  collapse=rows, grid_header=list(GRID_COLUMNS), grid=grid)


def _orbits(report: Report) -> Markup:
    measured = any(".orbit.d_" in m for tap in report.results.get("taps", {}).values() for m in tap.get("metrics", {}))
    return render("sections/orbits.html.j2", measured=measured, plots=report.plots)


def _timing(report: Report) -> Markup:
    timing = {k: v for k, v in report.results.get("timing", {}).items() if isinstance(v, (int, float))}
    total = sum(timing.values())
    rows = [(k, f"{v:.1f} s", round(200 * v / total) if total else 0, f"{100 * v / total if total else 0:.0f}%")
            for k, v in timing.items()]
    return render("sections/timing.html.j2", rows=rows, total=f"{total:.1f} s",
                  environment=report.results.get("environment", {}))


BUILDERS: dict[str, Callable[[Report], Markup]] = {
    "summary": _summary,
    "answers": lambda r: answers_section(r.results, r.history),
    "metrics": lambda r: metrics_section(r.results, list(r.plots)),
    "training": lambda r: training_section(r.results, r.plots, r.history),
    "buffer": lambda r: buffer_section(r.results, r.plots, r.history),
    "geometry": _geometry, "orbits": _orbits, "glossary": _glossary, "setup": _setup, "recipe": _recipe,
    "timing": _timing,
}


def render_report(results: dict, plots: Sequence[Plot], records: Sequence[dict] | None = None) -> str:
    """The page for `results` with the already drawn `plots` and the run's metrics.jsonl `records` (training
    curves: whether each head trained, where a killed run stopped; the collapse table); a section that fails shows
    its error instead."""
    records = list(records or [])
    report = Report(results, tuple(plots), train_history(records), summarise_collapse(results, records))
    sections = []
    for key, title in SECTIONS:
        try:
            sections.append({"key": key, "title": title, "content": BUILDERS[key](report), "error": None})
        except Exception as err:  # a malformed field costs one section, never the page
            sections.append({"key": key, "title": title, "content": "", "error": f"{type(err).__name__}: {err}"})
    try:
        header, header_error = _header(report), None
    except Exception as err:
        header, header_error = "", str(err)
    name = results.get("recipe", {}).get("name", "run") if isinstance(results.get("recipe"), dict) else "run"
    return render("report.html.j2", title=f"headprobe report: {name}", header=header, header_error=header_error,
                  sections=sections, failed=[p for p in plots if p.error])


def write_report(run_dir: str | Path) -> Path:
    """Regenerate run_dir/plots/*.png and run_dir/report.html from results.json + metrics.jsonl.

    Figures and sections that fail are noted in the page; only a missing/unreadable results.json or an
    unwritable directory raises (FileNotFoundError, ValueError, OSError).
    """
    from headprobe.record.directory import atomic_write_text, read_results

    run_dir = Path(run_dir)
    results, records = read_results(run_dir), read_records(run_dir)
    plots = render_plots(results, records, run_dir / "plots")
    path = run_dir / "report.html"
    atomic_write_text(path, render_report(results, plots, records))
    return path
