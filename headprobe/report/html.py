"""``report.html``: one self-contained page per run (inline CSS, figures embedded as base64, no scripts, no network).

Sections: the answer to each question of the paper per head with whether each head trained (`claims`), every
metric at every tap (protocol values such as `linear.C` in a table of their own, the per-parameter `aug_r2.*` folded
under `aug_r2.mean`; each name's meaning as a tooltip; deltas green/red by the buffer claim's predicted direction),
training curves, the older one-vote buffer verdicts with their evidence, geometry, orbits, a glossary of the run's
metrics, backbone and data with their protocol knobs, the recipe, timings. Built from ``results.json`` +
``metrics.jsonl`` alone, so ``headprobe report RUN_DIR`` can rebuild it at any time; a run still marked "running"
(killed) says where it stopped and shows what it recorded. A section or figure that fails to render is replaced by a
note saying why; the page itself is always written.

>>> write_report("runs/quickstart-20250101-120000")  # doctest: +SKIP
PosixPath('runs/quickstart-20250101-120000/report.html')
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .claims import answer_lines, answers_section
from .glossary import describe_metric, glossary_table, is_protocol_value, tooltip
from .markup import esc, figure, flatten, fmt, kv_table, page
from .plots import Plot, metric_names, read_records, render_plots, train_history
from .table import half_width
from .training import stopped_note, training_section
from .verdicts import buffer_section

__all__ = ["fmt", "render_report", "write_report"]

# Reading order: the numbers first, then how they were obtained.
SECTIONS = (("answers", "Answers to the paper's questions"), ("metrics", "Metrics at every tap"),
            ("training", "Training"), ("buffer", "Buffer verdicts"),
            ("geometry", "Geometry"), ("orbits", "Orbits"), ("glossary", "What the metrics mean"),
            ("setup", "Backbone, data and protocol"),
            ("recipe", "Recipe"), ("timing", "Timings"))


def _header(results: dict) -> str:
    recipe, bb, data = results.get("recipe", {}), results.get("backbone", {}), results.get("data", {})
    status = results.get("status", "unknown")
    answers = "".join(f"<li>{esc(line)}</li>" for line in answer_lines(results))
    error = results.get("error")
    nav = "".join(f"<a href='#{key}'>{esc(title)}</a>" for key, title in SECTIONS)
    return (f"<h1>headprobe report: {esc(recipe.get('name', 'run'))}</h1>"
            f"<p class='sub'>{esc(bb.get('id', '?'))} ({esc(bb.get('dim', '?'))}-d) on {esc(data.get('source', '?'))}"
            f" · status <span class='badge {esc(status)}'>{esc(status)}</span>"
            f" · headprobe {esc(results.get('headprobe_version', '?'))}</p>"
            + f"<p class='sub'>{esc(_context(results))}</p>"
            + (f"<ul class='answers'>{answers}</ul>" if answers else "")
            + (f"<p class='error'>failed while {esc(error.get('stage', '?'))}: {esc(error.get('message', ''))}</p>"
               if isinstance(error, dict) else "")
            + (f"<p class='note'>{esc(note)}</p>" if (note := stopped_note(results, results.get("history", {})))
               else "")
            + f"<nav>{nav}</nav>")


def _context(results: dict) -> str:
    data, recipe = results.get("data", {}), results.get("recipe", {})
    heads = list(results.get("heads", {})) or [h.get("name", "?") for h in recipe.get("heads") or []]
    objective = (recipe.get("objective") or {}).get("name")
    parts = [f"{fmt(data.get('n_train'))} train / {fmt(data.get('n_test'))} test images, "
             f"{fmt(data.get('n_classes'))} classes", f"pooling {recipe.get('backbone', {}).get('pooling', '?')}"]
    if heads:
        parts.append(f"{len(heads)} head{'s' if len(heads) > 1 else ''} ({', '.join(heads)})"
                     + (f" trained with {objective}" if objective else ""))
    return " · ".join(parts)


def _recipe(results: dict, plots: list[Plot]) -> str:
    import yaml

    text = yaml.safe_dump(results.get("recipe", {}), sort_keys=False, allow_unicode=True)
    return f"<p class='legend'>The resolved recipe (defaults and --set overrides applied).</p><pre>{esc(text)}</pre>"


def _setup(results: dict, plots: list[Plot]) -> str:
    data = dict(results.get("data", {}))
    names = data.pop("class_names", None)
    if names:
        data["classes"] = ", ".join(map(str, names[:30])) + (f", … ({len(names)} classes)" if len(names) > 30 else "")
    parts = [f"<div class='grid'><div>{kv_table(results.get('backbone', {}), 'Backbone')}</div>"
             f"<div>{kv_table(data, 'Data')}</div></div>"]
    protocol = results.get("protocol", {})
    if protocol:
        parts.append("<div class='grid'>" + "".join(f"<div>{kv_table(v, f'Protocol: {k}')}</div>"
                                                    for k, v in protocol.items() if isinstance(v, dict)) + "</div>")
    parts.append(_probe_protocol(results.get("taps", {})))
    return "".join(parts)


def _probe_protocol(taps: dict) -> str:
    """Each probe's knobs: one value when every tap used the same, otherwise one per tap."""
    probes: list[str] = []
    for tap in taps.values():
        probes += [p for p in tap.get("protocol", {}) if p not in probes]
    out = []
    for probe in probes:
        per_tap = {t: flatten(tap.get("protocol", {}).get(probe, {})) for t, tap in taps.items()}
        knobs = list(dict.fromkeys(k for knobs in per_tap.values() for k in knobs))
        rows = []
        for knob in knobs:
            values = {t: p.get(knob) for t, p in per_tap.items() if knob in p}
            same = len({repr(v) for v in values.values()}) == 1
            shown = (fmt(next(iter(values.values())), plain=True) if same
                     else "; ".join(f"{t}: {fmt(v, plain=True)}" for t, v in values.items()))
            rows.append(f"<tr><th>{esc(knob)}</th><td>{esc(shown)}</td></tr>")
        out.append(f"<h3>Probe protocol: {esc(probe)}</h3><table class='kv'>{''.join(rows)}</table>")
    return "".join(out)


def _metric_label(metric: str, results: dict) -> str:
    """The metric's name with its glossary tooltip, and for accuracies how many test units they are over."""
    data = results.get("data", {})
    n_classes = data.get("n_classes")
    label = f"<span title='{esc(tooltip(metric, n_classes))}'>{esc(metric)}</span>"
    if metric.endswith(".acc"):
        record = (results.get("taps", {}).get("backbone", {}).get("uncertainty") or {}).get(metric) or {}
        n, unit = record.get("n_units") or data.get("n_test"), record.get("unit") or "test images"
        if n is not None:
            label += f"<span class='delta'>n = {esc(fmt(n))} {esc(unit)}</span>"
    return label


def _cell(metric: str, value, tap: dict, kind: str, base) -> str:
    half = half_width(tap, metric)
    ci = f"<span class='ci'> ±{esc(fmt(float(half)))}</span>" if half is not None else ""
    flag = ""
    if metric == "mi.infonce" and isinstance(value, (int, float)) and value <= 0:
        flag = ("<span class='delta' title='InfoNCE ≤ 0: the critic does no better than chance at this tap; not "
                "evidence'>critic uninformative</span>")
    delta = _delta(metric, value, base) if kind != "bb" else ""
    return f"<td class='num {kind}'>{esc(fmt(value))}{ci}{delta}{flag}</td>"


def _metrics(results: dict, plots: list[Plot]) -> str:
    taps = results.get("taps", {})
    if not taps:
        return "<p class='note'>No tap was probed in this run.</p>"
    groups: dict[str, list[str]] = {}
    for name, tap in taps.items():
        groups.setdefault(tap.get("head") or "backbone", []).append(name)
    top = "".join(f"<th colspan='{len(names)}' class='{'bb' if g == 'backbone' else ''}'>"
                  f"{esc('before the head' if g == 'backbone' else 'head ' + g)}</th>" for g, names in groups.items())
    kinds = {t: _tap_kind(t, tap) for t, tap in taps.items()}
    order = [t for names in groups.values() for t in names]
    sub = "".join(f"<th class='{kinds[t]}'>{esc(t)}<span class='delta'>{esc(_tap_label(t, taps[t]))}</span></th>"
                  for t in order)
    base = taps.get("backbone", {}).get("metrics", {})
    names = metric_names(taps)

    def row(m: str) -> str:
        return (f"<tr><th>{_metric_label(m, results)}</th>"
                + "".join(_cell(m, taps[t].get("metrics", {}).get(m), taps[t], kinds[t], base.get(m)) for t in order)
                + "</tr>")

    # The per-parameter augmentation R² rows (13 for simclr) fold under their mean.
    per_parameter = [m for m in names if m.startswith("aug_r2.") and m != "aug_r2.mean" and not is_protocol_value(m)]
    rows = [row(m) for m in names if not is_protocol_value(m) and m not in per_parameter]
    legend = ("<p class='legend'>Grey column: backbone features (before the head). Blue columns: head outputs "
              "(after). Other columns: hidden layers (inside). Small numbers: difference from the backbone, green "
              "where it goes the way the buffer claim predicts for that metric, red where against it, uncoloured "
              "where the claim predicts nothing (a description). ±: the larger half of the 95% interval (paired "
              "bootstrap over test images or views; see the uncertainty records). Hover a metric's name for its "
              "meaning, or see “What the metrics mean”.</p>")
    body = (f"<table class='metrics'><thead><tr><th rowspan='2'>metric</th>{top}</tr><tr>{sub}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")
    if per_parameter:
        body += (f"<details><summary>aug_r2 per augmentation parameter ({len(per_parameter)}; their mean is "
                 f"aug_r2.mean above)</summary><table class='metrics'><thead><tr><th>metric</th>{sub}</tr></thead>"
                 f"<tbody>{''.join(row(m) for m in per_parameter)}</tbody></table></details>")
    knobs = [m for m in names if is_protocol_value(m)]
    protocol = ""
    if knobs:
        cells = "".join(f"<tr><th>{_metric_label(m, results)}</th>"
                        + "".join(f"<td class='num {kinds[t]}'>{esc(fmt(taps[t].get('metrics', {}).get(m)))}</td>"
                                  for t in order) + "</tr>" for m in knobs)
        protocol = ("<h3>Protocol values</h3><p class='legend'>Chosen on validation data or fixed by the protocol "
                    "(not measurements of the tap), per tap.</p><table class='metrics protocol'><thead><tr>"
                    f"<th>value</th>{sub}</tr></thead><tbody>{cells}</tbody></table>")
    return legend + body + protocol + "".join(figure(p) for p in plots if p.section == "metrics")


def _tap_kind(name: str, tap: dict) -> str:
    if tap.get("head") is None:
        return "bb"
    return "out" if name == tap["head"] else "hidden"


def _tap_label(name: str, tap: dict) -> str:
    if tap.get("head") is None:
        return "backbone"
    return "output" if name == tap["head"] else f"layer {tap.get('depth', '?')}"


def _delta(metric: str, value, base) -> str:
    """The difference from the backbone, green/red by the direction the buffer claim predicts for `metric`
    (`headprobe.stats.verdict.predicted_change`), uncoloured where it predicts nothing."""
    if not isinstance(value, (int, float)) or not isinstance(base, (int, float)) or isinstance(value, bool):
        return ""
    diff = value - base
    if diff == 0:
        return "<span class='delta'>±0</span>"
    from headprobe.stats.verdict import predicted_change

    sign = predicted_change(metric)
    if metric == "mi.infonce" and min(value, base) <= 0:
        sign = None  # a bound ≤ 0 at either tap: the critic is uninformative, the change is not evidence
    cls = "" if sign is None else " up" if sign * diff > 0 else " down"
    return f"<span class='delta{cls}'>{'+' if diff > 0 else ''}{esc(fmt(float(diff)))}</span>"


def _answers(results: dict, plots: list[Plot]) -> str:
    return answers_section(results, results.get("history", {}))


def _buffer(results: dict, plots: list[Plot]) -> str:
    return ("<p class='legend'>The older verdict: one vote over every metric that the claim predicts a direction for "
            "(class, augmentation and invariance together), kept for comparison with earlier runs. The answers at the "
            "top of the page replace it.</p>" + buffer_section(results, plots, results.get("history", {})))


def _training(results: dict, plots: list[Plot]) -> str:
    return training_section(results, plots, results.get("history", {}))


def _glossary(results: dict, plots: list[Plot]) -> str:
    names = metric_names(results.get("taps", {}))
    if not names:
        return "<p class='note'>No metric was recorded in this run.</p>"
    n_classes = results.get("data", {}).get("n_classes")
    unknown = sum(describe_metric(m) is None for m in names)
    return ("<p class='legend'>Each metric of this run: what it measures, its unit, what a higher value says, and "
            f"its chance level (class accuracies: 1/n_classes = 1/{esc(fmt(n_classes))}; rotation: 0.25)."
            + (f" {unknown} name(s) are not in the glossary." if unknown else "") + "</p>"
            + glossary_table(names, n_classes))


def _geometry(results: dict, plots: list[Plot]) -> str:
    parts = []
    for name, head in results.get("heads", {}).items():
        geometry = head.get("geometry")
        if geometry:
            shown = {k: (f"{len(v)} values (plotted)" if isinstance(v, list) and len(v) > 8 else v)
                     for k, v in flatten(geometry).items()}
            parts.append(kv_table(shown, f"Head {name}"))
    figures = [p for p in plots if p.section == "geometry"]
    if not parts and not figures:
        return "<p class='note'>No geometry was recorded in this run.</p>"
    return results.get("collapse_table", "") + "<div class='grid'>" + "".join(f"<div>{p}</div>" for p in parts) + (
        "</div>") + "".join(
        figure(p) for p in figures)


ORBIT_LEGEND = ("<p class='legend'>&lt;sweep&gt;.orbit.d_inter and .d_ratio are the paper's D_inter and "
                "D_inter / D_intra: the mean distance between class centroids (over D_intra, the mean distance "
                "within one image's orbit). .d_inter_image and .d_ratio_image compare the centroids of single "
                "images' orbits instead, which is not the paper's measure.</p>")


def _orbits(results: dict, plots: list[Plot]) -> str:
    figures = [p for p in plots if p.section == "orbits"]
    measured = any(".orbit.d_" in m for tap in results.get("taps", {}).values() for m in tap.get("metrics", {}))
    if not figures and not measured:
        return "<p class='note'>No orbits were recorded in this run.</p>"
    return (ORBIT_LEGEND if measured else "") + "".join(figure(p) for p in figures)


def _timing(results: dict, plots: list[Plot]) -> str:
    timing = {k: v for k, v in results.get("timing", {}).items() if isinstance(v, (int, float))}
    total = sum(timing.values())
    rows = "".join(
        f"<tr><th>{esc(k)}</th><td class='num'>{v:.1f} s</td>"
        f"<td><span class='bar' style='width:{200 * v / total if total else 0:.0f}px'></span>"
        f"{100 * v / total if total else 0:.0f}%</td></tr>" for k, v in timing.items())
    return (f"<table><thead><tr><th>stage</th><th>time</th><th>share</th></tr></thead><tbody>{rows}"
            f"<tr><th>total</th><td class='num'>{total:.1f} s</td><td></td></tr></tbody></table>"
            + kv_table(results.get("environment", {}), "Environment"))


BUILDERS: dict[str, Callable[[dict, list[Plot]], str]] = {
    "answers": _answers, "recipe": _recipe, "setup": _setup, "metrics": _metrics, "buffer": _buffer,
    "training": _training,
    "geometry": _geometry, "orbits": _orbits, "glossary": _glossary, "timing": _timing,
}


def render_report(results: dict, plots: list[Plot], records: list[dict] | None = None) -> str:
    """The page for `results` with the already drawn `plots` and the run's metrics.jsonl `records` (training
    curves: whether each head trained, where a killed run stopped); a section that fails shows its error instead."""
    if records is not None:
        results = {**results, "history": train_history(records)}
    body = []
    for key, title in SECTIONS:
        try:
            content = BUILDERS[key](results, plots)
        except Exception as err:  # a malformed field costs one section, never the page
            content = f"<p class='error'>This section could not be rendered: {esc(type(err).__name__)}: {esc(err)}</p>"
        body.append(f"<section id='{key}'><h2>{esc(title)}</h2>{content}</section>")
    failed = [p for p in plots if p.error]
    if failed:
        items = "".join(f"<li>{esc(p.title)}: {esc(p.error)}</li>" for p in failed)
        body.append(f"<section id='notes'><h2>Notes</h2><p>Figures that could not be drawn:</p><ul>{items}</ul>"
                    "</section>")
    try:
        header = _header(results)
    except Exception as err:
        header = f"<h1>headprobe report</h1><p class='error'>The header could not be rendered: {esc(err)}</p>"
    name = results.get("recipe", {}).get("name", "run") if isinstance(results.get("recipe"), dict) else "run"
    return page(f"headprobe report: {name}", header, "".join(body))


def write_report(run_dir: str | Path) -> Path:
    """Regenerate run_dir/plots/*.png and run_dir/report.html from results.json + metrics.jsonl.

    Figures and sections that fail are noted in the page; only a missing/unreadable results.json or an
    unwritable directory raises (FileNotFoundError, ValueError, OSError).
    """
    from headprobe.record.directory import atomic_write_text, read_results

    from .collapse import collapse_section

    run_dir = Path(run_dir)
    results, records = read_results(run_dir), read_records(run_dir)
    plots = render_plots(results, records, run_dir / "plots")
    results["collapse_table"] = collapse_section(results, records)  # claim 4's table, atop the Geometry section
    path = run_dir / "report.html"
    atomic_write_text(path, render_report(results, plots, records))
    return path
