"""Train projection heads on cached view features (frozen backbone).

All heads of a recipe train in one loop on the same batches: step s uses images
``perm(seed, epoch)[b·B:(b+1)·B]`` and two distinct views per image drawn from a
generator seeded by (seed, s). The batch schedule is a pure function of the step, so a
resumed run continues exactly where it stopped, and each head gets exactly the batches it
would get if trained alone (its initialisation is seeded by (seed, head name), not by the
order in which heads are built).

On the cached path every process trains the heads on the full global batch: the backbone
forwards (the expensive part) are sharded across processes, head training is cheap, and
replicating it makes multi-process numbers identical to single-process ones without a
cross-process BatchNorm (which torch does not offer on CPU).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .heads import Predictor, ProjectionHead
from .objectives import local_batch


def _seed_of(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & ((1 << 63) - 1)


@dataclass
class HeadState:
    """One head in training: modules, optimiser, schedule, and what happened to it."""

    name: str
    head: ProjectionHead
    predictor: Predictor | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    status: str = "training"
    message: str = ""
    last_loss: float = float("nan")
    last_good: dict | None = None
    history: list[dict] = field(default_factory=list)

    def modules(self) -> nn.ModuleList:
        return nn.ModuleList([m for m in (self.head, self.predictor) if m is not None])

    def state(self) -> dict:
        return {
            "head": self.head.state_dict(),
            "predictor": self.predictor.state_dict() if self.predictor is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "status": self.status,
            "message": self.message,
            "last_loss": self.last_loss,
        }

    def load(self, state: dict) -> None:
        self.head.load_state_dict(state["head"])
        if self.predictor is not None:
            self.predictor.load_state_dict(state["predictor"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.status, self.message, self.last_loss = state["status"], state["message"], state["last_loss"]


def build_head(spec, in_dim: int, seed: int) -> tuple[ProjectionHead, Predictor | None]:
    """A head (and predictor) whose initial weights depend only on (seed, spec.name)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_seed_of(seed, "head", spec.name))
        head = ProjectionHead(
            in_dim, kind=spec.type, depth=spec.depth, width=spec.width, out_dim=spec.out_dim, act=spec.act,
            bn_hidden=spec.bn_hidden, bn_out=spec.bn_out, l2_out=spec.l2_out, init_scale=spec.init_scale,
        )
        predictor = Predictor(head.out_dim, spec.predictor) if spec.predictor else None
    return head, predictor


def _schedule(train, total: int):
    def factor(step: int) -> float:
        if step < train.warmup_steps:
            return (step + 1) / train.warmup_steps
        if train.schedule == "constant":
            return 1.0
        progress = (step - train.warmup_steps) / max(1, total - train.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _optimizer(params, train) -> torch.optim.Optimizer:
    if train.optimizer == "sgd":
        return torch.optim.SGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    return torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay)


def make_states(specs, in_dim: int, train, total_steps: int, seed: int) -> dict[str, HeadState]:
    states = {}
    for spec in specs:
        head, predictor = build_head(spec, in_dim, seed)
        params = list(head.parameters()) + (list(predictor.parameters()) if predictor is not None else [])
        if not params:
            continue  # the identity head has nothing to train
        optimizer = _optimizer(params, train)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(train, total_steps))
        states[spec.name] = HeadState(spec.name, head, predictor, optimizer, scheduler)
    return states


@functools.lru_cache(maxsize=2)
def _epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The image order of one epoch, drawn once per epoch rather than at every step (O(N) each)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(_seed_of(seed, "epoch", epoch)))


def batch_for_step(step: int, n: int, views: int, batch_size: int, seed: int) -> tuple[torch.Tensor, ...]:
    """(image indices (B,), first views (B,), second views (B,)) of one step; two distinct views per image."""
    per_epoch = n // batch_size
    epoch, b = divmod(step, per_epoch)
    perm = _epoch_permutation(n, seed, epoch)
    idx = perm[b * batch_size : (b + 1) * batch_size]
    g = torch.Generator().manual_seed(_seed_of(seed, "views", step))
    v1 = torch.randint(views, (len(idx),), generator=g)
    v2 = (v1 + 1 + torch.randint(views - 1, (len(idx),), generator=g)) % views
    return idx, v1, v2


def _objective_loss(objective, options: dict, state: HeadState, z1: torch.Tensor, z2: torch.Tensor):
    h1, h2 = state.head(z1), state.head(z2)
    if state.predictor is not None:
        return objective(state.predictor(h1), state.predictor(h2), h1, h2, **options), h1
    return objective(h1, h2, **options), h1


def collapse_stats(h: torch.Tensor) -> dict[str, float]:
    """Std of L2-normalised outputs (≈ 1/√d when spread, → 0 at collapse) and RankMe of h: (B, d).

    RankMe is `probes.spectrum.rankme` on the uncentred outputs, as in Garrido et al. and as the probes and the
    geometry records compute it, so the training log, `metrics.jsonl`'s geometry records and the tap metric
    agree on the same matrix. NaN where undefined (non-finite or all-zero outputs; logged as null)."""
    from .probes.spectrum import rankme

    with torch.no_grad():
        hn = nn.functional.normalize(h.float(), dim=1)
        try:
            value = rankme(h.detach())
        except ValueError:
            value = math.nan
        return {"out_std": hn.std(0).mean().item(), "rankme": value}


def _grad_stats(state: HeadState) -> dict[str, float]:
    params = [p for p in state.modules().parameters() if p.grad is not None]
    g = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in params)).item()
    w = torch.sqrt(sum((p.detach().float() ** 2).sum() for p in params)).item()
    lr = state.optimizer.param_groups[0]["lr"]
    return {"grad_norm": g, "lr": lr, "rel_update": lr * g / max(w, 1e-12)}


def _track(state: HeadState, objective, options: dict, z1, z2, track, step: int, per_epoch: int, seed: int,
           log) -> None:
    from .geometry.analyse import objective_closure
    from .geometry.tracking import curvature_snapshot

    rows = min(track.track_rows, len(z1))
    snap = curvature_snapshot(state.head, z1[:rows], z2[:rows], objective_closure(objective, options, state.predictor),
                              predictor=state.predictor, max_iter=track.track_max_iter, seed=seed)
    snap.pop("cov_top_eigenvalues", None)
    record = {"stage": "geometry", "head": state.name, "step": step + 1, "epoch": step // per_epoch,
              **{k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in snap.items()}}
    state.history.append(record)
    if log is not None:
        log(record)


def save_checkpoint(path: Path, step: int, states: dict[str, HeadState]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save({"step": step, "heads": {name: s.state() for name, s in states.items()}}, tmp)
    tmp.replace(path)


class CheckpointError(RuntimeError):
    """A checkpoint that holds more than tensors, numbers, strings and plain containers, or cannot be read."""


def load_checkpoint(path: Path) -> dict:
    """A checkpoint of `save_checkpoint` or `train_tuned`, read onto the CPU with ``weights_only=True``.

    Unpickling an arbitrary file can run code it names, and run directories get shared: only what headprobe
    writes (tensors, numbers, strings, plain containers) is accepted; anything else raises `CheckpointError`.
    """
    import pickle

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path} holds Python objects other than tensors, numbers, strings and plain containers, so it was not "
            "loaded (unpickling it could run code); delete it, so that the newest checkpoint headprobe wrote is "
            "read instead, or train the run again."
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        raise CheckpointError(f"{path} is not a readable checkpoint ({err}); delete it, so that the newest "
                              "checkpoint before it is read instead, or train the run again.") from None
    if not isinstance(saved, dict) or not {"step", "heads"} <= set(saved):
        raise CheckpointError(f"{path} is not a headprobe checkpoint (it lacks 'step' and 'heads'); delete it, "
                              "so that the newest checkpoint before it is read instead, or train the run again.")
    return saved


def latest_checkpoint(folder: Path) -> Path | None:
    found = sorted(folder.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    return found[-1] if found else None


def _loop(states, views, objective, objective_options, train, seed, start, total, per_epoch, checkpoint_dir, log,
          progress, task, track) -> None:
    n, k, _ = views.shape
    for step in range(start, total):
        idx, v1, v2 = batch_for_step(step, n, k, train.batch_size, seed)
        z1, z2 = views[idx, v1], views[idx, v2]
        logging = (step + 1) % train.log_every == 0 or step == total - 1
        for state in states.values():
            if state.status != "training":
                continue
            state.modules().train()
            if track is not None and track.track_every and (step + 1) % track.track_every == 0:
                _track(state, objective, objective_options, z1, z2, track, step, per_epoch, seed, log)
            terms, h1 = _objective_loss(objective, objective_options, state, z1, z2)
            if not torch.isfinite(terms.loss):
                state.status = "stopped"
                state.message = (
                    f"loss became {terms.loss.item()} at step {step + 1}; the head keeps its weights from "
                    f"step {state.last_good['step'] if state.last_good else 0} (try a lower train.lr)"
                )
                if state.last_good is not None:
                    state.head.load_state_dict(state.last_good["head"])
                    if state.predictor is not None:
                        state.predictor.load_state_dict(state.last_good["predictor"])
                continue
            accum = train.grad_accum
            update = (step + 1) % accum == 0 or step == total - 1
            if step % accum == 0:
                state.optimizer.zero_grad(set_to_none=True)
            (terms.loss / accum).backward()
            if logging:
                record = {"stage": "train", "head": state.name, "step": step + 1, "epoch": step // per_epoch,
                          "loss": terms.loss.item(), **terms.terms, **collapse_stats(h1), **_grad_stats(state)}
                state.history.append(record)
                if log is not None:
                    log(record)
            if update:
                state.optimizer.step()
                state.scheduler.step()
            state.last_loss = terms.loss.item()
            if logging:
                state.last_good = {"step": step + 1, "head": copy.deepcopy(state.head.state_dict()),
                                   "predictor": copy.deepcopy(state.predictor.state_dict())
                                   if state.predictor is not None else None}
        if checkpoint_dir is not None and train.checkpoint_every and (step + 1) % train.checkpoint_every == 0:
            save_checkpoint(checkpoint_dir / f"step-{step + 1}.pt", step + 1, states)
        if task is not None:
            progress.advance(task)


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
    from .registry import OBJECTIVES

    n, k, dim = views.shape
    if n < train.batch_size:
        raise ValueError(
            f"train.batch_size = {train.batch_size} is larger than the {n} training images; "
            "lower train.batch_size or raise data.limit.train."
        )
    per_epoch = n // train.batch_size
    total = train.steps if train.steps is not None else train.epochs * per_epoch
    objective = OBJECTIVES.get(objective_name)
    states = make_states(specs, dim, train, -(-total // train.grad_accum), seed)
    if device is not None:
        # Train where the process's accelerator is; the heads come back to the CPU, where the features live.
        views = views.to(device)
        for state in states.values():
            state.modules().to(device)
    start = 0
    if resume_from is not None:
        saved = load_checkpoint(resume_from)
        start = saved["step"]
        for name, state in states.items():
            state.load(saved["heads"][name])
    task = progress.add_task(f"train {len(states)} heads", total=total, completed=start) if progress else None
    t0 = time.perf_counter()
    with local_batch():  # every process holds the whole batch here: nothing to gather
        _loop(states, views, objective, objective_options, train, seed, start, total, per_epoch, checkpoint_dir,
              log, progress, task, track)
    for state in states.values():
        if state.status == "training":
            state.status = "complete"
        state.modules().eval().cpu()
    if checkpoint_dir is not None:
        save_checkpoint(checkpoint_dir / f"step-{total}.pt", total, states)
    return states, {"steps": total, "steps_per_epoch": per_epoch, "start_step": start,
                    "train_s": time.perf_counter() - t0,
                    "track_s": sum(r.get("time_s", 0.0) for st in states.values() for r in st.history
                                   if r.get("stage") == "geometry")}


@torch.no_grad()
def head_taps(head: ProjectionHead, features: torch.Tensor, batch_size: int = 4096) -> list[torch.Tensor]:
    """features: (N, D) → the head's taps in eval mode, [(N, w_1), ..., (N, out_dim)]."""
    head.eval()
    outs: list[list[torch.Tensor]] = []
    for start in range(0, len(features), batch_size):
        outs.append(head.taps(features[start : start + batch_size]))
    return [torch.cat([o[i] for o in outs]) for i in range(head.depth)] if outs else []
