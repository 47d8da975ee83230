"""Train a tuned backbone (`backbone.tune`: last:N, lora, full; scratch backbones) together with its heads.

Views are made on the fly, never cached. Step s takes the images and view indices of the cached path,
``batch_for_step(s, N, K, B, seed)`` with K = ``augment.views``, and view k of image i is made exactly as
`features.extract_views` makes it (same `make_view`, crop size and normalisation, via `features._Views`),
so the backbone sees the same pixels in the same order as on the cached path; only its weights move.

One optimiser holds the backbone's trainable weights and every head (one parameter group each, one
schedule), and one backward pass goes through the sum of the heads' losses. AdamW and SGD update each
parameter from its own gradient only, so a head's parameters get exactly the update a per-head optimiser
would give them; but every head's loss now moves the shared backbone, so a head is no longer trained "as
if alone": adding or removing a head changes the others. An ``identity`` head puts the objective on the
backbone's features themselves (the "no projector" run). Because the backbone is shared, a loss that becomes
NaN/inf stops training altogether: every head stops, and backbone and heads go back to their last logged
good state.

Processes: rank r takes the shard ``r::W`` of the step's B image indices (B // W each, the remainder of B is
dropped), Accelerate wraps backbone + heads in DDP, and the objectives gather over ranks (this path does not
use `objectives.local_batch`), so W processes compute the objective of one global batch. On CUDA the
BatchNorm layers are synchronised across ranks while training; on CPU torch has no cross-process BatchNorm,
so there they normalise each rank's shard. ``features.precision`` bf16/fp16 autocasts the backbone forward on
CUDA only (fp16 with a gradient scaler); heads and objectives run in float32. The random numbers of step s
(dropout, LoRA dropout) come from a seed of (seed, s, rank), so a resumed run continues exactly.

>>> backbone = load_backbone("scratch:vit-tiny")  # doctest: +SKIP
>>> apply_tuning(backbone, "last:1")  # doctest: +SKIP
>>> states, summary = train_tuned(backbone, heads, data.train, augment=spec, views=8, objective_name="vicreg",
...                               objective_options={}, train=TrainSpec(steps=100), seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .train import (
    HeadState,
    _grad_stats,
    _objective_loss,
    _optimizer,
    _schedule,
    _seed_of,
    _track,
    batch_for_step,
    build_head,
    load_checkpoint,
)


def rank_shard(idx: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's rows of a global batch: ``idx[r::W]`` cut to ``len(idx) // W`` so every rank has as many."""
    return idx[rank::world][: len(idx) // world]


class StepViews(torch.utils.data.Dataset):
    """Step s → (x1, x2): this rank's two views of the step's images, each (b, 3, crop, crop), normalised."""

    def __init__(self, dataset, *, augment, preprocess, views: int, batch_size: int, seed: int, rank: int = 0,
                 world: int = 1) -> None:
        from .features import _Views, view_transforms

        spec, normalise = view_transforms(preprocess, augment)
        self.crop, self.n, self.k = preprocess.crop, len(dataset), views
        self.batch_size, self.seed, self.rank, self.world = batch_size, seed, rank, world
        self.flat = _Views(dataset, range(self.n * views), views, spec, seed, normalise)

    def _pixels(self, idx: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
        n_pixels = 3 * self.crop * self.crop
        rows = [self.flat[i * self.k + v][:n_pixels] for i, v in zip(idx.tolist(), view.tolist(), strict=True)]
        return torch.stack(rows).reshape(-1, 3, self.crop, self.crop)

    def __getitem__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx, v1, v2 = batch_for_step(step, self.n, self.k, self.batch_size, self.seed)
        idx, v1, v2 = (rank_shard(t, self.rank, self.world) for t in (idx, v1, v2))
        return self._pixels(idx, v1), self._pixels(idx, v2)


class _Joint(nn.Module):
    """Backbone + heads as one module (what DDP wraps): (x1, x2) → (summed loss, {head: (LossTerms, h1)}, z1, z2)."""

    def __init__(self, backbone, states: dict[str, HeadState], objective, options: dict, autocast_dtype) -> None:
        super().__init__()
        self.backbone = backbone
        self.heads = nn.ModuleList([state.modules() for state in states.values()])
        self.states, self.objective, self.options, self.autocast_dtype = states, objective, options, autocast_dtype

    def forward(self, x1: torch.Tensor, x2: torch.Tensor):
        dtype = self.autocast_dtype
        with torch.autocast(x1.device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            z1, z2 = self.backbone(x1), self.backbone(x2)
        z1, z2 = z1.float(), z2.float()
        out = {name: _objective_loss(self.objective, self.options, state, z1, z2)
               for name, state in self.states.items()}
        return torch.stack([terms.loss for terms, _ in out.values()]).sum(), out, z1, z2


def trainable_state(backbone) -> dict[str, torch.Tensor]:
    """The backbone's trainable parameters and the buffers (BatchNorm statistics) of the modules that own them,
    named as in `backbone.model`, detached copies on the CPU."""
    out = {}
    for prefix, module in backbone.model.named_modules():
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        dot = f"{prefix}." if prefix else ""
        for name, tensor in [*own, *module.named_buffers(recurse=False)]:
            out[dot + name] = tensor.detach().to("cpu", copy=True).contiguous()
    return out


def save_tuned_backbone(backbone, folder: str | Path) -> Path:
    """What tuning changed: LoRA → the peft adapter in ``folder/lora`` (`save_adapter`); last:N and full → the
    trainable weights (`trainable_state`) in ``folder/backbone.safetensors``, with the backbone id, its base
    fingerprint and the tuning record in the file's metadata. Returns the path written."""
    from safetensors.torch import save_file

    from .backbones.tuning import save_adapter

    folder = Path(folder)
    if backbone.tuning["policy"] == "lora":
        return save_adapter(backbone, folder / "lora")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "backbone.safetensors"
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(trainable_state(backbone), str(tmp), metadata={
        "id": backbone.id, "base_fingerprint": str(backbone.tuning.get("base_fingerprint")),
        "tuning": json.dumps(backbone.tuning, default=str)})
    tmp.replace(path)
    return path


def _sync_batchnorm(module: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """Swap every BatchNorm in `module` for a SyncBatchNorm sharing its weights and statistics; returns what
    `_restore_batchnorm` puts back (SyncBatchNorm cannot run on CPU, where the probes use the heads)."""
    swapped = []
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.modules.batchnorm._BatchNorm) and not isinstance(child, nn.SyncBatchNorm):
                sync = nn.SyncBatchNorm.convert_sync_batchnorm(child)  # shares parameters and buffer tensors
                setattr(parent, name, sync.train(child.training))
                swapped.append((parent, name, child))
    return swapped


def _restore_batchnorm(swapped: list[tuple[nn.Module, str, nn.Module]]) -> None:
    for parent, name, original in swapped:
        setattr(parent, name, original)


def _save_checkpoint(path: Path, step: int, backbone, states: dict[str, HeadState], optimizer, scheduler,
                     scaler) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    heads = {name: {"head": s.head.state_dict(), "predictor": s.predictor.state_dict() if s.predictor else None,
                    "status": s.status, "message": s.message, "last_loss": s.last_loss} for name, s in states.items()}
    torch.save({"step": step, "kind": "tuned", "tuning": dict(backbone.tuning), "backbone": trainable_state(backbone),
                "heads": heads, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict()}, tmp)
    tmp.replace(path)


def _load_checkpoint(path: Path, backbone, states: dict[str, HeadState], optimizer, scheduler, scaler) -> int:
    saved = load_checkpoint(path)
    if saved.get("kind") != "tuned":
        raise ValueError(f"{path} is a checkpoint of frozen-backbone head training, not of a tuned backbone.")
    missing = set(trainable_state(backbone)) - set(saved["backbone"])
    if missing:
        raise ValueError(f"{path} lacks the tuned weights {sorted(missing)[:4]}; it was saved with tune policy "
                         f"{saved['tuning'].get('policy')!r}, this run uses {backbone.tuning['policy']!r}.")
    backbone.model.load_state_dict(saved["backbone"], strict=False)
    for name, state in states.items():
        entry = saved["heads"][name]
        state.head.load_state_dict(entry["head"])
        if state.predictor is not None:
            state.predictor.load_state_dict(entry["predictor"])
        state.status, state.message, state.last_loss = entry["status"], entry["message"], entry["last_loss"]
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    scaler.load_state_dict(saved["scaler"])
    return saved["step"]


def _mean_over_ranks(values: list[float], device, world: int) -> list[float]:
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t / world).tolist()


def _all_rows(h: torch.Tensor, world: int) -> torch.Tensor:
    if world == 1:
        return h
    parts = [torch.empty_like(h) for _ in range(world)]
    dist.all_gather(parts, h.contiguous())
    return torch.cat(parts)


def _all_finite(loss: torch.Tensor, world: int) -> bool:
    """Whether the loss is finite on every rank (every rank must agree to stop)."""
    flag = torch.isfinite(loss.detach()).float().reshape(1)
    if world > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _backbone_stats(params: list[torch.Tensor], lr: float) -> dict[str, float]:
    with torch.no_grad():
        g = torch.sqrt(sum(((p.grad.float() ** 2).sum() for p in params if p.grad is not None),
                           torch.zeros((), device=params[0].device))).item()
        w = torch.sqrt(sum((p.detach().float() ** 2).sum() for p in params)).item()
    return {"backbone.grad_norm": g, "backbone.rel_update": lr * g / max(w, 1e-12)}


def _snapshot(backbone, states: dict[str, HeadState], step: int) -> dict:
    return {"step": step, "backbone": trainable_state(backbone),
            "heads": {n: {"head": {k: v.detach().cpu().clone() for k, v in s.head.state_dict().items()},
                          "predictor": {k: v.detach().cpu().clone() for k, v in s.predictor.state_dict().items()}
                          if s.predictor is not None else None} for n, s in states.items()}}


def _restore(backbone, states: dict[str, HeadState], good: dict) -> None:
    backbone.model.load_state_dict(good["backbone"], strict=False)
    for name, state in states.items():
        state.head.load_state_dict(good["heads"][name]["head"])
        if state.predictor is not None:
            state.predictor.load_state_dict(good["heads"][name]["predictor"])


def train_tuned(
    backbone,
    specs,
    dataset,
    *,
    augment,
    views: int,
    objective_name: str,
    objective_options: dict,
    train,
    seed: int,
    precision: str = "fp32",
    num_workers: int = 0,
    checkpoint_dir: Path | None = None,
    resume_from: Path | None = None,
    log=None,
    progress=None,
    track=None,
    state=None,
) -> tuple[dict[str, HeadState], dict]:
    """Train `backbone` (already tuned by `apply_tuning`) and every head of `specs` on views of `dataset`.

    `augment` is an `AugmentSpec` (its size is set to the backbone's crop), `views` the K of the cached path.
    Returns every head's `HeadState` (identity heads included; they all share one optimiser and scheduler) and a
    summary. `log(record)` gets one ``"stage": "train"`` record per head every `train.log_every` steps, as on the
    cached path, plus ``backbone.grad_norm``, ``backbone.rel_update`` and ``total_loss``. Checkpoints (backbone
    trainable state, heads, optimiser, scheduler, step) go to `checkpoint_dir` every `train.checkpoint_every`
    steps and at the end. Afterwards the backbone and heads are in eval mode, the heads on the CPU.
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    from .distributed import process_state
    from .features import _effective_precision
    from .objectives import local_batch
    from .registry import OBJECTIVES

    state = state or process_state()
    device, rank, world = state.device, state.process_index, state.num_processes
    n = len(dataset)
    if not specs:
        raise ValueError(f"backbone.tune = {backbone.tuning['policy']!r} trains the backbone with the heads' "
                         "objective, but the recipe has no heads; add one (type: identity trains the backbone alone).")
    if not backbone.trainable:
        raise ValueError(f"{backbone.id} has no trainable weights; call apply_tuning with last:N, lora or full first.")
    if n < train.batch_size:
        raise ValueError(f"train.batch_size = {train.batch_size} is larger than the {n} training images; "
                         "lower train.batch_size or raise data.limit.train.")
    if train.batch_size // world < 2:
        raise ValueError(f"train.batch_size = {train.batch_size} over {world} processes leaves fewer than 2 images "
                         "per process; raise train.batch_size.")
    per_epoch = n // train.batch_size
    total = train.steps if train.steps is not None else train.epochs * per_epoch
    objective = OBJECTIVES.get(objective_name)
    precision = _effective_precision(precision, device)
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    heads = {spec.name: build_head(spec, backbone.dim, seed) for spec in specs}
    backbone_params = [p for p in backbone.parameters() if p.requires_grad]
    groups = [{"params": backbone_params, "name": "backbone"}]
    groups += [{"params": [p for m in pair if m is not None for p in m.parameters()], "name": name}
               for name, pair in heads.items()]
    optimizer = _optimizer([g for g in groups if g["params"]], train)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(train, -(-total // train.grad_accum)))
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    states = {name: HeadState(name, head, predictor, optimizer, scheduler) for name, (head, predictor) in heads.items()}

    joint = _Joint(backbone, states, objective, objective_options, autocast_dtype)
    swapped = _sync_batchnorm(joint) if world > 1 and device.type == "cuda" else []
    # find_unused_parameters: a fully tuned backbone may hold weights its pooling never uses (DINOv2's mask token).
    # mixed_precision "no": autocast covers the backbone only (see _Joint), not the heads and objectives.
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision="no",
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    model = accelerator.prepare_model(joint)  # device placement; DDP when there are several processes
    start = _load_checkpoint(resume_from, backbone, states, optimizer, scheduler, scaler) if resume_from else 0
    stopped_at = start if any(s.status == "stopped" for s in states.values()) else None  # it stopped before

    steps = range(start, total if stopped_at is None else start)
    loader = torch.utils.data.DataLoader(
        StepViews(dataset, augment=augment, preprocess=backbone.preprocess, views=views,
                  batch_size=train.batch_size, seed=seed, rank=rank, world=world),
        batch_size=None, sampler=steps, num_workers=num_workers, pin_memory=device.type == "cuda")
    task = progress.add_task(f"train backbone ({backbone.tuning['policy']}) + {len(states)} heads", total=total,
                             completed=start) if progress else None
    rng_devices = [device] if device.type == "cuda" else []
    good = _snapshot(backbone, states, start)
    t0 = time.perf_counter()
    model.train()
    with torch.random.fork_rng(devices=rng_devices):
        for step, (x1, x2) in zip(steps, loader, strict=True):
            torch.manual_seed(_seed_of(seed, "tuned-step", step, rank))
            x1, x2 = x1.to(device, non_blocking=True), x2.to(device, non_blocking=True)
            logging = (step + 1) % train.log_every == 0 or step == total - 1
            loss, out, z1, z2 = model(x1, x2)
            if track is not None and track.track_every and (step + 1) % track.track_every == 0:
                with local_batch():  # a snapshot of this rank's rows; the Hessian products stay local
                    for s in states.values():
                        if list(s.head.parameters()):  # as on the cached path, identity heads are not tracked
                            _track(s, objective, objective_options, z1.detach(), z2.detach(), track, step,
                                   per_epoch, seed, log if state.is_main_process else None)
            if not _all_finite(loss, world):
                message = (f"the summed loss of the heads became {loss.item()} at step {step + 1}; the backbone is "
                           f"shared, so training stopped for every head, keeping backbone and heads from step "
                           f"{good['step']} (try a lower train.lr)")
                for s in states.values():
                    s.status, s.message = "stopped", message
                _restore(backbone, states, good)
                stopped_at = step + 1
                break
            accum = train.grad_accum
            update = (step + 1) % accum == 0 or step == total - 1
            if step % accum == 0:
                optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss / accum).backward()
            if update:
                scaler.unscale_(optimizer)
            if logging:
                _log_step(states, out, backbone_params, optimizer, loss, step, per_epoch, device, world,
                          log if state.is_main_process else None)
            if update:
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
            for name, (terms, _) in out.items():
                states[name].last_loss = terms.loss.item()
            if logging:
                good = _snapshot(backbone, states, step + 1)
            if (checkpoint_dir is not None and state.is_main_process and train.checkpoint_every
                    and (step + 1) % train.checkpoint_every == 0):
                _save_checkpoint(checkpoint_dir / f"step-{step + 1}.pt", step + 1, backbone, states, optimizer,
                                 scheduler, scaler)
            if task is not None:
                progress.advance(task)
    _restore_batchnorm(swapped)
    backbone.eval()
    for s in states.values():
        if s.status == "training":
            s.status = "complete"
        s.modules().eval().cpu()
    if checkpoint_dir is not None and state.is_main_process:
        _save_checkpoint(checkpoint_dir / f"step-{stopped_at or total}.pt", stopped_at or total, backbone, states,
                         optimizer, scheduler, scaler)
    return states, {"steps": total, "steps_per_epoch": per_epoch, "start_step": start, "stopped_at": stopped_at,
                    "processes": world, "batch_per_process": train.batch_size // world, "precision": precision,
                    "optimizer_groups": [g["name"] for g in optimizer.param_groups],
                    "train_s": time.perf_counter() - t0}


def _log_step(states, out, backbone_params, optimizer, loss, step, per_epoch, device, world, log) -> None:
    """One record per head: its loss and terms (averaged over ranks: the global batch's), collapse statistics of
    the gathered outputs, its gradient and the backbone's (DDP has already averaged them)."""
    from .train import collapse_stats

    lr = optimizer.param_groups[0]["lr"]
    shared = {"total_loss": _mean_over_ranks([loss.item()], device, world)[0],
              **_backbone_stats(backbone_params, lr)}
    for name, (terms, h1) in out.items():
        keys = list(terms.terms)
        values = _mean_over_ranks([terms.loss.item(), *terms.terms.values()], device, world)
        state = states[name]
        grads = _grad_stats(state) if list(state.modules().parameters()) else {}
        record = {"stage": "train", "head": name, "step": step + 1, "epoch": step // per_epoch, "loss": values[0],
                  **dict(zip(keys, values[1:], strict=True)), **collapse_stats(_all_rows(h1.detach(), world)),
                  **grads, **shared}
        state.history.append(record)
        if log is not None:
            log(record)
