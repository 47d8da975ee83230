"""Exact curvature for small problems, and the eigenvalues of a loss Hessian by whichever method fits its size.

`dense_hessian` builds the whole Hessian with `torch.func` (parameters flattened in `named_parameters()` order, an
input batch z: (B, D) as z.reshape(-1), as `hessian.hvp_fn` does); `per_sample_blocks` the exact per-sample blocks
of a loss that factorises over samples; `hessian_eigs` picks dense eigh or Lanczos by size.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, hessian, vmap

from .hessian import WHICH, Target, hvp_fn, lanczos, scalar_loss_value, wanted_indices

METHODS = ("auto", "dense", "lanczos")
DENSE_MAX_DIM = 2000


class _BoundLoss(nn.Module):
    """loss_fn(module) as a module call, so torch.func.functional_call can swap the module's parameters."""

    def __init__(self, module: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor]) -> None:
        super().__init__()
        self.module = module
        self.loss_fn = loss_fn

    def forward(self) -> torch.Tensor:
        return self.loss_fn(self.module)


def dense_hessian(loss_fn: Callable[[Target], torch.Tensor], x: Target) -> torch.Tensor:
    """Exact (N, N) Hessian of loss_fn(x) by torch.func.hessian (forward-over-reverse), N = flat size of x.

    x: a tensor such as z: (B, D) (N = B·D) or an nn.Module (its parameters that require grad, flattened in
    `named_parameters()` order, the same order as `hvp_fn`). The module must be torch.func-compatible: no in-place
    running-stat updates (BatchNorm in eval mode) and no dropout. Memory N², time N products: for N ≲ 2000.

    >>> dense_hessian(lambda z: (z ** 3).sum(), torch.ones(1, 2, dtype=torch.float64))
    tensor([[6., 0.],
            [0., 6.]], dtype=torch.float64)
    """
    if isinstance(x, nn.Module):
        named = [(name, p) for name, p in x.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("the module has no parameters that require grad; nothing to differentiate.")
        bound = _BoundLoss(x, loss_fn)
        shapes = [p.shape for _, p in named]

        def flat_loss(flat: torch.Tensor) -> torch.Tensor:
            pieces = flat.split([math.prod(s) for s in shapes])
            params = {f"module.{name}": piece.reshape(shape)
                      for (name, _), piece, shape in zip(named, pieces, shapes, strict=True)}
            return scalar_loss_value(functional_call(bound, params, ()))

        flat0 = torch.cat([p.detach().reshape(-1) for _, p in named])
    elif isinstance(x, torch.Tensor):
        shape = x.shape

        def flat_loss(flat: torch.Tensor) -> torch.Tensor:
            return scalar_loss_value(loss_fn(flat.reshape(shape)))

        flat0 = x.detach().reshape(-1)
    else:
        raise TypeError(f"x must be an nn.Module or a tensor, not {type(x).__name__}.")
    return hessian(flat_loss)(flat0)


def per_sample_blocks(loss_per_sample_fn: Callable[..., torch.Tensor], z: torch.Tensor,
                      *per_sample_args: torch.Tensor) -> torch.Tensor:
    """Exact per-sample Hessians ∇²ℓ(z_i): (B, D, D) for a loss that factorises, L(z) = Σ_i ℓ(z_i, args_i).

    z: (B, D); loss_per_sample_fn(z_i: (D,), *args_i) -> scalar; each of per_sample_args has leading size B.
    Then ∇²L is block diagonal with these blocks, so its spectrum is the union of B small D×D spectra
    (`per_sample_spectrum`), exact and with multiplicities -- instead of Lanczos on the B·D-dimensional,
    near-degenerate operator. For a mean over the batch, divide ℓ by B. Losses coupling samples (InfoNCE, VICReg,
    BatchNorm in the head) do not factorise: use `hessian_eigs` on the whole batch instead.
    """
    if z.ndim != 2:
        raise ValueError(f"z must be a batch (B, D), got shape {tuple(z.shape)}.")
    return vmap(hessian(loss_per_sample_fn))(z, *per_sample_args)


def per_sample_spectrum(loss_per_sample_fn: Callable[..., torch.Tensor], z: torch.Tensor,
                        *per_sample_args: torch.Tensor) -> torch.Tensor:
    """Eigenvalues of each per-sample Hessian block, (B, D) ascending; their union is the spectrum of ∇²L."""
    blocks = per_sample_blocks(loss_per_sample_fn, z, *per_sample_args)
    return torch.linalg.eigvalsh((blocks + blocks.transpose(-1, -2)) / 2)


def hessian_eigs(loss_fn: Callable[[Target], torch.Tensor], x: Target, k: int = 5, method: str = "auto",
                 which: str = "both", tol: float = 1e-6, max_iter: int | None = None, seed: int = 0,
                 eigenvectors: bool = False) -> dict:
    """Extreme Hessian eigenvalues of loss_fn(x) w.r.t. x (a tensor such as z: (B, D), or a module's parameters).

    method: "dense" (exact eigh of `dense_hessian`), "lanczos" (`lanczos` on `hvp_fn`), or "auto": dense when
    dim ≤ 2000. Returns {"eigenvalues": (p,) ascending, "residuals", "residual_kind", "error_bounds",
    "converged", "eigenvectors": (dim, p) or None, "n_hvp", "method", "dim"}; k values per requested end.
    "converged" is residual ≤ tol·max_j |λ_j|, relative to the operator's scale on both paths (dense: ‖H‖ from
    the full spectrum; Lanczos: ‖T_m‖, see `lanczos`).

    >>> out = hessian_eigs(lambda z: (z ** 2).sum(), torch.ones(2, 2, dtype=torch.float64), k=1)
    >>> out["method"], out["eigenvalues"].tolist()
    ('dense', [2.0, 2.0])
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {METHODS}.")
    if which not in WHICH:
        raise ValueError(f"which={which!r} is not one of {WHICH}.")
    if isinstance(x, nn.Module):
        dim = sum(p.numel() for p in x.parameters() if p.requires_grad)
    else:
        dim = x.numel()
    if method == "auto":
        method = "dense" if dim <= DENSE_MAX_DIM else "lanczos"
    if method == "lanczos":
        res = lanczos(hvp_fn(loss_fn, x), dim, k=k, which=which, max_iter=max_iter, tol=tol, seed=seed,
                      eigenvectors=eigenvectors)
        out = {key: getattr(res, key) for key in ("eigenvalues", "residuals", "residual_kind", "error_bounds",
                                                  "converged", "eigenvectors", "n_hvp")}
        return {**out, "method": "lanczos", "dim": dim}
    try:
        h = dense_hessian(loss_fn, x).to(torch.float64)
    except RuntimeError:
        # Forward-over-reverse lacks formulas for some ops (SiLU's backward in torch 2.14): build the same
        # matrix from double-backward products instead, one row H e_i at a time.
        hvp = hvp_fn(loss_fn, x)
        h = torch.stack([hvp(e) for e in torch.eye(hvp.dim, dtype=hvp.dtype, device=hvp.device)]).to(torch.float64)
        h = (h + h.T) / 2
    values, vectors = torch.linalg.eigh((h + h.T) / 2)
    norm = values.abs().max()
    idx = wanted_indices(dim, k, which)
    values, vectors = values[idx], vectors[:, idx]
    residuals = (h @ vectors - vectors * values).norm(dim=0)
    return {
        "eigenvalues": values, "residuals": residuals, "residual_kind": "explicit", "error_bounds": residuals,
        "converged": residuals <= tol * norm,
        "eigenvectors": vectors if eigenvectors else None, "n_hvp": 0, "method": "dense", "dim": dim,
    }
