"""The effective Hessian of a loss with respect to the backbone representation, split as the paper splits it.

"H_eff(z) = J_h(z)ᵀ ∇²_h L J_h(z) + Σ_i [∇_h L]_i ∇²_z h_i(z) = G-term + M-term" (the paper, claim 3). "Linear and
ReLU heads have M = 0 (almost everywhere); smooth heads do not": `effective_hessian` computes both terms
separately, exactly, for one batch, and checks that they add up to the Hessian of L(h(z)). For a linear head
"W can make the effective Hessian isotropic (vᵀH_eff v = |v|²) on an r-dimensional subspace", r = rank ∇²_h L
(claim 1); the "whitening" entry measures how far H_eff is from that. For SimSiam's cosine loss ∇²_h L is
indefinite, so the premise of claim 1 fails: "loss_hessian_h" says so rather than assume it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.func import jacrev

from headprobe.geometry.hessian import hvp_fn
from headprobe.geometry.pullback import batchnorm_mode, check_representation_batch

LossFn = Callable[[torch.Tensor], object]


def scalar_loss(out: object) -> torch.Tensor:
    """A scalar tensor from loss_fn's output: a tensor, or an objective's LossTerms (its .loss)."""
    loss = getattr(out, "loss", out)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ValueError("loss_fn must return a scalar tensor or a LossTerms; reduce the loss to one number.")
    return loss.reshape(())




def _dense_hessian(loss_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """(N, N) matrix with [i, j] = ∂g_i/∂x_j, g = ∇ loss_fn(x), from N products of `hvp_fn` (row i = H e_i).

    Double backward rather than `hessian.dense_hessian`'s forward-over-reverse, which fails on operations without
    forward-mode formulas (SiLU's backward in torch 2.14, i.e. every Swish head).
    """
    hvp = hvp_fn(loss_fn, x)
    return torch.stack([hvp(e) for e in torch.eye(hvp.dim, dtype=hvp.dtype, device=hvp.device)])


def _sym_eigvalsh(m: torch.Tensor) -> torch.Tensor:
    return torch.linalg.eigvalsh((m + m.T) / 2)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> float:
    return float(num / den) if den > 0 else float("nan")


def isotropy(values: torch.Tensor, r: int, rtol: float) -> dict:
    """How close a symmetric operator with eigenvalues `values` is to c·P on its top-r eigenspace (by |λ|), P that
    space's projector: what `whitening` returns, from the eigenvalues alone (all of them, or, matrix-free, the top r
    and any others known: `geometry.whiten`; the ones left out count as 0).

    >>> isotropy(torch.tensor([2.0, 2.0, 0.0], dtype=torch.float64), 2, 1e-12)["isotropy_error"]
    0.0
    """
    if not 1 <= r <= len(values):
        raise ValueError(f"the subspace dimension r must lie in 1..{len(values)}, got {r}.")
    values = values[values.abs().argsort(descending=True)]
    top, rest = values[:r], values[r:]
    total = values.norm()
    scale = top.mean()
    smallest, largest = top.abs().min(), top.abs().max()
    return {
        "rank": r,
        "eigenvalues": top.tolist(),
        "scale": float(scale),
        "spread": float(largest / smallest) if smallest > rtol * largest else float("inf"),
        "relative_std": _ratio(top.std(unbiased=False), scale.abs()),
        "n_negative": int((top < 0).sum()),
        "outside": _ratio(rest.norm(), total),
        "isotropy_error": _ratio(torch.cat([top - scale, rest]).norm(), total),
    }


def whitening(h_eff: torch.Tensor, r: int, rtol: float | None = None) -> dict:
    """How close the symmetric h_eff: (N, N) is to c·P on its top-r eigenspace (by |λ|), P that space's projector.

    Returns {"rank": r, "eigenvalues": the top r, by decreasing |λ|; "scale": their mean c; "spread":
    max|λ|/min|λ| over them (1 when isotropic; inf when one is numerically 0, |λ| ≤ rtol·max|λ|, rtol = N·eps by
    default: H_eff then has rank < r); "relative_std": std/|mean|; "n_negative";
    "outside": ‖λ outside the top r‖ / ‖λ‖; "isotropy_error": ‖h_eff − c·P‖_F / ‖h_eff‖_F} (`isotropy`).

    >>> whitening(torch.diag(torch.tensor([2.0, 2.0, 0.0], dtype=torch.float64)), 2)["isotropy_error"]
    0.0
    """
    n = h_eff.shape[0]
    rtol = n * torch.finfo(h_eff.dtype).eps if rtol is None else rtol
    if not 1 <= r <= n:
        raise ValueError(f"the subspace dimension r must lie in 1..{n}, got {r}.")
    return isotropy(_sym_eigvalsh(h_eff), r, rtol)


def effective_hessian(head: nn.Module, z: torch.Tensor, loss_fn: LossFn, batchnorm: str = "running",
                      rtol: float | None = None, return_matrices: bool = False) -> dict:
    """H_eff = G-term + M-term of L(h(z)) w.r.t. the flattened batch z: (B, D), exactly (dense, N = B·D).

    loss_fn maps the head outputs (B, out) to a scalar (a tensor or a LossTerms); for a two-view objective stack
    the views into z and split inside, e.g. ``lambda h: vicreg(h[:n], h[n:])``. J = ∂vec h/∂vec z (B·out, B·D)
    comes from torch.func.jacrev; ∇²_h L, M = ∇²_z (gᵀh(z)) with g = ∇_h L held fixed, and the direct Hessian H of
    L(h(z)) from one Hessian-vector product (double backward) per variable; G = Jᵀ ∇²_h L J. "consistency" =
    ‖G + M − H‖_F/‖H‖_F checks the split. Memory (B·D)² + (B·out)²: a few hundred to ~2000 variables.

    batchnorm: "running" (default; eval mode, the per-sample head of the paper's analysis: J is block diagonal)
    or "batch" (batch statistics as in a training step; BatchNorm then couples samples and is itself nonlinear,
    so even ReLU heads get an M-term). A stop-gradient in loss_fn freezes its targets at their current values: the
    matrices are then the Hessians of that frozen-target loss.

    Returns {"eigenvalues", "g_term_eigenvalues", "m_term_eigenvalues": ascending; "lambda_min", "lambda_max";
    "rank": numerical rank of H; "m_ratio": ‖M‖_F/‖H‖_F; "m_ratio_spectral": ‖M‖_2/‖H‖_2; "consistency";
    "loss_hessian_h": {"lambda_min", "lambda_max", "rank", "psd"}; "whitening": `whitening(H, r)` with
    r = rank ∇²_h L (capped at B·D); "dim", "out_dim", "n_samples", "batchnorm", "rtol"} and, with
    return_matrices, "matrices": {"H", "G", "M", "J", "loss_hessian_h", "loss_grad_h"} as tensors. Ranks cut at
    rtol·max|λ|, rtol = B·max(out, D)·eps by default.

    >>> head = nn.Linear(3, 2, bias=False).double()
    >>> out = effective_hessian(head, torch.randn(4, 3, dtype=torch.float64), lambda h: (h ** 2).sum())
    >>> out["m_ratio"], out["consistency"] < 1e-12, out["whitening"]["rank"]
    (0.0, True, 8)
    """
    check_representation_batch("z", z)
    if rtol is not None and not 0 < rtol < 1:
        raise ValueError(f"rtol must lie in (0, 1), got {rtol}; it is the relative cut-off for numerical ranks.")
    z0 = z.detach()
    b, dim = z0.shape

    def loss_of_h(h: torch.Tensor) -> torch.Tensor:
        return scalar_loss(loss_fn(h))

    with batchnorm_mode(head, batchnorm):
        with torch.no_grad():
            h0 = head(z0)
            if h0.ndim != 2 or h0.shape[0] != b:
                raise ValueError(f"the head maps z {tuple(z0.shape)} to {tuple(h0.shape)}; it must return (B, out).")
            # torch.func differentiates w.r.t. z through the outer no_grad, which only stops graphs to the parameters.
            jac = jacrev(head)(z0).reshape(h0.numel(), b * dim)
        out_dim = h0.shape[1]
        h_leaf = h0.clone().requires_grad_(True)
        grad_h = torch.autograd.grad(loss_of_h(h_leaf), h_leaf)[0]
        hess_h = _dense_hessian(loss_of_h, h0)
        m_term = _dense_hessian(lambda x: (grad_h * head(x)).sum(), z0)
        full = _dense_hessian(lambda x: loss_of_h(head(x)), z0)
    g_term = jac.T @ hess_h @ jac
    rtol = b * max(out_dim, dim) * torch.finfo(hess_h.dtype).eps if rtol is None else rtol
    h_values = _sym_eigvalsh(hess_h)
    h_scale = h_values.abs().max()
    rank_h = int((h_values.abs() > rtol * h_scale).sum()) if h_scale > 0 else 0
    values = _sym_eigvalsh(full)
    full_norm = full.norm()
    result = {
        "eigenvalues": values.tolist(),
        "g_term_eigenvalues": _sym_eigvalsh(g_term).tolist(),
        "m_term_eigenvalues": _sym_eigvalsh(m_term).tolist(),
        "lambda_min": float(values[0]),
        "lambda_max": float(values[-1]),
        "rank": int((values.abs() > rtol * values.abs().max()).sum()) if values.abs().max() > 0 else 0,
        "m_ratio": _ratio(m_term.norm(), full_norm),
        "m_ratio_spectral": _ratio(torch.linalg.matrix_norm(m_term, 2), torch.linalg.matrix_norm(full, 2)),
        "consistency": _ratio((g_term + m_term - full).norm(), full_norm),
        "loss_hessian_h": {
            "lambda_min": float(h_values[0]),
            "lambda_max": float(h_values[-1]),
            "rank": rank_h,
            "psd": bool(h_values[0] >= -rtol * h_scale),
        },
        "whitening": whitening(full, min(rank_h, b * dim), rtol=rtol) if rank_h > 0 else None,
        "dim": b * dim,
        "out_dim": out_dim,
        "n_samples": b,
        "batchnorm": batchnorm,
        "rtol": rtol,
    }
    if return_matrices:
        result["matrices"] = {"H": full, "G": g_term, "M": m_term, "J": jac, "loss_hessian_h": hess_h,
                              "loss_grad_h": grad_h}
    return result

