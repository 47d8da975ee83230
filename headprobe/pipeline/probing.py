"""Probing a run's taps: the backbone tap, then every head tap (once per seed where there are several), on this
process or shared out among several (`pipeline.probe_sharing`); the seeds' metrics aggregated
(`aggregate_seeds`); then each head's buffer verdict and the paper's questions answered (`probe_heads`).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from headprobe.pipeline.taps import (
    Tap,
    draw_resamples,
    head_taps,
    pending_probes,
    record_probe,
    record_uncertainty,
    run_probes,
    unit_key,
)
from headprobe.recipe import RecipeError
from headprobe.stats.bootstrap import PerUnit, SeedMean, load_per_unit, n_units, seed_interval


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
        draw_resamples(ctx, features, ctx.per_unit[unit_key(tap, seed)])
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
