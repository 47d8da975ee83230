"""The training seeds of a multi-process run on the cached path, shared out among the processes.

On the cached (frozen-backbone) path every process holds the whole view cache, and a seed's heads train exactly as
in one process (`train.CachedSteps.world == 1`). With several seeds, process r trains seeds r, r + W, ... instead of
every process training every seed; then the processes exchange what each trained (the heads' weights, status, loss
and history, the training summary, the logged records), so every process holds every seed's heads, as before, and
the main process writes the other processes' records to metrics.jsonl. Each seed is trained once, by one process,
with the same weights as one process gives (with the same thread count: BLAS sums depend on it).

Each process writes its own seeds' checkpoints into the run directory when it sees it (one machine, or a shared
file system; `SharedSeeds.writes_checkpoints`), so `--resume` resumes every seed; a process that does not see it
writes none, and `--resume` trains its seeds again from the start, to the same weights.
"""

from __future__ import annotations

import time

from headprobe.parallel.collectives import all_objects
from headprobe.record.writer import RecordWriter
from headprobe.train.engine import HeadState, build_head

__all__ = ["SharedSeeds", "portable_states", "restore_states", "seeds_of_process"]


def seeds_of_process(seeds: list[int], rank: int, world: int) -> list[int]:
    """The seeds process `rank` of `world` trains: every W-th, from its rank.

    >>> seeds_of_process([0, 1, 2], 0, 2), seeds_of_process([0, 1, 2], 1, 2)
    ([0, 2], [1])
    """
    return seeds[rank::world]


def portable_states(states: dict) -> dict:
    """Trained `HeadState`s → plain data (CPU state dicts and numbers) that can be sent to another process."""
    def weights(module):
        return None if module is None else {k: v.detach().cpu() for k, v in module.state_dict().items()}

    return {name: {"head": weights(s.head), "predictor": weights(s.predictor), "status": s.status,
                   "message": s.message, "last_loss": s.last_loss, "history": s.history}
            for name, s in states.items()}


def restore_states(specs, dim: int, seed: int, portable: dict) -> dict:
    """`portable_states` → `HeadState`s: each head rebuilt from its spec (`engine.build_head`), its trained weights
    loaded, in eval mode on the CPU as training leaves it. There is no optimiser: the head is trained."""

    states = {}
    for spec in specs:
        if spec.name not in portable:
            continue
        entry = portable[spec.name]
        head, predictor = build_head(spec, dim, seed)
        head.load_state_dict(entry["head"])
        if predictor is not None:
            predictor.load_state_dict(entry["predictor"])
        state = HeadState(spec.name, head, predictor, None, None, status=entry["status"], message=entry["message"],
                          history=entry["history"])
        state.last_loss = entry["last_loss"]
        state.modules().eval()
        states[spec.name] = state
    return states


class SharedSeeds:
    """The seed executor of W processes (`executors.SeedExecutor`): with several seeds, each trained by one process
    (`seeds_of_process`) and exchanged; with one, every process trains it, as one process does."""

    def __init__(self, state) -> None:
        self.state = state

    def writes_checkpoints(self, seeds: list[int], record: RecordWriter) -> bool:
        """With the seeds shared out, each process writes its own seeds' checkpoints into the main process's run
        directory when it sees that directory (one machine, or a shared file system) and the main one writes files."""
        if len(seeds) < 2:
            return record.writable
        return all_objects(record.writable, self.state.num_processes)[0] and record.path.is_dir()

    def stage_seconds(self, seeds: list[int], seconds: dict[int, float]) -> float:
        """The processes trained their seeds side by side: the stage took the longest process's time."""
        world = self.state.num_processes
        if len(seeds) < 2:
            return sum(seconds.values())
        return max(sum(seconds[s] for s in seeds_of_process(seeds, r, world)) for r in range(world))

    def train(self, ctx, seeds: list[int], specs, dim: int, train_one, log) -> dict:
        """{seed: (head states, summary)} for every seed, each trained by one process (one seed: by every process).

        `train_one(seed, log)` trains one seed and returns (states, summary); `log(record, seed)` writes a record
        (the main process's `RecordWriter.log`). A failure on any process is sent to every process, so none waits
        forever for the exchange, and raised on each."""
        if len(seeds) < 2:
            return {seed: train_one(seed, lambda entry, seed=seed: log(entry, seed)) for seed in seeds}
        world, rank = self.state.num_processes, self.state.process_index
        main = self.state.is_main_process
        local, trained, records, failure = {}, {}, [], None
        try:
            for seed in seeds_of_process(seeds, rank, world):
                def keep(record: dict, seed: int = seed) -> None:
                    if main:
                        log(record, seed)
                    else:  # written by the main process after the exchange, with the time it was logged
                        records.append((seed, {"time": round(time.time(), 3), **record}))

                local[seed] = train_one(seed, keep)
                trained[seed] = (portable_states(local[seed][0]), local[seed][1])
        except Exception as err:  # sent to every process, so that none waits forever for this one
            failure = err
        shares = all_objects((trained, records, None if failure is None else f"{type(failure).__name__}: {failure}"),
                             world)
        if failure is not None:
            raise failure
        failed = [(r, message) for r, (*_, message) in enumerate(shares) if message is not None]
        if failed:  # inside ctx.stage, so that the main process records it in results.json
            with ctx.stage("training the seeds shared among the processes"):
                _raise_failure(*failed[0])
        out = dict(local)
        for r, (share, logged, _) in enumerate(shares):
            for seed, (portable, summary) in share.items():
                if r != rank:
                    out[seed] = (restore_states(specs, dim, seed, portable), summary)
            if main and r != rank:
                for seed, record in logged:
                    log(record, seed)
        return {seed: out[seed] for seed in seeds}


def _raise_failure(process: int, message: str) -> None:
    raise RuntimeError(f"process {process} failed while training its seeds ({message}); every process stops.")
