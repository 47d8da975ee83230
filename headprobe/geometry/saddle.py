"""Claim 4 from many constructed collapsed states: the sign of λ_min of tiny heads started collapsed.

"At a (pseudo-)collapsed state a Swish/GELU head gives negative Hessian eigenvalues (a strict saddle); linear and
ReLU heads under gradient flow do not" (the paper, claim 4). A training run passes through a handful of collapsed
points, too few to decide; `collapsed_states` builds many independent ones instead. Each state of a seed is the
paper's pseudo-collapse: a near-collapsed representation batch (what a randomly initialised backbone gives: every
z within a relative spread `spread` of one mean μ, two views drawn around it) and a freshly built head with its
weights ×`init_scale` (`train.heads.ProjectionHead(init_scale=0.1)`, biases as built). A state counts only where
`collapse.collapse_criterion` says its outputs are collapsed.

Arms (`ARMS`, `SaddleSpec.arms`): BatchNorm's batch coupling is the escape route the paper names for linear and
ReLU heads, so each head type is measured without BatchNorm ("none"), with BatchNorm on batch statistics after the
head's hidden layer ("bn_head"; the linear head becomes Linear → BN → Linear, its second layer with a bias), in
the SimSiam predictor ("bn_predictor": Linear → BN → ReLU → Linear, the same weights), and in both ("bn_both").
The target loss has no predictor: only "none" and "bn_head" are measured under it. A head with BatchNorm is drawn
from the same seed as the one without, not with the same weights (its first layer has no bias).

At each state, λ_min and λ_max of the Hessian of the loss w.r.t. the stacked batch [z1; z2] come from Lanczos run
to the operator's full dimension (exact up to round-off at these sizes), with the bound of
`extremes.negative_beyond_bound` (λ_min < −max(error bound, round-off)). Two losses:

- "simsiam": the symmetric SimSiam loss through a ReLU predictor (`tracking.symmetric_simsiam`), the paper's
  objective. Its ∇²_h L is indefinite, so the G-term alone can be negative for any head;
- "target": ½ mean_b ‖h_b − t_b‖² with fixed random targets t, so ∇²_h L ⪰ 0 and ∇_h L ≠ 0 at collapse: λ_min can
  be negative only through the head's M-term, zero for linear and ReLU heads. This asks "does a smooth head make
  collapse a saddle on its own".

`rayleigh_head` (vᵀMv at λ_min's eigenvector v, `gm_split.curvature_shares`) says how much of λ_min is the head's;
`rayleigh_head_bn` and `rayleigh_head_act` split it exactly into the part from the head's BatchNorm on batch
statistics and the part from its activation (`bn_share.head_bn_split`: the activation's part is the M-term with
the batch statistics held fixed at their values).

>>> from headprobe.train.heads import ProjectionHead
>>> spec = SaddleSpec(heads=("swish",), seeds=(0,), states=2)
>>> [s.head for s in collapsed_states(spec, ProjectionHead)]
['swish', 'swish', 'swish', 'swish', 'swish', 'swish', 'swish', 'swish']
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from headprobe.geometry.bn_share import head_bn_split
from headprobe.geometry.collapse import COLLAPSE_THRESHOLD, collapse_criterion, out_std
from headprobe.geometry.extremes import negative_beyond_bound, scaled_extremes
from headprobe.geometry.gm_split import SplitOperators, curvature_shares
from headprobe.geometry.hessian import hvp_fn
from headprobe.geometry.pullback import batchnorm_mode
from headprobe.geometry.tracking import symmetric_simsiam

# Head type → the ProjectionHead arguments that build it (two linear layers, no BatchNorm); with BatchNorm in the
# head, `HEAD_TYPES_BN` (the linear head as an MLP without activation: ProjectionHead's "linear" has no BatchNorm).
HEAD_TYPES = {"linear": {"kind": "linear"}, "relu": {"kind": "mlp", "act": "relu"},
              "swish": {"kind": "mlp", "act": "swish"}, "gelu": {"kind": "mlp", "act": "gelu"}}
HEAD_TYPES_BN = HEAD_TYPES | {"linear": {"kind": "mlp", "act": "none"}}
SMOOTH, PIECEWISE_LINEAR = ("swish", "gelu"), ("linear", "relu")
LOSSES = ("simsiam", "target")
# Arm → (BatchNorm in the head, BatchNorm in the predictor), both on batch statistics as in a training step.
ARMS = {"none": (False, False), "bn_head": (True, False), "bn_predictor": (False, True), "bn_both": (True, True)}


def arm_label(head: str, arm: str) -> str:
    """The name a head type's arm is answered under: "relu" without BatchNorm, "relu+bn_head" with it."""
    return head if arm == "none" else f"{head}+{arm}"


def arms_for(loss: str, arms: tuple[str, ...]) -> tuple[str, ...]:
    """The arms measured under `loss`: the target loss has no predictor, so no predictor BatchNorm."""
    return arms if loss == "simsiam" else tuple(a for a in arms if not ARMS[a][1])


@dataclass(frozen=True)
class SaddleSpec:
    """The constructed collapsed states: `states` per seed and head type, heads dim → width → dim, `batch` rows per
    view (the Hessian has side 2·batch·dim), weights ×init_scale, representations within `spread` (relative to
    ‖μ‖) of their mean, collapse at out_std ≤ threshold/√dim, the loss "simsiam" or "target"."""

    heads: tuple[str, ...] = ("linear", "relu", "swish", "gelu")
    seeds: tuple[int, ...] = (0, 1, 2)
    states: int = 50
    dim: int = 6
    width: int = 12
    batch: int = 4
    init_scale: float = 0.1
    spread: float = 0.01
    threshold: float = COLLAPSE_THRESHOLD
    loss: str = "simsiam"
    arms: tuple[str, ...] = tuple(ARMS)

    def __post_init__(self) -> None:
        unknown = [h for h in self.heads if h not in HEAD_TYPES]
        if unknown:
            raise ValueError(f"head type {unknown[0]!r} is unknown here; use among {', '.join(HEAD_TYPES)}.")
        bad = [a for a in self.arms if a not in ARMS]
        if bad or not self.arms:
            raise ValueError(f"saddle arm {bad[0] if bad else None!r} is unknown; use some of {', '.join(ARMS)}.")
        if self.loss not in LOSSES:
            raise ValueError(f"loss {self.loss!r} is unknown; use {' or '.join(LOSSES)}.")
        if min(self.states, self.dim, self.width, self.batch) < 1 or self.batch < 2 or not self.seeds:
            raise ValueError(f"the states need states, dim, width ≥ 1, batch ≥ 2 and a seed; got {self}.")
        if not (self.init_scale > 0 and self.spread >= 0 and self.threshold > 0):
            raise ValueError(f"init_scale and threshold must be > 0 and spread ≥ 0; got {self}.")

    def sizes(self) -> str:
        side = 2 * self.batch * self.dim
        return (f"{len(self.heads)} head types × {len(self.arms)} BatchNorm arms ({', '.join(self.arms)}) × "
                f"{len(self.seeds)} seeds × {self.states} states; heads {self.dim} → {self.width} → {self.dim} "
                f"(weights ×{self.init_scale:g}), {self.batch} rows per view, Hessian side {side}")


@dataclass(frozen=True)
class SaddleState:
    """One constructed state: its head type, seed and index, whether it is collapsed (out_std ≤ collapse_bound),
    λ_min, λ_max and the bound λ_min is compared with (max(Lanczos error bound, round-off)), whether λ_min < −bound,
    vᵀMv at λ_min's eigenvector, whether Lanczos converged at λ_min; its BatchNorm arm (`ARMS`), and vᵀMv split into
    the head's BatchNorm part and its activation part (`bn_share.head_bn_split`; they add up to rayleigh_head)."""

    head: str
    seed: int
    index: int
    collapsed: bool
    out_std: float | None
    collapse_bound: float
    lambda_min: float
    lambda_max: float
    bound: float
    negative: bool
    rayleigh_head: float
    converged: bool
    arm: str = "none"
    rayleigh_head_bn: float = 0.0
    rayleigh_head_act: float = 0.0

    @property
    def label(self) -> str:
        return arm_label(self.head, self.arm)

    def record(self) -> dict:
        return dataclasses.asdict(self)


def state_curvature(head: nn.Module, loss_of_h, z1: torch.Tensor, z2: torch.Tensor, seed: int = 0) -> dict:
    """λ_min, λ_max (Lanczos to the full dimension 2·B·D), the bound, "negative" (λ_min < −bound), "converged",
    "rayleigh_head" (vᵀMv at λ_min's unit eigenvector) and its split into "rayleigh_head_bn" and
    "rayleigh_head_act" (`bn_share.head_bn_split`) of the Hessian of loss_of_h([head(z1); head(z2)]) w.r.t. the
    stacked batch [z1; z2]: (2B, D); loss_of_h maps the stacked outputs (2B, out) to a scalar. The head (and any
    module in loss_of_h) is measured in the mode it is in: BatchNorm in train mode uses batch statistics."""
    z = torch.cat([z1, z2]).detach()
    n = len(z1)
    hvp = hvp_fn(lambda x: loss_of_h(torch.cat([head(x[:n]), head(x[n:])])), z)
    ext = scaled_extremes(hvp, hvp.dim, hvp.dtype, hvp.device, 1, 1e-10, hvp.dim, seed, eigenvectors=True)
    v = ext["vectors"][:, 0]
    shares = curvature_shares(SplitOperators(head, loss_of_h, z), v, None)
    split = head_bn_split(head, loss_of_h, z, v)
    return {"lambda_min": float(ext["values"][0]), "lambda_max": float(ext["values"][-1]),
            "bound": max(float(ext["error_bounds"][0]), ext["roundoff"]), "negative": negative_beyond_bound(ext),
            "converged": ext["converged_min"], "rayleigh_head": shares["rayleigh_head"],
            "rayleigh_head_bn": shares["rayleigh_head"] - split["rayleigh_head_act"],
            "rayleigh_head_act": split["rayleigh_head_act"]}


def _losses(spec: SaddleSpec, gen: torch.Generator) -> dict:
    """{predictor BatchNorm: (the state's loss of the stacked outputs h: (2B, dim), its predictor or None)}, the
    random parts drawn from `gen` once: the predictor with and without BatchNorm has the same weights."""
    n = spec.batch
    if spec.loss == "target":
        targets = torch.randn(2 * n, spec.dim, generator=gen, dtype=torch.float64)
        return {False: (lambda h: 0.5 * ((h - targets) ** 2).sum(dim=1).mean(), None)}
    predictor_seed = int(torch.randint(2**31, (1,), generator=gen))
    out = {}
    for bn in (False, True):
        with torch.random.fork_rng():
            torch.manual_seed(predictor_seed)
            first, last = nn.Linear(spec.dim, spec.width), nn.Linear(spec.width, spec.dim)
        layers = [first, *([nn.BatchNorm1d(spec.width)] if bn else []), nn.ReLU(), last]
        predictor = nn.Sequential(*layers).double()
        objective = symmetric_simsiam(predictor)
        out[bn] = (lambda h, objective=objective: objective(h[:n], h[n:]), predictor)
    return out


def collapsed_states(spec: SaddleSpec, head_class) -> list[SaddleState]:
    """Every (head type, arm, seed, state) of `spec` (the arms `arms_for` the loss), collapsed or not (count only
    `collapsed`). The representation batch, the loss's random parts and the head's weights of state i of seed s
    are drawn from seed (s, i): every head type and arm sees the same batch and loss, so they are paired within a
    state. BatchNorm is on batch statistics (train mode), its running statistics untouched. head_class: the heads'
    class, `train.heads.ProjectionHead` (passed in: geometry sits below train in the package's layers)."""
    out = []
    for seed in spec.seeds:
        for index in range(spec.states):
            gen = torch.Generator().manual_seed(1_000_003 * seed + index)
            mu = torch.randn(spec.dim, generator=gen, dtype=torch.float64)
            noise = spec.spread * float(mu.norm()) / math.sqrt(spec.dim)
            z1, z2 = (mu + noise * torch.randn(spec.batch, spec.dim, generator=gen, dtype=torch.float64)
                      for _ in range(2))
            losses = _losses(spec, gen)
            head_seed = int(torch.randint(2**31, (1,), generator=gen))
            for name in spec.heads:
                for arm in arms_for(spec.loss, spec.arms):
                    head_bn, predictor_bn = ARMS[arm]
                    loss_of_h, predictor = losses[predictor_bn]
                    with torch.random.fork_rng():
                        torch.manual_seed(head_seed)
                        head = head_class(spec.dim, depth=2, width=spec.width, out_dim=spec.dim, bn_hidden=head_bn,
                                          init_scale=spec.init_scale,
                                          **(HEAD_TYPES_BN if head_bn else HEAD_TYPES)[name]).double()
                    with batchnorm_mode([head, predictor], "batch"):
                        with torch.no_grad():
                            verdict = collapse_criterion(out_std(head(z1)), spec.dim, spec.threshold)
                        curvature = state_curvature(head, loss_of_h, z1, z2, seed=index)
                    out.append(SaddleState(name, seed, index, verdict["collapsed"], verdict["out_std"],
                                           verdict["threshold"], arm=arm, **curvature))
    return out
