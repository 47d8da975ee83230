"""How images reach the backbone: the DataLoader's worker processes, pinned memory and prefetching.

``features.num_workers: null`` (the default) chooses the worker count from the machine and the device
(`auto_workers`): decoding and augmenting then run in worker processes while the main process runs the backbone.
Results do not depend on the worker count: each item is a pure function of its index (view k of image i is
f(seed, i, k), see `data.augment.sample_params`), and a DataLoader returns batches in index order whatever the
number of workers.
On CUDA, batches are copied into pinned memory (so the host-to-device copy can overlap the forward) and each
worker prefetches `PREFETCH_FACTOR` batches ahead.
"""

from __future__ import annotations

import os

import torch

__all__ = ["MAX_AUTO_WORKERS", "PREFETCH_FACTOR", "ImageDecodeError", "auto_workers", "cpus_available",
           "loader_options", "pipeline_record", "resolve_workers"]

MAX_AUTO_WORKERS = 8  # past ~8 decoders a single backbone is rarely waiting on the input
PREFETCH_FACTOR = 4  # batches each worker keeps ready; torch's default is 2


class ImageDecodeError(ValueError):
    """An image file that cannot be decoded. Raised in a worker process, torch re-raises it in the main process as
    ``ImageDecodeError("Caught ImageDecodeError in DataLoader worker process 0. Original Traceback ...")``; the
    constructor keeps only the original sentence, so the user reads the same message with or without workers."""

    def __init__(self, message: str) -> None:
        if "Original Traceback" in message:
            message = message.rstrip().splitlines()[-1].partition(": ")[2] or message
        super().__init__(message)


def cpus_available() -> int:
    """The CPUs this process may use: its affinity mask (which schedulers and containers restrict) capped by its
    cgroup CPU quota (`parallel.threads.usable_cpus`), not the machine's count."""
    from ..parallel.threads import usable_cpus

    return usable_cpus()[0]


def auto_workers(cpus: int | None = None, local_processes: int | None = None,
                 device: torch.device | str = "cpu") -> int:
    """The worker count chosen for ``num_workers: null``, from the CPUs per local process (c):

    - on a GPU, min(8, c − 1): the forward runs on the GPU, so every CPU but the main process's can decode;
    - on the CPU, min(8, c // 4): the forward itself needs the CPUs, and decoding in the main process costs little
      beside it while the CPUs are few (on 2 shared cores 0 workers ran at 1.01x the bare forward and 1 worker at
      0.98x of 0 workers: `benchmarks/results/extract.json`); with many CPUs the forward gets faster and the serial
      decoding does not, so a quarter of them decode.

    `local_processes` defaults to ``LOCAL_WORLD_SIZE`` (set by torchrun and accelerate), so the processes of one
    node share its CPUs.
    """
    cpus = cpus_available() if cpus is None else cpus
    if local_processes is None:
        local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    per_process = cpus // max(1, local_processes)
    workers = per_process - 1 if torch.device(device).type == "cuda" else per_process // 4
    return max(0, min(MAX_AUTO_WORKERS, workers))


def resolve_workers(requested: int | None, device: torch.device | str = "cpu") -> int:
    """`requested` (a recipe's ``features.num_workers``) as a worker count: None → `auto_workers` for `device`."""
    if requested is None:
        return auto_workers(device=device)
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
        raise ValueError(f"features.num_workers = {requested!r}: give a worker count >= 0, or null to choose it "
                         "from the machine.")
    return requested


def loader_options(requested: int | None, device: torch.device | str, *, persistent: bool = False) -> dict:
    """Keyword arguments for `torch.utils.data.DataLoader`: the worker count, pinned memory on CUDA, prefetching
    with workers, and `persistent_workers` when the caller iterates the same loader more than once."""
    workers, cuda = resolve_workers(requested, device), torch.device(device).type == "cuda"
    options: dict = {"num_workers": workers, "pin_memory": cuda}
    if workers:
        options |= {"prefetch_factor": PREFETCH_FACTOR, "persistent_workers": persistent}
    return options


def pipeline_record(requested: int | None, device: torch.device | str) -> dict:
    """What `protocol.features` records about the input pipeline (results do not depend on it)."""
    options = loader_options(requested, device)
    return {"num_workers": options["num_workers"],
            "num_workers_rule": "requested" if requested is not None else
            f"auto: min({MAX_AUTO_WORKERS}, {'CPUs - 1' if torch.device(device).type == 'cuda' else 'CPUs // 4'}) per "
            f"local process, with {cpus_available()} CPUs available",
            "pin_memory": options["pin_memory"], "prefetch_factor": options.get("prefetch_factor")}
