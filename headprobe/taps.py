"""Taps — where the probes look — and probing them: the backbone, every hidden layer of each head and its output.

A `Tap` maps backbone features to the representation at that point (`transform`); `tap_data` applies it to every
feature set the run extracted (`stages.FeatureSet`), and `probe_tap` runs the recipe's probes on the result,
keeping each probe's per-image values so that `record_uncertainty` can put a 95% interval on every metric and
`probe_heads` can decide each head's buffer verdict on paired resamples. With several seeds, each head tap is
probed once per seed and `aggregate_seeds` makes the tap's metrics from them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .recipe import RecipeError
from .stats import (
    ORBIT_IMAGES,
    TEST_IMAGES,
    PerUnit,
    bootstrap_resamples,
    load_per_unit,
    save_per_unit,
    seed_interval,
    tap_uncertainty,
)


@dataclass(frozen=True)
class Tap:
    """name: `backbone`, `HEAD@i` (i-th hidden layer) or `HEAD` (output); transform: backbone features (N, D) →
    this tap's (N, D'), None for the backbone itself."""

    name: str
    head: str | None = None
    depth: int = 0
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None


def head_taps(name: str, head) -> list[Tap]:
    """The taps of a trained head: `name@1` … `name@(depth-1)` and `name` (the output)."""
    from .train import head_taps as layer_outputs

    return [Tap(name if depth == head.depth else f"{name}@{depth}", name, depth,
                lambda x, d=depth, h=head: layer_outputs(h, x)[d - 1]) for depth in range(1, head.depth + 1)]


def tap_data(features, tap: Tap, recipe):
    """The inputs of every probe at one tap (`probes.suite.TapData`), from a `stages.FeatureSet`."""
    from .probes.suite import TapData

    def at(x: torch.Tensor) -> torch.Tensor:
        return x if tap.transform is None else tap.transform(x)

    views = params = None
    if features.views is not None:
        n, k, d = features.views.features.shape
        views = at(features.views.features.reshape(n * k, d)).reshape(n, k, -1)
        params = features.views.params
    rot = {}
    if features.rotated is not None:
        for split, (x, y) in features.rotated.items():
            rot[f"rotated_{split}_x"], rot[f"rotated_{split}_y"] = at(x), y
    orbits = orbit_labels = None
    if features.orbits is not None:
        orbits = {s: at(t.reshape(-1, t.shape[-1])).reshape(t.shape[0], t.shape[1], -1)
                  for s, t in features.orbits.items()}
        # extract_orbits takes the first N test images, so their classes are the first N test labels
        orbit_labels = features.test.labels[: next(iter(features.orbits.values())).shape[0]]
    return TapData(tap.name, at(features.train.features), features.train.labels, at(features.test.features),
                   features.test.labels, features.n_classes, seed=recipe.seed, val_fraction=recipe.data.val_fraction,
                   views=views, view_params=params, orbits=orbits, orbit_labels=orbit_labels,
                   inert_params=features.inert_params, **rot)


def probe_tap(ctx, features, tap: Tap, seed: int | None = None) -> None:
    """Every probe of the recipe at one tap. With `seed` (a run with several seeds) the metrics go into
    taps[tap]["seeds"][seed], and `aggregate_seeds` makes the tap's own metrics from them. Probes finished in a
    resumed run are not redone."""
    from .registry import PROBES

    t0 = time.perf_counter()
    entry = ctx.results["taps"].setdefault(tap.name, {"head": tap.head, "depth": tap.depth, "metrics": {},
                                                      "protocol": {}})
    record = entry if seed is None else entry.setdefault("seeds", {}).setdefault(str(seed),
                                                                                 {"metrics": {}, "protocol": {}})
    key = tap.name if seed is None else f"{tap.name}.seed-{seed}"
    todo = [name for name in ctx.recipe.probes if name not in record["protocol"]]
    store = ctx.run_dir.path / "per_unit" / f"{key}.safetensors"
    per_unit = ctx.per_unit.setdefault(key, load_per_unit(store) if ctx.resume else {})
    data = tap_data(features, tap, ctx.recipe) if todo else None
    for name in todo:
        options = dataclasses.asdict(ctx.recipe.probes[name])
        where = f"tap {tap.name!r}" + ("" if seed is None else f" (seed {seed})")
        out = ctx.stage(f"running probe {name!r} on {where}", PROBES.get(name), data, **options)
        record["metrics"].update(out.metrics)
        record["protocol"][name] = out.protocol
        per_unit.update(out.per_unit)
        if out.per_unit and ctx.run_dir.writable:
            store.parent.mkdir(exist_ok=True)
            save_per_unit(store, per_unit)
        extra = {} if seed is None else {"seed": seed}
        ctx.run_dir.log_metrics({"stage": "probe", "tap": tap.name, **extra, "probe": name, **out.metrics})
        ctx.run_dir.write_results(ctx.results)
    if seed is None:
        record_uncertainty(ctx, features, tap.name)
    if todo:
        ctx.clock("probe_s", t0)


def record_uncertainty(ctx, features, tap_name: str) -> None:
    """taps[tap]["uncertainty"][metric]: a 95% interval and how it was obtained (headprobe.stats). Resamples are
    drawn once per kind of unit and shared by every tap (class-stratified for test images)."""
    for p in ctx.per_unit[tap_name].values():
        if p.unit not in ctx.resamples:
            n = len(p.values) if isinstance(p, PerUnit) else len(p.spread)
            # Test images and the orbit images (the first n test images) keep each class's count.
            strata = features.test.labels[:n] if p.unit in (TEST_IMAGES, ORBIT_IMAGES) else None
            ctx.resamples[p.unit] = bootstrap_resamples(n, seed=ctx.recipe.seed, strata=strata)
    tap = ctx.results["taps"][tap_name]
    tap["uncertainty"] = tap_uncertainty(tap["metrics"], ctx.per_unit[tap_name], ctx.resamples)
    ctx.run_dir.write_results(ctx.results)


def aggregate_seeds(ctx, features, tap_name: str) -> None:
    """A tap probed once per seed: its metrics are the means over seeds (of the metrics every seed has), its
    per-unit values the seed means (so the bootstrap interval covers test-set and seed variation together), and
    each uncertainty record adds the per-seed values, their standard deviation and a t interval over seeds (the
    interval itself where a metric has no per-unit values)."""
    seeds = ctx.recipe.seed_list
    tap = ctx.results["taps"][tap_name]
    records = [tap["seeds"][str(s)] for s in seeds]
    names = [m for m in records[0]["metrics"] if all(isinstance(r["metrics"].get(m), (int, float)) for r in records)]
    tap["metrics"] = {m: sum(r["metrics"][m] for r in records) / len(records) for m in names}
    tap["protocol"] = records[0]["protocol"]  # the probes' settings and splits are the same for every seed
    per_seed = [ctx.per_unit.get(f"{tap_name}.seed-{s}", {}) for s in seeds]
    # Means over seeds of per-image values are per-image values of the seed-mean metric; a ratio statistic is not
    # (the mean of ratios is not a ratio): those metrics get the seeds' t interval instead.
    ctx.per_unit[tap_name] = {
        m: PerUnit(torch.stack([p[m].values.double() for p in per_seed]).mean(0), first.unit)
        for m, first in per_seed[0].items()
        if isinstance(first, PerUnit) and all(isinstance(p.get(m), PerUnit) and p[m].unit == first.unit
                                              and p[m].values.shape == first.values.shape for p in per_seed)}
    record_uncertainty(ctx, features, tap_name)
    for m, record in tap["uncertainty"].items():
        values = [r["metrics"][m] for r in records]
        spread = seed_interval(values)
        record |= {"per_seed": values, "sd_seeds": spread["sd_seeds"], "n_seeds": spread["n_seeds"],
                   "ci95_seeds": spread["ci95"]}
        if record["ci95"] is None:
            record["ci95"], record["method"] = spread["ci95"], spread["method"]
    ctx.run_dir.write_results(ctx.results)


def probe_heads(ctx, features, trained) -> None:
    """Probe every tap of every head (once per seed when there are several) and decide each head's verdict."""
    from .buffer import buffer_verdict

    several = len(trained.by_seed) > 1
    for spec in ctx.recipe.heads:
        first = trained.first.get(spec.name)
        chosen = None if first is None else _chosen_taps(spec, first.head)
        if first is None:
            probe_tap(ctx, features, Tap(spec.name, spec.name, 0))  # the identity head: the same for every seed
        elif spec.type == "pretrained":  # the checkpoint's own head: one module, not retrained per seed
            for tap in chosen:
                probe_tap(ctx, features, tap)
        else:
            by_seed = {seed: _chosen_taps(spec, states[spec.name].head) for seed, states in trained.by_seed.items()}
            for i, tap in enumerate(chosen):
                for seed, seeded in by_seed.items():
                    probe_tap(ctx, features, seeded[i], seed=seed if several else None)
                if several:
                    aggregate_seeds(ctx, features, tap.name)
        compared = spec.name if chosen is None else chosen[-1].name
        verdict = buffer_verdict(ctx.results["taps"], compared, ctx.per_unit, ctx.resamples)
        ctx.results["buffer"][spec.name] = verdict | ({} if compared == spec.name else {"tap": compared})
        ctx.run_dir.write_results(ctx.results)


def _chosen_taps(spec, head) -> list[Tap]:
    """The head's taps the recipe asks for (`heads[i].taps`: layer numbers), every one by default."""
    taps = head_taps(spec.name, head)
    if spec.taps is None:
        return taps
    beyond = [d for d in spec.taps if d > len(taps)]
    if beyond:
        raise RecipeError(f"heads: {spec.name!r} has {len(taps)} layers, so taps {beyond} do not exist; choose "
                          f"among 1..{len(taps)} (the output is {len(taps)}).")
    return [t for t in taps if t.depth in spec.taps]
