"""Multinomial L2-regularised logistic regression, fitted in torch to sklearn's objective and stopping rule.

`fit_logistic` fits one C. The other public pieces serve `linear_probe`, which walks a C grid as one path:
`free_parameters` / `canonical_parameters` (sklearn's (W, b) to the solver's variables and back),
`fit_free_parameters` (one preconditioned L-BFGS fit, finished in float64 where float32 cannot resolve the loss),
`shift_curvature_pairs` / `refit_curvature_pairs` (curvature pairs carried to the next C and to the refit) and
`feature_moments` (what shapes the preconditioner). `_class_preconditioner` is this module's own; the objective,
read over row blocks, is `headprobe.probes.logistic_blocks.loss_and_grad`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from headprobe.probes.lbfgs import minimize
from headprobe.probes.logistic_blocks import loss_and_grad, second_moments, squared_norms
from headprobe.probes.row_blocks import Rows


def solver_dtype(x) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def fit_logistic(
    x: torch.Tensor,
    y: torch.Tensor,
    C: float,
    num_classes: int,
    *,
    max_iter: int = 1000,
    tol: float = 1e-6,
    init: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fit an L2-regularised logistic regression; x: (N, D), y: (N,) -> W: (D, K), b: (K,).

    Minimises sklearn's `LogisticRegression(C=C, solver="lbfgs")` objective
        C · Σ_i CE(x_i W + b, y_i) + ½ ‖W‖²   (intercept unpenalised),
    computed as the equivalent mean CE + ‖W‖² / (2 C N), with full-batch L-BFGS (strong Wolfe line search).
    Like sklearn, it stops when the largest gradient entry of that mean objective is at most `tol` or after
    `max_iter` iterations. Runs on x's device, in float64 if x is float64 and float32 otherwise.

    For K = 2 sklearn fits a single binomial weight vector, not two softmax columns (whose penalty would
    differ by a factor of two); so here class 0's column and intercept stay at zero, W[:, 1] equals
    sklearn's `coef_[0]` and b[1] its `intercept_[0]`. For K > 2, b sums to zero, as sklearn's does.
    `init` = (W, b) warm-starts the solver.
    """
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(
            f"fit_logistic needs x: (N, D) and y: (N,) with N > 0 "
            f"but got x {tuple(x.shape)}, y {tuple(y.shape)}."
        )
    if not C > 0:
        raise ValueError(f"C must be positive but got {C}; larger C means weaker regularisation.")
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2 but got {num_classes}.")
    if torch.is_floating_point(y) or y.min() < 0 or y.max() >= num_classes:
        raise ValueError(f"y must hold integer class indices in 0..{num_classes - 1}.")
    counts = torch.bincount(y.long(), minlength=num_classes)
    if (counts == 0).any():
        missing = (counts == 0).nonzero().flatten().tolist()
        raise ValueError(
            f"classes {missing} have no samples in y; their unpenalised intercepts would run off to -inf. "
            "Remap labels to the classes present or make sure every class has samples."
        )

    x = x.to(solver_dtype(x))
    y = y.to(x.device, torch.int64)
    binary = num_classes == 2
    rows = Rows.of(x, block_rows=len(x))
    W, b, _, _ = fit_free_parameters(
        rows, y, C, *free_parameters(init, rows, num_classes), binary, max_iter=max_iter, tol=tol
    )
    return canonical_parameters(W, b, binary)


def _rows(x: Rows | torch.Tensor) -> Rows:
    """A tensor as `Rows` read in one block, in its own dtype; `Rows` as they are."""
    return x if isinstance(x, Rows) else Rows.of(x, dtype=x.dtype, block_rows=max(1, len(x)))


def free_parameters(
    init: tuple[torch.Tensor, torch.Tensor] | None, x: Rows | torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`init` = (W: (D, K), b: (K,)) or None (zeros) -> the solver's free variables (D, F), (F,) on x's device, in
    x's dtype (D: the dimension of the probe's coordinates, `Rows.dim`)."""
    x = _rows(x)
    d, free_classes = x.dim, 1 if num_classes == 2 else num_classes
    if init is None:
        return (torch.zeros(d, free_classes, dtype=x.dtype, device=x.device),
                torch.zeros(free_classes, dtype=x.dtype, device=x.device))
    W0, b0 = (t.to(x.device, x.dtype) for t in init)
    if W0.shape != (d, num_classes) or b0.shape != (num_classes,):
        raise ValueError(
            f"init must be (W: ({d}, {num_classes}), b: ({num_classes},)) but got "
            f"W {tuple(W0.shape)}, b {tuple(b0.shape)}."
        )
    # The softmax only sees logit differences, so class 0's column is folded into the binary weights.
    return (W0[:, 1:] - W0[:, :1], b0[1:] - b0[:1]) if num_classes == 2 else (W0.clone(), b0.clone())


@dataclass
class FitRecord:
    """How one fit went: recorded per C in `linear_probe`'s protocol["fits"]."""

    C: float
    evaluations: int
    iterations: int
    grad_max: float
    stop: str  # "tolerance", "max_iter", "max_evaluations", "no_progress" (a line search that cannot move)
    float64_finish: bool = False  # a float32 fit that stalled and was finished with float64 logits

    def record(self) -> dict:
        return asdict(self)


def fit_free_parameters(
    x: Rows | torch.Tensor,
    y: torch.Tensor,
    C: float,
    W: torch.Tensor,
    b: torch.Tensor,
    binary: bool,
    *,
    max_iter: int,
    tol: float,
    history: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    moments: FeatureMoments | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], FitRecord]:
    """The solver behind `fit_logistic`, starting from the free variables W: (D, F), b: (F,); x: the N training rows
(`Rows`, read block by block), y: their (N,) labels.

    Returns W, b (free variables, not yet canonical), the L-BFGS curvature pairs of this objective (in the
    flattened (Wᵀ, b) space; `shift_curvature_pairs` turns them into pairs of another C on the same x) and how it
    went. `history` starts L-BFGS with curvature pairs of this very objective; `moments` (`feature_moments`)
    shapes the preconditioner, the diagonal second moments when not given.
    """
    x = _rows(x)
    n, d = len(x), x.dim
    # The solver's variable is Wᵀ, (F, D): the logits are then formed as Wᵀxᵀ, (F, N), and the weight gradient
    # as gᵀx, the two products CPU BLAS runs fastest for a handful of classes (against x W and xᵀg:
    # `benchmarks/results/choices.json`, `logistic_layout`). L-BFGS only takes dot products of the flattened
    # variables, so the layout does not change the iterates.
    free = W.shape[1]
    if moments is None:
        moments = feature_moments(x, max_dim=0)  # the diagonal
    curvature: list[torch.Tensor] = []

    def evaluate(theta: torch.Tensor) -> tuple[float, torch.Tensor]:
        Wt, bias = theta[: free * d].view(free, d), theta[free * d :]
        loss, grad_w, grad_b, A = loss_and_grad(x, y, Wt, bias, C, binary, curvature=not curvature)
        if A is not None:
            curvature.append(A)
        return float(loss), torch.cat([grad_w.flatten(), grad_b])

    theta = torch.cat([W.T.flatten(), b])
    loss, grad = evaluate(theta)
    precondition = _class_preconditioner(curvature[0], moments, 1 / (C * n))
    theta, grad, history, evaluations, iterations, stop = minimize(
        evaluate, theta, loss, grad, tol=tol, max_iter=max_iter, precondition=precondition, history=history
    )
    fit = FitRecord(C, evaluations, iterations, grad.abs().max().item(), stop)
    if stop == "no_progress" and x.dtype != torch.float64:
        # The line search cannot resolve the loss any further from float32 logits (it happens at large C, where
        # the logits are large), though sklearn's gradient test is not met yet. Finish from here with float64
        # logits and parameters: each row block is converted as it is read, so no float64 copy of x is made.
        theta, history = theta.double(), [(s.double(), y.double()) for s, y in history]
        loss, grad = evaluate(theta)
        theta, grad, history, evaluations, iterations, fit.stop = minimize(
            evaluate, theta, loss, grad, tol=tol, max_iter=max(1, max_iter - iterations),
            precondition=_class_preconditioner(curvature[0], moments.to(torch.float64), 1 / (C * n)), history=history,
        )
        fit.evaluations += evaluations
        fit.iterations += iterations
        fit.grad_max, fit.float64_finish = grad.abs().max().item(), True
        theta, history = theta.to(x.dtype), [(s.to(x.dtype), y.to(x.dtype)) for s, y in history]
    W, b = theta[: free * d].view(free, d).T.contiguous(), theta[free * d :].clone()
    return W, b, history, fit


def canonical_parameters(W: torch.Tensor, b: torch.Tensor, binary: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Free variables -> the (D, K), (K,) parameters `fit_logistic` reports."""
    if binary:
        return torch.cat([torch.zeros_like(W), W], dim=1), torch.cat([torch.zeros_like(b), b])
    # The loss is invariant to adding a constant to every intercept; pin the one sklearn reports.
    return W, b - b.mean()


def shift_curvature_pairs(
    history: list[tuple[torch.Tensor, torch.Tensor]], old_C: float, new_C: float, n: int, size_w: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Curvature pairs of the objective at old_C -> the same pairs at new_C, on the same x.

    The cross-entropy part of the gradient does not depend on C, and the penalty's gradient is W / (C N), so a
    gradient change y over a step s changes exactly by (1/(new_C N) - 1/(old_C N)) · s on the weight entries.
    Pairs that stop being positive curvature (possible when the penalty shrinks) are dropped.
    """
    shift = 1 / (new_C * n) - 1 / (old_C * n)
    shifted = []
    for s, y in history:
        y = y.clone()
        y[:size_w].add_(s[:size_w], alpha=shift)
        if y.dot(s) > 1e-10:
            shifted.append((s, y))
    return shifted


@dataclass
class FeatureMoments:
    """The features' second-moment matrix as `_class_preconditioner` takes it: values (r,) along the columns
    of basis (D, r) plus `bulk` times the projector on the rest, or, with basis None, the diagonal values (D,)."""

    values: torch.Tensor
    basis: torch.Tensor | None = None
    bulk: float = 0.0

    def to(self, dtype: torch.dtype) -> FeatureMoments:
        return FeatureMoments(self.values.to(dtype), None if self.basis is None else self.basis.to(dtype), self.bulk)


def refit_curvature_pairs(
    history: list[tuple[torch.Tensor, torch.Tensor]], ratio: torch.Tensor, shift: torch.Tensor, C: float,
    n_fit: int, n_all: int,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Curvature pairs of the fit on the fitting part -> approximate pairs for the refit on all of train.

    The refit's variables are the fit's under the change of standardisation θ' = Tθ, Wᵀ' = Wᵀ diag(ratio), b' = b +
    Wᵀ shift (the start of the refit), so a step maps to Ts and a gradient change to T⁻ᵀy, which keeps sᵀy; the
    penalty's part of y is exchanged for the refit's exactly, and the cross-entropy's part is the fitting part's
    curvature standing in for all of train's; the refit then takes fewer loss evaluations than from the transformed
    start alone (figures: `benchmarks/README.md`, "Measurements quoted by the modules"). Pairs that lose positive
    curvature are dropped.
    """
    d = ratio.shape[0]
    free = history[0][0].shape[0] // (d + 1) if history else 0
    pairs = []
    for s, y in history:
        s_w, s_b, y_w, y_b = s[: free * d].view(free, d), s[free * d :], y[: free * d].view(free, d), y[free * d :]
        s_w_new = s_w * ratio
        y_w_new = (y_w - s_w / (C * n_fit) - y_b[:, None] * shift[None, :]) / ratio + s_w_new / (C * n_all)
        s_new = torch.cat([s_w_new.flatten(), s_b + s_w @ shift])
        y_new = torch.cat([y_w_new.flatten(), y_b])
        if y_new.dot(s_new) > 1e-10:
            pairs.append((s_new, y_new))
    return pairs


def _class_preconditioner(A: torch.Tensor, moments: FeatureMoments, penalty: float):
    """v -> P v (rows of v) with P ≈ the inverse Hessian of the objective; A: (F, F) mean softmax curvature at
    the start.

    The weight block of the Hessian, mean_n (diag p_n - p_n p_nᵀ) ⊗ x_n x_nᵀ + penalty · I, is approximated by
    A ⊗ M + penalty · I with M the features' second-moment matrix (`FeatureMoments`: its diagonal, or a low-rank
    eigenbasis plus a bulk level) -- the softmax curvature and the features taken as independent -- whose
    inverse is cheap in the eigenbases of A and M; the intercept block by A (plus a multiple of 11ᵀ on the one
    direction the softmax cannot see). It only shapes L-BFGS's first guess of the inverse Hessian, so the
    optimum is unchanged. With the diagonal alone it saves loss evaluations over the default grid; `feature_moments`
    says what the eigenbasis adds (figures: `benchmarks/README.md`, "Measurements quoted by the modules").
    """
    free, d = A.shape[0], (moments.values if moments.basis is None else moments.basis).shape[0]
    dtype = moments.values.dtype
    eigenvalues, Q = torch.linalg.eigh(A)
    eigenvalues = eigenvalues.clamp_min(0)
    scale = (eigenvalues[:, None] * moments.values.double()[None, :] + penalty).reciprocal().to(dtype)
    bulk_scale = (eigenvalues[:, None] * moments.bulk + penalty).reciprocal().to(dtype)
    intercept = A + A.trace() / free**2 * torch.ones_like(A) if free > 1 else A
    intercept_eig, intercept_Q = torch.linalg.eigh(intercept)
    intercept_eig = intercept_eig.clamp_min(1e-6 * intercept_eig.max().clamp_min(1e-300))
    P_b = (intercept_Q / intercept_eig) @ intercept_Q.T
    Q, P_b, V = Q.to(dtype), P_b.to(dtype), moments.basis

    def precondition(v: torch.Tensor) -> torch.Tensor:
        w = Q.T @ v[:, : free * d].view(-1, free, d)
        if V is None:
            w = Q @ (w * scale)
        else:
            along = w @ V
            w = Q @ ((w - along @ V.T) * bulk_scale + (along * scale) @ V.T)
        return torch.cat([w.flatten(1), v[:, free * d :] @ P_b], dim=1)  # P_b is symmetric

    return precondition


def feature_moments(x: Rows | torch.Tensor, *, max_rows: int = 2048, max_dim: int = 1024) -> FeatureMoments:
    """The features' second-moment matrix xᵀx / N for `_class_preconditioner`, from at most `max_rows` evenly
    spaced rows: the eigenvectors whose eigenvalues lie outside the Marchenko-Pastur band of isotropic noise,
    and one level for the rest; just the diagonal when D > max_dim. x: (N, D) rows (`Rows`, or a tensor).

    Standardised backbone features are strongly correlated, and L-BFGS spends most of its iterations on the
    directions the correlations squeeze; the eigenbasis lets the preconditioner undo them (on the quickstart's
    DINOv2 features the grid takes about half the loss evaluations it takes with the diagonal). Sample eigenvalues
    of isotropic features still spread over the band σ²(1 ± sqrt(D / rows))²; taken at face value they precondition
    noise, so the ones inside it are replaced by their mean (figures: `benchmarks/README.md`, "Measurements quoted
    by the modules"). A preconditioner needs only the shape of the Hessian, so a subsample of rows is enough, and it
    is computed once per probe. Above `max_dim` the dense eigendecomposition stops paying for itself (its time at
    D = 1024: `benchmarks/results/choices.json`, `logistic_eigh`).
    """
    rows = _rows(x)
    n, d, dtype = len(rows), rows.dim, rows.dtype
    if d > max_dim:
        return FeatureMoments(squared_norms(rows) / n)
    sample = rows.take(torch.arange(0, n, max(1, n // max_rows)))
    # float64: float32 eigh of a rank-deficient second-moment matrix with many zero columns (mean-pooled ReLU
    # features with dead units) returned NaN eigenvalues without raising (LAPACK ssyevd), and the NaN
    # preconditioner turned the whole C path into NaN. Should it still fail, the diagonal shapes the steps.
    eigenvalues, eigenvectors = torch.linalg.eigh(second_moments(sample))
    if not (torch.isfinite(eigenvalues).all() and torch.isfinite(eigenvectors).all()):
        return FeatureMoments(squared_norms(rows) / n)
    eigenvalues, eigenvectors = eigenvalues.clamp_min(0).to(dtype), eigenvectors.to(dtype)
    ratio, level = d / len(sample), eigenvalues.mean()
    inside = (eigenvalues >= level * (1 - ratio**0.5) ** 2) & (eigenvalues <= level * (1 + ratio**0.5) ** 2)
    bulk = eigenvalues[inside].mean().item() if inside.any() else 0.0
    return FeatureMoments(eigenvalues[~inside], eigenvectors[:, ~inside], bulk)
