"""The one training loop of projection heads, for the cached path (`train`) and the tuned path (`train_tuned`).

Step s of every run uses images ``perm(seed, epoch)[b·B:(b+1)·B]`` and two distinct views per image drawn from a
generator seeded by (seed, s) (`batch_for_step`): the schedule is a pure function of the step, so a resumed run
continues exactly where it stopped. Where the step's representations come from is the caller's `StepSource`:
indexing cached view features, or views made on the fly and passed through a tuned backbone. What updates the
weights is a list of `Optimisation`s: one per head on the cached path (each head trains as if alone and stops
alone on a NaN loss), or one joint optimiser of backbone and heads on the tuned path (one backward pass through
the summed loss; a NaN stops every head). Both share the schedule (linear warm-up, then cosine or constant),
gradient accumulation, the logging cadence and records, the last-good snapshots a NaN restores, curvature
tracking, the step-0 collapse check, checkpoints (`headprobe.train.checkpoint`) and the summary.

Several heads train in one loop over the same cached batches rather than one training run each: one run with 5
heads took 1/3.1 of 5 single-head runs, and the shared loop costs nothing over separate ones (1.03x;
`benchmarks/bench_multihead.py`, `benchmarks/results/multihead.json`).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import math
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from headprobe.geometry.collapse import check_collapsed_start
from headprobe.parallel.collectives import all_finite, all_rows, mean_over_ranks
from headprobe.parallel.signals import atomic_step
from headprobe.registry import OBJECTIVES
from headprobe.train.checkpoint import load_trainable_state, restore_checkpoint, save_checkpoint, trainable_state
from headprobe.train.curvature import track_curvature, tracked_stat_rows
from headprobe.train.heads import Predictor, ProjectionHead, registered_head
from headprobe.train.stats import collapse_stats, update_stats  # noqa: F401  (train.py re-exports collapse_stats)


def seed_of(*parts: object) -> int:
    """A 63-bit seed that depends only on `parts` (sha256 of their repr), e.g. ``seed_of(seed, "views", step)``."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & ((1 << 63) - 1)


def steps_of(train, n: int) -> tuple[int, int]:
    """(steps per epoch, total steps) of `train` (a `TrainSpec`) on n training images."""
    if n < train.batch_size:
        raise ValueError(f"train.batch_size = {train.batch_size} is larger than the {n} training images; "
                         "lower train.batch_size or raise data.limit.train.")
    per_epoch = n // train.batch_size
    return per_epoch, train.steps if train.steps is not None else train.epochs * per_epoch


def lr_schedule(train, total: int):
    """The learning-rate factor of optimiser update u (`LambdaLR`): linear warm-up, then cosine to 0 or constant."""
    def factor(step: int) -> float:
        if step < train.warmup_steps:
            return (step + 1) / train.warmup_steps
        if train.schedule == "constant":
            return 1.0
        progress = (step - train.warmup_steps) / max(1, total - train.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def make_optimizer(params, train) -> torch.optim.Optimizer:
    """`train.optimizer` ("sgd" or AdamW) over `params` (tensors or parameter groups)."""
    if train.optimizer == "sgd":
        return torch.optim.SGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    return torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay)


@functools.lru_cache(maxsize=2)
def _epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The image order of one epoch, drawn once per epoch rather than at every step (O(N) each)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed_of(seed, "epoch", epoch)))


def batch_for_step(step: int, n: int, views: int, batch_size: int, seed: int) -> tuple[torch.Tensor, ...]:
    """(image indices (B,), first views (B,), second views (B,)) of one step; two distinct views per image."""
    per_epoch = n // batch_size
    epoch, b = divmod(step, per_epoch)
    perm = _epoch_permutation(n, seed, epoch)
    idx = perm[b * batch_size : (b + 1) * batch_size]
    g = torch.Generator().manual_seed(seed_of(seed, "views", step))
    v1 = torch.randint(views, (len(idx),), generator=g)
    v2 = (v1 + 1 + torch.randint(views - 1, (len(idx),), generator=g)) % views
    return idx, v1, v2


def build_head(spec, in_dim: int, seed: int) -> tuple[ProjectionHead, Predictor | None]:
    """A head (and predictor) whose initial weights depend only on (seed, spec.name), built by the function the
    HEADS registry holds for its type (a plug-in's too)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_of(seed, "head", spec.name))
        head = registered_head(spec, in_dim)
        predictor = Predictor(head.out_dim, spec.predictor) if spec.predictor else None
    return head, predictor


@dataclass
class HeadState:
    """One head in training: modules, the optimiser and schedule that update it, and what happened to it."""

    name: str
    head: ProjectionHead
    predictor: Predictor | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    status: str = "training"
    message: str = ""
    _last_loss: float | torch.Tensor = field(default=float("nan"), repr=False)
    last_good: dict | None = None
    history: list[dict] = field(default_factory=list)

    @property
    def last_loss(self) -> float:
        """The loss of the last step. Set as a tensor every step and read as a float only when asked: an `.item()`
        per head per step would make the host wait for a GPU at every step, which a plain training loop never does."""
        if isinstance(self._last_loss, torch.Tensor):
            self._last_loss = self._last_loss.item()
        return self._last_loss

    @last_loss.setter
    def last_loss(self, value: float | torch.Tensor) -> None:
        self._last_loss = value.detach() if isinstance(value, torch.Tensor) else value

    def modules(self) -> nn.ModuleList:
        return nn.ModuleList([m for m in (self.head, self.predictor) if m is not None])

    def has_weights(self) -> bool:
        """False for the identity head: nothing to train, track or probe inside it."""
        return any(True for _ in self.head.parameters())


def objective_loss(objective, options: dict, state: HeadState, z1: torch.Tensor, z2: torch.Tensor, *,
                   gather_distributed: bool):
    """(LossTerms, h1) of one head on the representations z1, z2: (B, D); the predictor applied when there is one.
    `gather_distributed`: whether z1, z2 are this process's share of a batch split across processes (the objective
    then gathers what it defines over the batch) or already the whole batch. Passed only when True, so a plug-in
    objective that never runs split across processes need not take it."""
    h1, h2 = state.head(z1), state.head(z2)
    if gather_distributed:
        options = {**options, "gather_distributed": True}
    if state.predictor is not None:
        return objective(state.predictor(h1), state.predictor(h2), h1, h2, **options), h1
    return objective(h1, h2, **options), h1


@dataclass
class StepOutput:
    """What a step source computed at one step: this process's representations z1, z2: (b, D), every training
    head's (LossTerms, h1), and, when the source sums the heads' losses itself (one joint forward), that sum."""

    z1: torch.Tensor
    z2: torch.Tensor
    losses: dict[str, tuple]
    total: torch.Tensor | None = None


class StepSource(Protocol):
    """Where a step's representations come from: cached view features, or a tuned backbone on fresh views.

    `world`: the processes one step's batch is split over (1: every process holds the whole batch). `first_views`:
    (z (B, D), step 0's first views of the whole batch through the fresh backbone; the mean feature (D,)).
    `batches(steps)`: (step, what `forward` needs) per step. `running()`: the context the steps run in (the
    objectives' batch scope, random-number streams). `forward(step, batch, states)`: the step's representations
    and the losses of `states`, the heads still training, in train mode. `finish()`: undo what training needed
    (synchronised BatchNorm) and put a backbone in eval mode."""

    world: int
    device: torch.device

    def first_views(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    def batches(self, steps: range) -> Iterable[tuple[int, object]]: ...

    def running(self) -> AbstractContextManager: ...

    def forward(self, step: int, batch, states: list[HeadState]) -> StepOutput: ...

    def finish(self) -> None: ...


@dataclass
class Optimisation:
    """One optimiser and its schedule, the heads it updates and a tuned backbone it updates with them; the unit
    that accumulates gradients, stops on a NaN loss and goes back to its last good weights.

    name: the checkpoint's key (the head's name, or "joint" for a backbone trained with its heads)."""

    name: str
    heads: list[HeadState]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    backbone: object = None
    backbone_good: dict | None = None

    @property
    def training(self) -> bool:
        return self.heads[0].status == "training"

    def loss(self, out: StepOutput) -> torch.Tensor:
        if len(self.heads) == 1 and self.backbone is None:
            return out.losses[self.heads[0].name][0].loss
        return out.total if out.total is not None else torch.stack([out.losses[s.name][0].loss
                                                                    for s in self.heads]).sum()

    def snapshot(self, step: int) -> None:
        for s in self.heads:
            s.last_good = {"step": step, "head": copy.deepcopy(s.head.state_dict()),
                           "predictor": copy.deepcopy(s.predictor.state_dict()) if s.predictor is not None else None}
        if self.backbone is not None:
            self.backbone_good = trainable_state(self.backbone)

    def stop(self, loss: float, step: int) -> None:
        """Mark every head stopped at `step` and restore the last snapshot."""
        good = self.heads[0].last_good["step"]
        if self.backbone is None:
            message = (f"loss became {loss} at step {step}; the head keeps its weights from step {good} "
                       "(try a lower train.lr)")
        else:
            message = (f"the summed loss of the heads became {loss} at step {step}; the backbone is shared, so "
                       f"training stopped for every head, keeping backbone and heads from step {good} (try a "
                       "lower train.lr)")
            load_trainable_state(self.backbone, self.backbone_good, f"the snapshot of step {good}")
        for s in self.heads:
            s.status, s.message = "stopped", message
            s.head.load_state_dict(s.last_good["head"], strict=True)
            if s.predictor is not None:
                s.predictor.load_state_dict(s.last_good["predictor"], strict=True)


def _log_step(group: Optimisation, out: StepOutput, step: int, per_epoch: int, source: StepSource, log) -> None:
    """One "train" record per head of `group`: loss and terms (averaged over processes: the global batch's),
    collapse statistics of the gathered outputs, its gradient, and with a tuned backbone the summed loss and the
    backbone's gradient (DDP has already averaged the gradients)."""
    device, world = source.device, source.world
    lr = group.optimizer.param_groups[0]["lr"]
    shared = {}
    if group.backbone is not None:
        g, rel = update_stats([p for p in group.backbone.parameters() if p.requires_grad], lr)
        shared = {"total_loss": mean_over_ranks([group.loss(out).item()], device, world)[0],
                  "backbone.grad_norm": g, "backbone.rel_update": rel}
    for state in group.heads:
        terms, h1 = out.losses[state.name]
        keys = list(terms.terms)
        values = mean_over_ranks([terms.loss.item(), *terms.terms.values()], device, world)
        params = [p for p in state.modules().parameters() if p.grad is not None]
        grads = {}
        if params:
            g, rel = update_stats(params, lr)
            grads = {"grad_norm": g, "lr": lr, "rel_update": rel}
        record = {"stage": "train", "head": state.name, "step": step + 1, "epoch": step // per_epoch,
                  "loss": values[0], **dict(zip(keys, values[1:], strict=True)),
                  **collapse_stats(all_rows(h1.detach(), world)), **grads, **shared}
        state.history.append(record)
        if log is not None:
            log(record)


def _optimise(group: Optimisation, out: StepOutput, loss: torch.Tensor, finite: bool, step: int, total: int, train,
              per_epoch: int, source: StepSource, log) -> None:
    """One step of `group` with its loss (`group.loss(out)`): stop on a non-finite loss (`finite`: whether it is
    finite on every process), else accumulate its gradient and update every `train.grad_accum` steps (and at the
    last), logging and snapshotting every `train.log_every` steps."""
    if not finite:
        group.stop(loss.item(), step + 1)
        return
    accum, logging = train.grad_accum, (step + 1) % train.log_every == 0 or step == total - 1
    update = (step + 1) % accum == 0 or step == total - 1
    if step % accum == 0:
        group.optimizer.zero_grad(set_to_none=True)
    group.scaler.scale(loss / accum).backward()
    if update:
        group.scaler.unscale_(group.optimizer)
    if logging:
        _log_step(group, out, step, per_epoch, source, log)
    if update:
        group.scaler.step(group.optimizer)
        group.scaler.update()
        group.scheduler.step()
    for state in group.heads:
        state.last_loss = out.losses[state.name][0].loss
    if logging:
        group.snapshot(step + 1)


def _train_steps(source: StepSource, groups: list[Optimisation], steps: range, total: int, per_epoch: int, *,
                 objective, objective_options: dict, train, seed: int, checkpoint_dir: Path | None, log,
                 progress, task, track, backbone) -> int | None:
    """Run `steps`; returns the step after which every optimisation had stopped, or None.

    Each step is atomic for a scheduler's stop signal (`parallel.signals.atomic_step`). Interrupted between steps
    (a stop signal always is; Ctrl-C when it lands there), the steps done are checkpointed before the interruption
    goes on, so --resume continues from them rather than from the last `train.checkpoint_every`."""

    tracking = track is not None and bool(track.track_every)
    stat_rows = tracked_stat_rows(source, track, seed_of(seed, "collapse rows")) if tracking else None
    done, in_step = steps.start, False
    try:
        with source.running():
            for step, batch in source.batches(steps):
                with atomic_step():
                    in_step = True
                    training = [g for g in groups if g.training]
                    states = [s for g in training for s in g.heads]
                    out = source.forward(step, batch, states)
                    if tracking and (step + 1) % track.track_every == 0:
                        # a snapshot of this process's rows: the objective is called without gathering
                        for state in states:
                            if state.has_weights():  # an identity head has no curvature of its own
                                track_curvature(state, objective, objective_options, out.z1.detach(),
                                                out.z2.detach(), track, step, per_epoch, seed, log, stat_rows)
                    losses = [group.loss(out) for group in training]
                    for group, loss, finite in zip(training, losses, all_finite(losses, source.world), strict=True):
                        _optimise(group, out, loss, finite, step, total, train, per_epoch, source, log)
                    if groups and not any(g.training for g in groups):
                        return step + 1
                    every = train.checkpoint_every
                    if checkpoint_dir is not None and every and (step + 1) % every == 0:
                        save_checkpoint(checkpoint_dir / f"step-{step + 1}.pt", step + 1, groups, backbone)
                    done, in_step = step + 1, False
                if task is not None:
                    progress.advance(task)
    except KeyboardInterrupt:
        # Mid-accumulation the gradients summed so far are not in a checkpoint: only a whole update is flushed.
        if checkpoint_dir is not None and not in_step and done > steps.start and done % train.grad_accum == 0:
            save_checkpoint(checkpoint_dir / f"step-{done}.pt", done, groups, backbone)
        raise
    return None


def run_training(source: StepSource, groups: list[Optimisation], specs, *, objective_name: str,
                 objective_options: dict, train, seed: int, total: int, per_epoch: int, label: str,
                 checkpoint_dir: Path | None = None, resume_from: Path | None = None, log=None, progress=None,
                 track=None, backbone=None) -> tuple[dict[str, HeadState], dict]:
    """Train `groups` for `total` steps of `source`; returns every head's state and the training summary.

    With `track` (a `GeometrySpec`) the fresh heads first get the step-0 collapse check
    (`geometry.collapse.check_collapsed_start` on `source.first_views()`), and every `track.track_every` steps a
    curvature record. `resume_from` restores a checkpoint (strictly) and continues at its step. Checkpoints go to
    `checkpoint_dir` every `train.checkpoint_every` steps and at the end. Afterwards every head is in eval mode
    on the CPU. Summary: "steps", "steps_per_epoch", "start_step", "stopped_at" (the step after which every
    head had stopped, or None), "collapse_start", "train_s", "track_s" (the tracking's share of train_s)."""

    objective = OBJECTIVES.get(objective_name)
    states = {s.name: s for g in groups for s in g.heads}
    collapse = {}
    if track is not None:  # the fresh heads (a resumed run's step 0 too) on step 0's first views

        z, mean_feature = source.first_views()
        collapse = check_collapsed_start({n: s for n, s in states.items() if s.has_weights()}, specs, z,
                                         mean_feature, track)
    start = restore_checkpoint(resume_from, groups, backbone) if resume_from is not None else 0
    task = progress.add_task(label, total=total, completed=start) if progress else None
    for group in groups:
        group.snapshot(start)
    t0 = time.perf_counter()
    stopped_at = start if groups and not any(g.training for g in groups) else _train_steps(
        source, groups, range(start, total), total, per_epoch, objective=objective,
        objective_options=objective_options, train=train, seed=seed, checkpoint_dir=checkpoint_dir, log=log,
        progress=progress, task=task, track=track, backbone=backbone)
    source.finish()
    for state in states.values():
        if state.status == "training":
            state.status = "complete"
        state.modules().eval().cpu()
    if checkpoint_dir is not None:
        save_checkpoint(checkpoint_dir / f"step-{stopped_at or total}.pt", stopped_at or total, groups, backbone)
    return states, {"steps": total, "steps_per_epoch": per_epoch, "start_step": start, "stopped_at": stopped_at,
                    "collapse_start": collapse, "train_s": time.perf_counter() - t0,
                    "track_s": sum(r.get("time_s", 0.0) for s in states.values() for r in s.history
                                   if r.get("stage") == "geometry")}
