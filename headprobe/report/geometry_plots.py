"""Geometry and orbit figures: curvature over training, Hessian density, spectra, orbit PCA.

Each takes plain arrays (lists or numpy) and a path, and raises a ValueError with a sentence when the
data it needs is absent or malformed, so the report can say why a figure is missing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .canvas import BACKBONE_COLOR, head_colors, new_figure, save, series


def convergence_flags(records: Sequence[dict], key: str) -> list[bool | None]:
    """For each record holding a number for `key` (the points `series` returns): whether its Lanczos run converged
    on that end: the record's "<key>_converged" (tracking writes "lambda_min_converged", "lambda_max_converged"),
    else None (the record says nothing)."""
    flags = []
    for r in records:
        if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool):
            flag = r.get(f"{key}_converged")
            flags.append(flag if isinstance(flag, bool) else None)
    return flags


def relative_lambda_min(records: Sequence[dict]) -> dict[str, list]:
    """The scale-free λ_min of each record holding λ_min and λ_max > 0: {"step", "ratio" (λ_min/λ_max), "bound"
    (error_bound_min/λ_max, 0 where the record has none), "collapsed" (the record's flag; None: not recorded),
    "converged" (`convergence_flags`' value for λ_min)}."""
    out: dict[str, list] = {"step": [], "ratio": [], "bound": [], "collapsed": [], "converged": []}
    for r in records:
        low, high = r.get("lambda_min"), r.get("lambda_max")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high)):
            continue
        if high <= 0:
            continue
        bound = r.get("error_bound_min")
        out["step"].append(r["step"])
        out["ratio"].append(low / high)
        out["bound"].append(bound / high if isinstance(bound, (int, float)) and math.isfinite(bound) else 0.0)
        out["collapsed"].append(r.get("collapsed") if isinstance(r.get("collapsed"), bool) else None)
        out["converged"].append(convergence_flags([r], "lambda_min")[0])
    return out


def _legend_marks() -> list:
    from matplotlib.lines import Line2D

    return [Line2D([], [], color="grey", marker="o", linestyle="", label="collapsed (out_std ≤ threshold)"),
            Line2D([], [], color="grey", marker="o", markerfacecolor="none", linestyle="", label="not collapsed"),
            Line2D([], [], color="grey", marker="x", linestyle="", label="λ_min not converged")]


def plot_lambda_over_training(history: Mapping[str, Sequence[dict]], path: Path,
                              colors: Mapping[str, str] | None = None) -> Path:
    """Three panels against the training step, from the "geometry" records tracking writes: λ_max of the loss
    Hessian (log axis when positive); λ_min/λ_max, scale-free on a linear axis, with ± error_bound_min/λ_max as
    error bars; and out_std with each head's collapse bound. Filled markers: the point's state is collapsed by the
    recorded criterion; hollow: it is not (or not recorded); ×: λ_min's Lanczos run did not converge."""
    if not any(series(recs, "lambda_min")[0] or series(recs, "lambda_max")[0] for recs in history.values()):
        raise ValueError("no lambda_min / lambda_max in the tracked geometry records")
    colors = colors or head_colors(list(history))
    fig = new_figure(14, 4.2)
    top, rel, std = (fig.add_subplot(1, 3, k) for k in (1, 2, 3))
    maxima = []
    for head, recs in history.items():
        color = colors[head]
        steps, vals = series(recs, "lambda_max")
        maxima += vals
        if steps:
            top.plot(steps, vals, color=color, label=head, linewidth=1.3, marker=".")
        r = relative_lambda_min(recs)
        if r["step"]:
            rel.plot(r["step"], r["ratio"], color=color, linewidth=1.0, label=head)
            rel.errorbar(r["step"], r["ratio"], yerr=r["bound"], fmt="none", ecolor=color, elinewidth=0.8, capsize=2)
            for i, step in enumerate(r["step"]):
                filled = r["collapsed"][i] is True
                rel.scatter([step], [r["ratio"][i]], s=22, zorder=3, edgecolors=color,
                            facecolors=color if filled else "none")
                if r["converged"][i] is False:
                    rel.scatter([step], [r["ratio"][i]], s=40, marker="x", color=color, zorder=4)
        s_steps, s_vals = series(recs, "out_std")
        if s_steps:
            std.plot(s_steps, s_vals, color=color, linewidth=1.2, marker=".", label=head)
            bounds = [b for b in (rec.get("collapse_bound") for rec in recs) if isinstance(b, (int, float))]
            if bounds:
                std.axhline(bounds[0], color=color, linestyle=":", linewidth=1.0)
    if maxima and min(maxima) > 0:
        top.set_yscale("log")
    top.set_title("λ_max of the loss Hessian", fontsize=10)
    top.set_ylabel("λ_max")
    rel.axhline(0, color="black", linewidth=0.8)
    rel.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2), useMathText=True)
    rel.set_title("λ_min / λ_max (bars: ± error bound / λ_max)", fontsize=10)
    rel.set_ylabel("λ_min / λ_max")
    rel.legend(handles=[*rel.get_legend_handles_labels()[0], *_legend_marks()], fontsize=7)
    std.set_title("out_std of the head outputs (dotted: collapse bound)", fontsize=10)
    std.set_ylabel("out_std")
    if std.lines:
        std.set_yscale("log")
    for ax in (top, rel, std):
        ax.set_xlabel("training step")
    if maxima:
        top.legend(fontsize=7)
    fig.suptitle("Curvature over training (λ_min < 0: the loss has a descent direction)")
    return save(fig, path)


def plot_hessian_density(densities: Mapping[str, Mapping[str, Sequence[float]]], path: Path,
                         colors: Mapping[str, str] | None = None) -> Path:
    """densities: head → {"grid": eigenvalues, "density": spectral density on the grid} (e.g. from SLQ)."""
    if not densities:
        raise ValueError("no Hessian densities")
    colors = colors or head_colors(list(densities))
    fig = new_figure(7.5, 4.2)
    ax = fig.add_subplot()
    positive = True
    for head, d in densities.items():
        grid, dens = np.asarray(d["grid"], dtype=float), np.asarray(d["density"], dtype=float)
        if grid.shape != dens.shape:
            raise ValueError(f"head {head!r}: grid has {grid.size} points but density has {dens.size}")
        positive &= bool((dens > 0).all())
        ax.plot(grid, dens, color=colors[head], label=head, linewidth=1.4)
    if positive:
        ax.set_yscale("log")
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("eigenvalue λ of the loss Hessian")
    ax.set_ylabel("spectral density")
    ax.set_title("Hessian eigenvalue density per head")
    ax.legend(fontsize=8)
    return save(fig, path)


def plot_spectra(spectra: Mapping[str, Sequence[float]], title: str, ylabel: str, path: Path,
                 colors: Mapping[str, str] | None = None) -> Path:
    """Eigenvalues sorted in decreasing order against their rank (log–log), one line per entry."""
    spectra = {k: v for k, v in spectra.items() if len(v)}
    if not spectra:
        raise ValueError("no spectra")
    colors = colors or head_colors(list(spectra))
    fig = new_figure(7.5, 4.2)
    ax = fig.add_subplot()
    for name, values in spectra.items():
        vals = np.sort(np.abs(np.asarray(values, dtype=float)))[::-1]
        vals = vals[vals > 0]
        dashed = "@" in name
        ax.plot(np.arange(1, len(vals) + 1), vals, color=colors.get(name, BACKBONE_COLOR), label=name,
                linestyle="--" if dashed else "-", linewidth=1.4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rank of the eigenvalue")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save(fig, path)


def orbit_pca(points, orbit=None) -> tuple[np.ndarray, np.ndarray, list[float] | None]:
    """Orbit points on their top two principal components.

    points: (N, D) with `orbit` (N,) the image each point belongs to, or trajectories (M images, T steps, D)
    (e.g. `headprobe.probes.orbits.orbit_pca` output, ids implied). Returns xy (N, 2) or (M·T, 2), the ids, and
    the fractions of variance on PC1 and PC2 (None when the points are already 2-D and are kept as they are).
    """
    x = np.asarray(points, dtype=float)
    if x.ndim == 3:
        if orbit is not None:
            raise ValueError("trajectories (M, T, D) carry their orbit ids; pass orbit=None")
        orbit, x = np.repeat(np.arange(x.shape[0]), x.shape[1]), x.reshape(-1, x.shape[2])
    if x.ndim != 2 or len(x) < 2:
        raise ValueError(f"orbit points must be an (N, D) or (M, T, D) array of 2 or more points, not {x.shape}")
    ids = np.zeros(len(x), dtype=int) if orbit is None else np.asarray(orbit)
    if len(ids) != len(x):
        raise ValueError(f"{len(x)} orbit points but {len(ids)} orbit ids")
    if x.shape[1] <= 2:
        return np.pad(x, ((0, 0), (0, 2 - x.shape[1]))), ids, None
    centred = x - x.mean(0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    var = s**2
    return centred @ vt[:2].T, ids, (var[:2] / var.sum()).tolist() if var.sum() > 0 else None


def _orbit_legend(ordered: bool) -> list:
    """Legend entries that say how to read an orbit panel (the colours are images, so they get no entry)."""
    from matplotlib.lines import Line2D

    if ordered:
        return [Line2D([], [], color="grey", marker=".", label="one image's orbit, in sweep order"),
                Line2D([], [], color="grey", marker="o", markerfacecolor="none", linestyle="", label="first step")]
    return [Line2D([], [], color="grey", marker=".", linestyle="", label="one augmented view"),
            Line2D([], [], color="grey", marker="x", linestyle="", label="the image's orbit centre")]


def plot_orbit_pca(orbits: Mapping[str, object], path: Path, title: str = "Augmentation orbits") -> Path:
    """orbits: tap → trajectories (M, T, D), or {"points": (N, D), "orbit": (N,) image ids}; one panel per tap.

    Trajectories are drawn as lines in sweep order (○ first step); unordered points as dots (× orbit centre)."""
    if not orbits:
        raise ValueError("no orbits")
    from matplotlib import colormaps

    palette = colormaps["tab10"].colors
    cols = min(3, len(orbits))
    rows = math.ceil(len(orbits) / cols)
    fig = new_figure(4.2 * cols, 3.9 * rows + 0.4)
    for k, (tap, entry) in enumerate(orbits.items()):
        ordered = not isinstance(entry, Mapping)
        xy, ids, explained = orbit_pca(entry, None) if ordered else orbit_pca(entry["points"], entry.get("orbit"))
        ax = fig.add_subplot(rows, cols, k + 1)
        for n, orbit_id in enumerate(dict.fromkeys(ids.tolist())):
            mine, color = xy[ids == orbit_id], palette[n % len(palette)]
            if ordered:
                ax.plot(mine[:, 0], mine[:, 1], color=color, marker=".", linewidth=1.2, markersize=5)
                ax.scatter(*mine[0], s=45, facecolors="none", edgecolors=color)
            else:
                ax.scatter(mine[:, 0], mine[:, 1], s=10, color=color, alpha=0.7)
                ax.scatter(*mine.mean(0), s=60, color=color, marker="x")
        ax.set_xlabel(f"PC1 ({100 * explained[0]:.0f}% of variance)" if explained else "PC1")
        ax.set_ylabel(f"PC2 ({100 * explained[1]:.0f}% of variance)" if explained else "PC2")
        ax.set_title(tap, fontsize=10)
        ax.legend(handles=_orbit_legend(ordered), fontsize=7, loc="best")
    fig.suptitle(f"{title}: 2-D PCA per tap (colour: one image)")
    return save(fig, path)
