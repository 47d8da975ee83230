"""Figures of one run, one per question, drawn from ``results.json`` + ``metrics.jsonl`` alone.

Every figure function takes plain data and a path, draws with matplotlib's Agg canvas (no pyplot, no
global state, no display) and returns the path. `render_plots` draws every figure the run has data
for, each on its own, so one failing figure is recorded as an error and the others are still drawn;
`write_plots(run_dir)` is the same for a run directory.

>>> paths = write_plots("runs/quickstart-20250101-120000")  # doctest: +SKIP
>>> [p.name for p in paths]  # doctest: +SKIP
['tap_heatmap.png', 'metric_bars.png', 'training_curves.png', ...]
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from headprobe.probes.declaration import metric_declaration

from .canvas import BACKBONE_COLOR, head_colors, log_if_wide, new_figure, save, series
from .geometry_plots import plot_hessian_density, plot_lambda_over_training, plot_orbit_pca, plot_spectra
from .glossary import is_protocol_value, metric_unit
from .heatmap import plot_tap_heatmap


@dataclass
class Plot:
    """One figure of the report: where it was written, or why it could not be drawn."""

    name: str
    title: str
    section: str
    path: Path | None = None
    error: str | None = None


def read_records(run_dir: str | Path) -> list[dict]:
    """The records of ``metrics.jsonl``; a torn last line (a run killed mid-write) and lines that are not UTF-8 JSON
    (garbage from a failing disk) are skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def train_history(records: Sequence[dict], stage: str = "train") -> dict[str, list[dict]]:
    """head → its records of `stage` sorted by step: "train" (loss, collapse statistics, optimisation) or
    "geometry" (the curvature snapshots tracking writes every `geometry.track_every` steps: λ_min, λ_max, ...);
    a step logged twice (a resumed run) keeps the last record."""
    by_head: dict[str, dict[int, dict]] = {}
    for record in records:
        if record.get("stage") == stage and "head" in record and "step" in record:
            by_head.setdefault(record["head"], {})[record["step"]] = record
    return {head: [steps[s] for s in sorted(steps)] for head, steps in by_head.items()}


def metric_names(taps: Mapping[str, dict], plotted_only: bool = False) -> list[str]:
    names: list[str] = []
    for tap in taps.values():
        names += [m for m in tap.get("metrics", {}) if m not in names and not (plotted_only and is_protocol_value(m))]
    return names


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _tap_order(results: dict) -> tuple[list[str], dict[str, str | None]]:
    taps = results.get("taps", {})
    return list(taps), {name: tap.get("head") for name, tap in taps.items()}


def _heads_of(results: dict) -> list[str]:
    heads = list(results.get("heads", {}))
    for tap in results.get("taps", {}).values():
        if tap.get("head") and tap["head"] not in heads:
            heads.append(tap["head"])
    return heads


MAX_PANELS = 12


def headline_place(metric: str) -> float | None:
    """Where `metric` goes in the headline plot (lower first), as its probe declares (`Metric.headline`: the
    questions a reader asks first); None for a metric that is not a headline one. The heat-map and the HTML table
    hold every metric."""
    found = metric_declaration(metric)
    return found[0].headline if found is not None and found[0].is_headline(metric) else None


def headline_metrics(metrics: list[str]) -> list[str]:
    """At most MAX_PANELS metrics: the headline ones present, by their declared place (ties in the run's order),
    then the others in order (one panel each is slow)."""
    places = {m: place for m in metrics if (place := headline_place(m)) is not None}
    chosen = sorted(places, key=lambda m: places[m])
    chosen += [m for m in metrics if m not in places]
    return chosen[:MAX_PANELS]


def plot_metric_bars(results: dict, path: Path) -> Path:
    """One panel per headline metric: the backbone bar (dashed reference line) next to every head tap."""
    taps = results["taps"]
    names, owner = _tap_order(results)
    metrics = headline_metrics(metric_names(taps, plotted_only=True))
    if not metrics:
        raise ValueError("no metrics to plot")
    colors = head_colors(_heads_of(results))
    cols = min(3, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    fig = new_figure(4.2 * cols, 2.9 * rows + 0.4)
    for k, metric in enumerate(metrics):
        ax = fig.add_subplot(rows, cols, k + 1)
        vals = [_number(taps[t]["metrics"].get(metric)) for t in names]
        bar_colors = [colors.get(owner[t], BACKBONE_COLOR) if owner[t] else BACKBONE_COLOR for t in names]
        bars = ax.bar(range(len(names)), np.nan_to_num(vals), color=bar_colors)
        for bar, tap in zip(bars, names, strict=True):
            if owner[tap] and tap != owner[tap]:
                bar.set_alpha(0.5)
                bar.set_hatch("//")
        _interval_marks(ax, taps, names, metric)
        base = taps.get("backbone", {}).get("metrics", {}).get(metric)
        if isinstance(base, (int, float)):
            ax.axhline(base, color=BACKBONE_COLOR, linestyle="--", linewidth=1)
        finite = [v for v in vals if math.isfinite(v)]
        if finite and min(finite) > 0 and max(finite) / min(finite) > 1e3:
            ax.set_yscale("log")
        ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
        ax.set_title(metric, fontsize=10)
        ax.set_ylabel(metric_unit(metric), fontsize=8)
    fig.suptitle("Backbone (grey, dashed line) vs each head; hatched bars are hidden layers; "
                 "whiskers: 95% interval, dots: seeds")
    return save(fig, path)


def _interval_marks(ax, taps: Mapping[str, dict], names: list[str], metric: str) -> None:
    """Whiskers at each bar's 95% interval (results.json "uncertainty") and one dot per seed where there are
    several: one errorbar and one scatter call per panel (one per bar cost the report a second)."""
    xs, ys, below, above, seed_x, seed_y = [], [], [], [], [], []
    for j, tap in enumerate(names):
        record = (taps[tap].get("uncertainty") or {}).get(metric) or {}
        ci, value = record.get("ci95"), _number(taps[tap]["metrics"].get(metric))
        if isinstance(ci, list) and len(ci) == 2 and None not in ci and math.isfinite(value):
            xs.append(j)
            ys.append(value)
            below.append(max(value - ci[0], 0.0))
            above.append(max(ci[1] - value, 0.0))
        seeds = [_number(v) for v in record.get("per_seed") or []]
        if len(seeds) > 1:
            seed_x += [j] * len(seeds)
            seed_y += seeds
    if xs:
        ax.errorbar(xs, ys, yerr=[below, above], color="black", capsize=3, linewidth=1, linestyle="none")
    if seed_x:
        ax.scatter(seed_x, seed_y, s=9, color="black", zorder=3)


def plot_training_curves(history: Mapping[str, Sequence[dict]], out_dims: Mapping[str, int], path: Path,
                         colors: Mapping[str, str] | None = None) -> Path:
    """Loss, output spread (with its 1/√d no-collapse level) and RankMe against the training step, per head."""
    if not history:
        raise ValueError("no training records")
    colors = colors or head_colors(list(history))
    fig = new_figure(13, 3.8)
    panels = [("loss", "training loss", "objective value"),
              ("out_std", "spread of L2-normalised outputs", "mean per-dim std"),
              ("rankme", "RankMe of the head output (batch)", "effective rank (dims)")]
    for k, (key, title, ylabel) in enumerate(panels):
        ax = fig.add_subplot(1, 3, k + 1)
        for head, recs in history.items():
            steps, vals = series(recs, key)
            if steps:
                ax.plot(steps, vals, color=colors[head], label=head, linewidth=1.4)
        if key == "out_std":
            for d in sorted({out_dims[h] for h in history if out_dims.get(h)}):
                ax.axhline(1 / math.sqrt(d), color="black", linestyle=":", linewidth=1, label=f"1/√d, d={d}")
        if key == "loss":
            log_if_wide(ax, [v for recs in history.values() for v in series(recs, key)[1]])
        if key == "out_std":
            refs = [1 / math.sqrt(out_dims[h]) for h in history if out_dims.get(h)]
            ax.set_ylim(0, max([ax.get_ylim()[1], *(1.15 * r for r in refs)]))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    fig.suptitle("Training and collapse (out_std → 0 or RankMe → 1 means collapse)")
    return save(fig, path)


def plot_series_panels(history: Mapping[str, Sequence[dict]], keys: Sequence[str], title: str, path: Path,
                       labels: Mapping[str, str] | None = None, colors: Mapping[str, str] | None = None) -> Path:
    """One panel per record key (e.g. the objective's terms, grad_norm, lr) against the step, per head."""
    keys = [k for k in keys if any(series(recs, k)[0] for recs in history.values())]
    if not keys:
        raise ValueError(f"no training records hold {', '.join(keys) or 'these keys'}")
    colors = colors or head_colors(list(history))
    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig = new_figure(4.4 * cols, 3.2 * rows + 0.4)
    for k, key in enumerate(keys):
        ax = fig.add_subplot(rows, cols, k + 1)
        for head, recs in history.items():
            steps, vals = series(recs, key)
            if steps:
                ax.plot(steps, vals, color=colors[head], label=head, linewidth=1.3)
        log_if_wide(ax, [v for recs in history.values() for v in series(recs, key)[1]])
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel((labels or {}).get(key, "value"), fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return save(fig, path)


def head_out_dims(results: dict) -> dict[str, int]:
    """Output width of each trained head, from its recorded config (the rule `ProjectionHead` applies)."""
    dims = {}
    for name, head in results.get("heads", {}).items():
        config = head.get("config", {})
        if config.get("type") == "identity":
            dims[name] = results.get("backbone", {}).get("dim")
        else:
            dims[name] = config.get("out_dim") or config.get("width")
    return {k: v for k, v in dims.items() if isinstance(v, int) and v > 0}


def _term_keys(history: Mapping[str, Sequence[dict]], objective: str | None) -> list[str]:
    keys: list[str] = []
    for recs in history.values():
        for record in recs:
            keys += [k for k in record if k not in keys and objective and k.startswith(f"{objective}.")]
    return keys


def _geometry(results: dict, key: str) -> dict:
    return {head: h["geometry"][key] for head, h in results.get("heads", {}).items()
            if isinstance(h.get("geometry"), dict) and h["geometry"].get(key) is not None}


def _tap_spectra(results: dict) -> dict[str, list[float]]:
    spectra = {}
    for name, tap in results.get("taps", {}).items():
        values = tap.get("protocol", {}).get("spectrum", {}).get("eigenvalues_top")
        if values:
            spectra[name] = values
    return spectra


def plan_plots(results: dict, records: Sequence[dict]) -> list[tuple[Plot, Callable[[Path], Path]]]:
    """Every figure the data supports, as (Plot, draw(path)); figures without data are left out."""
    history, tracked = train_history(records), train_history(records, "geometry")
    objective = results.get("protocol", {}).get("train", {}).get("objective") or results.get("recipe", {}).get(
        "objective", {}).get("name")
    plan: list[tuple[Plot, Callable[[Path], Path]]] = []
    colors = head_colors(list(dict.fromkeys(_heads_of(results) + list(history) + list(tracked))))

    def add(name, title, section, draw):
        plan.append((Plot(name, title, section), draw))

    if metric_names(results.get("taps", {}), plotted_only=True):
        add("tap_heatmap", "Every metric at every tap", "metrics", lambda p: plot_tap_heatmap(results, p))
        add("metric_bars", "Backbone vs each head tap, per metric", "metrics", lambda p: plot_metric_bars(results, p))
    if history:
        add("training_curves", "Loss and collapse curves", "training",
            lambda p: plot_training_curves(history, head_out_dims(results), p, colors))
        terms = _term_keys(history, objective)
        if terms:
            add("objective_terms", f"Terms of the {objective} objective", "training",
                lambda p: plot_series_panels(history, terms, f"Terms of the {objective} objective", p,
                                             colors=colors))
        add("optimisation", "Optimisation: gradient norm, learning rate, relative update", "training",
            lambda p: plot_series_panels(history, ["grad_norm", "lr", "rel_update"], "Optimisation", p,
                                         {"grad_norm": "‖∇‖ (L2)", "lr": "learning rate",
                                          "rel_update": "lr·‖∇‖ / ‖w‖"}, colors))
    if any("lambda_min" in r or "lambda_max" in r for recs in tracked.values() for r in recs):
        add("lambda_over_training", "λ_min and λ_max over training", "geometry",
            lambda p: plot_lambda_over_training(tracked, p, colors))
    densities = _geometry(results, "hessian_density")
    if densities:
        add("hessian_density", "Hessian eigenvalue density", "geometry",
            lambda p: plot_hessian_density(densities, p, colors))
    pullback = _geometry(results, "pullback_spectrum")
    if pullback:
        add("pullback_spectrum", "Pull-back metric spectrum", "geometry",
            lambda p: plot_spectra(pullback, "Pull-back metric spectrum per head", "eigenvalue of JᵀJ", p,
                                           colors))
    spectra = _tap_spectra(results)
    if spectra:
        _, owner = _tap_order(results)
        tap_colors = {t: colors.get(owner.get(t), BACKBONE_COLOR) for t in spectra}
        add("feature_spectra", "Feature covariance spectrum at each tap", "geometry",
            lambda p: plot_spectra(spectra, "Covariance spectrum of the features at each tap",
                                   "eigenvalue (variance)", p, tap_colors))
    for sweep, taps in orbit_sets(results.get("orbits")).items():
        title = f"Orbits of the {sweep} sweep" if sweep else "Augmentation orbits"
        name = "orbit_pca_" + re.sub(r"[^A-Za-z0-9_.-]", "_", sweep) if sweep else "orbit_pca"
        add(name, f"{title}, 2-D PCA per tap", "orbits",
            lambda p, taps=taps, title=title: plot_orbit_pca(taps, p, title))
    return plan


def orbit_sets(orbits) -> dict[str, dict]:
    """results["orbits"] as sweep → {tap: entry}: either {tap: entry} (one set, sweep "") or {sweep: {tap: entry}}.

    An entry is trajectories (M, T, D) as a nested list, or {"points": (N, D), "orbit": (N,)}."""
    if not isinstance(orbits, Mapping) or not orbits:
        return {}
    nested = all(isinstance(v, Mapping) and "points" not in v for v in orbits.values())
    sets = {str(sweep): dict(taps) for sweep, taps in orbits.items()} if nested else {"": dict(orbits)}
    return {sweep: taps for sweep, taps in sets.items() if taps}


def render_plots(results: dict, records: Sequence[dict], out_dir: str | Path) -> list[Plot]:
    """Draw every planned figure into out_dir/<name>.png; a figure that fails keeps its error, the rest go on."""
    out_dir = Path(out_dir)
    try:
        plan = plan_plots(results, records)
    except Exception as err:  # malformed results: the page still comes, saying why it has no figures
        return [Plot("figures", "all figures", "metrics", error=f"{type(err).__name__}: {err}")]
    done = []
    for plot, draw in plan:
        path = out_dir / f"{plot.name}.png"
        try:
            plot.path = draw(path)
        except Exception as err:  # one broken figure must not cost the report its other figures
            plot.error = f"{type(err).__name__}: {err}"
            path.unlink(missing_ok=True)  # never leave an earlier run's figure under this name
        done.append(plot)
    return done


def write_plots(run_dir: str | Path) -> list[Path]:
    """Regenerate run_dir/plots/*.png from results.json + metrics.jsonl; returns the files written."""
    from headprobe.record.directory import read_results

    run_dir = Path(run_dir)
    plots = render_plots(read_results(run_dir), read_records(run_dir), run_dir / "plots")
    return [p.path for p in plots if p.path is not None]
