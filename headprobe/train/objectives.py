"""Self-supervised objectives as plain functions: InfoNCE (SimCLR), VICReg, Barlow Twins and SimSiam.

Every objective returns a `LossTerms`: ``.loss`` to call ``backward()`` on and ``.terms`` to log.

Why not lightly's losses (`NTXentLoss`, `VICRegLoss`, `BarlowTwinsLoss`, `NegativeCosineSimilarity`): lightly is a
development dependency only (it brings PyTorch Lightning), its losses return no terms, and its `BarlowTwinsLoss` adds
batch norm's ε = 1e-5 to the variance where the paper's formula has none. On one 256 × 512 batch (forward and backward,
`benchmarks/bench_objectives.py`, `benchmarks/results/objectives.json`) InfoNCE, VICReg and SimSiam gave lightly's
values at 1.27x, 1.74x and 1.13x its speed; Barlow Twins ran at 0.76x (torch's batch norm, which lightly uses, cannot
standardise without ε).

Distributed runs: with ``gather_distributed=True`` (lightly's name; off by default, so the call site says it)
and ``torch.distributed`` initialised with a world size above one, each function gathers what the paper defines
over the batch — the InfoNCE negatives, VICReg's variance and covariance, Barlow Twins' standardisation and
cross-correlation — from every rank with `gather_with_grad`, so that ``W`` processes with ``B`` samples each
compute the objective of one ``W·B`` batch. Every rank must then pass the same batch size (use
``drop_last=True``) and call the objective at the same point, since the gather is a collective. Code that
already holds the global batch on every process (headprobe's cached path) passes ``False``.

What each rank gets, with the global batch split in equal parts:

- ``vicreg``, ``barlow_twins``: the loss of the global batch, identical on every rank.
- ``info_nce``: the loss of this rank's anchors against all ``2·W·B`` candidates; ``simsiam``: the loss of
  this rank's samples (it has no batch statistics). The mean over ranks is the global loss.

In both cases DDP's gradient averaging gives the parameters exactly the one-process gradient of the global
loss: `gather_with_grad` sums the gradients that all ranks' losses send to this rank's rows, so each rank's
parameter gradient is ``W`` times its share, and DDP divides by ``W``. The gradient that reaches a rank's
own *inputs* is therefore ``W`` times the one-process gradient of those rows — the same factor DDP gives any
batch-mean loss.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
import torch.nn.functional as F

from headprobe.checks import check_floating
from headprobe.registry import OBJECTIVES as REGISTERED


class LossTerms:
    """What every objective returns.

    loss: 0-d tensor to call ``backward()`` on.
    terms: ``{name: value}`` of the total (under the objective's name, e.g. ``"vicreg"``) and of each
        unweighted term the paper defines (e.g. ``"vicreg.sim"``), as Python floats for logging. An objective may
        pass them as 0-d tensors: they become floats when ``terms`` is first read, so a training step that does not
        log makes no host-device synchronisation for them (four per head per step for VICReg on a GPU otherwise).
    """

    def __init__(self, loss: torch.Tensor, terms: dict[str, float | torch.Tensor]) -> None:
        self.loss = loss
        self._terms = {name: value.detach() if isinstance(value, torch.Tensor) else value
                       for name, value in terms.items()}

    @property
    def terms(self) -> dict[str, float]:
        if any(isinstance(value, torch.Tensor) for value in self._terms.values()):
            self._terms = {name: float(value) for name, value in self._terms.items()}
        return self._terms

    def __repr__(self) -> str:
        return f"LossTerms(loss={self.loss!r}, terms={self.terms!r})"


def _world() -> tuple[int, int]:
    """(rank, world size) of the default process group, or (0, 1) when none is initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _GatherWithGrad(torch.autograd.Function):
    """All-gather along dim 0 whose backward returns this rank's rows of the gradient summed over ranks."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        rank, world = _world()
        ctx.rows = slice(rank * x.shape[0], (rank + 1) * x.shape[0])
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        # Every rank's loss depends on this rank's rows; their gradients are summed here.
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rows]


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from every rank, in rank order, keeping autograd.

    x: (B, ...) with the same shape on every rank. Returns (W·B, ...); ``x`` itself when
    ``torch.distributed`` is not initialised or has one process.

    The backward pass is the ``GatherLayer`` of solo-learn and lightly: the gradient of the gathered
    tensor is summed over ranks (``all_reduce``) and this rank's rows are returned. Summing, rather than
    keeping only the local gradient, is what makes DDP's averaged gradients equal the one-process ones.
    ``torch.distributed.nn.functional.all_gather`` computes the same gradient but is deprecated in
    torch 2.14 and emulates the reduction with one scatter per rank on gloo.

    >>> gather_with_grad(torch.ones(2, 3)).shape  # one process
    torch.Size([2, 3])
    """
    if _world()[1] == 1:
        return x
    return _GatherWithGrad.apply(x)


def _check_pair(name: str, a: torch.Tensor, b: torch.Tensor, min_batch: int) -> None:
    """Raise ValueError unless a, b: (N, D) floating tensors of one shape with N >= min_batch."""
    for label, t in (("first", a), ("second", b)):
        if t.ndim != 2:
            raise ValueError(
                f"{name}: the {label} view must be 2-D (N, D) but has shape {tuple(t.shape)}; "
                "flatten the embeddings to one vector per sample."
            )
        check_floating(f"{name}: the {label} view", t, "embeddings")
    if a.shape != b.shape:
        raise ValueError(
            f"{name}: the two views have shapes {tuple(a.shape)} and {tuple(b.shape)}; "
            "they must hold the same samples in the same order with the same dimension."
        )
    if a.shape[0] < min_batch or a.shape[1] == 0:
        raise ValueError(
            f"{name} needs at least {min_batch} samples of dimension >= 1 per rank but got shape {tuple(a.shape)}."
        )


def _check_positive(name: str, **values: float) -> None:
    for key, value in values.items():
        if not value > 0:
            raise ValueError(f"{name}: {key} must be > 0 but is {value}.")


def _check_non_negative(name: str, **values: float) -> None:
    for key, value in values.items():
        if not value >= 0:
            raise ValueError(f"{name}: {key} must be >= 0 but is {value}.")


def _off_diagonal(m: torch.Tensor) -> torch.Tensor:
    """m: (D, D) -> (D·(D−1),) entries with i != j."""
    d = m.shape[0]
    return m.flatten()[:-1].view(d - 1, d + 1)[:, 1:].flatten()


def info_nce(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.1, *,
             gather_distributed: bool = False) -> LossTerms:
    """SimCLR's NT-Xent loss (Chen et al., 2020).

    "We randomly sample a minibatch of N examples and define the contrastive prediction task on pairs of
    augmented examples derived from the minibatch, resulting in 2N data points. [...] Given a positive
    pair, [...] we treat the other 2(N − 1) augmented examples within a minibatch as negative examples."

        ℓ(i, j) = −log [ exp(sim(z_i, z_j)/τ) / Σ_{k=1}^{2N} 1[k ≠ i] exp(sim(z_i, z_k)/τ) ],
        sim(u, v) = uᵀv / (‖u‖ ‖v‖),

    "The final loss is computed across all positive pairs, both (i, j) and (j, i), in a mini-batch":
    the mean of ℓ over the 2N anchors.

    z1, z2: (N, D) embeddings of two views; row n of each is a positive pair. They are L2-normalised here.
    With ``gather_distributed``: the anchors are this rank's 2N rows and the candidates the 2·W·N rows of all ranks.

    >>> z = torch.eye(4)
    >>> round(info_nce(z, z, temperature=0.1).loss.item(), 6)  # log(1 + 6·e^−10)
    0.000272
    """
    _check_pair("info_nce", z1, z2, min_batch=1)
    _check_positive("info_nce", temperature=temperature)
    rank, world = _world() if gather_distributed else (0, 1)
    n = z1.shape[0]
    anchors = F.normalize(torch.cat([z1, z2]), dim=1)
    g1, g2 = (gather_with_grad(anchors[:n]), gather_with_grad(anchors[n:])) if world > 1 else (anchors[:n], anchors[n:])
    candidates = torch.cat([g1, g2])
    logits = anchors @ candidates.T / temperature
    total = world * n
    own = torch.arange(n, device=z1.device) + rank * n
    self_index = torch.cat([own, own + total])
    positive = torch.cat([own + total, own])
    is_self = F.one_hot(self_index, 2 * total).bool()
    loss = F.cross_entropy(logits.masked_fill(is_self, float("-inf")), positive)
    return LossTerms(loss, {"info_nce": loss})


# The factor on v(Z) + v(Z') under each convention of `vicreg(variance=...)`.
VICREG_VARIANCE = {"official": 0.5, "paper": 1.0}


def vicreg(
    z1: torch.Tensor,
    z2: torch.Tensor,
    sim_weight: float = 25.0,
    var_weight: float = 25.0,
    cov_weight: float = 1.0,
    eps: float = 1e-4,
    gamma: float = 1.0,
    variance: str = "official",
    *,
    gather_distributed: bool = False,
) -> LossTerms:
    """VICReg: Variance-Invariance-Covariance Regularization (Bardes, Ponce & LeCun, ICLR 2022).

        v(Z) = 1/d Σ_j max(0, γ − S(z^j, ε)),  S(x, ε) = sqrt(Var(x) + ε)
        C(Z) = 1/(n−1) Σ_i (z_i − z̄)(z_i − z̄)ᵀ,  c(Z) = 1/d Σ_{i≠j} [C(Z)]²_{i,j}
        ℓ(Z, Z') = λ s(Z, Z') + μ [v(Z) + v(Z')] / 2 + ν [c(Z) + c(Z')],  with λ = μ = 25, ν = 1.

    ``variance="official"`` (the default) halves the variance term as the authors' released code does
    (facebookresearch/vicreg ``main_vicreg.py``: ``std_loss = mean(relu(1 - std_x)) / 2 + mean(relu(1 - std_y)) / 2``;
    lightly's ``VICRegLoss`` too): λ = μ = 25, ν = 1 were tuned with that form. ``variance="paper"`` is the
    paper's printed Eq. (6), μ [v(Z) + v(Z')], whose hinge weighs twice as much at the same μ.
    The invariance term s is the mean squared error over all N·D entries, as in the paper's Algorithm 1
    (``sim_loss = mse_loss(z_a, z_b)``) for which the weights were tuned; its Eq. for s sums over the D
    dimensions instead. Var is the unbiased variance over the batch, like C(Z).

    z1, z2: (N, D) embeddings of two views, N >= 2. With ``gather_distributed``: all three terms are computed on the
    gathered (W·N, D) batch, so every rank returns the global loss.
    Terms: ``vicreg`` (the total), ``vicreg.sim`` = s, ``vicreg.var`` = the variance term μ multiplies
    ([v(Z) + v(Z')] / 2 by default, v(Z) + v(Z') with ``variance="paper"``), ``vicreg.cov`` = c(Z) + c(Z').

    >>> out = vicreg(torch.randn(8, 4), torch.randn(8, 4))
    >>> sorted(out.terms)
    ['vicreg', 'vicreg.cov', 'vicreg.sim', 'vicreg.var']
    """
    _check_pair("vicreg", z1, z2, min_batch=2)
    _check_non_negative("vicreg", sim_weight=sim_weight, var_weight=var_weight, cov_weight=cov_weight)
    _check_positive("vicreg", eps=eps, gamma=gamma)
    if variance not in VICREG_VARIANCE:
        raise ValueError(f"vicreg got variance={variance!r}; use 'official' (the authors' code: the variance term "
                         "halved, what λ = μ = 25 were tuned with) or 'paper' (Eq. 6 as printed).")
    if gather_distributed:
        z1, z2 = gather_with_grad(z1), gather_with_grad(z2)
    n, d = z1.shape
    sim = F.mse_loss(z1, z2)
    var = z1.new_zeros(())
    cov = z1.new_zeros(())
    for z in (z1, z2):
        z = z - z.mean(dim=0)
        std = torch.sqrt(z.var(dim=0) + eps)
        var = var + F.relu(gamma - std).mean()
        c = z.T @ z / (n - 1)
        cov = cov + _off_diagonal(c).pow(2).sum() / d
    var = var * VICREG_VARIANCE[variance]
    loss = sim_weight * sim + var_weight * var + cov_weight * cov
    return LossTerms(
        loss, {"vicreg": loss, "vicreg.sim": sim, "vicreg.var": var, "vicreg.cov": cov}
    )


def barlow_twins(z1: torch.Tensor, z2: torch.Tensor, lambd: float = 5e-3, *,
                 gather_distributed: bool = False) -> LossTerms:
    """Barlow Twins (Zbontar et al., ICML 2021).

        L_BT = Σ_i (1 − C_ii)² + λ Σ_i Σ_{j≠i} C_ij²
        C_ij = Σ_b z^A_{b,i} z^B_{b,j} / ( sqrt(Σ_b (z^A_{b,i})²) · sqrt(Σ_b (z^B_{b,j})²) )

    "where b indexes batch samples and i, j index the vector dimension of the networks' outputs", with the
    outputs mean-centred along the batch; the paper uses λ = 5·10⁻³. Each dimension is standardised over the
    batch with its population (1/N) standard deviation and C = ẐᴬᵀẐᴮ / N, which is this formula exactly, so
    identical views give C_ii = 1. There is no ε: a dimension that is constant over the batch gives NaN.

    z1, z2: (N, D) embeddings of two views, N >= 2. With ``gather_distributed``: standardisation and C use the gathered
    (W·N, D) batch, so every rank returns the global loss.
    Terms: ``barlow_twins`` (the total), ``barlow_twins.on_diag`` = Σ (1 − C_ii)²,
    ``barlow_twins.off_diag`` = Σ_{i≠j} C_ij² (before λ).

    >>> z = torch.randn(16, 4)
    >>> abs(barlow_twins(z, z).terms["barlow_twins.on_diag"]) < 1e-6
    True
    """
    _check_pair("barlow_twins", z1, z2, min_batch=2)
    _check_non_negative("barlow_twins", lambd=lambd)
    if gather_distributed:
        z1, z2 = gather_with_grad(z1), gather_with_grad(z2)
    n = z1.shape[0]
    z1 = (z1 - z1.mean(dim=0)) / z1.std(dim=0, unbiased=False)
    z2 = (z2 - z2.mean(dim=0)) / z2.std(dim=0, unbiased=False)
    c = z1.T @ z2 / n
    on_diag = (1 - torch.diagonal(c)).pow(2).sum()
    off_diag = _off_diagonal(c).pow(2).sum()
    loss = on_diag + lambd * off_diag
    return LossTerms(
        loss,
        {"barlow_twins": loss, "barlow_twins.on_diag": on_diag, "barlow_twins.off_diag": off_diag},
    )


def simsiam(p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor, *,
            gather_distributed: bool = False) -> LossTerms:
    """SimSiam's symmetrised negative cosine with stop-gradient (Chen & He, CVPR 2021).

        D(p1, z2) = − p1/‖p1‖₂ · z2/‖z2‖₂,   L = ½ D(p1, stopgrad(z2)) + ½ D(p2, stopgrad(z1))

    "This is defined for each image, and the total loss is averaged over all images." No gradient reaches
    z1 or z2 through this loss.

    p1, p2: (N, D) predictor outputs of the two views; z1, z2: (N, D) projector outputs. It has no batch
    statistics, so nothing is gathered: on each rank it is the mean over that rank's samples.

    >>> z = torch.randn(4, 8)
    >>> round(simsiam(z, z, z, z).loss.item(), 6)
    -1.0
    """
    _check_pair("simsiam", p1, p2, min_batch=1)
    _check_pair("simsiam", z1, z2, min_batch=1)
    _check_pair("simsiam", p1, z1, min_batch=1)
    loss = -0.5 * (
        F.cosine_similarity(p1, z2.detach(), dim=1).mean() + F.cosine_similarity(p2, z1.detach(), dim=1).mean()
    )
    return LossTerms(loss, {"simsiam": loss})


# Losses unchanged when every output of both views is shifted by one vector c (h -> h + c): VICReg's terms are a
# difference, a standard deviation and a centred covariance; Barlow Twins standardises each dimension over the
# batch. Under them the last layer's bias has no gradient but rounding noise (`train.heads.freeze_unidentified_bias`).
# A plug-in objective may say the same by setting `shift_invariant = True` on its function.
vicreg.shift_invariant = True
barlow_twins.shift_invariant = True


def objective_protocol(name: str, options: dict) -> dict:
    """Every keyword of objective `name` with the value a run uses (its default unless `options` sets it), so
    `results.json` records conventions such as VICReg's `variance` even where the recipe left them implicit."""

    parameters = inspect.signature(REGISTERED.get(name)).parameters.values()
    defaults = {p.name: p.default for p in parameters
                if p.default is not inspect.Parameter.empty and p.name != "gather_distributed"}
    return defaults | dict(options)
