"""Probing a run's taps: the backbone tap, then every head tap (once per seed where there are several; with a
backbone tuned per seed, the backbone tap too), where the probe executor puts each probe (`pipeline.executors`: this
process, or shared out among several); the seeds' metrics aggregated (`aggregate_seeds`); then each head's buffer
verdict and the paper's questions answered (`probe_heads`, `answer_heads`). Every output goes to the record's one
writer (`ctx.record`) as it is made.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from headprobe.pipeline.taps import Tap, draw_resamples, head_taps, tap_intervals
from headprobe.recipe import RecipeError
from headprobe.record.writer import TapSummary
from headprobe.stats.bootstrap import PerUnit, SeedMean, n_units, seed_interval
from headprobe.stats.measures import TapMeasures


@dataclass(frozen=True)
class Probed:
    """What probing some units returns: whether any probe ran, and the measurements of every tap recorded so far
    (these units' and the earlier ones'; resumed, those of the earlier invocations too), each probe's output having
    gone to the record's writer as it finished."""

    ran: bool
    taps: dict[str, TapMeasures]


def probe_tap(ctx, features, tap: Tap, seed: int | None = None) -> float | None:
    """Every probe of the recipe at one tap, each output handed to the record as it finishes; returns the seconds
    probing took, None when every probe was recorded already (a resumed run does not redo them). With `seed` (a run
    with several seeds) the metrics go into taps[tap]["seeds"][seed], and `aggregate_seeds` makes the tap's own
    metrics from them. The probe executor (`ctx.probes`) decides where each probe runs."""
    t0 = ctx.probes.start_clock()
    probed = probe_units(ctx, features, [(tap, seed)])
    if seed is None:
        ctx.record.summary(tap_intervals(ctx, features, tap.name, probed.taps[tap.name]))
    return time.perf_counter() - t0 if probed.ran else None


def reuse_tap(ctx, source: Path, tap_name: str = "backbone") -> bool:
    """Take tap `tap_name`'s probes from the finished run in `source` instead of running them again: a sweep whose
    runs share the backbone, data, features, augmentation, probes and seed (`pipeline.BACKBONE_TAP_INPUTS`) measures
    the same backbone tap in each. Its metrics, protocols and per-image values are copied (intervals are recomputed
    from them on this run's resamples, which the same seed draws alike) and the tap records ``reused_from`` (the
    source run, relative to this one). Every process must see `source`; otherwise (or where `source` lacks the tap)
    nothing is taken and the tap is probed as usual. Returns whether it was taken."""
    import copy
    import os

    from headprobe.record.directory import metrics_from_json, read_results

    previous = read_results(source) if (source / "results.json").is_file() else {}
    entry = previous.get("taps", {}).get(tap_name)
    usable = entry is not None and set(ctx.recipe.probes) <= set(entry.get("protocol", {}))
    if not ctx.probes.all_agree(usable):
        return False
    entry = metrics_from_json({tap_name: copy.deepcopy(entry)})[tap_name]
    entry["reused_from"] = os.path.relpath(source.resolve(), ctx.record.path.resolve())
    ctx.record.reused_tap(tap_name, entry, source)
    return True


def probe_units(ctx, features, units: list[tuple[Tap, int | None]]) -> Probed:
    """Run every pending probe of each (tap, seed) unit, where the probe executor puts it, each output recorded
    (`RecordWriter.probe`); returns whether any probe ran and every tap's measurements (`Probed`)."""
    pending = []
    for tap, seed in units:
        done = ctx.record.open_unit(tap.name, tap.head, tap.depth, seed)
        pending.append([name for name in ctx.recipe.probes if name not in done])
    ctx.probes.run(ctx, features, units, pending, ctx.record)
    ctx.record.flush()  # the outputs still waiting for results.json (`RecordWriter.probe`)
    return Probed(any(pending), ctx.record.measures())


def aggregate_seeds(ctx, features, tap_name: str, measured: TapMeasures) -> TapSummary:
    """A tap probed once per seed: its metrics are the means over seeds (of the metrics every seed has), its
    per-unit values the seed means (recomputed statistics: the seed mean of each seed's replicates), and
    each uncertainty record adds the per-seed values, their standard deviation and a t interval over seeds (the
    interval itself where a metric has no per-unit values)."""
    from headprobe.stats.bootstrap import tap_uncertainty

    records = [measured.seeds[str(s)] for s in ctx.recipe.seed_list]
    names = [m for m in records[0].metrics if all(isinstance(r.metrics.get(m), (int, float)) for r in records)]
    metrics = {m: sum(r.metrics[m] for r in records) / len(records) for m in names}
    protocol = dict(records[0].protocol)  # the probes' settings and splits are the same for every seed
    per_seed = [r.per_unit for r in records]
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
    draw_resamples(ctx, features, combined)
    uncertainty = tap_uncertainty(metrics, combined, ctx.resamples)
    for m, record in uncertainty.items():
        values = [r.metrics[m] for r in records]
        spread = seed_interval(values)
        record |= {"per_seed": values, "sd_seeds": spread["sd_seeds"], "n_seeds": spread["n_seeds"],
                   "ci95_seeds": spread["ci95"]}
        if record["ci95"] is None:
            record["ci95"], record["method"] = spread["ci95"], spread["method"]
    return TapSummary(tap_name, uncertainty, metrics, protocol, combined)


def probe_heads(ctx, features, trained, backbone: bool = False) -> float | None:
    """Probe every tap of every head (once per seed when there are several), decide each head's verdict and answer
    the paper's questions (`answer_heads`); returns the seconds probing took (None when no probe ran). The probes
    of all the head taps (and with `backbone` the backbone tap's, first) go to the probe executor at once, so that
    several processes share them out."""
    units, compared = head_units(ctx, trained.by_seed, seeded=len(trained.by_seed) > 1)
    every = [(Tap("backbone"), None)] * backbone + units
    t0 = ctx.probes.start_clock()
    probed = probe_units(ctx, features, every)
    answer_heads(ctx, features, every, compared, probed.taps)
    return time.perf_counter() - t0 if probed.ran else None


def head_units(ctx, by_seed: dict, seeded: bool, tuned: bool = False) -> tuple[list[tuple[Tap, int | None]], dict]:
    """(the (tap, seed) units of every head's taps, {head: the tap its answers are read at (its output)}).
    by_seed: {seed: {head: state}} of the heads trained; seeded: the units carry their seed (a run with several);
    tuned: the backbone was tuned per seed, so the identity head (the backbone's own features) differs per seed
    too, where otherwise it is one unit."""
    units, compared = [], {}
    for spec in ctx.recipe.heads:
        first = next(iter(by_seed.values())).get(spec.name)
        chosen = None if first is None else _chosen_taps(spec, first.head)
        compared[spec.name] = spec.name if chosen is None else chosen[-1].name
        if first is None:  # the identity head
            tap = Tap(spec.name, spec.name, 0)
            units += [(tap, seed) for seed in by_seed] if seeded and tuned else [(tap, None)]
        elif spec.type == "pretrained":  # the checkpoint's own head: one module, not retrained per seed
            units += [(tap, None) for tap in chosen]
        else:
            seeds = {seed: _chosen_taps(spec, states[spec.name].head) for seed, states in by_seed.items()}
            units += [(taps[i], seed if seeded else None) for i in range(len(chosen)) for seed, taps in seeds.items()]
    return units, compared


def answer_heads(ctx, features, every: list[tuple[Tap, int | None]], compared: dict[str, str],
                 taps: dict[str, TapMeasures]) -> None:
    """After probing the units `every`: the intervals of every tap probed once (those computed next to its probes
    where the executor kept them) and the seed aggregates of those probed per seed (`aggregate_seeds`), then each
    head's buffer verdict and the paper's questions answered (`stats.claims`: results["claims"]), into the record.
    compared: {head: the tap it is compared at}; taps: every tap's measurements (`probe_units`)."""
    from headprobe.recipe.null_heads import is_null, null_of
    from headprobe.stats.claims import answer_questions
    from headprobe.stats.verdict import buffer_verdict

    record = ctx.record
    for tap, seed in every:  # on every process: each verdict resamples them
        measured = taps[tap.name] if seed is None else taps[tap.name].seeds[str(seed)]
        draw_resamples(ctx, features, measured.per_unit)
    once, averaged = [], []
    for tap, seed in every:
        names = once if seed is None else averaged
        if tap.name not in names:
            names.append(tap.name)
    computed = []
    for name in once:
        known = ctx.probes.probed_intervals(name, taps[name].metrics)
        if known is None:
            computed.append(name)
        else:
            record.summary(TapSummary(name, known), write=False)
    ctx.probes.summaries(computed, lambda name: tap_intervals(ctx, features, name, taps[name]), record)
    aggregates = ctx.probes.summaries(averaged, lambda name: aggregate_seeds(ctx, features, name, taps[name]), record)
    # A tap probed per seed is compared at its seeds' means.
    taps = taps | {s.tap: dataclasses.replace(taps[s.tap], metrics=s.metrics, per_unit=s.per_unit,
                                              protocol=s.protocol) for s in aggregates}
    buffer = {head: dataclasses.replace(buffer_verdict(taps, tap, ctx.resamples), tap=None if tap == head else tap)
              for head, tap in compared.items()}
    # The paper's questions, each answered from its primary measure with an interval over seeds and test images.
    # Null heads are nulls on a frozen backbone; on a tuned one a `type: random` head trains the backbone like any.
    frozen, heads = ctx.recipe.backbone.tune == "frozen", ctx.recipe.heads
    nulls = {spec.name: null for spec in heads if frozen and (null := null_of(heads, spec.name))}
    claims = answer_questions(taps, ctx.resamples, compared, ctx.recipe.claims, seed=ctx.recipe.seed,
                              nulls=nulls, null_heads=tuple(s.name for s in heads if frozen and is_null(s)))
    record.put("buffer", buffer, merge=True, write=False)
    record.put("claims", claims)  # the geometry stage's answers join them after (`pipeline.compose`)


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
