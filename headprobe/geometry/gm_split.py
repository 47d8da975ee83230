"""The split H = G + M of a tracked loss Hessian w.r.t. the representation batch, by Lanczos on products only.

A negative λ_min alone says nothing about the head: SimSiam's ∇²_h L is indefinite, so the G-term J_hᵀ ∇²_h L J_h
has negative curvature for every head, linear included. `split_curvature` measures λ_min of the G-term, the size
of the M-term Σ_i [∇_h L]_i ∇²_z h_i (zero for linear and ReLU heads without BatchNorm) and λ_min of ∇²_h L, so
each negative λ_min is attributed to the loss (the G-term alone is negative) or to the head (it is not: the
M-term made it). `geometry.tracking.curvature_snapshot(split=True)` adds its keys to each tracked record.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from headprobe.geometry.extremes import negative_beyond_bound, scaled_extremes
from headprobe.geometry.hessian import HessianVectorProduct, hvp_fn


class SplitOperators:
    """Products with the pieces of H = G + M of L(h(z)) w.r.t. the stacked batch z = [z1; z2]: (2B, D).

    h = [head(z1); head(z2)] (each view through the head on its own, as in the training step); A = ∇²_h L, with
    whatever L contains (the predictor and a stop-gradient included) held as part of the loss. G v = Jᵀ A J v,
    M v = ∇²_z (gᵀ h(z)) v with g = ∇_h L fixed. J v comes from the transpose trick J v = ∂(Jᵀu · v)/∂u and Jᵀ w
    from one backward pass, reverse mode only (like `hvp_fn`: forward-mode formulas are missing for SiLU's
    backward): the head runs once per graph, so BatchNorm sees the same batch statistics in every product."""

    def __init__(self, head: nn.Module, loss_of_h: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor) -> None:
        n = z.shape[0] // 2

        def pair(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([head(x[:n]), head(x[n:])])

        self.z = z.detach().requires_grad_(True)
        self.h = pair(self.z)
        h0 = self.h.detach()
        h_leaf = h0.clone().requires_grad_(True)
        grad_h = torch.autograd.grad(loss_of_h(h_leaf), h_leaf)[0]
        self.loss_h: HessianVectorProduct = hvp_fn(loss_of_h, h0)
        # A head linear in z leaves gᵀh(z) without second derivatives: hvp_fn's products are then exact zeros.
        self.m_term = hvp_fn(lambda x: (grad_h * pair(x)).sum(), self.z)
        self.u = torch.zeros_like(h0, requires_grad=True)
        self.jt_u = torch.autograd.grad(self.h, self.z, self.u, create_graph=True)[0]
        self.dim, self.dtype, self.device = self.z.numel(), self.z.dtype, self.z.device
        self.g_calls = 0

    def jacobian(self, v: torch.Tensor) -> torch.Tensor:
        """J v: (2B·out,) for v: (2B·D,)."""
        if not self.jt_u.requires_grad:  # Jᵀu does not depend on u: J = 0
            return torch.zeros(self.h.numel(), dtype=self.dtype, device=self.device)
        jv = torch.autograd.grad(self.jt_u, self.u, v.reshape(self.z.shape), retain_graph=True, allow_unused=True)[0]
        return (jv if jv is not None else torch.zeros_like(self.h)).reshape(-1)

    def jacobian_t(self, w: torch.Tensor) -> torch.Tensor:
        """Jᵀ w: (2B·D,) for w: (2B·out,)."""
        return torch.autograd.grad(self.h, self.z, w.reshape(self.h.shape), retain_graph=True)[0].reshape(-1)

    def g_term(self, v: torch.Tensor) -> torch.Tensor:
        self.g_calls += 1
        jv = self.jacobian(v.to(self.dtype))
        return self.jacobian_t(self.loss_h(jv.to(self.loss_h.dtype)).to(self.dtype)).to(v.dtype)

    def m_product(self, v: torch.Tensor) -> torch.Tensor:
        return self.m_term(v)


def split_curvature(head: nn.Module, loss_of_h, z: torch.Tensor, full_hvp, full: dict, k: int, tol: float,
                    max_iter: int, seed: int, predictor: nn.Module | None) -> dict:
    """λ_min of the G-term, size of the M-term, λ_min of ∇²_h L, and where a negative λ_min of H comes from.

    z: (2B, D) the stacked batch; full_hvp: products with H; full: `scaled_extremes` of H. The keys are listed in
    `geometry.tracking.curvature_snapshot`'s docstring."""
    ops = SplitOperators(head, loss_of_h, z)
    g = scaled_extremes(ops.g_term, ops.dim, ops.dtype, ops.device, k, tol, max_iter, seed)
    m = scaled_extremes(ops.m_product, ops.dim, ops.dtype, ops.device, k, tol, max_iter, seed)
    a = scaled_extremes(ops.loss_h, ops.loss_h.dim, ops.loss_h.dtype, ops.device, k, tol, max_iter, seed)
    u = torch.randn(ops.dim, generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float64)
    u = (u / u.norm()).to(device=ops.device, dtype=ops.dtype)
    hu = full_hvp(u)
    consistency = float((ops.g_term(u) + ops.m_product(u) - hu).norm() / hu.norm()) if hu.norm() > 0 else 0.0
    h_norm = float(full["values"].abs().max())
    m_norm = float(m["values"].abs().max())
    source = "none"
    if negative_beyond_bound(full):
        source = "loss" if negative_beyond_bound(g) else "head"
    return {
        "lambda_min_gterm": float(g["values"][0]),
        "lambda_max_gterm": float(g["values"][-1]),
        "error_bound_min_gterm": float(g["error_bounds"][0]),
        "lambda_min_gterm_converged": g["converged_min"],
        "lambda_min_mterm": float(m["values"][0]),
        "lambda_max_mterm": float(m["values"][-1]),
        "m_norm_ratio": m_norm / h_norm if h_norm > 0 else (0.0 if m_norm == 0 else math.inf),
        "lambda_min_loss_h": float(a["values"][0]),
        "lambda_max_loss_h": float(a["values"][-1]),
        "error_bound_min_loss_h": float(a["error_bounds"][0]),
        "dim_loss_h": ops.loss_h.dim,
        "negative_beyond_bound": negative_beyond_bound(full),
        "negative_gterm": negative_beyond_bound(g),
        "negative_loss_h": negative_beyond_bound(a),
        "curvature_source": source,
        "split_consistency": consistency,
        "split_converged": g["converged"] and m["converged"] and a["converged"],
        "gterm_predictor": "in the loss" if predictor is not None else "none",
        "n_hvp_split": 2 * g["n_iter"] + m["n_iter"] + a["n_iter"] + 6,
    }
