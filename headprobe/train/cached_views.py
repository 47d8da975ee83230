"""Train projection heads on cached view features (frozen backbone): the cached step source of `engine`.

All heads of a recipe train in one loop on the same batches (`engine.batch_for_step`), each with its own
optimiser, so each head gets exactly the batches it would get if trained alone (its initialisation is seeded by
(seed, head name), not by the order in which heads are built), and a head whose loss becomes NaN/inf stops alone.

On the cached path every process trains the heads on the full global batch: the backbone forwards (the expensive
part) are sharded across processes, head training is cheap, and replicating it makes multi-process numbers
identical to single-process ones without a cross-process BatchNorm (which torch does not offer on CPU).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from headprobe.features.cache import as_float32
from headprobe.features.tensor_file import gather_rows, is_mapped, mean_over_rows
from headprobe.registry import OBJECTIVES
from headprobe.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from headprobe.train.engine import (
    HeadState,
    Optimisation,
    StepOutput,
    batch_for_step,
    build_head,
    collapse_stats,
    lr_schedule,
    make_optimizer,
    objective_loss,
    run_training,
    steps_of,
)
from headprobe.train.heads import ProjectionHead, freeze_unidentified_bias

__all__ = ["CheckpointError", "CachedSteps", "HeadState", "batch_for_step", "build_head", "collapse_stats",
           "head_taps", "latest_checkpoint", "load_checkpoint", "make_states", "train_heads"]


def make_states(specs, in_dim: int, train, total_steps: int, seed: int) -> dict[str, HeadState]:
    """One `HeadState` per head of `specs` with weights, each with its own optimiser and schedule over
    `total_steps` updates (the identity head has nothing to train and is left out)."""
    states = {}
    for spec in specs:
        head, predictor = build_head(spec, in_dim, seed)
        params = list(head.parameters()) + (list(predictor.parameters()) if predictor is not None else [])
        if not params:
            continue
        optimizer = make_optimizer(params, train)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(train, total_steps))
        states[spec.name] = HeadState(spec.name, head, predictor, optimizer, scheduler)
    return states


class CachedSteps:
    """Step s → the cached features of its images' two views: ``views[idx, v1]``, ``views[idx, v2]``, (B, D)."""

    world = 1  # every process holds the whole batch

    def __init__(self, views: torch.Tensor, *, objective, objective_options: dict, batch_size: int, seed: int,
                 device: torch.device) -> None:
        self.views, self.objective, self.options = views, objective, objective_options
        self.batch_size, self.seed, self.device = batch_size, seed, device

    def first_views(self) -> tuple[torch.Tensor, torch.Tensor]:
        n, k, _ = self.views.shape
        idx, v1, _ = batch_for_step(0, n, k, self.batch_size, self.seed)
        return (as_float32(gather_rows(self.views, idx, v1), self.device),
                as_float32(mean_over_rows(self.views), self.device))

    def batches(self, steps: range):
        return ((step, None) for step in steps)

    def running(self):
        return contextlib.nullcontext()

    def forward(self, step: int, batch, states: list[HeadState]) -> StepOutput:
        n, k, _ = self.views.shape
        idx, v1, v2 = batch_for_step(step, n, k, self.batch_size, self.seed)
        # A mapped view cache (`tensor_file`) stays on disk: each batch reads its 2·B rows, which then go to the
        # device; the memory held is the batch's, not the cache's.
        # A float16/bfloat16 cache (features.store_dtype) is upcast here, batch by batch.
        z1, z2 = (gather_rows(self.views, idx, v).to(self.device, torch.float32, non_blocking=True) for v in (v1, v2))
        losses = {}
        for state in states:
            state.modules().train()
            # every process holds the whole batch here: nothing to gather
            losses[state.name] = objective_loss(self.objective, self.options, state, z1, z2, gather_distributed=False)
        return StepOutput(z1, z2, losses)

    def finish(self) -> None:
        pass


def train_heads(
    specs,
    views: torch.Tensor,
    *,
    objective_name: str,
    objective_options: dict,
    train,
    seed: int,
    checkpoint_dir: Path | None = None,
    resume_from: Path | None = None,
    log=None,
    progress=None,
    track=None,
    device: torch.device | str | None = None,
) -> tuple[dict[str, HeadState], dict]:
    """Train every head in `specs` on `views` (N, K, D); returns the head states and a training summary.

    `log(record)` receives one record per head every `train.log_every` steps. A head whose loss
    becomes NaN/inf stops with a message, keeps its last good weights, and the others go on.
    `track` (a `GeometrySpec`) with `track_every` set logs curvature snapshots ("stage": "geometry"):
    λ_min/λ_max of the loss Hessian w.r.t. the current representation batch, taken before the step.
    """

    n, _, dim = views.shape
    per_epoch, total = steps_of(train, n)
    states = make_states(specs, dim, train, -(-total // train.grad_accum), seed)
    objective = OBJECTIVES.get(objective_name)
    frozen = [name for name, state in states.items() if freeze_unidentified_bias(state.head, objective)]
    # Train where the process's accelerator is; the heads come back to the CPU, where the features live.
    # Mapped views stay mapped (each batch is copied to the device); the others move there whole.
    device = torch.device(device) if device is not None else views.device
    views = views if is_mapped(views) else views.to(device)
    for state in states.values():
        state.modules().to(device)
    groups = [Optimisation(name, [s], s.optimizer, s.scheduler, torch.amp.GradScaler(device.type, enabled=False))
              for name, s in states.items()]
    source = CachedSteps(views, objective=objective, objective_options=objective_options,
                         batch_size=train.batch_size, seed=seed, device=device)
    states, summary = run_training(
        source, groups, specs, objective_name=objective_name, objective_options=objective_options, train=train,
        seed=seed, total=total, per_epoch=per_epoch, label=f"train {len(states)} heads",
        checkpoint_dir=checkpoint_dir, resume_from=resume_from, log=log, progress=progress, track=track)
    if frozen:
        summary["output_bias_kept"] = frozen
    return states, summary


@torch.no_grad()
def head_taps(head: ProjectionHead, features: torch.Tensor, batch_size: int = 4096) -> list[torch.Tensor]:
    """features: (N, D) → the head's taps in eval mode, [(N, w_1), ..., (N, out_dim)]."""
    head.eval()
    outs: list[list[torch.Tensor]] = []
    for start in range(0, len(features), batch_size):
        outs.append(head.taps(features[start : start + batch_size]))
    return [torch.cat([o[i] for o in outs]) for i in range(head.depth)] if outs else []
