"""Curvature of a scalar loss: Hessian-vector products and Lanczos (the power-iteration baseline:
`headprobe.geometry.power`; exact Hessians and `hessian_eigs`: `headprobe.geometry.eigs`; Hutchinson and SLQ:
`headprobe.geometry.density`).

The paper tracks "λ_min of the loss Hessian w.r.t. the backbone output batch, by power iteration (20 steps for
λ_max, 20 on H − λ_max I)", which gives unreliable signs for λ_min ~ 1e-7. Here the same number comes from
Lanczos with full reorthogonalisation together with its residual ‖Hv − λv‖, or exactly from a dense Hessian
(small problems) or from per-sample Hessian blocks (losses that factorise over samples). `power_iteration`
is the PyHessian-style baseline kept for comparison.

Why not scipy's `eigsh` (ARPACK): `lanczos` stops at a tolerance relative to ‖H‖, so a tiny λ_min is known to within
tol·‖H‖ without chasing its own relative accuracy, restarts in the complement of an invariant subspace, gives the
Ritz pairs stochastic Lanczos quadrature needs (`density`) and runs on the operator's device. At tol 1e-3 (for eigsh
the setting that guarantees `lanczos`'s accuracy) it took 19 Hessian-vector products against eigsh's 206 on a
synthetic spectrum and 26 against 38 on a VICReg loss Hessian, and 1/25 and 1/14 of power iteration's
(`benchmarks/bench_hessian.py`, `benchmarks/results/hessian.json`; eigsh's best case, its tol picked knowing the
answer, is in the notes there: 21 products on both).

Every operator is a flat vector view: parameters are flattened in `named_parameters()` order, an input batch
z: (B, D) as z.reshape(-1), so dim = number of parameters or B·D.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy.linalg import eigh_tridiagonal
from torch import nn

HVP = Callable[[torch.Tensor], torch.Tensor]
Target = nn.Module | torch.Tensor
# The ends of the spectrum `lanczos` (and `eigs.hessian_eigs`) can be asked for.
WHICH = ("both", "largest", "smallest")


class HessianVectorProduct:
    """v: (dim,) ↦ H v: (dim,), for the Hessian H of one fixed scalar loss; built by `hvp_fn`.

    `calls` counts the products taken; `dim`, `dtype`, `device` describe the flat variable.
    """

    def __init__(self, loss: torch.Tensor, targets: list[torch.Tensor]) -> None:
        self.loss = loss.detach()
        self.targets = targets
        self.numels = [t.numel() for t in targets]
        self.dim = sum(self.numels)
        self.dtype = targets[0].dtype
        self.device = targets[0].device
        self.calls = 0
        grads = torch.autograd.grad(loss, targets, create_graph=True, allow_unused=True)
        # A gradient that is None (unused variable) or has no graph (loss linear in it) has zero Hessian rows.
        self._grads = [g if g is not None and g.requires_grad else None for g in grads]

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        if v.shape != (self.dim,):
            raise ValueError(f"the Hessian-vector product takes a flat vector of shape ({self.dim},), "
                             f"got {tuple(v.shape)}; reshape the direction with .reshape(-1).")
        self.calls += 1
        outputs, directions = [], []
        for grad, piece in zip(self._grads, v.split(self.numels), strict=True):
            if grad is not None:
                outputs.append(grad)
                directions.append(piece.reshape(grad.shape).to(device=grad.device, dtype=grad.dtype))
        products: list[torch.Tensor | None] = [None] * len(self.targets)
        if outputs:
            products = list(torch.autograd.grad(outputs, self.targets, grad_outputs=directions,
                                                retain_graph=True, allow_unused=True))
        return torch.cat([(p if p is not None else torch.zeros_like(t)).reshape(-1)
                          for p, t in zip(products, self.targets, strict=True)]).to(device=v.device, dtype=v.dtype)


def hvp_fn(loss_fn: Callable[[Target], torch.Tensor], params_or_input: Target) -> HessianVectorProduct:
    """Hessian-vector products of `loss_fn(params_or_input)` (a scalar).

    params_or_input: an `nn.Module` (Hessian w.r.t. its parameters that require grad, flattened) or a tensor
    such as a representation batch z: (B, D) (Hessian w.r.t. z.reshape(-1)). `loss_fn` is called once, here.

    >>> z = torch.randn(4, 3, dtype=torch.float64)
    >>> hvp = hvp_fn(lambda x: (x ** 2).sum(), z)
    >>> hvp(torch.ones(12, dtype=torch.float64))[:3]
    tensor([2., 2., 2.], dtype=torch.float64)
    """
    # Reverse-over-reverse (double backward), not torch.func's forward-over-reverse jvp(grad(f)): the forward
    # pass and the gradient graph are built once and every product is one backward pass through that graph.
    # So a module runs exactly once -- one dropout mask, one set of BatchNorm batch statistics, one running-stat
    # update -- and every product is of the same symmetric matrix, which Lanczos needs; any autograd op works,
    # including ones without forward-mode formulas. The price: the graph stays in memory while the product lives.
    if isinstance(params_or_input, nn.Module):
        targets = [p for p in params_or_input.parameters() if p.requires_grad]
        if not targets:
            raise ValueError("the module has no parameters that require grad; "
                             "unfreeze the ones to differentiate (p.requires_grad_(True)).")
        target: Target = params_or_input
    elif isinstance(params_or_input, torch.Tensor):
        if not torch.is_floating_point(params_or_input):
            raise ValueError(f"the input has dtype {params_or_input.dtype}; a Hessian needs a floating-point tensor.")
        target = params_or_input.detach().requires_grad_(True)
        targets = [target]
    else:
        raise TypeError(f"params_or_input must be an nn.Module or a tensor, not {type(params_or_input).__name__}.")
    loss = scalar_loss_value(loss_fn(target))
    if not loss.requires_grad:
        raise ValueError("loss_fn's output does not depend on params_or_input through autograd; "
                         "compute the loss from the module or tensor it is given, without .detach() or no_grad.")
    return HessianVectorProduct(loss, targets)


@dataclass
class LanczosResult:
    """What `lanczos` returns; p = number of requested eigenpairs.

    eigenvalues: (p,) Ritz values, ascending. residuals: (p,) ‖Hv − λv‖, see `residual_kind`.
    error_bounds: (p,) min(r, r²/gap), gap = distance to the nearest other Ritz value: an estimate of |λ − λ_true|
    (exact bound when the gap to the rest of H's spectrum is at least the Ritz gap).
    converged: (p,) residual ≤ tol·max(scale, |λ|), scale = max_j |θ_j| over all Ritz values unless given (see
    `lanczos`). eigenvectors: (dim, p) unit Ritz vectors or None.
    n_hvp: Hessian-vector products used, the checks of the returned vectors included. n_iter: Krylov dimension.
    residual_kind: "lanczos_relation" (β_m|e_mᵀs|, free) or "explicit" (one extra product per returned vector).
    """

    eigenvalues: torch.Tensor
    residuals: torch.Tensor
    error_bounds: torch.Tensor
    converged: torch.Tensor
    eigenvectors: torch.Tensor | None
    n_hvp: int
    n_iter: int
    residual_kind: str


_BASIS_BLOCK = 32  # the Krylov basis starts at max_steps halved until below 2 blocks (32-63 rows), then doubles


def _first_rows(max_steps: int) -> int:
    """max_steps halved (rounding up) until below 2·_BASIS_BLOCK: doubling from there ends exactly at max_steps,
    from about max_steps / 2, so the last growth holds at most ~1.5 × max_steps rows for a moment."""
    rows = max_steps
    while rows >= 2 * _BASIS_BLOCK:
        rows = -(-rows // 2)
    return rows


class _LanczosRecurrence:
    """H Q_m = Q_m T_m + β_m q_{m+1} e_mᵀ, Q kept orthonormal by full reorthogonalisation.

    The basis Q is one contiguous (rows, dim) buffer of `rows` rows at first (default `_first_rows`: max_steps if
    below 64, else 32 to 63) that doubles, capped at max_steps, when full: its memory follows the steps taken,
    `rows` ≤ max(63, 2m), not max_steps. Growing copies the rows into the larger buffer (both live for that
    moment). Every product reads the same contiguous rows as a max_steps-row buffer would, so the numbers do not
    depend on when or whether it grew.
    """

    def __init__(self, matvec: HVP, start: torch.Tensor, max_steps: int, rows: int | None = None) -> None:
        self.matvec = matvec
        self.max_steps = max_steps
        rows = _first_rows(max_steps) if rows is None else rows
        self.q = start.new_zeros(min(rows, max_steps), start.numel())
        self.q[0] = start / start.norm()
        self.alpha: list[float] = []
        self.beta: list[float] = []
        self.anorm = 0.0
        self.invariant = False

    @property
    def m(self) -> int:
        return len(self.alpha)

    @property
    def rows(self) -> int:
        """Rows allocated for the basis now: its memory is rows × dim numbers."""
        return self.q.shape[0]

    def _room_for(self, row: int) -> None:
        """Grow the basis (doubling, capped at max_steps) until it has row `row`."""
        if row < self.q.shape[0]:
            return
        if row >= self.max_steps:
            raise IndexError(f"row {row} is past the {self.max_steps} steps this recurrence may take.")
        rows = self.q.shape[0]
        while rows <= row:
            rows = min(2 * rows, self.max_steps)
        grown = self.q.new_zeros(rows, self.q.shape[1])
        grown[: self.q.shape[0]] = self.q
        self.q = grown

    def step(self) -> None:
        j = self.m
        w = self.matvec(self.q[j])
        alpha = float(torch.dot(self.q[j], w))
        w = w - alpha * self.q[j] - (self.beta[-1] * self.q[j - 1] if j else 0.0)
        basis = self.q[: j + 1]
        for _ in range(2):  # "twice is enough" (Kahan-Parlett): one pass leaves O(eps·κ) components behind
            w = w - basis.T @ (basis @ w)
        beta = float(w.norm())
        self.anorm = max(self.anorm, abs(alpha) + beta + (self.beta[-1] if j else 0.0))
        self.invariant = beta <= self.q.shape[1] * torch.finfo(self.q.dtype).eps * max(self.anorm, 1e-300)
        self.alpha.append(alpha)
        self.beta.append(0.0 if self.invariant else beta)
        if not self.invariant and j + 1 < self.max_steps:
            self._room_for(j + 1)
            self.q[j + 1] = w / beta

    def restart(self, vector: torch.Tensor) -> None:
        """Continue in the orthogonal complement after the Krylov space became invariant (β = 0 decouples T)."""
        basis = self.q[: self.m]
        for _ in range(2):
            vector = vector - basis.T @ (basis @ vector)
        self._room_for(self.m)
        self.q[self.m] = vector / vector.norm()
        self.invariant = False

    def ritz(self, indices: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Ritz values (ascending) at `indices` of T_m (all when None) and their eigenvectors s: (m, len(indices))."""
        # All pairs by MRRR, O(m²): LAPACK's index-selected bisection + inverse iteration returns duplicated
        # values and vectors for clustered Ritz values (e.g. the zeros of a low-rank H) when the ends are split.
        theta, s = eigh_tridiagonal(np.asarray(self.alpha), np.asarray(self.beta[:-1]))
        return (theta, s) if indices is None else (theta[indices], s[:, indices])


def lanczos_ritz_pairs(matvec: HVP, start: torch.Tensor, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Ritz values θ (ascending) and eigenvectors s of T_m after m = n_steps Lanczos steps from `start` (fewer when
    the Krylov space becomes invariant first), the nodes and weights of Lanczos quadrature: uᵀf(H)u / uᵀu ≈
    Σ_i s[0, i]² f(θ_i). θ: (m,), s: (m, m). The basis is allocated at once, n_steps rows of start's size.

    >>> theta, s = lanczos_ritz_pairs(lambda v: torch.arange(1.0, 4.0, dtype=torch.float64) * v,
    ...                               torch.ones(3, dtype=torch.float64), 3)
    >>> theta.round(6).tolist(), (s[0] ** 2).round(6).tolist()
    ([1.0, 2.0, 3.0], [0.333333, 0.333333, 0.333333])
    """
    rec = _LanczosRecurrence(matvec, start, n_steps, rows=n_steps)
    rec.step()
    while not rec.invariant and rec.m < n_steps:
        rec.step()
    return rec.ritz()


def wanted_indices(m: int, k: int, which: str) -> list[int]:
    lower = set(range(min(k, m))) if which in ("smallest", "both") else set()
    upper = set(range(max(m - k, 0), m)) if which in ("largest", "both") else set()
    return sorted(lower | upper)


def counted_matvec(hvp: HVP, dtype: torch.dtype, device: torch.device) -> tuple[HVP, list[int]]:
    """hvp in the working dtype/device, with a call counter (a list so the caller sees it change)."""
    count = [0]

    def matvec(v: torch.Tensor) -> torch.Tensor:
        count[0] += 1
        return hvp(v).to(device=device, dtype=dtype)

    return matvec, count


def krylov_setup(hvp: HVP, dim: int, seed: int, dtype: torch.dtype, device) -> tuple[torch.device, torch.Generator]:
    """Check dim and dtype for an operator on dim variables -> (the device it works on, a seeded generator)."""
    if dim < 1:
        raise ValueError(f"dim must be a positive number of variables, got {dim}.")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}.")
    device = torch.device(device if device is not None else getattr(hvp, "device", "cpu"))
    # A CPU generator so that a seed gives the same start vectors on every device.
    return device, torch.Generator().manual_seed(seed)


def rademacher(dim: int, gen: torch.Generator, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(dim,) independent ±1 entries, each sign with probability ½, drawn from `gen`."""
    return (torch.randint(0, 2, (dim,), generator=gen) * 2 - 1).to(device=device, dtype=dtype)


def lanczos(hvp: HVP, dim: int, k: int = 6, which: str = "both", max_iter: int | None = None, tol: float = 1e-6,
            seed: int = 0, dtype: torch.dtype = torch.float64, eigenvectors: bool = False,
            device: torch.device | str | None = None, scale: float | None = None) -> LanczosResult:
    """Extreme eigenvalues of a symmetric operator by Lanczos with full reorthogonalisation.

    which: "largest" / "smallest" (k values) or "both" (k from each end). Stops when every requested Ritz pair
    has residual bound β_m|e_mᵀs| ≤ tol·max_j |θ_j| (θ: all Ritz values of T_m, so max_j |θ_j| = ‖T_m‖ ≤ ‖H‖), or
    after max_iter products (default min(dim, max(300, 3k))), warning then. tol is thus relative to the operator's
    scale: H and c·H take the same steps to the same relative accuracy, a small λ_min (1e-3·λ_max, or 1e-7) is
    known to within tol·‖H‖, and H = 0 gives exact zeros, converged. A given scale (a norm known in advance, in H's
    units) replaces ‖T_m‖ as the floor: residual ≤ tol·max(scale, |θ|) for each requested θ.
    With eigenvectors=True the Ritz vectors are formed and their residuals ‖Hv − λv‖ recomputed with one extra
    product each. When the Krylov space becomes invariant (few distinct eigenvalues, e.g. a low-rank H) Lanczos
    restarts in its complement, which recovers multiplicities; otherwise a single start vector sees one copy of a
    repeated eigenvalue: use the dense or per-sample path when multiplicities matter.
    Memory: the Krylov basis, rows × dim numbers in `dtype`. For max_iter < 64, rows = max_iter; else the basis
    starts at 32-63 rows and doubles, ending exactly at max_iter, as steps are taken (rows ≤ max(63, 2·n_iter)), so
    a run that converges early never holds max_iter rows. While it grows, the old and new basis coexist briefly:
    a run that reaches max_iter peaks at about 1.5 × max_iter rows for that moment.

    >>> a = torch.diag(torch.arange(1.0, 101.0, dtype=torch.float64))
    >>> out = lanczos(lambda v: a @ v, 100, k=1, which="largest")
    >>> round(out.eigenvalues.item(), 6), bool(out.converged.all())
    (100.0, True)
    """
    if which not in WHICH:
        raise ValueError(f"which={which!r} is not one of {WHICH}.")
    if k < 1 or tol <= 0:
        raise ValueError(f"lanczos needs k >= 1 and tol > 0, got k={k}, tol={tol}.")
    if scale is not None and not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive finite operator norm estimate, got {scale}; "
                         "leave it None to measure the tolerance against the Ritz values.")
    device, gen = krylov_setup(hvp, dim, seed, dtype, device)
    requested = min(dim, 2 * k if which == "both" else k)
    max_iter = min(dim, max(300, 3 * k)) if max_iter is None else max_iter
    if not requested <= max_iter <= dim:
        raise ValueError(f"max_iter={max_iter} must lie between the {requested} requested eigenvalues and dim={dim}.")
    matvec, count = counted_matvec(hvp, dtype, device)
    rec = _LanczosRecurrence(matvec, torch.randn(dim, generator=gen, dtype=dtype).to(device), max_iter)
    before_restart = None
    while True:
        rec.step()
        if rec.m >= requested:
            all_theta, all_s = rec.ritz()
            wanted = wanted_indices(rec.m, k, which)
            theta, s = all_theta[wanted], all_s[:, wanted]
            residuals = np.abs(rec.beta[-1] * s[-1])
            # ‖T_m‖, not max(1, |θ|): an absolute floor would accept anything from an operator far below 1.
            floor = float(np.abs(all_theta).max()) if scale is None else scale
            atol = tol * np.maximum(floor, np.abs(theta))
        if rec.invariant and rec.m < max_iter:
            # The Krylov space is exhausted (H has few distinct eigenvalues, e.g. low rank): its Ritz values are
            # exact but blind to multiplicity. Restart in the complement until a restart changes nothing requested.
            unchanged = (rec.m >= requested and before_restart is not None
                         and np.allclose(theta, before_restart, rtol=0, atol=atol.max()))
            if not unchanged:
                before_restart = theta if rec.m >= requested else None
                rec.restart(torch.randn(dim, generator=gen, dtype=dtype).to(device))
                continue
        # ≤, not <: H = 0 has zero Ritz values and zero residuals, which are exact.
        if rec.m >= requested and (np.all(residuals <= atol) or rec.m == max_iter):
            break
    vectors = None
    kind = "lanczos_relation"
    if eigenvectors:
        vectors = rec.q[: rec.m].T @ torch.as_tensor(s, dtype=dtype, device=device)
        vectors = vectors / vectors.norm(dim=0)
        theta_t = torch.as_tensor(theta, dtype=dtype, device=device)
        residuals = np.array([float((matvec(vectors[:, i]) - theta_t[i] * vectors[:, i]).norm())
                              for i in range(len(theta))])
        kind = "explicit"
    converged = residuals <= atol
    if not converged.all():
        warnings.warn(f"lanczos stopped after {rec.m} iterations (max_iter={max_iter}) with "
                      f"{int((~converged).sum())} of {len(theta)} residuals above tol·max(scale, |θ|) "
                      f"(tol={tol}, scale={floor:.2e}, largest residual {residuals.max():.2e}); "
                      "raise max_iter or loosen tol.", stacklevel=2)
    gaps = np.array([np.min(np.abs(np.delete(all_theta, np.argmin(np.abs(all_theta - t))) - t), initial=np.inf)
                     for t in theta])
    bounds = np.where(gaps > residuals, np.minimum(residuals, residuals**2 / np.maximum(gaps, 1e-300)), residuals)
    return LanczosResult(
        eigenvalues=torch.as_tensor(theta), residuals=torch.as_tensor(residuals),
        error_bounds=torch.as_tensor(bounds), converged=torch.as_tensor(converged),
        eigenvectors=vectors, n_hvp=count[0], n_iter=rec.m, residual_kind=kind,
    )


def scalar_loss_value(loss: torch.Tensor) -> torch.Tensor:
    """A loss function's output as a 0-d tensor; anything else is refused with the fix."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"loss_fn must return a scalar tensor, got {shape}; reduce it with .sum() or .mean().")
    return loss.reshape(())
