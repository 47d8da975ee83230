"""Curvature tracked during training: a "geometry" record of a head at a step (`geometry.tracking`), and the fixed
rows its collapse statistics are taken on. Called by the training loop (`engine`) every `geometry.track_every` steps.
"""

from __future__ import annotations

import torch

from headprobe.geometry.analyse import objective_closure
from headprobe.geometry.collapse import fixed_stat_rows
from headprobe.geometry.tracking import curvature_snapshot


def tracked_stat_rows(source, track, rows_seed: int) -> torch.Tensor | None:
    """The fixed rows whose head outputs give every tracked record's collapse statistics: `track.track_stat_rows`
    of a source's cached view features (`views`: (N, K, D), `geometry.collapse.fixed_stat_rows`, drawn with
    `rows_seed`, the engine's seed_of(seed, "collapse rows")); None for a source without cached views (a tuned
    backbone changes every representation, so its records take the statistics on the step's whole batch instead)."""

    views = getattr(source, "views", None)
    if not isinstance(views, torch.Tensor) or views.ndim != 3:
        return None
    return fixed_stat_rows(views, track.track_stat_rows, rows_seed).float()  # a float16/bfloat16 cache, upcast


def track_curvature(state, objective, options: dict, z1: torch.Tensor, z2: torch.Tensor, track,
                    step: int, per_epoch: int, seed: int, log, stat_rows: torch.Tensor | None = None) -> None:
    """Append (and log) a "geometry" record of `state`'s head on z1, z2: (b, D), taken before step `step`'s
    update: `geometry.tracking.curvature_snapshot` on the first `track.track_rows` rows, its collapse statistics
    on `stat_rows` (`tracked_stat_rows`: the same rows at every step; None: all b rows of the step's batch)."""

    rows = min(track.track_rows, len(z1))
    fixed = stat_rows is not None
    controls = getattr(track, "track_controls", False)
    snap = curvature_snapshot(state.head, z1[:rows], z2[:rows], objective_closure(objective, options, state.predictor),
                              predictor=state.predictor, max_iter=track.track_max_iter, seed=seed,
                              split=getattr(track, "track_split", False), stat_rows=stat_rows if fixed else z1,
                              collapse_threshold=getattr(track, "collapse_threshold", None), controls=controls)
    snap.pop("cov_top_eigenvalues", None)
    record = {"stage": "geometry", "head": state.name, "step": step + 1, "epoch": step // per_epoch,
              **{k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in snap.items()},
              "stats_rows_fixed": fixed}
    state.history.append(record)
    if log is not None:
        log(record)
