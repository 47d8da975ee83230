"""Claim 3's measure: the M-term's share ‖M‖_F / ‖H_eff‖_F of the effective Hessian, per evaluation batch.

"H_eff(z) = J_h(z)ᵀ ∇²_h L J_h(z) + Σ_i [∇_h L]_i ∇²_z h_i(z) = G-term + M-term. Linear and ReLU heads have M = 0
(almost everywhere); smooth heads do not" (the paper, claim 3). `m_share` measures ‖M‖_F/‖H‖_F of the loss
L([head(z1); head(z2)]) w.r.t. the stacked batch [z1; z2], each view through the head on its own as in the training
step, matrix-free: ‖A‖_F² = E‖Av‖² for v ~ N(0, I), so Σ_v ‖Mv‖² / Σ_v ‖Hv‖² over the same probes v (or, with
probes=None, over the basis vectors: exactly `effective.effective_hessian`'s "m_ratio"). M v is the product with
∇²_z (gᵀh(z)), g = ∇_h L held fixed (`gm_split.SplitOperators`); a head piecewise linear in z gives exact zeros.

BatchNorm on batch statistics couples the samples of a batch and divides by their spread, a smooth function of z:
a ReLU+BN head then has an M-term, while with running statistics (eval mode, the per-sample head) BatchNorm is an
affine map and the head's M-term is 0. `predicts_zero_m` says which a head's structure predicts.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from headprobe.geometry.gm_split import SplitOperators, has_batchnorm
from headprobe.geometry.hessian import hvp_fn
from headprobe.geometry.pullback import BATCHNORM_MODES, batchnorm_mode

# Activations whose second derivative is not zero almost everywhere (ReLU, LeakyReLU and Identity are piecewise
# linear); an L2-normalised output (`ProjectionHead.l2_out`) is smooth too.
SMOOTH_ACTIVATIONS = (nn.SiLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.Softplus, nn.ELU, nn.Mish)


def predicts_zero_m(head: nn.Module, batchnorm: str) -> bool:
    """Whether claim 3 predicts M = 0 for `head` with its BatchNorm in `batchnorm` mode: no smooth activation, no
    L2-normalised output, and no BatchNorm on batch statistics."""
    if batchnorm not in BATCHNORM_MODES:
        raise ValueError(f"batchnorm must be one of {', '.join(BATCHNORM_MODES)}, got {batchnorm!r}.")
    smooth = any(isinstance(m, SMOOTH_ACTIVATIONS) for m in head.modules()) or bool(getattr(head, "l2_out", False))
    return not smooth and not (batchnorm == "batch" and has_batchnorm(head))


def m_share(head: nn.Module, loss_of_h, z1: torch.Tensor, z2: torch.Tensor, probes: int | None = 8,
            batchnorm: str = "batch", seed: int = 0) -> float:
    """‖M‖_F / ‖H_eff‖_F of loss_of_h([head(z1); head(z2)]) w.r.t. [z1; z2]: (2B, D), from `probes` Gaussian
    vectors (None: every basis vector, exact), with the head's BatchNorm in `batchnorm` mode; 0 when H = M = 0."""
    if probes is not None and probes < 1:
        raise ValueError(f"probes must be at least 1 (or None for the exact ratio), got {probes}.")
    z = torch.cat([z1, z2]).detach()
    with batchnorm_mode(head, batchnorm):
        ops = SplitOperators(head, loss_of_h, z)
        full = hvp_fn(lambda x: loss_of_h(ops.pair(x)), z)
        if probes is None:
            vectors = torch.eye(ops.dim, dtype=ops.dtype, device=ops.device)
        else:
            gen = torch.Generator().manual_seed(seed)
            vectors = torch.randn(probes, ops.dim, generator=gen, dtype=torch.float64).to(ops.device, ops.dtype)
        m_sq = sum(float(ops.m_product(v).norm()) ** 2 for v in vectors)
        h_sq = sum(float(full(v).norm()) ** 2 for v in vectors)
    if h_sq == 0:
        return 0.0 if m_sq == 0 else math.inf
    return math.sqrt(m_sq / h_sq)


def batch_shares(head: nn.Module, loss_of_pair, views: torch.Tensor, batches: int, batch: int,
                 probes: int | None = 8, batchnorm: str = "batch", seed: int = 0) -> list[float]:
    """`m_share` on `batches` disjoint batches of `batch` images, views[idx, 0] and views[idx, 1] the two views.

    views: (N, K ≥ 2, D) cached view features; loss_of_pair(h1, h2) → a scalar tensor; the images are a
    permutation seeded by `seed`, so batches do not overlap (fewer batches when N < batches·batch)."""
    n = views.shape[0]
    if views.ndim != 3 or views.shape[1] < 2:
        raise ValueError(f"views must be (N, K ≥ 2, D) cached view features, got {tuple(views.shape)}.")
    if n < batch or batch < 2:
        raise ValueError(f"the M-term share needs batches of ≥ 2 images and at least one batch; got batch={batch} "
                         f"with {n} images.")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    out = []
    for i in range(min(batches, n // batch)):
        idx = order[i * batch:(i + 1) * batch]
        out.append(m_share(head, lambda h: loss_of_pair(h[:batch], h[batch:]), views[idx, 0], views[idx, 1],
                           probes, batchnorm, seed + i))
    return out
