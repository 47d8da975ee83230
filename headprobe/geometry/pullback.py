"""The pull-back metric of a projection head, G(z) = J_h(z)ᵀ J_h(z), and its degeneracy along augmentations.

The paper models the head h as a metric on the backbone's representation space: a small step dz moves the head
output by |J_h dz|, so dzᵀ G(z) dz is the squared length the loss sees. A linear head has one constant G; a nonlinear
head adapts G to z (claim 2). "The pull-back metric G = J_hᵀJ_h is singular along augmentation directions; the head
loses the augmentation information the backbone keeps" (claim 5): `augmentation_degeneracy` measures how much
less the head stretches augmentation tangents than other directions.

Per-sample Jacobians need a per-sample head, so they are taken with BatchNorm on its running statistics (eval
mode, as the head is used after training): in train mode BatchNorm couples the rows of a batch and J_h(z_i) is not
defined on its own. `batchnorm_mode` switches, and always restores, the mode.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.func import jacrev, vmap

BATCHNORM_MODES = ("running", "batch")
# Every BatchNorm class torch.nn defines, named publicly: the torch.nn classes the private base class
# torch.nn.modules.batchnorm._BatchNorm covers.
BATCHNORMS = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LazyBatchNorm1d, nn.LazyBatchNorm2d, nn.LazyBatchNorm3d,
    nn.SyncBatchNorm,
)


@contextmanager
def batchnorm_mode(modules: nn.Module | list[nn.Module], mode: str) -> Iterator[None]:
    """Evaluate modules with BatchNorm on running statistics ("running") or on batch statistics ("batch").

    "running" is eval mode for the whole module. "batch" is eval mode except that every BatchNorm normalises with
    the statistics of the batch it sees, as in a training step, without updating its running statistics -- so a
    measurement taken inside a training loop leaves the model exactly as it found it. Modes and running statistics
    are restored on exit.

    >>> bn = nn.BatchNorm1d(2)
    >>> with batchnorm_mode(bn, "batch"):
    ...     out = bn(torch.tensor([[0.0, 1.0], [2.0, 3.0]]))
    >>> out.abs().max().item() > 0.99, bn.num_batches_tracked.item(), bn.training
    (True, 0, True)
    """
    if mode not in BATCHNORM_MODES:
        raise ValueError(f"batchnorm mode {mode!r} is unknown; use 'running' (eval mode, running statistics) or "
                         "'batch' (statistics of the batch, as in a training step).")
    roots = [modules] if isinstance(modules, nn.Module) else [m for m in modules if m is not None]
    saved = [(m, m.training, getattr(m, "track_running_stats", None)) for root in roots for m in root.modules()]
    try:
        for root in roots:
            root.eval()
            if mode == "batch":
                for m in root.modules():
                    if isinstance(m, BATCHNORMS):
                        # training=True with track_running_stats=False: batch statistics, running ones untouched.
                        m.train()
                        m.track_running_stats = False
        yield
    finally:
        for m, training, track in saved:
            m.training = training
            if track is not None:
                m.track_running_stats = track


def check_representation_batch(name: str, z: torch.Tensor) -> None:
    """Raise ValueError unless z: (B, D) floating-point representations with B, D ≥ 1."""
    if not isinstance(z, torch.Tensor) or z.ndim != 2:
        shape = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
        raise ValueError(f"{name} must be a batch of representations (B, D), got {shape}.")
    if not torch.is_floating_point(z):
        raise ValueError(f"{name} has dtype {z.dtype}; Jacobians need floating-point representations.")
    if z.shape[0] < 1 or z.shape[1] < 1:
        raise ValueError(f"{name} has shape {tuple(z.shape)}; it needs at least one row and one dimension.")


def head_jacobian(head: nn.Module, z: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Per-sample Jacobians J_h(z_i) = ∂h(z_i)/∂z_i: z (B, D) -> (B, out, D), BatchNorm on running statistics.

    Batched with torch.func (`vmap` over `jacrev`). Memory B·out·D numbers: for wide heads pass a few hundred rows,
    or `chunk_size` rows at a time through vmap.

    >>> head = nn.Linear(3, 2, bias=False)
    >>> torch.equal(head_jacobian(head, torch.randn(4, 3))[2], head.weight)
    True
    """
    check_representation_batch("z", z)

    def single(x: torch.Tensor) -> torch.Tensor:
        return head(x.unsqueeze(0)).squeeze(0)

    # torch.func differentiates w.r.t. z through the outer no_grad, which only stops graphs to the parameters.
    with batchnorm_mode(head, "running"), torch.no_grad():
        out = head(z[:1].detach())
        if out.ndim != 2:
            raise ValueError(f"the head maps (B, D) to shape {tuple(out.shape)}; it must return one vector per row.")
        return vmap(jacrev(single), chunk_size=chunk_size)(z.detach())


def _median(values: torch.Tensor) -> float:
    return float(values.double().quantile(0.5)) if values.numel() else float("nan")


def pullback_metric(head: nn.Module, z: torch.Tensor, rtol: float | None = None,
                    chunk_size: int | None = None) -> dict:
    """Spectrum, rank, conditioning and sample-to-sample variation of G(z_i) = J_h(z_i)ᵀ J_h(z_i); z: (B, D).

    The eigenvalues of G_i are the squared singular values of J_i (computed from J, not from the squared G).
    Rank is numerical: σ_k > rtol·σ_1 with rtol = max(out, D)·eps by default; G has rank ≤ min(out, D), so when
    out < D at least D − out directions are exactly null. The condition number is σ_1²/σ_r² on each sample's
    support (r = its rank), never 1/0. Variation = mean_i ‖G_i − Ḡ‖_F / ‖Ḡ‖_F with Ḡ the mean metric: 0 for a
    linear head (constant metric; round-off, ~1e-6 in float32), > 0 for a head that adapts its metric to z.

    Returns {"eigenvalues": (D,) mean over samples of each G_i's spectrum, descending; "eigenvalues_std";
    "trace": mean tr(G_i); "rank": median per-sample rank, "rank_min", "rank_max"; "condition_number": median
    per-sample σ_1²/σ_r², "condition_number_scope": "support"; "variation"; "n_samples", "dim", "out_dim", "rtol",
    "batchnorm": "running", "note"}. JSON-ready.

    >>> out = pullback_metric(nn.Linear(3, 2, bias=False), torch.randn(5, 3))
    >>> out["rank"], out["variation"] < 1e-6
    (2, True)
    """
    jac = head_jacobian(head, z, chunk_size=chunk_size)
    b, out_dim, dim = jac.shape
    rtol = max(out_dim, dim) * torch.finfo(jac.dtype).eps if rtol is None else rtol
    if not 0 < rtol < 1:
        raise ValueError(f"rtol must lie in (0, 1), got {rtol}; it is the relative cut-off for the numerical rank.")
    sv = torch.linalg.svdvals(jac)
    eigenvalues = jac.new_zeros(b, dim)
    eigenvalues[:, : sv.shape[1]] = sv.square()
    ranks = (sv > rtol * sv[:, :1]).sum(dim=1)
    supported = ranks > 0
    idx = (ranks - 1).clamp(min=0)
    conds = (sv[:, 0] / sv.gather(1, idx[:, None]).squeeze(1)).square()[supported]
    mean_metric = torch.einsum("bod,boe->de", jac, jac) / b
    scale = mean_metric.norm()
    # Chunked so that at most 256 metrics (D × D each) are in memory at once.
    deviations = torch.cat([(torch.einsum("bod,boe->bde", part, part) - mean_metric).flatten(1).norm(dim=1)
                            for part in jac.split(256)])
    note = (f"G has rank ≤ out_dim = {out_dim} < D = {dim}: at least {dim - out_dim} directions are exactly null."
            if out_dim < dim else "")
    if not bool(supported.all()):
        note += f" {int((~supported).sum())} of {b} samples have J_h = 0 (e.g. every unit inactive)."
    return {
        "eigenvalues": eigenvalues.mean(0).tolist(),
        "eigenvalues_std": eigenvalues.std(0, unbiased=False).tolist(),
        "trace": float(eigenvalues.sum(1).mean()),
        "rank": int(ranks.double().quantile(0.5, interpolation="lower")),
        "rank_min": int(ranks.min()),
        "rank_max": int(ranks.max()),
        "condition_number": _median(conds),
        "condition_number_scope": "support",
        "variation": float(deviations.mean() / scale) if scale > 0 else float("nan"),
        "n_samples": b,
        "dim": dim,
        "out_dim": out_dim,
        "rtol": rtol,
        "batchnorm": "running",
        "note": note.strip(),
    }


def _directions(name: str, d: torch.Tensor, b: int, dim: int) -> torch.Tensor:
    """(B, D) or (B, K, D) -> (B, K, D)."""
    if d.ndim == 2:
        d = d.unsqueeze(1)
    if d.ndim != 3 or d.shape[0] != b or d.shape[2] != dim:
        raise ValueError(f"{name} must have shape ({b}, {dim}) or ({b}, K, {dim}) to match z_anchor, "
                         f"got {tuple(d.shape)}.")
    return d.detach().to(torch.float64)


def _squared_gains(jac: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Per-sample squared gains |J_i v_ik|² / |v_ik|²: jac (B, out, D), v (B, K, D) -> (B, K)."""
    return torch.einsum("bod,bkd->bko", jac, v).square().sum(-1) / v.square().sum(-1)


def augmentation_degeneracy(head: nn.Module, z_anchor: torch.Tensor, z_views: torch.Tensor | None = None,
                            tangent: torch.Tensor | None = None, chunk_size: int | None = None) -> dict:
    """How much the head stretches augmentation directions compared with other directions (the paper, claim 5).

    z_anchor: (B, D) representations; either z_views: (B, D) or (B, K, D) representations of augmented views (the
    tangent is the finite difference z_view − z_anchor) or tangent: (B, D) or (B, K, D) supplied directions. The
    gain of a direction v at z_i is |J_h(z_i) v| / |v|. Compared with:
    - isotropic: the RMS gain over uniformly random directions, exactly sqrt(tr G_i / D) (no sampling);
    - between samples: the gain along z_{i+1} − z_i, the direction to another image.
    "ratio" = RMS tangent gain / RMS isotropic gain, "ratio_between" likewise: 1 for the identity or an orthogonal
    head, → 0 when G is singular along augmentations. With views, "secant_gain" = RMS |h(z') − h(z)| / |z' − z|
    (no linearisation). Gains are RMS over samples (and views); BatchNorm on running statistics.

    >>> w = nn.Linear(3, 3, bias=False)
    >>> with torch.no_grad():
    ...     _ = w.weight.copy_(torch.diag(torch.tensor([1.0, 1.0, 0.0])))
    >>> along_null = torch.tensor([0.0, 0.0, 1.0]).repeat(4, 1)
    >>> augmentation_degeneracy(w, torch.randn(4, 3), tangent=along_null)["ratio"]
    0.0
    """
    check_representation_batch("z_anchor", z_anchor)
    if (z_views is None) == (tangent is None):
        raise ValueError("pass exactly one of z_views (augmented representations of the anchors) or tangent "
                         "(directions at the anchors).")
    b, dim = z_anchor.shape
    if z_views is not None:
        views = _directions("z_views", z_views, b, dim)
        v = views - z_anchor.detach().to(torch.float64)[:, None]
    else:
        v = _directions("tangent", tangent, b, dim)
    norms = v.norm(dim=-1)
    keep = norms > 0
    if not bool(keep.any()):
        raise ValueError("every tangent is zero (the views equal their anchors); there is no direction to measure.")
    jac = head_jacobian(head, z_anchor, chunk_size=chunk_size).to(torch.float64)
    tangent_sq = _squared_gains(jac, v.masked_fill(~keep[..., None], 1.0))[keep]
    isotropic_sq = jac.square().sum((1, 2)) / dim
    result = {
        "tangent_gain": math.sqrt(float(tangent_sq.mean())),
        "isotropic_gain": math.sqrt(float(isotropic_sq.mean())),
        "n_tangents": int(keep.sum()),
        "n_zero_tangents": int((~keep).sum()),
        "n_samples": b,
        "dim": dim,
        "batchnorm": "running",
    }
    result["ratio"] = result["tangent_gain"] / result["isotropic_gain"] if result["isotropic_gain"] > 0 else None
    if b > 1:
        anchors = z_anchor.detach().to(torch.float64)
        between = (anchors.roll(-1, dims=0) - anchors)[:, None]
        nonzero = between.norm(dim=-1)[:, 0] > 0
        if bool(nonzero.any()):
            between_gain = math.sqrt(float(_squared_gains(jac[nonzero], between[nonzero]).mean()))
            result["between_gain"] = between_gain
            result["ratio_between"] = result["tangent_gain"] / between_gain if between_gain > 0 else None
    if z_views is not None:
        with batchnorm_mode(head, "running"), torch.no_grad():
            h_anchor = head(z_anchor.detach()).to(torch.float64)
            k = views.shape[1]
            h_views = head(views.reshape(b * k, dim).to(z_anchor.dtype)).to(torch.float64).reshape(b, k, -1)
        secant_sq = ((h_views - h_anchor[:, None]).square().sum(-1)[keep] / norms[keep].square())
        result["secant_gain"] = math.sqrt(float(secant_sq.mean()))
    return result
