"""Claim 4 from many constructed collapsed states: the sign of λ_min of tiny heads started collapsed.

"At a (pseudo-)collapsed state a Swish/GELU head gives negative Hessian eigenvalues (a strict saddle); linear and
ReLU heads under gradient flow do not" (PAPER.md, claim 4). A training run passes through a handful of collapsed
points, too few to decide; `collapsed_states` builds many independent ones instead. Each state of a seed is the
paper's pseudo-collapse: a near-collapsed representation batch (what a randomly initialised backbone gives: every
z within a relative spread `spread` of one mean μ, two views drawn around it) and a freshly built head with its
weights ×`init_scale` (`train.heads.ProjectionHead(init_scale=0.1)`, biases as built), no BatchNorm in the head or
the predictor (so BatchNorm's batch coupling, the escape route the paper names for linear and ReLU heads, is not
in the measure). A state counts only where `collapse.collapse_criterion` says its outputs are collapsed.

At each state, λ_min and λ_max of the Hessian of the loss w.r.t. the stacked batch [z1; z2] come from Lanczos run
to the operator's full dimension (exact up to round-off at these sizes), with the bound of
`extremes.negative_beyond_bound` (λ_min < −max(error bound, round-off)). Two losses:

- "simsiam": the symmetric SimSiam loss through a ReLU predictor (`tracking.symmetric_simsiam`), the paper's
  objective. Its ∇²_h L is indefinite, so the G-term alone can be negative for any head;
- "target": ½ mean_b ‖h_b − t_b‖² with fixed random targets t, so ∇²_h L ⪰ 0 and ∇_h L ≠ 0 at collapse: λ_min can
  be negative only through the head's M-term, zero for linear and ReLU heads. This asks "does a smooth head make
  collapse a saddle on its own".

`rayleigh_head` (vᵀMv at λ_min's eigenvector v, `gm_split.curvature_shares`) says how much of λ_min is the head's.

>>> from headprobe.train.heads import ProjectionHead
>>> spec = SaddleSpec(heads=("swish",), seeds=(0,), states=2)
>>> [s.head for s in collapsed_states(spec, ProjectionHead)]
['swish', 'swish']
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from headprobe.geometry.collapse import COLLAPSE_THRESHOLD, collapse_criterion, out_std
from headprobe.geometry.extremes import negative_beyond_bound, scaled_extremes
from headprobe.geometry.gm_split import SplitOperators, curvature_shares
from headprobe.geometry.hessian import hvp_fn
from headprobe.geometry.tracking import symmetric_simsiam

# Head type → the ProjectionHead arguments that build it (two linear layers, no BatchNorm).
HEAD_TYPES = {"linear": {"kind": "linear"}, "relu": {"kind": "mlp", "act": "relu"},
              "swish": {"kind": "mlp", "act": "swish"}, "gelu": {"kind": "mlp", "act": "gelu"}}
SMOOTH, PIECEWISE_LINEAR = ("swish", "gelu"), ("linear", "relu")
LOSSES = ("simsiam", "target")


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

    def __post_init__(self) -> None:
        unknown = [h for h in self.heads if h not in HEAD_TYPES]
        if unknown:
            raise ValueError(f"head type {unknown[0]!r} is unknown here; use among {', '.join(HEAD_TYPES)}.")
        if self.loss not in LOSSES:
            raise ValueError(f"loss {self.loss!r} is unknown; use {' or '.join(LOSSES)}.")
        if min(self.states, self.dim, self.width, self.batch) < 1 or self.batch < 2 or not self.seeds:
            raise ValueError(f"the states need states, dim, width ≥ 1, batch ≥ 2 and a seed; got {self}.")
        if not (self.init_scale > 0 and self.spread >= 0 and self.threshold > 0):
            raise ValueError(f"init_scale and threshold must be > 0 and spread ≥ 0; got {self}.")

    def sizes(self) -> str:
        side = 2 * self.batch * self.dim
        return (f"{len(self.heads)} head types × {len(self.seeds)} seeds × {self.states} states; heads {self.dim} → "
                f"{self.width} → {self.dim} (weights ×{self.init_scale:g}), {self.batch} rows per view, Hessian side "
                f"{side}")


@dataclass(frozen=True)
class SaddleState:
    """One constructed state: its head type, seed and index, whether it is collapsed (out_std ≤ collapse_bound),
    λ_min, λ_max and the bound λ_min is compared with (max(Lanczos error bound, round-off)), whether λ_min < −bound,
    vᵀMv at λ_min's eigenvector, and whether Lanczos converged at λ_min."""

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

    def record(self) -> dict:
        return dataclasses.asdict(self)


def state_curvature(head: nn.Module, loss_of_h, z1: torch.Tensor, z2: torch.Tensor, seed: int = 0) -> dict:
    """λ_min, λ_max (Lanczos to the full dimension 2·B·D), the bound, "negative" (λ_min < −bound), "converged" and
    "rayleigh_head" (vᵀMv at λ_min's unit eigenvector) of the Hessian of loss_of_h([head(z1); head(z2)]) w.r.t.
    the stacked batch [z1; z2]: (2B, D); loss_of_h maps the stacked outputs (2B, out) to a scalar."""
    z = torch.cat([z1, z2]).detach()
    n = len(z1)
    hvp = hvp_fn(lambda x: loss_of_h(torch.cat([head(x[:n]), head(x[n:])])), z)
    ext = scaled_extremes(hvp, hvp.dim, hvp.dtype, hvp.device, 1, 1e-10, hvp.dim, seed, eigenvectors=True)
    shares = curvature_shares(SplitOperators(head, loss_of_h, z), ext["vectors"][:, 0], None)
    return {"lambda_min": float(ext["values"][0]), "lambda_max": float(ext["values"][-1]),
            "bound": max(float(ext["error_bounds"][0]), ext["roundoff"]), "negative": negative_beyond_bound(ext),
            "converged": ext["converged_min"], "rayleigh_head": shares["rayleigh_head"]}


def _loss(spec: SaddleSpec, gen: torch.Generator):
    """The state's loss of the stacked outputs h: (2B, dim), its random parts drawn from `gen`."""
    n = spec.batch
    if spec.loss == "target":
        targets = torch.randn(2 * n, spec.dim, generator=gen, dtype=torch.float64)
        return lambda h: 0.5 * ((h - targets) ** 2).sum(dim=1).mean()
    with torch.random.fork_rng():
        torch.manual_seed(int(torch.randint(2**31, (1,), generator=gen)))
        predictor = nn.Sequential(nn.Linear(spec.dim, spec.width), nn.ReLU(), nn.Linear(spec.width, spec.dim))
    objective = symmetric_simsiam(predictor.double())
    return lambda h: objective(h[:n], h[n:])


def collapsed_states(spec: SaddleSpec, head_class) -> list[SaddleState]:
    """Every (head type, seed, state) of `spec`, collapsed or not (count only `collapsed`). The representation
    batch, the loss's random parts and the head's weights of state i of seed s are drawn from seed (s, i): every
    head type sees the same batch and loss, so head types are paired within a state. head_class: the heads' class,
    `train.heads.ProjectionHead` (passed in: geometry sits below train in the package's layers)."""
    out = []
    for seed in spec.seeds:
        for index in range(spec.states):
            gen = torch.Generator().manual_seed(1_000_003 * seed + index)
            mu = torch.randn(spec.dim, generator=gen, dtype=torch.float64)
            noise = spec.spread * float(mu.norm()) / math.sqrt(spec.dim)
            z1, z2 = (mu + noise * torch.randn(spec.batch, spec.dim, generator=gen, dtype=torch.float64)
                      for _ in range(2))
            loss_of_h = _loss(spec, gen)
            head_seed = int(torch.randint(2**31, (1,), generator=gen))
            for name in spec.heads:
                with torch.random.fork_rng():
                    torch.manual_seed(head_seed)
                    head = head_class(spec.dim, depth=2, width=spec.width, out_dim=spec.dim, bn_hidden=False,
                                          init_scale=spec.init_scale, **HEAD_TYPES[name]).double()
                with torch.no_grad():
                    verdict = collapse_criterion(out_std(head(z1)), spec.dim, spec.threshold)
                curvature = state_curvature(head, loss_of_h, z1, z2, seed=index)
                out.append(SaddleState(name, seed, index, verdict["collapsed"], verdict["out_std"],
                                       verdict["threshold"], **curvature))
    return out

