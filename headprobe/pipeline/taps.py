"""Taps — where the probes look — and probing one of them: the backbone, every hidden layer of each head and its
output.

A `Tap` maps backbone features to the representation at that point (`transform`); `tap_data` applies it to every
feature set the run extracted (`stages.FeatureSet`). For one unit (a tap, and a seed where there are several),
`run_probes` runs the recipe's probes and yields their outputs, which the probe executor hands to the record
(`RecordWriter.probe`); `tap_intervals` makes a 95% interval for every metric of a tap. `pipeline.probing` decides
which units to probe; the probe executor (`pipeline.executors`) decides where.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from headprobe.record.writer import TapSummary
from headprobe.stats.bootstrap import (
    ORBIT_IMAGES,
    TEST_IMAGES,
    TRAIN_IMAGES,
    bootstrap_resamples,
    n_units,
    tap_uncertainty,
)
from headprobe.stats.measures import TapMeasures


@dataclass(frozen=True)
class Tap:
    """name: `backbone`, `HEAD@i` (i-th hidden layer) or `HEAD` (output); transform: backbone features (N, D) →
    this tap's (N, D'), None for the backbone itself."""

    name: str
    head: str | None = None
    depth: int = 0
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None


class HeadLayers:
    """A head's layers up to `depth`, as a tap's transform: (N, D) backbone features -> (N, w_depth), run on the
    device of its input (the head is moved there once). Row-wise because the head is in eval mode (BatchNorm with
    its running statistics): `training` says so to `features.rows.TapRows`, which refuses a head in training mode.
    The rows go through the head `BATCH_ROWS` at a time, the batches `train.cached_views.head_taps` takes (the same
    products, so the same bits), and only this depth's output is kept: one (N, w_depth) tensor, not every layer's."""

    BATCH_ROWS = 4096

    def __init__(self, head, depth: int):
        self.head, self.depth = head, depth

    @property
    def training(self) -> bool:
        return self.head.training

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        head = self.head.to(x.device).eval()
        out = None
        for start in range(0, len(x), self.BATCH_ROWS):
            rows = head.taps(x[start : start + self.BATCH_ROWS])[self.depth - 1]
            if out is None:
                out = torch.empty((len(x), *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
            out[start : start + len(rows)] = rows
        return out if out is not None else head.taps(x)[self.depth - 1]


def head_taps(name: str, head) -> list[Tap]:
    """The taps of a trained head: `name@1` … `name@(depth-1)` and `name` (the output), in eval mode (so a tap
    is computed a block of rows at a time, `features.rows`)."""
    head.eval()
    return [Tap(name if depth == head.depth else f"{name}@{depth}", name, depth, HeadLayers(head, depth))
            for depth in range(1, head.depth + 1)]


def tap_data(features, tap: Tap, recipe, device: torch.device | str | None = None,
             block_rows: int | None = None):
    """The inputs of every probe at one tap (`probes.tap_data.TapData`), from a `stages.FeatureSet`. The view probes
    get `features.probe_views` (the held-out test images' views unless `augment.probe_views: train`). Every feature
    set is handed out by rows (`features.rows.TapRows`, `block_rows` stored rows computed at once, default
    `features.rows.BLOCK_ROWS`): converted to float32 on `device` (a mapped float16/bfloat16 cache,
    `features.store_dtype`, is upcast there) and, at a head's tap, passed through its layers a block at a time, so
    nothing is computed whole until a probe reads it whole (`run_probes`)."""
    from headprobe.features.rows import TapRows
    from headprobe.probes.tap_data import TapData

    def at(x: torch.Tensor, what: str) -> TapRows:
        return TapRows(x, tap.transform, device=device, block_rows=block_rows, name=f"tap {tap.name!r} {what}")

    views = params = None
    probed = features.probe_views
    if probed is not None:
        views, params = at(probed.features, "views"), probed.params
    rot = {}
    if features.rotated is not None:
        for split, (x, y) in features.rotated.items():
            rot[f"rotated_{split}_x"], rot[f"rotated_{split}_y"] = at(x, f"rotated {split} images"), y
    orbits = orbit_labels = None
    if features.orbits is not None:
        orbits = {s: at(t, f"{s} orbits") for s, t in features.orbits.items()}
        # extract_orbits takes the first N test images, so their classes are the first N test labels
        orbit_labels = features.test.labels[: next(iter(features.orbits.values())).shape[0]]
    return TapData(tap.name, at(features.train.features, "train"), features.train.labels,
                   at(features.test.features, "test"), features.test.labels, features.n_classes, seed=recipe.seed,
                   val_fraction=recipe.data.val_fraction, views=views, view_params=params, orbits=orbits,
                   orbit_labels=orbit_labels, inert_params=features.inert_params, **rot)


def run_probes(ctx, features, tap: Tap, seed: int | None, todo: list[str], processes: tuple[int, int] | None = None):
    """Yield (probe name, `ProbeOutput`) for each of the probes `todo` at (tap, seed), as each finishes. With
    `processes` (this process's rank, how many run the probe: only the shared probe executor passes it), every
    process runs these probes together (the sharded k-NN)."""
    from headprobe.probes.declaration import CHUNKS, declared_probe
    from headprobe.registry import PROBES

    # The probes run on the process's device (the GPU on a GPU node); their per-unit values come back on the CPU.
    data = tap_data(features, tap, ctx.recipe, ctx.state.device).to(ctx.state.device) if todo else None
    for name in todo:
        options = dataclasses.asdict(ctx.recipe.probes[name]) | ({} if processes is None else
                                                                 {"processes": processes})
        where = f"tap {tap.name!r}" + ("" if seed is None else f" (seed {seed})")
        probe, declared = PROBES.get(name), declared_probe(name)
        with ctx.stage(f"running probe {name!r} on {where}"):
            # One that reads in chunks gets the rows (`features.rows.TapRows`); any other (plug-ins registered the
            # old way included) gets whole tensors of what it reads, computed for it and dropped after it.
            out = probe(data if declared.reads == CHUNKS else data.whole(declared.needs), **options)
        yield name, out


def tap_intervals(ctx, features, tap_name: str, measured: TapMeasures) -> TapSummary:
    """taps[tap]["uncertainty"][metric]: a 95% interval and how it was obtained (stats.bootstrap), from the tap's
    metrics and per-unit values (`measured`). Resamples are drawn once per kind of unit and shared by every tap
    (`draw_resamples`)."""
    draw_resamples(ctx, features, measured.per_unit)
    return TapSummary(tap_name, tap_uncertainty(measured.metrics, measured.per_unit, ctx.resamples))


def draw_resamples(ctx, features, per_unit: Mapping) -> None:
    """The bootstrap resamples of every kind of unit in `per_unit` not drawn yet, into ctx.resamples: test images,
    the orbit images (the first n test images) and the training images keep each class's count."""
    for p in per_unit.values():
        if p.unit not in ctx.resamples:
            n = n_units(p)
            strata = (features.test.labels[:n] if p.unit in (TEST_IMAGES, ORBIT_IMAGES) else
                      features.train.labels if p.unit == TRAIN_IMAGES else None)
            ctx.resamples[p.unit] = bootstrap_resamples(n, seed=ctx.recipe.seed, strata=strata)
            ctx.verify_cache()  # the labels read, outside any stage
