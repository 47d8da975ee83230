"""What processes exchange: numbers of one training step over the processes that split its batch (the tuned path's
DDP ranks), the k-NN bank's partial neighbours (`probes.sharded_knn`) and the probes' results (`taps`).

With ``world == 1`` (the cached path, where every process holds the whole batch) none of them communicates.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def mean_over_ranks(values: list[float], device, world: int) -> list[float]:
    """The mean of each number over the `world` processes (float64 all-reduce)."""
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t / world).tolist()


def all_rows(h: torch.Tensor, world: int) -> torch.Tensor:
    """h: (b, d) on each of `world` processes → (world·b, d), the rows of every process in rank order."""
    if world == 1:
        return h
    parts = [torch.empty_like(h) for _ in range(world)]
    dist.all_gather(parts, h.contiguous())
    return torch.cat(parts)


def all_finite(losses: list[torch.Tensor], world: int) -> list[bool]:
    """Whether each loss is finite on every process (every process must agree to stop), read from the device at
    once: one synchronisation per training step, not one per head."""
    if not losses:  # nothing training (on every process alike)
        return []
    flags = torch.stack([torch.isfinite(loss.detach()).reshape(()) for loss in losses]).float()
    if world > 1:
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    return [bool(flag) for flag in flags.tolist()]


def sum_over_ranks(value: int, world: int, device="cpu") -> int:
    """The sum of an integer over the `world` processes (`device`: where the backend reduces, CUDA for NCCL)."""
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t)
    return int(t.item())


def max_over_ranks(value: int, world: int, device="cpu") -> int:
    """The largest value of an integer over the `world` processes."""
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def all_objects(obj, world: int) -> list:
    """Any picklable value from each of `world` processes → the list of them in rank order, on every process."""
    if world == 1:
        return [obj]
    parts: list = [None] * world
    dist.all_gather_object(parts, obj)
    return parts


def broadcast_buffers(modules, world: int) -> None:
    """Every rank takes rank 0's buffers (BatchNorm running statistics) of `modules`, in place. Under DDP each rank
    updates its BatchNorm running statistics from its own share of the batch and DDP re-broadcasts them only at the
    start of the next forward, so after the last step the ranks' copies differ: a tap scored on rank 1 would not be
    the tap rank 0 checkpoints, and which rank scores it depends on timing (the probe executor's load balancing)."""
    if world <= 1:
        return
    import torch.distributed as dist

    for module in modules:
        for buffer in module.buffers():
            dist.broadcast(buffer.data, src=0)
