"""The split H = G + M of a tracked loss Hessian w.r.t. the representation batch, by Lanczos on products only, and
the attribution of a negative λ_min to the objective, the predictor's BatchNorm or the head.

A negative λ_min alone says nothing about the head: SimSiam's ∇²_h L is indefinite, so the G-term J_hᵀ ∇²_h L J_h
has negative curvature for every head, linear included; and SimSiam's predictor normalises with batch statistics,
which couples the samples and bends the loss -- the BatchNorm escape route the paper names for linear and ReLU
heads, not the head's own curvature. `split_curvature` measures λ_min of the G-term, of the M-term Σ_i [∇_h L]_i
∇²_z h_i (zero for linear and ReLU heads without BatchNorm), of ∇²_h L, and of H with the predictor's BatchNorm on
running statistics; then it attributes λ_min by share: at the unit eigenvector v of λ_min,

    λ_min = vᵀMv + (Jv)ᵀ A_run (Jv) + (Jv)ᵀ (A − A_run) (Jv)     (head + objective + predictor_bn),

A = ∇²_h L with the predictor's BatchNorm on batch statistics (as in the training step), A_run the same with it on
running statistics (the predictor a fixed map, piecewise linear for SimSiam's ReLU predictor, so A_run is the
objective proper seen through it). The part with the most negative Rayleigh quotient is the source. Its share
(quotient / λ_min) is recorded with the others. `geometry.tracking.curvature_snapshot(split=True)` adds the keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from headprobe.geometry.bn_share import head_bn_split
from headprobe.geometry.extremes import negative_beyond_bound, scaled_extremes
from headprobe.geometry.hessian import HessianVectorProduct, hvp_fn
from headprobe.geometry.pullback import BATCHNORMS, batchnorm_mode


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

        self.pair = pair
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


PARTS = ("head", "objective", "predictor_bn")


def has_batchnorm(module: nn.Module | None) -> bool:
    """Whether `module` holds a BatchNorm layer (None: no module, no BatchNorm)."""
    return module is not None and any(isinstance(m, BATCHNORMS) for m in module.modules())


def curvature_shares(ops: SplitOperators, v: torch.Tensor, loss_h_running: HessianVectorProduct | None) -> dict:
    """The Rayleigh quotients of the parts of H at the unit vector v: (2B·D,) and the one that is most negative.

    "rayleigh_head" vᵀMv; "rayleigh_objective" (Jv)ᵀ A_run (Jv), A_run = ∇²_h L with the predictor's BatchNorm on
    running statistics (`loss_h_running`; None: no predictor BatchNorm, A_run = A); "rayleigh_predictor_bn" (Jv)ᵀ
    (A − A_run)(Jv); "rayleigh_sum" their sum (vᵀHv); "share_<part>" each quotient / the sum (they add up to 1);
    "curvature_source_by_share" the part with the most negative quotient."""
    v = v.to(device=ops.device, dtype=ops.dtype)
    jv = ops.jacobian(v)
    batch = float(jv @ ops.loss_h(jv.to(ops.loss_h.dtype)).to(ops.dtype))
    running = batch if loss_h_running is None else float(jv @ loss_h_running(jv.to(loss_h_running.dtype)).to(ops.dtype))
    quotients = {"head": float(v @ ops.m_product(v)), "objective": running, "predictor_bn": batch - running}
    total = sum(quotients.values())
    out = {f"rayleigh_{part}": q for part, q in quotients.items()}
    out["rayleigh_sum"] = total
    out |= {f"share_{part}": (q / total if total != 0 else math.nan) for part, q in quotients.items()}
    out["curvature_source_by_share"] = min(PARTS, key=quotients.get)
    return out


def split_curvature(head: nn.Module, loss_of_h, z: torch.Tensor, full_hvp, full: dict, k: int, tol: float,
                    max_iter: int, seed: int, predictor: nn.Module | None) -> dict:
    """λ_min of the G-term, of the M-term, of ∇²_h L and of H with the predictor's BatchNorm on running statistics,
    and the share each part of H has in a negative λ_min (`curvature_shares`).

    z: (2B, D) the stacked batch; full_hvp: products with H; full: `scaled_extremes` of H with its Ritz vectors.
    Call it with the head and predictor in the mode of the training step (BatchNorm on batch statistics). The keys
    are listed in `geometry.tracking.curvature_snapshot`'s docstring."""
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
    negative = negative_beyond_bound(full)
    extra: dict = {"predictor_batchnorm": has_batchnorm(predictor)}
    loss_h_running, n_running = None, 0
    if extra["predictor_batchnorm"]:
        with batchnorm_mode(predictor, "running"):  # graphs built here keep running statistics in every product
            loss_h_running = hvp_fn(loss_of_h, ops.h.detach())
            full_running = hvp_fn(lambda x: loss_of_h(ops.pair(x)), ops.z.detach())
        r = scaled_extremes(full_running, full_running.dim, full_running.dtype, ops.device, k, tol, max_iter, seed)
        n_running = r["n_iter"] + 1
        extra |= {"lambda_min_predictor_bn_running": float(r["values"][0]),
                  "error_bound_min_predictor_bn_running": float(r["error_bounds"][0]),
                  "negative_predictor_bn_running": negative_beyond_bound(r)}
    shares = curvature_shares(ops, full["vectors"][:, 0], loss_h_running)
    if has_batchnorm(head):  # the head's BatchNorm as its own share: vᵀMv = activation's part + BatchNorm's, exactly
        act = head_bn_split(head, loss_of_h, ops.z.detach(), full["vectors"][:, 0])["rayleigh_head_act"]
        bn = shares["rayleigh_head"] - act
        total = shares["rayleigh_sum"]
        extra |= {"rayleigh_head_act": act, "rayleigh_head_bn": bn,
                  "share_head_act": act / total if total != 0 else math.nan,
                  "share_head_bn": bn / total if total != 0 else math.nan}
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
        "negative_beyond_bound": negative,
        "negative_gterm": negative_beyond_bound(g),
        "negative_loss_h": negative_beyond_bound(a),
        **extra,
        **shares,
        "curvature_source": shares["curvature_source_by_share"] if negative else "none",
        "attribution_rule": "by share: the part of H with the most negative Rayleigh quotient at λ_min's "
                            "eigenvector, where λ_min < −max(error bound, round-off)",
        "split_consistency": consistency,
        "split_converged": g["converged"] and m["converged"] and a["converged"],
        "gterm_predictor": "in the loss" if predictor is not None else "none",
        "n_hvp_split": 2 * g["n_iter"] + m["n_iter"] + a["n_iter"] + 6 + n_running + 4,
    }
