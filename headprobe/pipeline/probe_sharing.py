"""The probes of a multi-process run, shared out among the processes (the DINOv2 evaluation code is the anchor).

W processes (torchrun, `accelerate launch`) hold the same features. Two kinds of sharing, both giving the
one-process numbers:

- a probe that declares it shards its bank (`Probe.shards_bank`: the k-NN) runs on a large bank (its option
  `shard_bank`, `shard_knn_bank`) on every process at once, each over its 1/W of the training bank, the partial
  top-k lists merged (`probes.sharded_knn`): the same predictions, 1/W of the similarity work and of its memory
  (the normalised bank, the score blocks) on each process (the features themselves are held whole by every
  process, as for every probe);
- every other (tap, seed, probe) is run by one process (`share_of_probes`): the longest first, each to the process
  with the least work so far, by the time that probe took on an earlier tap (by the probe's declared cost prior,
  `probes.declaration.Probe.cost`, before any was).

Each process then records every probe's output, in the one-process order, from an all-gather, so every process
holds the same results and the main one writes them. Each probe's 95% intervals are computed by the process that
ran it, next to it (`SharedProbes.probed_intervals`); `SharedProbes.summaries` shares out what is left (seed
aggregates, resumed taps) tap by tap.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext

from headprobe.parallel.collectives import all_objects
from headprobe.parallel.counter import SharedCounter
from headprobe.pipeline.taps import draw_resamples, run_probes
from headprobe.probes.declaration import declared_probe
from headprobe.record.writer import RecordWriter, TapSummary
from headprobe.report.progress import FollowedCount
from headprobe.stats.bootstrap import tap_uncertainty

# From this many training rows the k-NN bank is sharded across processes by default (`shard_knn_bank`).
SHARD_BANK_ROWS = 65_536


def shard_knn_bank(shard_bank: bool | None, n_train: int) -> bool:
    """Whether the processes run each k-NN (a probe that shards its bank) together over 1/W of the bank each: its
    option `shard_bank` (`probes.knn.shard_bank`), or when null, from SHARD_BANK_ROWS training rows.

    Why not always: on a small bank each process's part costs nearly what the whole does (fixed costs: norms,
    certification, merging), so W synchronised k-NNs over 1/W each are slower than one whole k-NN per tap dealt to
    one process (figures: `benchmarks/README.md`, "Measurements quoted by the modules").
    """
    return n_train >= SHARD_BANK_ROWS if shard_bank is None else shard_bank


def prior_costs(names: list[str]) -> dict[str, float]:
    """The cost estimates before any probe is timed: each probe's declared cost prior (seconds per tap, k-NN = 1;
    `probes.declaration.Probe.cost`, measured in benchmarks/results/probe_costs.json)."""
    return {name: declared_probe(name).cost for name in names}


def share_of_probes(pending: list[list[str]], order: list[str], rank: int, world: int,
                    costs: dict[str, float] | None = None) -> dict[int, list[str]]:
    """The probes process `rank` of `world` runs: {unit index: [probe names, in `order`]}, from each unit's
    pending probes.

    Without `costs` the (unit, probe) pairs are taken probe by probe (in `order`, the recipe's) and dealt
    round-robin, so each process gets every probe's units in turn. With `costs` (seconds per probe name, measured
    on an earlier tap; a probe not yet timed costs the mean of those that were) the pairs go longest first, each
    to the process with the least estimated work so far (ties: the lower rank) -- the LPT rule, within 4/3 of the
    best split.

    >>> share_of_probes([["linear", "knn"], ["linear", "knn"]], ["linear", "knn"], rank=1, world=2)
    {1: ['linear', 'knn']}
    >>> share_of_probes([["linear", "knn"]] * 3, ["linear", "knn"], 0, 2, costs={"linear": 3.0, "knn": 1.0})
    {0: ['linear'], 2: ['linear']}
    """
    pairs = [(i, name) for name in order for i, names in enumerate(pending) if name in names]
    if costs:
        default = sum(costs.values()) / len(costs)
        load = [0.0] * world
        owner = {}
        for i, name in sorted(pairs, key=lambda pair: -costs.get(pair[1], default)):  # stable: recipe order
            r = min(range(world), key=lambda p: (load[p], p))
            load[r] += costs.get(name, default)
            owner[(i, name)] = r
        chosen = [pair for pair in pairs if owner[pair] == rank]
    else:
        chosen = pairs[rank::world]
    mine: dict[int, list[str]] = {}
    for i, name in sorted(chosen, key=lambda pair: (pair[0], order.index(pair[1]))):
        mine.setdefault(i, []).append(name)
    return mine


class SharedProbes:
    """The probe executor of W processes (`executors.ProbeExecutor`): the k-NN on a large bank run together, every
    other (tap, seed, probe) by one process, every output recorded on every process in the one-process order.
    `seconds`: what each probe took on the first tap that ran it, by which the later shares are dealt (the same on
    every process: they come from the all-gather); `intervals`: those computed next to each probe, by tap."""

    backbone_with_heads = True

    def __init__(self, state) -> None:

        self.state = state
        self.seconds: dict[str, float] = {}
        self.intervals: dict[str, dict] = {}
        # The probes finished so far on every process, one count per probing stage (`run`), which the main process
        # shows while it works and waits (`report.progress.FollowedCount`).
        self.counter = SharedCounter(state.process_index, state.num_processes)
        self.stages = 0

    def start_clock(self) -> float:
        """A process still finishing the stage before (its start-up or training, which are not synchronised) would
        otherwise have its lag counted as probing."""
        self.state.wait_for_everyone()
        return time.perf_counter()

    def all_agree(self, flag: bool) -> bool:
        return all(all_objects(flag, self.state.num_processes))

    def run(self, ctx, features, units: list, pending: list[list[str]], record: RecordWriter) -> None:
        """Run the pending probes of `units` ((tap, seed) pairs) on W processes together and record all of them on
        every process; results.json and the per-unit stores are written once, at the end."""

        def intervals(out, seed: int | None) -> dict:
            """Per metric, so each process computes those of the probes it ran, in parallel. Only for a tap probed
            once: a tap probed per seed gets its intervals from the seed means (`probing.aggregate_seeds`)."""
            if seed is not None:
                return {}
            draw_resamples(ctx, features, out.per_unit)
            return tap_uncertainty(out.metrics, out.per_unit, ctx.resamples)

        world, rank = self.state.num_processes, self.state.process_index
        order = list(ctx.recipe.probes)
        together = {name for name in order if declared_probe(name).shards_bank
                    and shard_knn_bank(ctx.recipe.probes[name].shard_bank, len(features.train.labels))}
        costs = self.seconds
        count, self.stages = f"probes-{self.stages}", self.stages + 1
        total = sum(len(names) for names in pending)
        with ctx.progress() as progress, self._followed(ctx, progress, len(units), total, count):
            outputs = []  # (unit index, probe, output, the process that ran it: "all" for a probe run together)
            for i, names in enumerate(pending):  # the same units in the same order on every process
                todo = [name for name in names if name in together]
                if todo:
                    tap, seed = units[i]
                    for name, out in run_probes(ctx, features, tap, seed, todo, processes=(rank, world)):
                        outputs.append((i, name, out, "all", intervals(out, seed)))
                        self.counter.add(count, int(rank == 0))  # run by all, counted once
            dealt = [[name for name in names if name not in together] for names in pending]
            timed = all(name in costs for names in dealt for name in names)
            estimates = dict(costs) if timed else prior_costs(order)
            mine = share_of_probes(dealt, order, rank, world, costs=estimates)
            finished, failure = [], None
            try:
                for i, names in mine.items():
                    tap, seed = units[i]
                    # A unit's probes in one run_probes: its tap data (the head's layers over every feature) made once.
                    t0 = time.perf_counter()
                    for name, out in run_probes(ctx, features, tap, seed, names):
                        uncertainty = intervals(out, seed)  # part of the pair's cost, as before
                        finished.append((i, name, out, uncertainty, time.perf_counter() - t0))
                        self.counter.add(count, 1)
                        t0 = time.perf_counter()
            except Exception as err:  # sent to every process, so that none waits forever for this one
                failure = err
            shares = all_objects((finished, None if failure is None else f"{type(failure).__name__}: {failure}"),
                                 world)
        if failure is not None:
            raise failure
        failed = [(r, message) for r, (_, message) in enumerate(shares) if message is not None]
        if failed:  # inside ctx.stage, so that the main process records it in results.json
            with ctx.stage("running the probes shared among the processes"):
                _raise_failure(*failed[0])
        for r, (share, _) in enumerate(shares):
            for i, name, out, uncertainty, seconds in share:
                outputs.append((i, name, out, r, uncertainty))
                costs.setdefault(name, seconds)  # the first tap's time: later taps of a run are alike
        for i, name, out, process, uncertainty in sorted(outputs, key=lambda item: (item[0], order.index(item[1]))):
            tap, seed = units[i]
            record.probe(tap.name, seed, name, out, process, write=False)
            if seed is None:  # a tap probed once: `probed_intervals` makes its intervals from these
                self.intervals.setdefault(tap.name, {}).update(uncertainty)
        if outputs:
            record.write()  # results.json after the per-unit stores of every probe just recorded

    def _followed(self, ctx, progress, n_units: int, total: int, count: str):
        """The main process's display of the whole stage: done/total over every process (`count`), followed while
        the probes run and the processes exchange them; nothing to follow on the others or with nothing to run."""


        if not (ctx.show and total):
            return nullcontext()
        task = progress.add_task(f"probing {n_units} tap{'s' if n_units > 1 else ''}", total=total)
        return FollowedCount(progress, task, total, lambda: self.counter.read(count))

    def probed_intervals(self, tap: str, metrics: dict) -> dict | None:
        """A tap's intervals from those computed next to each of its probes, where every metric has one (a resumed
        run's earlier probes have none): the records `probing.tap_intervals` would make, in its order."""
        known = self.intervals.get(tap, {})
        if not set(metrics) <= set(known):
            return None
        return {metric: known[metric] for metric in metrics}

    def summaries(self, tap_names: list[str], compute: Callable[[str], TapSummary], record: RecordWriter
                  ) -> list[TapSummary]:
        """compute(tap) for every tap, its work shared among the processes: each computes its share of the taps
        (`tap_names[rank::world]`) and sends the summaries to the others; every process records all of them and
        returns them."""
        world, rank = self.state.num_processes, self.state.process_index
        mine = [compute(name) for name in tap_names[rank::world]]
        done = [summary for part in all_objects(mine, world) for summary in part]
        for summary in done:
            record.summary(summary, write=False)
        return done


def _raise_failure(process: int, message: str) -> None:
    raise RuntimeError(f"process {process} failed ({message}); every process stops.")
