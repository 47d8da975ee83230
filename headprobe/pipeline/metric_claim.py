"""Q-metric's measures in the geometry stage (`stats.metric_claim`): every trained head of every seed, and the same
head at its initial weights, on evaluation batches of the run's cached views (`geometry.local_metric`)."""

from __future__ import annotations

import copy

import torch

from headprobe.geometry.analyse import objective_closure
from headprobe.geometry.effective import scalar_loss
from headprobe.geometry.local_metric import batch_local_metric
from headprobe.stats.metric_claim import MetricMeasure

STATES = ("trained", "init")


def metric_batches(n: int, batch: int, batches: int, rows: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(image indices (b,), rows of the stacked [z1; z2] (≤ rows,)) of each Q-metric evaluation batch: `batches`
    disjoint batches of b = max(2, min(batch, n // batches)) images drawn from `seed` (fewer when n < 2·batches),
    each with `rows` sampled rows of different images, each in a view drawn at random; the same for every head,
    seed and state."""
    b = max(2, min(batch, n // max(batches, 1)))
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=gen)
    count = min(batches, n // b) if b >= 2 else 0
    out = []
    for i in range(count):
        images = torch.randperm(b, generator=gen)[: min(rows, b)]
        views = torch.randint(2, (len(images),), generator=gen)
        out.append((order[i * b:(i + 1) * b], images + views * b))
    return out


def constant_jacobian(head) -> bool:
    """Whether the head's Jacobian is the same at every z in eval mode: bias-free linear layers, or one affine
    layer (a Linear, with or without BatchNorm on running statistics)."""
    if getattr(head, "kind", None) == "linear":
        return True
    layers = getattr(head, "layers", None)
    return layers is not None and len(layers) == 1 and not getattr(head, "l2_out", False)


def _arch(spec) -> dict:
    kind = getattr(spec, "type", "mlp")
    return {"kind": kind, "act": None if kind == "linear" else spec.act, "depth": spec.depth, "width": spec.width,
            "out_dim": spec.out_dim or spec.width, "bn_hidden": bool(spec.bn_hidden) and kind != "linear"}


def metric_measures(by_seed: dict[int, dict], specs, objective, options: dict, views: torch.Tensor, geometry,
                    seed: int = 0) -> list[MetricMeasure]:
    """Each trained head's `MetricMeasure` over the seeds of by_seed ({seed: {name: state with .head and
    .predictor}}), trained and at its initial weights (rebuilt from (seed, name) as training built them:
    `train.engine.build_head`), on `metric_batches(N, geometry.metric_batch, geometry.metric_batches,
    geometry.metric_rows, seed)`; views: (N, K ≥ 2, D). Float64, eval mode (BatchNorm on running statistics).
    Pretrained heads, null heads and heads without parameters are left out."""
    from headprobe.recipe.null_heads import trainable_specs
    from headprobe.train.engine import build_head

    batches = metric_batches(views.shape[0], geometry.metric_batch, geometry.metric_batches, geometry.metric_rows,
                             seed)
    if not batches:
        return []
    out = []
    for spec in trainable_specs(specs):
        found: dict = {key: {} for key in ("adaptation", "distance", "adaptation_init", "distance_init",
                                           "loss_metric_change", "negative_share")}
        ranks: set[int] = set()
        constant = False
        for s, heads in by_seed.items():
            state = heads.get(spec.name)
            if state is None or not any(True for _ in state.head.parameters()):
                continue
            constant = constant_jacobian(state.head)
            for name, (head, predictor) in zip(STATES, ((state.head, state.predictor),
                                                        build_head(spec, views.shape[-1], s)), strict=True):
                head = copy.deepcopy(head).double().eval()
                predictor = copy.deepcopy(predictor).double().eval() if predictor is not None else None
                fn = objective_closure(objective, options, predictor)
                suffix = "" if name == "trained" else "_init"
                for key in ("adaptation", "distance"):
                    found[key + suffix][s] = []
                for idx, rows in batches:
                    b = len(idx)
                    rec = batch_local_metric(head, lambda h, fn=fn, b=b: scalar_loss(fn(h[:b], h[b:])),
                                             views[idx, 0].double(), views[idx, 1].double(), rows)
                    if rec["n_rows"] == 0:
                        continue
                    found["adaptation" + suffix][s].append(rec["adaptation"])
                    found["distance" + suffix][s].append(rec["distance"])
                    if name == "trained":
                        found["loss_metric_change"].setdefault(s, []).append(rec["loss_metric_change"])
                        found["negative_share"].setdefault(s, []).append(rec["negative_share"])
                        ranks |= set(rec["rank"])
        if any(found["adaptation"].values()):
            out.append(MetricMeasure(spec.name, **found, arch=_arch(spec), constant=constant,
                                     ranks=tuple(sorted(ranks))))
    return out
