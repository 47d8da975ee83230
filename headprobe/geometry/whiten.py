"""Claim 1's measure: how isotropic a head makes the effective Hessian on its top-r subspace, matrix-free.

"With r = rank of the loss Hessian with respect to the head output, a linear head W can make the effective Hessian
isotropic (vᵀH_eff v = |v|²) on an r-dimensional subspace" (the paper, claim 1). For one sample x_i of an
evaluation batch (a row of the stacked views [z1; z2], each view through the head on its own as in training),
the effective Hessian is the diagonal block H_i = ∂²L/∂z_i² of the batch loss, D × D in the backbone's feature
space: H_i = W_iᵀ A_i W_i (+ the M-term, zero for a linear head), A_i = ∂²L/∂h_i², r_i = rank A_i. Whitening means
H_i = c·P on its top-r_i eigenspace; the isotropy error ‖H_i − c·P‖_F/‖H_i‖_F (`effective.isotropy`) is 0 exactly
then. The head W = U_r Λ_r^{-1/2} R (A = UΛUᵀ, R with orthonormal rows) achieves it: Wᵀ A W = RᵀR.

Matrix-free: products with H_i and A_i (`DiagonalBlock`: a batch of directions at once, one double backward
through the whole batch's loss, so batch statistics and every coupling of the loss are in them); A_i densely from
its `out` products (its rank), H_i's top r_i (+ 8 oversampled) eigenvalues by block subspace iteration
(`subspace.top_eigenpairs`), which sees multiplicities where Lanczos would not. Under the premise, for a linear
head, rank H_i ≤ r_i, so the block captures H_i exactly (`captured`) and the error equals the dense one up to
round-off.

The premise (`loss_hessian_premise`): ∇²_h L PSD on the evaluated batch, from λ_min of the whole batch's ∇²_h L
(Lanczos on products, `extremes.scaled_extremes`): "psd" true when λ_min ≥ −max(bound, round-off) with λ_min
converged, false when λ_min < −that (a Ritz value is never below λ_min, so this needs no convergence), None when it
cannot be told.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from headprobe.geometry.effective import isotropy, scalar_loss
from headprobe.geometry.extremes import negative_beyond_bound, scaled_extremes
from headprobe.geometry.hessian import hvp_fn
from headprobe.geometry.subspace import top_eigenpairs

RANK_RTOL = 1e-9  # rank A_i: eigenvalues above RANK_RTOL·max|λ| count
OVERSAMPLE, SUBSPACE_TOL, SUBSPACE_MAX_ITER = 8, 1e-10, 30
PREMISE_TOL, PREMISE_MAX_ITER = 1e-8, 200
CHUNK = 64  # directions per batched product: the graph's activations times CHUNK in memory


class DiagonalBlock:
    """Products with the diagonal block ∂²L/∂x_i² of a scalar loss of a batch x: (n, d), row i, for a block of
    directions v: (m, d) → (m, d). The loss's graph is built once (one forward pass: batch statistics fixed), every
    product one batched double backward (`is_grads_batched`), CHUNK directions at a time; `products` counts them."""

    def __init__(self, loss_of_batch: Callable[[torch.Tensor], object], x: torch.Tensor, row: int) -> None:
        if not 0 <= row < x.shape[0]:
            raise ValueError(f"row {row} is outside the batch of {x.shape[0]} rows.")
        self.dim, self.dtype, self.device = x.shape[1], x.dtype, x.device
        self.x_row = x[row].detach().clone().requires_grad_(True)
        batch = torch.cat([x[:row].detach(), self.x_row[None], x[row + 1:].detach()])
        loss = scalar_loss(loss_of_batch(batch))
        grad = torch.autograd.grad(loss, self.x_row, create_graph=True, allow_unused=True)[0]
        # no graph: the loss is at most linear in this row, its block is zero
        self.grad = grad if grad is not None and grad.requires_grad else None
        self.products = 0

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        if v.ndim != 2 or v.shape[1] != self.dim:
            raise ValueError(f"the block takes directions (m, {self.dim}), got {tuple(v.shape)}.")
        self.products += len(v)
        v = v.to(device=self.device, dtype=self.dtype)
        if self.grad is None:
            return torch.zeros_like(v)
        return torch.cat([self._products(chunk) for chunk in v.split(CHUNK)])

    def _products(self, v: torch.Tensor) -> torch.Tensor:
        try:
            out = torch.autograd.grad(self.grad, self.x_row, grad_outputs=v, retain_graph=True,
                                      is_grads_batched=True, allow_unused=True)[0]
        except RuntimeError:  # an op without a batching rule: one backward per direction instead
            out = torch.stack([torch.autograd.grad(self.grad, self.x_row, grad_outputs=d, retain_graph=True,
                                                   allow_unused=True)[0] for d in v])
        return torch.zeros_like(v) if out is None else out

    def dense(self) -> torch.Tensor:
        """The (d, d) block from d products (symmetrised)."""
        block = self(torch.eye(self.dim, dtype=self.dtype, device=self.device))
        return (block + block.T) / 2


def stacked_views(head: nn.Module, n: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """x: (2n, D) = [z1; z2] ↦ [head(z1); head(z2)]: each view through the head on its own, as in training."""
    return lambda x: torch.cat([head(x[:n]), head(x[n:])])


def loss_hessian_premise(loss_of_h: Callable[[torch.Tensor], object], h: torch.Tensor, seed: int = 0,
                         max_iter: int = PREMISE_MAX_ITER) -> dict:
    """Whether ∇²_h L of the whole batch h: (n, out) is PSD: {"psd": True / False / None, "lambda_min",
    "lambda_max", "bound" (max(Lanczos error bound, round-off)), "converged_min", "n_iter", "dim"}."""
    hvp = hvp_fn(lambda y: scalar_loss(loss_of_h(y)), h.detach())
    ext = scaled_extremes(hvp, hvp.dim, hvp.dtype, hvp.device, 1, PREMISE_TOL, max_iter, seed)
    bound = max(float(ext["error_bounds"][0]), ext["roundoff"])
    negative = negative_beyond_bound(ext)
    return {"psd": False if negative else True if ext["converged_min"] else None,
            "lambda_min": float(ext["values"][0]), "lambda_max": float(ext["values"][-1]), "bound": bound,
            "converged_min": ext["converged_min"], "n_iter": ext["n_iter"], "dim": hvp.dim}


class RowEffectiveHessian:
    """Products with H_i = J_iᵀ A_i J_i + M_i, the effective Hessian of sample i of the stacked batch z: (2n, D),
    for a block of directions (m, D) → (m, D): J_i v by forward mode through the head at z_i alone, A_i = ∂²L/∂h_i²
    (out × out, from `out` products of the whole batch's loss of h, `DiagonalBlock`: the loss's couplings are in
    it; its rank is r_i), J_iᵀ by reverse mode and the M-term ∇²_z (g_iᵀ h(z_i)) v, g_i = ∂L/∂h_i held fixed (zero
    for a linear head) by a double backward through that one row. Exact for a head that maps each sample on its own
    (no BatchNorm on batch statistics). H_i itself is never formed: a product costs a pass through the head at one
    row, and A_i's `out` products through the loss are taken once."""

    def __init__(self, head: nn.Module, loss_of_h: Callable[[torch.Tensor], object], z: torch.Tensor,
                 row: int) -> None:
        from torch.func import jvp, vjp, vmap

        z = z.detach()
        self.dim, self.dtype, self.device = z.shape[1], z.dtype, z.device
        with torch.no_grad():
            h = stacked_views(head, z.shape[0] // 2)(z)
        self.a = DiagonalBlock(loss_of_h, h, row).dense()
        h_leaf = h.clone().requires_grad_(True)
        g = torch.autograd.grad(scalar_loss(loss_of_h(h_leaf)), h_leaf)[0][row]
        self.m_term = DiagonalBlock(lambda x: (g * head(x)).sum(), z[row:row + 1], 0)
        x0 = z[row:row + 1]

        def one(x: torch.Tensor) -> torch.Tensor:
            return head(x)[0]

        _, pullback = vjp(one, x0)
        self._jv = vmap(lambda v: jvp(one, (x0,), (v[None],))[1])
        self._jtw = vmap(lambda w: pullback(w)[0][0])
        self.products = 0

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        self.products += len(v)
        v = v.to(device=self.device, dtype=self.dtype)
        with torch.no_grad():
            g_term = self._jtw(self._jv(v) @ self.a)
        return g_term + self.m_term(v)


def row_isotropy(head: nn.Module, loss_of_h: Callable[[torch.Tensor], object], z: torch.Tensor, row: int,
                 seed: int = 0) -> dict:
    """The isotropy of H_i (`RowEffectiveHessian`) on its top-r_i subspace, r_i = rank ∂²L/∂h_i², for row i of the
    stacked batch z = [z1; z2]: (2n, D); loss_of_h maps the stacked outputs (2n, out) to a scalar. The head maps
    each sample on its own (put its BatchNorm on running statistics).

    Returns `effective.isotropy`'s keys but the eigenvalues ("rank": r_i (capped at D), "isotropy_error",
    "relative_std", "spread", "outside" — over the block's Ritz values), and "block_lambda_min" (of A_i, relative
    to its largest |λ|), "psd_block", "residual_max" (the largest Ritz residual / max|θ|), "converged", "captured"
    (the block saw every nonzero eigenvalue: the error is the dense one), "n_products"."""
    op = RowEffectiveHessian(head, loss_of_h, z, row)
    values = torch.linalg.eigvalsh(op.a)
    largest = float(values.abs().max())
    if largest == 0.0:
        return {"rank": 0, "isotropy_error": None, "block_lambda_min": 0.0, "psd_block": True,
                "why": "∂²L/∂h_i² is zero at this row: no subspace to whiten"}
    rank = int((values.abs() > RANK_RTOL * largest).sum())
    block_min = float(values[0]) / largest
    r = min(rank, z.shape[1])
    res = top_eigenpairs(op, z.shape[1], r, oversample=OVERSAMPLE, tol=SUBSPACE_TOL, max_iter=SUBSPACE_MAX_ITER,
                         seed=seed, dtype=z.dtype, device=z.device)
    scale = float(res.eigenvalues.abs().max())
    out = isotropy(res.eigenvalues, r, RANK_RTOL)
    del out["eigenvalues"]
    return out | {"block_lambda_min": block_min, "psd_block": block_min >= -RANK_RTOL,
                  "residual_max": float(res.residuals.max()) / scale if scale > 0 else 0.0,
                  "converged": res.converged, "captured": res.captured, "n_products": op.products}


def batch_isotropy(head: nn.Module, loss_of_h: Callable[[torch.Tensor], object], z1: torch.Tensor,
                   z2: torch.Tensor, rows: torch.Tensor, seed: int = 0) -> dict:
    """One evaluation batch: `row_isotropy` at each of `rows` (indices into [z1; z2]) and the premise on the whole
    batch. {"isotropy_error": the mean over rows, "rows": each row's record, "premise": `loss_hessian_premise`}."""
    z = torch.cat([z1, z2]).detach()
    with torch.no_grad():
        h = stacked_views(head, len(z1))(z)
    per_row = [row_isotropy(head, loss_of_h, z, int(i), seed + j) for j, i in enumerate(rows)]
    errors = [r["isotropy_error"] for r in per_row if r["isotropy_error"] is not None]
    return {"isotropy_error": sum(errors) / len(errors) if errors else None, "rows": per_row,
            "premise": loss_hessian_premise(loss_of_h, h, seed)}
