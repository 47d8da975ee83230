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
from pathlib import Path

import torch

from headprobe.recipe import RecipeError
from headprobe.stats.bootstrap import (
    ORBIT_IMAGES,
    TEST_IMAGES,
    TRAIN_IMAGES,
    PerUnit,
    SeedMean,
    bootstrap_resamples,
    load_per_unit,
    n_units,
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
    """The taps of a trained head: `name@1` … `name@(depth-1)` and `name` (the output). A tap's transform runs the
    head on the device of its input (the head is moved there once)."""
    from headprobe.train.cached_views import head_taps as layer_outputs

    return [Tap(name if depth == head.depth else f"{name}@{depth}", name, depth,
                lambda x, d=depth, h=head: layer_outputs(h.to(x.device), x)[d - 1])
            for depth in range(1, head.depth + 1)]


def tap_data(features, tap: Tap, recipe, device: torch.device | str | None = None):
    """The inputs of every probe at one tap (`probes.suite.TapData`), from a `stages.FeatureSet`. The view probes
    get `features.probe_views` (the held-out test images' views unless `augment.probe_views: train`). With
    `device`, the backbone features move there first, so a head tap's layers run on the device too."""
    from headprobe.probes.suite import TapData

    def at(x: torch.Tensor) -> torch.Tensor:
        x = x if device is None else x.to(device)
        return x if tap.transform is None else tap.transform(x)

    views = params = None
    probed = features.probe_views
    if probed is not None:
        n, k, d = probed.features.shape
        views = at(probed.features.reshape(n * k, d)).reshape(n, k, -1)
        params = probed.params
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
    resumed run are not redone. With several processes each runs a share of the probes (`probe_units`)."""
    t0 = probe_clock(ctx)
    ran = probe_units(ctx, features, [(tap, seed)])
    if seed is None:
        record_uncertainty(ctx, features, tap.name)
    if ran:
        ctx.clock("probe_s", t0)


def reuse_tap(ctx, source: Path, tap_name: str = "backbone") -> bool:
    """Take tap `tap_name`'s probes from the finished run in `source` instead of running them again: a sweep whose
    runs share the backbone, data, features, augmentation, probes and seed (`pipeline.BACKBONE_TAP_INPUTS`) measures
    the same backbone tap in each. Its metrics, protocols and per-image values are copied (intervals are recomputed
    from them on this run's resamples, which the same seed draws alike) and the tap records ``reused_from`` (the
    source run, relative to this one). Every process must see `source`; otherwise (or where `source` lacks the tap)
    nothing is taken and the tap is probed as usual. Returns whether it was taken."""
    import copy
    import os
    import shutil

    from headprobe.parallel.collectives import all_objects
    from headprobe.record.directory import metrics_from_json, read_results

    previous = read_results(source) if (source / "results.json").is_file() else {}
    entry = previous.get("taps", {}).get(tap_name)
    usable = entry is not None and set(ctx.recipe.probes) <= set(entry.get("protocol", {}))
    if not all(all_objects(usable, ctx.state.num_processes)):
        return False
    entry = metrics_from_json({tap_name: copy.deepcopy(entry)})[tap_name]
    entry["reused_from"] = os.path.relpath(source.resolve(), ctx.run_dir.path.resolve())
    store = source / "per_unit" / f"{tap_name}.safetensors"
    ctx.per_unit[tap_name] = load_per_unit(store)
    if ctx.run_dir.writable and store.is_file():
        (ctx.run_dir.path / "per_unit").mkdir(exist_ok=True)
        shutil.copyfile(store, ctx.run_dir.path / "per_unit" / store.name)
    ctx.results["taps"][tap_name] = entry
    ctx.run_dir.write_results(ctx.results)
    return True


def probe_clock(ctx) -> float:
    """The start of a probing stage's clock (`timing.probe_s`). With several processes it starts once every process
    is here: one still finishing the stage before (its start-up or training, which are not synchronised) would
    otherwise have its lag counted as probing."""
    if ctx.state.num_processes > 1:
        ctx.state.wait_for_everyone()
    return time.perf_counter()


def probe_units(ctx, features, units: list[tuple[Tap, int | None]]) -> bool:
    """Run every pending probe of each (tap, seed) unit and record it in ctx.results and ctx.per_unit; returns
    whether any probe ran. One process runs them in order and records each as it finishes (so an interrupted run
    keeps it); several processes share them out (`probe_sharing.probe_units_shared`) and record the same."""
    pending = [pending_probes(ctx, tap, seed) for tap, seed in units]
    if ctx.state.num_processes > 1:
        from headprobe.pipeline.probe_sharing import probe_units_shared

        probe_units_shared(ctx, features, units, pending)
        return any(pending)
    total = sum(len(names) for names in pending)
    with ctx.progress() as progress:
        label = f"probing {len(units)} tap{'s' if len(units) > 1 else ''}"
        task = progress.add_task(label, total=total) if total else None
        for (tap, seed), names in zip(units, pending, strict=True):
            for name, out in run_probes(ctx, features, tap, seed, names):
                record_probe(ctx, tap, seed, name, out)
                progress.advance(task)
    return any(pending)


def _unit_key(tap: Tap, seed: int | None) -> str:
    return tap.name if seed is None else f"{tap.name}.seed-{seed}"


def pending_probes(ctx, tap: Tap, seed: int | None) -> list[str]:
    """The recipe's probes not yet recorded at (tap, seed); makes its results entry and per-unit store on the way
    (loaded from the run directory when resuming)."""
    entry = ctx.results["taps"].setdefault(tap.name, {"head": tap.head, "depth": tap.depth, "metrics": {},
                                                      "protocol": {}})
    record = entry if seed is None else entry.setdefault("seeds", {}).setdefault(str(seed),
                                                                                 {"metrics": {}, "protocol": {}})
    key = _unit_key(tap, seed)
    store = ctx.run_dir.path / "per_unit" / f"{key}.safetensors"
    ctx.per_unit.setdefault(key, load_per_unit(store) if ctx.resume else {})
    return [name for name in ctx.recipe.probes if name not in record["protocol"]]


def run_probes(ctx, features, tap: Tap, seed: int | None, todo: list[str], processes: tuple[int, int] | None = None):
    """Yield (probe name, `ProbeOutput`) for each of the probes `todo` at (tap, seed), as each finishes. With
    processes=(rank, world), every process runs these probes together (the sharded k-NN)."""
    from headprobe.registry import PROBES

    # The probes run on the process's device (the GPU on a GPU node); their per-unit values come back on the CPU.
    data = tap_data(features, tap, ctx.recipe, ctx.state.device).to(ctx.state.device) if todo else None
    for name in todo:
        options = dataclasses.asdict(ctx.recipe.probes[name]) | ({} if processes is None else
                                                                 {"processes": processes})
        where = f"tap {tap.name!r}" + ("" if seed is None else f" (seed {seed})")
        yield name, ctx.stage(f"running probe {name!r} on {where}", PROBES.get(name), data, **options)


def record_probe(ctx, tap: Tap, seed: int | None, name: str, out, process: int | str | None = None,
                 write: bool = True) -> None:
    """One probe's output into results.json, metrics.jsonl (with the process that ran it, in a run of several)
    and the per-unit store. write=False leaves saving results.json and the per-unit store to the caller
    (`save_unit`), which records several probes at once."""
    entry = ctx.results["taps"][tap.name]
    record = entry if seed is None else entry["seeds"][str(seed)]
    key = _unit_key(tap, seed)
    record["metrics"].update(out.metrics)
    record["protocol"][name] = out.protocol
    per_unit = ctx.per_unit[key]
    per_unit.update(out.per_unit)
    extra = ({} if seed is None else {"seed": seed}) | ({} if process is None else {"process": process})
    ctx.run_dir.log_metrics({"stage": "probe", "tap": tap.name, **extra, "probe": name, **out.metrics})
    if write:
        if out.per_unit:
            save_unit(ctx, tap, seed)
        ctx.run_dir.write_results(ctx.results)


def save_unit(ctx, tap: Tap, seed: int | None) -> None:
    """The per-unit values of (tap, seed) into the run's per-unit store."""
    key = _unit_key(tap, seed)
    if ctx.per_unit[key] and ctx.run_dir.writable:
        store = ctx.run_dir.path / "per_unit" / f"{key}.safetensors"
        store.parent.mkdir(exist_ok=True)
        save_per_unit(store, ctx.per_unit[key])


def record_uncertainty(ctx, features, tap_name: str, write: bool = True) -> None:
    """taps[tap]["uncertainty"][metric]: a 95% interval and how it was obtained (stats.bootstrap). Resamples are
    drawn once per kind of unit and shared by every tap (`draw_resamples`).
    write=False leaves writing results.json to the caller (`probe_heads` writes once per head, after its verdict:
    a ~1 MB results.json rewritten per tap cost a third of the intervals' time on the quickstart)."""
    draw_resamples(ctx, features, ctx.per_unit[tap_name])
    tap = ctx.results["taps"][tap_name]
    tap["uncertainty"] = tap_uncertainty(tap["metrics"], ctx.per_unit[tap_name], ctx.resamples)
    if write:
        ctx.run_dir.write_results(ctx.results)


def draw_resamples(ctx, features, per_unit: dict) -> None:
    """The bootstrap resamples of every kind of unit in `per_unit` not drawn yet, into ctx.resamples: test images,
    the orbit images (the first n test images) and the training images keep each class's count."""
    for p in per_unit.values():
        if p.unit not in ctx.resamples:
            n = n_units(p)
            strata = (features.test.labels[:n] if p.unit in (TEST_IMAGES, ORBIT_IMAGES) else
                      features.train.labels if p.unit == TRAIN_IMAGES else None)
            ctx.resamples[p.unit] = bootstrap_resamples(n, seed=ctx.recipe.seed, strata=strata)


def aggregate_seeds(ctx, features, tap_name: str, write: bool = True) -> None:
    """A tap probed once per seed: its metrics are the means over seeds (of the metrics every seed has), its
    per-unit values the seed means (recomputed statistics: the seed mean of each seed's replicates), and
    each uncertainty record adds the per-seed values, their standard deviation and a t interval over seeds (the
    interval itself where a metric has no per-unit values)."""
    seeds = ctx.recipe.seed_list
    tap = ctx.results["taps"][tap_name]
    records = [tap["seeds"][str(s)] for s in seeds]
    names = [m for m in records[0]["metrics"] if all(isinstance(r["metrics"].get(m), (int, float)) for r in records)]
    tap["metrics"] = {m: sum(r["metrics"][m] for r in records) / len(records) for m in names}
    tap["protocol"] = records[0]["protocol"]  # the probes' settings and splits are the same for every seed
    per_seed = [ctx.per_unit.get(f"{tap_name}.seed-{s}", {}) for s in seeds]
    # Means over seeds of per-image values are per-image values of the seed-mean metric; a statistic recomputed per
    # resample (a ratio is not a mean) is the mean of each seed's statistic on the same resamples (`SeedMean`).
    # Metrics without per-unit values at every seed get the seeds' t interval instead.
    combined = {}
    for m, first in per_seed[0].items():
        parts = [p.get(m) for p in per_seed]
        if any(part is None or part.unit != first.unit or n_units(part) != n_units(first) for part in parts):
            continue
        if isinstance(first, PerUnit) and all(type(part) is type(first) for part in parts):
            combined[m] = type(first)(torch.stack([part.values.double() for part in parts]).mean(0), first.unit)
        elif not isinstance(first, PerUnit) and not any(isinstance(part, PerUnit) for part in parts):
            combined[m] = SeedMean(parts, first.unit)
    ctx.per_unit[tap_name] = combined
    record_uncertainty(ctx, features, tap_name, write=False)
    for m, record in tap["uncertainty"].items():
        values = [r["metrics"][m] for r in records]
        spread = seed_interval(values)
        record |= {"per_seed": values, "sd_seeds": spread["sd_seeds"], "n_seeds": spread["n_seeds"],
                   "ci95_seeds": spread["ci95"]}
        if record["ci95"] is None:
            record["ci95"], record["method"] = spread["ci95"], spread["method"]
    if write:
        ctx.run_dir.write_results(ctx.results)


def probe_heads(ctx, features, trained, backbone: bool = False) -> None:
    """Probe every tap of every head (once per seed when there are several), decide each head's verdict and answer
    the paper's questions (`stats.claims`: results["claims"]). With several processes the probes of all the head
    taps (and with `backbone` the backbone tap's, first) are shared out among them at once (`probe_units`)."""
    from headprobe.pipeline.probe_sharing import intervals_from_probes, share_intervals
    from headprobe.stats.claims import answer_questions
    from headprobe.stats.verdict import buffer_verdict

    several = len(trained.by_seed) > 1
    plans = []  # (spec, the taps compared, the seed-averaged taps, the (tap, seed) units to probe)
    for spec in ctx.recipe.heads:
        first = trained.first.get(spec.name)
        chosen = None if first is None else _chosen_taps(spec, first.head)
        if first is None:  # the identity head: the same for every seed
            plans.append((spec, chosen, [], [(Tap(spec.name, spec.name, 0), None)]))
        elif spec.type == "pretrained":  # the checkpoint's own head: one module, not retrained per seed
            plans.append((spec, chosen, [], [(tap, None) for tap in chosen]))
        else:
            by_seed = {seed: _chosen_taps(spec, states[spec.name].head) for seed, states in trained.by_seed.items()}
            units = [(seeded[i], seed if several else None) for i in range(len(chosen))
                     for seed, seeded in by_seed.items()]
            plans.append((spec, chosen, chosen if several else [], units))
    t0 = probe_clock(ctx)
    every = [(Tap("backbone"), None)] * backbone + [unit for *_, units in plans for unit in units]
    ran = probe_units(ctx, features, every)
    for tap, seed in every:  # on every process: each verdict resamples them
        draw_resamples(ctx, features, ctx.per_unit[_unit_key(tap, seed)])
    # The intervals of every tap probed once (and the seed means of those probed per seed), shared among the
    # processes of a multi-process run; then each head's verdict.
    once = [tap.name for tap, seed in every if seed is None]
    once = [name for name in once if not intervals_from_probes(ctx, name)]  # computed next to the probes already
    share_intervals(ctx, once, lambda name: record_uncertainty(ctx, features, name, write=False))
    averaged = [tap.name for *_, taps, _ in plans for tap in taps]
    share_intervals(ctx, averaged, lambda name: aggregate_seeds(ctx, features, name, write=False), per_unit=True)
    compared = {spec.name: spec.name if chosen is None else chosen[-1].name for spec, chosen, _, _ in plans}
    for head, tap in compared.items():
        verdict = buffer_verdict(ctx.results["taps"], tap, ctx.per_unit, ctx.resamples)
        ctx.results["buffer"][head] = verdict | ({} if tap == head else {"tap": tap})
    # The paper's questions, each answered from its primary measure with an interval over seeds and test images.
    ctx.results["claims"] = answer_questions(ctx.results["taps"], ctx.per_unit, ctx.resamples, compared,
                                             ctx.recipe.claims, seed=ctx.recipe.seed)
    ctx.run_dir.write_results(ctx.results)
    if ran:
        ctx.clock("probe_s", t0)


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
