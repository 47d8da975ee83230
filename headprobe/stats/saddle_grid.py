"""Claim 4's per-cell saddle grid: per head kind (linear, ReLU, Swish, GELU+BN, ...) and start (collapsed / normal),
how many of the tracked points were at a collapsed strict saddle, over seeds, as the paper counts epochs
("λ_min < 0 in 72/100 epochs, Swish, collapsed start; 69/100 normal start; ReLU 1/100").

Three steps. The training stage tallies each head's tracked points per seed (`tally_points`, recorded in
results.json["heads"][H]["tracked"][seed]): tracked, collapsed (the point's `collapsed` flag: out_std ≤
threshold/√d), strict saddles among the collapsed points and among all points (λ_min < −max(error bound,
round-off)), and the escape scale Σ lr·|λ_min|·Δsteps over the collapsed negative points (`escape_diagnostics`
below: a perturbation along λ_min's eigenvector grows by about exp(drive), so a drive ≪ 1 cannot
explain an escape; with a frozen backbone z does not move at all). `saddle_grid(results)` then pools the heads of
one cell over seeds (the record's writer stores its rows as results.json["saddle_grid"], which `recorded_grid`
reads for report.html and `headprobe claims`): each proportion of tracked points with the envelope of Wilson's
interval at the effective size and the two-stage cluster bootstrap over seeds (`stats.clustered.
proportion_interval`: points of one seed share its trajectory, so they are clustered).

>>> points = [{"stage": "geometry", "step": 1, "collapsed": True, "negative_beyond_bound": True, "lambda_min": -2.0,
...            "lambda_max": 4.0}, {"stage": "geometry", "step": 3, "collapsed": False, "negative_beyond_bound": True,
...            "lambda_min": -1.0, "lambda_max": 4.0}]
>>> t = tally_points(points, lr=0.1, frozen=False)
>>> (t["tracked"], t["collapsed"], t["saddle_collapsed"], t["saddle"], t["escape_drive_sum"])
(2, 1, 1, 2, 0.4)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

__all__ = ["GRID_COLUMNS", "PAPER_GRID", "escape_diagnostics", "grid_cells", "grid_lines", "grid_text", "head_kind",
           "recorded_grid", "saddle_grid", "tally_history", "tally_points"]

# The paper's counts of λ_min < 0 in E tracked epochs (ResNet-18 from scratch, 3 seeds), by (kind, start).
PAPER_GRID = {("swish", "collapsed"): "72/100", ("swish", "normal"): "69/100", ("relu", "collapsed"): "1/100"}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _lr_at(step: int, train: Sequence[dict], default: float | None) -> float | None:
    """The learning rate of the last training record at or before `step` (the schedule's value), else the recipe's."""
    before = [r["lr"] for r in train if _number(r.get("lr")) and _number(r.get("step")) and r["step"] <= step]
    return before[-1] if before else default


def escape_diagnostics(points: Sequence[dict], states: Sequence[bool | None], train: Sequence[dict],
                       results: dict) -> dict:
    """Whether the tracked curvature can explain a head's escape from collapse (issue #36's reading of claim 4).

    Per collapsed point: λ_min/λ_max, and the drive lr·|λ_min|·Δsteps of a negative λ_min over the steps to the
    next tracked point (to the last training step after the last one): gradient descent on z at that learning rate
    grows a perturbation along λ_min's eigenvector by about exp(drive), so a summed drive far below 1 cannot
    explain an escape (scratch_collapse: 3e-7 · 0.05 · 32 ≈ 5e-7). The backbone's own Jacobian scales the real
    rate; with a frozen backbone z never moves and the curvature w.r.t. z drives nothing at all. Returns
    "lambda_ratio_median", "escape_drive_sum", "escape_drive_max" (over the collapsed points with λ_min < 0),
    "escape_step" (first tracked step whose state is not collapsed after one that was; None if none), and
    "curvature_explains_escape": None when the head did not leave collapse, "no (frozen backbone: z does not
    move)", "no (drive ≪ 1)" below 0.1, "yes (drive ≥ 1)", "partly" in between."""
    recipe = results.get("recipe") or {}
    default_lr = (recipe.get("train") or {}).get("lr")
    frozen = ((recipe.get("backbone") or {}).get("tune") or "frozen") == "frozen" and not str(
        (recipe.get("backbone") or {}).get("id", "")).startswith("scratch:")
    order = sorted(range(len(points)), key=lambda i: points[i].get("step") or 0)
    last_step = max((r["step"] for r in train if _number(r.get("step"))), default=None)
    ratios, drives, escape_step, was_collapsed = [], [], None, False
    for rank, i in enumerate(order):
        point, collapsed = points[i], states[i]
        if collapsed is False and was_collapsed and escape_step is None:
            escape_step = point.get("step")
        was_collapsed = was_collapsed or bool(collapsed)
        low, high = point.get("lambda_min"), point.get("lambda_max")
        if not collapsed or not _number(low):
            continue
        if _number(high) and high > 0:
            ratios.append(low / high)
        step = point.get("step")
        following = points[order[rank + 1]].get("step") if rank + 1 < len(order) else last_step
        lr = _lr_at(step, train, default_lr) if _number(step) else None
        if low < 0 and _number(following) and _number(step) and _number(lr):
            drives.append(lr * -low * max(0, following - step))
    total = sum(drives) if drives else (0.0 if ratios else None)
    escaped = escape_step is not None
    if not escaped:
        explains = None
    elif frozen:
        explains = "no (frozen backbone: z does not move)"
    elif total is None or total < 0.1:
        explains = "no (drive ≪ 1)"
    else:
        explains = "yes (drive ≥ 1)" if total >= 1 else "partly"
    return {"lambda_ratio_median": statistics.median(ratios) if ratios else None, "escape_drive_sum": total,
            "escape_drive_max": max(drives) if drives else None, "escape_step": escape_step,
            "curvature_explains_escape": explains}


def strict_saddle(record: Mapping) -> bool:
    """λ_min < −max(error bound, round-off) at a tracked point: the record's "negative_beyond_bound" (with the split),
    else λ_min below −error_bound_min."""
    if isinstance(record.get("negative_beyond_bound"), bool):
        return record["negative_beyond_bound"]
    low, bound = record.get("lambda_min"), record.get("error_bound_min")
    return _number(low) and low < -(bound if _number(bound) else 0.0)


def tally_points(records: Sequence[Mapping], lr: float | None, frozen: bool) -> dict:
    """One head's tracked points of one seed ("geometry" records; its "train" records, if given, supply the
    schedule's learning rate and the last step): {"tracked", "collapsed", "saddle_collapsed" (strict saddles among
    the collapsed points), "saddle" (among all tracked points, the paper's count), "unknown" (no collapse flag),
    "lambda_ratio_median", "escape_drive_sum", "escape_drive_max", "escape_step", "curvature_explains_escape"}."""
    points = sorted((r for r in records if r.get("stage") == "geometry"), key=lambda r: r.get("step") or 0)
    train = [r for r in records if r.get("stage") == "train"]
    states = [r["collapsed"] if isinstance(r.get("collapsed"), bool) else None for r in points]
    saddles = [strict_saddle(r) for r in points]
    recipe = {"train": {"lr": lr}, "backbone": {"tune": "frozen" if frozen else "full"}}
    escape = escape_diagnostics(points, states, train, {"recipe": recipe})
    return {"tracked": len(points), "collapsed": sum(c is True for c in states),
            "saddle_collapsed": sum(s and c is True for s, c in zip(saddles, states, strict=True)),
            "saddle": sum(saddles), "unknown": sum(c is None for c in states)} | escape


def tally_history(by_seed: Mapping[int, Mapping], names: Sequence[str], lr: float | None,
                  frozen: bool) -> dict[str, dict[str, dict]]:
    """{head: {seed: `tally_points`}} for the heads `names` of by_seed ({seed: {name: state with .history}}) that
    have tracked points; what the training stage records as results["heads"][H]["tracked"]."""
    out: dict[str, dict[str, dict]] = {}
    for seed, states in by_seed.items():
        for name in names:
            state = states.get(name)
            history = getattr(state, "history", None) or []
            if any(r.get("stage") == "geometry" for r in history):
                out.setdefault(name, {})[str(seed)] = tally_points(history, lr, frozen)
    return out


def head_kind(config: Mapping) -> str:
    """The grid's row label of a head: "linear", or the activation with "+bn" for BatchNorm in its hidden layers."""
    if config.get("type") != "mlp":
        return str(config.get("type"))
    return f"{config.get('act')}{'+bn' if config.get('bn_hidden') else ''}"


def _start(results: Mapping, name: str) -> str:
    begin = (((results.get("protocol") or {}).get("train") or {}).get("collapse_start") or {}).get(name) or {}
    return "collapsed" if begin.get("requested") else "normal"


def _lr(results: Mapping) -> float | None:
    """The run's recipe learning rate (train.lr), None where it has none."""
    lr = ((results.get("recipe") or {}).get("train") or {}).get("lr")
    return float(lr) if _number(lr) else None


def _clusters(tallies: Sequence[Mapping], key: str) -> list[list[int]]:
    return [[1] * t[key] + [0] * (t["tracked"] - t[key]) for t in tallies if t["tracked"]]


def _interval(clusters: list[list[int]]) -> dict | None:
    from headprobe.stats.clustered import proportion_interval  # torch only where there is an interval to draw

    return proportion_interval(clusters) if clusters else None


def saddle_grid(results: Mapping | Sequence[Mapping]) -> list[dict]:
    """One row per (head kind, start) of a run's tracked heads (results["heads"][H]["tracked"]), pooled over the
    cell's heads and seeds; a list of runs' results (a sweep: one head per run, paper_saddle_grid.yaml) pools the
    cell over every run's heads and seeds. Row: "kind", "start", "heads", "n_seeds" (head × seed trajectories),
    "tracked", "collapsed", "saddle_collapsed", "saddle", "collapsed_share" / "saddle_collapsed_share" /
    "saddle_share" (each `proportion_interval` of the tracked points, clustered by trajectory: value, ci95, ...;
    None without points), "escape_drive_max" (the largest trajectory's Σ lr·|λ_min|·Δsteps), "escape_step" (per
    trajectory), "paper". Rows in the order the heads appear; [] when nothing was tracked. Runs at several learning
    rates (a sweep over train.lr: the paper's activation × BN × lr grid) get a cell per lr as well, the kind read
    "swish, lr 0.005"."""
    runs = [results] if isinstance(results, Mapping) else list(results)
    by_lr = len({_lr(run) for run in runs}) > 1  # runs at several learning rates: the lr is an axis of the grid
    cells: dict[tuple[str, str], dict] = {}
    for i, run in enumerate(runs):
        for name, head in (run.get("heads") or {}).items():
            tracked = head.get("tracked") or {}
            if not tracked:
                continue
            kind = head_kind(head.get("config") or {})
            key = (f"{kind}, lr {_lr(run):g}" if by_lr and _number(_lr(run)) else kind, _start(run, name))
            cell = cells.setdefault(key, {"heads": [], "tallies": [], "escape": {}})
            label = name if len(runs) == 1 else f"{run.get('name') or 'run'}#{i}:{name}"
            cell["heads"].append(label)
            for seed, tally in tracked.items():
                cell["tallies"].append(tally)
                cell["escape"][f"{label}/{seed}"] = tally.get("escape_step")
    rows = []
    for (kind, start), cell in cells.items():
        tallies = cell["tallies"]
        drives = [t["escape_drive_sum"] for t in tallies if _number(t.get("escape_drive_sum"))]
        rows.append({"kind": kind, "start": start, "heads": cell["heads"], "n_seeds": len(tallies),
                     **{k: sum(t[k] for t in tallies) for k in ("tracked", "collapsed", "saddle_collapsed", "saddle")},
                     "collapsed_share": _interval(_clusters(tallies, "collapsed")),
                     "saddle_collapsed_share": _interval(_clusters(tallies, "saddle_collapsed")),
                     "saddle_share": _interval(_clusters(tallies, "saddle")),
                     "escape_drive_max": max(drives) if drives else None, "escape_step": cell["escape"],
                     "paper": PAPER_GRID.get((kind.split(", lr ")[0], start), "")})
    return rows


def recorded_grid(results: Mapping) -> list[dict]:
    """The grid the run recorded (results["saddle_grid"], written with the training: `record.writer`), read without
    torch by the light commands (`headprobe report`, `headprobe claims`); [] when it has none."""
    rows = results.get("saddle_grid")
    return list(rows) if isinstance(rows, list) else []


GRID_COLUMNS = ("head kind", "start", "seeds", "collapsed / tracked", "collapsed strict saddle / tracked [95%]",
                "strict saddle / tracked [95%]", "strict saddle / collapsed", "max Σ lr·|λ_min|·Δsteps", "paper")


def _share(count: int, total: int, interval: dict | None) -> str:
    if interval is None:
        return f"{count}/{total}"
    low, high = interval["ci95"]
    return f"{count}/{total} = {interval['value']:.2f} [{low:.2f}, {high:.2f}]"


def grid_cells(row: Mapping) -> list[str]:
    """The row's cells in GRID_COLUMNS order, as text."""
    drive = row["escape_drive_max"]
    return [row["kind"], row["start"], str(row["n_seeds"]), f"{row['collapsed']}/{row['tracked']}",
            _share(row["saddle_collapsed"], row["tracked"], row["saddle_collapsed_share"]),
            _share(row["saddle"], row["tracked"], row["saddle_share"]),
            f"{row['saddle_collapsed']}/{row['collapsed']}", "—" if drive is None else f"{drive:.2g}",
            row["paper"] or "—"]


def grid_lines(rows: Sequence[Mapping]) -> list[str]:
    """A Markdown table of `saddle_grid`'s rows (no lines when there are none)."""
    if not rows:
        return []
    return ["| " + " | ".join(GRID_COLUMNS) + " |", "|" + "---|" * len(GRID_COLUMNS),
            *("| " + " | ".join(grid_cells(r)) + " |" for r in rows)]


def grid_text(runs: Mapping[str, Mapping]) -> str:
    """`headprobe claims`'s section after the answers: each run's recorded grid (`recorded_grid`) as Markdown under
    a heading naming the run, and with several tracked runs (a sweep) the grid pooled over all of them
    (`saddle_grid` of the list: torch for its intervals); "" when no run tracked anything."""
    parts = [f"\nClaim 4, tracked points per head kind and start (saddle grid), run {label}:\n\n"
             + "\n".join(grid_lines(rows)) + "\n" for label, results in runs.items()
             if (rows := recorded_grid(results))]
    tracked = [r for r in runs.values() if recorded_grid(r)]
    if len(tracked) > 1:
        parts.append(f"\nClaim 4, saddle grid pooled over the {len(tracked)} runs:\n\n"
                     + "\n".join(grid_lines(saddle_grid(tracked))) + "\n")
    return "".join(parts)
