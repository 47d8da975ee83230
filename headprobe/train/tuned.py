"""Train a tuned backbone (`backbone.tune`: last:N, lora, full; scratch backbones) together with its heads.

Views are made on the fly, never cached. Step s takes the images and view indices of the cached path,
``batch_for_step(s, N, K, B, seed)`` with K = ``augment.views``, and view k of image i is made exactly as
`features.views.extract_views` makes it (same `make_view`, crop size and normalisation, via `AugmentedViews`),
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
pass `gather_distributed=False`), so W processes compute the objective of one global batch. On CUDA the
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
from pathlib import Path

import torch
from torch import nn

from headprobe.backbones.tuning import save_adapter
from headprobe.data.loader import loader_options
from headprobe.features.extract import effective_precision
from headprobe.features.views import AugmentedViews, view_transforms
from headprobe.geometry.pullback import BATCHNORMS
from headprobe.parallel.atomic import replace_atomically
from headprobe.parallel.collectives import all_rows, broadcast_buffers
from headprobe.parallel.distributed import process_state
from headprobe.registry import OBJECTIVES
from headprobe.train.checkpoint import trainable_state
from headprobe.train.engine import (
    HeadState,
    Optimisation,
    StepOutput,
    batch_for_step,
    build_head,
    lr_schedule,
    make_optimizer,
    objective_loss,
    run_training,
    seed_of,
    steps_of,
)
from headprobe.train.heads import freeze_unidentified_bias

__all__ = ["StepViews", "TunedSteps", "rank_shard", "save_tuned_backbone", "train_tuned", "trainable_state"]


def rank_shard(idx: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's rows of a global batch: ``idx[r::W]`` cut to ``len(idx) // W`` so every rank has as many."""
    return idx[rank::world][: len(idx) // world]


class StepViews(torch.utils.data.Dataset):
    """Step s → (x1, x2): this rank's two views of the step's images, each (b, 3, crop, crop), normalised."""

    def __init__(self, dataset, *, augment, preprocess, views: int, batch_size: int, seed: int, rank: int = 0,
                 world: int = 1) -> None:

        spec, normalise = view_transforms(preprocess, augment)
        self.crop, self.n, self.k = preprocess.crop, len(dataset), views
        self.batch_size, self.seed, self.rank, self.world = batch_size, seed, rank, world
        self.flat = AugmentedViews(dataset, range(self.n * views), views, spec, seed, normalise)

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

    def __init__(self, backbone, states: dict[str, HeadState], objective, options: dict, autocast_dtype,
                 gather_distributed: bool) -> None:
        super().__init__()
        self.gather_distributed = gather_distributed
        self.backbone = backbone
        self.heads = nn.ModuleList([state.modules() for state in states.values()])
        self.states, self.objective, self.options, self.autocast_dtype = states, objective, options, autocast_dtype

    def features(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.autocast_dtype
        with torch.autocast(x.device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            return self.backbone(x)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor):
        z1, z2 = self.features(x1).float(), self.features(x2).float()
        # with several processes each holds its share of the global batch: the objectives gather across them
        out = {name: objective_loss(self.objective, self.options, state, z1, z2,
                                    gather_distributed=self.gather_distributed)
               for name, state in self.states.items()}
        return torch.stack([terms.loss for terms, _ in out.values()]).sum(), out, z1, z2


def save_tuned_backbone(backbone, folder: str | Path) -> Path:
    """What tuning changed: LoRA → the peft adapter in ``folder/lora`` (`save_adapter`); last:N and full → the
    trainable weights (`trainable_state`) in ``folder/backbone.safetensors``, with the backbone id, its base
    fingerprint and the tuning record in the file's metadata. Returns the path written."""
    from safetensors.torch import save_file


    folder = Path(folder)
    if backbone.tuning["policy"] == "lora":
        return save_adapter(backbone, folder / "lora")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "backbone.safetensors"
    metadata = {"id": backbone.id, "base_fingerprint": str(backbone.tuning.get("base_fingerprint")),
                "tuning": json.dumps(backbone.tuning, default=str)}
    replace_atomically(path, lambda tmp: save_file(trainable_state(backbone), str(tmp), metadata=metadata))
    return path


def _sync_batchnorm(module: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """Swap every BatchNorm in `module` for a SyncBatchNorm sharing its weights and statistics; returns what
    `TunedSteps.finish` puts back (SyncBatchNorm cannot run on CPU, where the probes use the heads)."""
    swapped = []
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, BATCHNORMS) and not isinstance(child, nn.SyncBatchNorm):
                sync = nn.SyncBatchNorm.convert_sync_batchnorm(child)  # shares parameters and buffer tensors
                setattr(parent, name, sync.train(child.training))
                swapped.append((parent, name, child))
    return swapped


class TunedSteps:
    """Step s → this process's shard of the step's images (`StepViews`), two views each, through the tuned
    backbone and every head in one (DDP) forward. The random numbers of step s (dropout) come from
    ``seed_of(seed, "tuned-step", s, rank)``."""

    def __init__(self, joint: _Joint, model: nn.Module, views: StepViews, *, seed: int, state, num_workers: int | None,
                 swapped: list) -> None:
        self.joint, self.model, self.views, self.seed, self.swapped = joint, model, views, seed, swapped
        self.device, self.rank, self.world = state.device, state.process_index, state.num_processes
        self.num_workers = num_workers

    def first_views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 0's first views through the backbone as it is before training (eval mode), gathered over the
        processes; their mean stands in for the mean view feature the cached path averages over all views."""
        with torch.no_grad():
            z = all_rows(self.joint.features(self.views[0][0].to(self.device)).float(), self.world)
        return z, z.mean(0)

    def batches(self, steps: range):

        # One loader over every step of every epoch, its workers persistent: they start once per run, and the
        # prefetched steps stay in flight across epoch boundaries. Step s's views are f(seed, s): any worker count.
        loader = torch.utils.data.DataLoader(self.views, batch_size=None, sampler=steps,
                                             **loader_options(self.num_workers, self.device, persistent=True))
        return zip(steps, loader, strict=True)

    @contextlib.contextmanager
    def running(self):
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            self.model.train()
            yield

    def forward(self, step: int, batch, states: list[HeadState]) -> StepOutput:
        torch.manual_seed(seed_of(self.seed, "tuned-step", step, self.rank))
        x1, x2 = (x.to(self.device, non_blocking=True) for x in batch)
        loss, out, z1, z2 = self.model(x1, x2)
        return StepOutput(z1, z2, out, loss)

    def finish(self) -> None:
        for parent, name, original in self.swapped:
            setattr(parent, name, original)
        self.joint.backbone.eval()


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
    num_workers: int | None = 0,
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


    state = state or process_state()
    device, world = state.device, state.num_processes
    if not specs:
        raise ValueError(f"backbone.tune = {backbone.tuning['policy']!r} trains the backbone with the heads' "
                         "objective, but the recipe has no heads; add one (type: identity trains the backbone alone).")
    if not backbone.trainable:
        raise ValueError(f"{backbone.id} has no trainable weights; call apply_tuning with last:N, lora or full first.")
    per_epoch, total = steps_of(train, len(dataset))
    if train.batch_size // world < 2:
        raise ValueError(f"train.batch_size = {train.batch_size} over {world} processes leaves fewer than 2 images "
                         "per process; raise train.batch_size.")
    objective = OBJECTIVES.get(objective_name)
    precision = effective_precision(precision, device)
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    heads = {spec.name: build_head(spec, backbone.dim, seed) for spec in specs}
    kept = [name for name, (head, _) in heads.items() if freeze_unidentified_bias(head, objective)]
    groups = [{"params": [p for p in backbone.parameters() if p.requires_grad], "name": "backbone"}]
    groups += [{"params": [p for m in pair if m is not None for p in m.parameters()], "name": name}
               for name, pair in heads.items()]
    optimizer = make_optimizer([g for g in groups if g["params"]], train)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(train, -(-total // train.grad_accum)))
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    states = {name: HeadState(name, head, predictor, optimizer, scheduler) for name, (head, predictor) in heads.items()}

    joint = _Joint(backbone, states, objective, objective_options, autocast_dtype, gather_distributed=world > 1)
    swapped = _sync_batchnorm(joint) if world > 1 and device.type == "cuda" else []
    # find_unused_parameters: a fully tuned backbone may hold weights its pooling never uses (DINOv2's mask token).
    # mixed_precision "no": autocast covers the backbone only (see _Joint), not the heads and objectives.
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision="no",
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    model = accelerator.prepare_model(joint)  # device placement; DDP when there are several processes
    views = StepViews(dataset, augment=augment, preprocess=backbone.preprocess, views=views,
                      batch_size=train.batch_size, seed=seed, rank=state.process_index, world=world)
    source = TunedSteps(joint, model, views, seed=seed, state=state, num_workers=num_workers, swapped=swapped)
    main = state.is_main_process
    states, summary = run_training(
        source, [Optimisation("joint", list(states.values()), optimizer, scheduler, scaler, backbone)], specs,
        objective_name=objective_name, objective_options=objective_options, train=train, seed=seed, total=total,
        per_epoch=per_epoch, label=f"train backbone ({backbone.tuning['policy']}) + {len(states)} heads",
        checkpoint_dir=checkpoint_dir if main else None, resume_from=resume_from, log=log if main else None,
        progress=progress, track=track, backbone=backbone)
    # One set of modules on every rank: rank 0's BatchNorm running statistics (what it checkpoints) everywhere.
    broadcast_buffers([backbone, *(m for s in states.values() for m in (s.head, s.predictor) if m is not None)], world)
    return states, {**summary, **({"output_bias_kept": kept} if kept else {}), "processes": world,
                    "batch_per_process": train.batch_size // world,
                    "precision": precision, "optimizer_groups": [g["name"] for g in optimizer.param_groups]}
