"""Multinomial L2-regularised logistic-regression probe on frozen features.

The solver is written in torch rather than calling sklearn: it runs full-batch on the features' device
(a GPU when there is one) in float32, and walks the C grid as one regularisation path instead of
restarting from zero per C as sklearn does. Each fit starts from the secant through the previous two
solutions, keeps the previous fit's L-BFGS curvature pairs (exactly corrected for the new C), and is
preconditioned in class space. It still minimises exactly sklearn's `LogisticRegression(solver="lbfgs")`
objective, to sklearn's stopping rule, so its numbers can be checked against sklearn's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

# torch's strong-Wolfe line search (the one `torch.optim.LBFGS` runs); `_lbfgs` below reuses it rather than
# carrying a copy.
from torch.optim.lbfgs import _strong_wolfe

from headprobe.probes.knn import _check_split


@dataclass
class LinearProbeResult:
    """What `linear_probe` returns.

    metrics: {"linear.acc": test accuracy, "linear.val_acc": best validation accuracy, "linear.C": chosen C}.
    predictions: (M,) int64 predicted test labels, on the CPU.
    probabilities: (M, K) float32 test-set class probabilities, on the CPU.
    protocol: every knob and intermediate choice, so a result can be reproduced from it alone.
    """

    metrics: dict[str, float]
    predictions: torch.Tensor
    probabilities: torch.Tensor
    protocol: dict


def _work_dtype(x: torch.Tensor) -> torch.dtype:
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

    x = x.to(_work_dtype(x))
    y = y.to(x.device, torch.int64)
    binary = num_classes == 2
    W, b, _, _ = _fit(x, y, C, *_free_start(init, x, num_classes), binary, max_iter=max_iter, tol=tol)
    return _canonical(W, b, binary)


def _free_start(
    init: tuple[torch.Tensor, torch.Tensor] | None, x: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`init` = (W: (D, K), b: (K,)) or None (zeros) -> the solver's free variables (D, F), (F,) on x's device."""
    d, free_classes = x.shape[1], 1 if num_classes == 2 else num_classes
    if init is None:
        return x.new_zeros(d, free_classes), x.new_zeros(free_classes)
    W0, b0 = (t.to(x.device, x.dtype) for t in init)
    if W0.shape != (d, num_classes) or b0.shape != (num_classes,):
        raise ValueError(
            f"init must be (W: ({d}, {num_classes}), b: ({num_classes},)) but got "
            f"W {tuple(W0.shape)}, b {tuple(b0.shape)}."
        )
    # The softmax only sees logit differences, so class 0's column is folded into the binary weights.
    return (W0[:, 1:] - W0[:, :1], b0[1:] - b0[:1]) if num_classes == 2 else (W0.clone(), b0.clone())


@dataclass
class _Fit:
    """How one fit went: recorded per C in `linear_probe`'s protocol["fits"]."""

    C: float
    evaluations: int
    iterations: int
    grad_max: float
    stop: str  # "tolerance", "max_iter", "max_evaluations", "no_progress" (a line search that cannot move)
    float64_finish: bool = False  # a float32 fit that stalled and was finished with float64 logits

    def record(self) -> dict:
        return asdict(self)


def _fit(
    x: torch.Tensor,
    y: torch.Tensor,
    C: float,
    W: torch.Tensor,
    b: torch.Tensor,
    binary: bool,
    *,
    max_iter: int,
    tol: float,
    history: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    moments: _Moments | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], _Fit]:
    """The solver behind `fit_logistic`, starting from the free variables W: (D, F), b: (F,).

    Returns W, b (free variables, not yet canonical), the L-BFGS curvature pairs of this objective (in the
    flattened (Wᵀ, b) space; `_shift_history` turns them into pairs of another C on the same x) and how it went.
    `history` starts L-BFGS with curvature pairs of this very objective; `moments` (`_feature_moments`) shapes the
    preconditioner, the diagonal second moments when not given.
    """
    n, d = x.shape
    # The solver's variable is Wᵀ, (F, D): the logits are then formed as Wᵀxᵀ, (F, N), and the weight gradient
    # as gᵀx, the two products CPU BLAS runs fastest for a handful of classes (3.9 and 3.4 ms at 8000 × 768 × 10,
    # against 6.3 and 20 ms for x W and xᵀg). L-BFGS only takes dot products of the flattened variables, so the
    # layout does not change the iterates.
    free = W.shape[1]
    targets = _one_hot(y, free + (free == 1))
    if moments is None:
        moments = _feature_moments(x, max_dim=0)  # the diagonal
    curvature: list[torch.Tensor] = []

    def evaluate(theta: torch.Tensor) -> tuple[float, torch.Tensor]:
        Wt, bias = theta[: free * d].view(free, d), theta[free * d :]
        loss, grad_w, grad_b, A = _loss_and_grad(x, targets, Wt, bias, C, binary, curvature=not curvature)
        if A is not None:
            curvature.append(A)
        return float(loss), torch.cat([grad_w.flatten(), grad_b])

    theta = torch.cat([W.T.flatten(), b])
    loss, grad = evaluate(theta)
    precondition = _class_preconditioner(curvature[0], moments, 1 / (C * n))
    theta, grad, history, evaluations, iterations, stop = _lbfgs(
        evaluate, theta, loss, grad, tol=tol, max_iter=max_iter, precondition=precondition, history=history
    )
    fit = _Fit(C, evaluations, iterations, grad.abs().max().item(), stop)
    if stop == "no_progress" and x.dtype != torch.float64:
        # The line search cannot resolve the loss any further from float32 logits (it happens at large C, where
        # the logits are large), though sklearn's gradient test is not met yet. Finish from here with float64
        # logits and parameters: each row block is converted as it is read, so no float64 copy of x is made.
        theta, history = theta.double(), [(s.double(), y.double()) for s, y in history]
        loss, grad = evaluate(theta)
        theta, grad, history, evaluations, iterations, fit.stop = _lbfgs(
            evaluate, theta, loss, grad, tol=tol, max_iter=max(1, max_iter - iterations),
            precondition=_class_preconditioner(curvature[0], moments.to(torch.float64), 1 / (C * n)), history=history,
        )
        fit.evaluations += evaluations
        fit.iterations += iterations
        fit.grad_max, fit.float64_finish = grad.abs().max().item(), True
        theta, history = theta.to(x.dtype), [(s.to(x.dtype), y.to(x.dtype)) for s, y in history]
    W, b = theta[: free * d].view(free, d).T.contiguous(), theta[free * d :].clone()
    return W, b, history, fit


def _canonical(W: torch.Tensor, b: torch.Tensor, binary: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Free variables -> the (D, K), (K,) parameters `fit_logistic` reports."""
    if binary:
        return torch.cat([torch.zeros_like(W), W], dim=1), torch.cat([torch.zeros_like(b), b])
    # The loss is invariant to adding a constant to every intercept; pin the one sklearn reports.
    return W, b - b.mean()


def _lbfgs(
    evaluate,
    theta: torch.Tensor,
    loss: float,
    grad: torch.Tensor,
    *,
    tol: float,
    max_iter: int,
    precondition,
    history: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    memory: int = 50,
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], int, int, str]:
    """Minimise with L-BFGS from theta (loss, grad = evaluate(theta) already taken); -> theta, grad, pairs,
    evaluations, iterations, why it stopped.

    The iteration is `torch.optim.LBFGS(history_size=memory, line_search_fn="strong_wolfe",
    tolerance_change=0)`'s, with the same line search (see `_line_search` for the one exception, steps whose
    predicted decrease is below the loss's rounding) and stopping rules (max |grad| <= tol, `max_iter`
    iterations, 1.25 · max_iter evaluations, a step that cannot move), written out for what that optimizer
    cannot do: start from curvature pairs (`history`) of an earlier fit, and scale the initial inverse Hessian
    by a preconditioner instead of the identity (`precondition`: (..., P) -> (..., P) rows times P, with P
    symmetric positive definite; the initial matrix is then γP, γ = sᵀy / yᵀPy of the newest pair).

    The direction comes from the compact form of the L-BFGS inverse Hessian (Byrd, Nocedal & Schnabel 1994,
    eq. 2.6) rather than the two-loop recursion: the same matrix, but a handful of matrix products over the
    stored pairs instead of 4 · memory vector operations, each dispatched from Python (with 100 pairs these
    took ~2 ms per iteration, a quarter of an evaluation at 8000 × 768 × 10). What remains is reading the
    stored pairs about seven times per iteration, so `memory` is 50 rather than torch's 100: over the
    benchmark's grid on three data seeds that took 222/241/206 loss evaluations against 232/248/200 with 100
    pairs (and 238/269/230 with 30), in less time.
    """
    size, dtype = theta.shape[0], theta.dtype
    # Pairs live in rows [first, last) of buffers twice the memory, oldest first, so every product below takes
    # contiguous slices; when the buffers fill up, the newest memory - 1 rows move to the front (one copy per
    # memory iterations) instead of the order being restored by index on every iteration.
    steps = theta.new_empty(2 * memory, size)  # s
    changes = theta.new_empty(2 * memory, size)  # y
    preconditioned = theta.new_empty(2 * memory, size)  # P y
    sy = torch.zeros(2 * memory, 2 * memory, dtype=torch.float64, device=theta.device)  # sy[i, j] = s_i · y_j
    ypy = torch.zeros_like(sy)  # y_i · P y_j
    first = last = 0

    def add_pair(s: torch.Tensor, y: torch.Tensor, py: torch.Tensor) -> None:
        nonlocal first, last
        if last == 2 * memory:
            keep = slice(last - memory + 1, last)
            for buffer in (steps, changes, preconditioned):
                buffer[: memory - 1] = buffer[keep].clone()
            for gram in (sy, ypy):
                gram[: memory - 1, : memory - 1] = gram[keep, keep].clone()
            first, last = 0, memory - 1
        steps[last], changes[last], preconditioned[last] = s, y, py
        window = slice(first, last + 1)
        sy[last, window] = (changes[window] @ s).double()
        sy[window, last] = (steps[window] @ y).double()
        ypy[last, window] = ypy[window, last] = (preconditioned[window] @ y).double()
        last += 1
        first = max(first, last - memory)

    if history:  # loaded at once: three products instead of one round of add_pair per pair
        last = len(history)
        steps[:last], changes[:last] = torch.stack([s for s, _ in history]), torch.stack([y for _, y in history])
        preconditioned[:last] = precondition(changes[:last])
        sy[:last, :last] = (steps[:last] @ changes[:last].T).double()
        ypy[:last, :last] = (changes[:last] @ preconditioned[:last].T).double()

    def direction_for(g: torch.Tensor, pg: torch.Tensor) -> torch.Tensor:
        """-H g, given pg = P g."""
        if last == first:
            return pg.neg()
        window = slice(first, last)
        S, PY, SY = steps[window], preconditioned[window], sy[window, window]
        gamma = SY[-1, -1] / ypy[last - 1, last - 1]
        a, b = (S @ g).double(), (PY @ g).double().mul_(gamma)
        R, middle = SY.triu(), ypy[window, window] * gamma + torch.diag(SY.diagonal())
        r_a = torch.linalg.solve_triangular(R, a[:, None], upper=True)
        p1 = torch.linalg.solve_triangular(R.T, middle @ r_a - b[:, None], upper=False)
        hg = (pg * gamma.to(dtype)).addmv_(S.T, p1[:, 0].to(dtype)).addmv_(PY.T, r_a[:, 0].to(dtype), alpha=-gamma)
        return hg.neg_()

    max_evaluations = max_iter * 5 // 4
    evaluations, iterations, stop = 1, 0, "tolerance"
    pg = precondition(grad[None])[0]
    while grad.abs().max() > tol:
        if iterations >= max_iter or evaluations >= max_evaluations:
            stop = "max_iter" if iterations >= max_iter else "max_evaluations"
            break
        direction = direction_for(grad, pg)
        slope = grad.dot(direction)
        if slope > 0:
            stop = "no_progress"
            break
        t = 1.0 if last > first else min(1.0, 1.0 / direction.abs().sum().item())
        new_loss, new_grad, t, used = _line_search(evaluate, theta, t, direction, loss, grad, slope,
                                                   max_evaluations - evaluations)
        evaluations += used
        iterations += 1
        step = direction.mul_(t)
        change = new_grad - grad
        new_pg = precondition(new_grad[None])[0]
        if change.dot(step) > 1e-10:
            # P is linear and fixed within a fit, so P y = P g_new - P g, and P g_new is needed next anyway.
            add_pair(step, change, new_pg - pg)
        theta, loss, grad, pg = theta + step, new_loss, new_grad, new_pg
        if step.abs().max() <= 0:
            stop = "no_progress" if grad.abs().max() > tol else "tolerance"
            break
    pairs = [(steps[i].clone(), changes[i].clone()) for i in range(first, last)]
    return theta, grad, pairs, evaluations, iterations, stop


def _line_search(
    evaluate, theta: torch.Tensor, t: float, direction: torch.Tensor, loss: float, grad: torch.Tensor,
    slope: torch.Tensor, budget: int,
) -> tuple[float, torch.Tensor, float, int]:
    """torch's strong-Wolfe line search, except where the decrease it asks for is below the loss's rounding.

    When |t · slope| is under one unit of rounding of the loss in the parameters' dtype, the sufficient-decrease
    test compares rounding noise (float32 logits resolve a loss of ~2 to ~1e-9, and near the optimum the
    predicted decrease is smaller), and the search zooms for nothing: 6-7 evaluations for one step at C = 0.01
    on the benchmark. There the first trial step is accepted on Hager & Zhang's (2005) approximate Wolfe
    conditions instead -- the loss may not rise by more than that rounding, and the slope along the line must
    have risen to within [0.9 · slope, -0.8 · slope] -- which test the gradient, still accurate there. Otherwise
    that first evaluation is handed to torch's search, so nothing is evaluated twice.
    -> (loss, grad, step length, evaluations).
    """
    first = None
    rounding = torch.finfo(theta.dtype).eps * abs(loss)
    if abs(t * float(slope)) <= rounding:
        first = evaluate(theta + t * direction)
        new_slope = float(first[1].dot(direction))
        if first[0] <= loss + rounding and 0.9 * float(slope) <= new_slope <= -0.8 * float(slope):
            return first[0], first[1], t, 1

    def along(start: torch.Tensor, step: float, d: torch.Tensor) -> tuple[float, torch.Tensor]:
        nonlocal first
        if first is not None and step == t:
            cached, first = first, None
            return cached
        return evaluate(start + step * d)

    return _strong_wolfe(along, theta, t, direction, loss, grad, slope, max_ls=budget)


def _shift_history(
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
class _Moments:
    """The features' second-moment matrix as `_class_preconditioner` takes it: values (r,) along the columns
    of basis (D, r) plus `bulk` times the projector on the rest, or, with basis None, the diagonal values (D,)."""

    values: torch.Tensor
    basis: torch.Tensor | None = None
    bulk: float = 0.0

    def to(self, dtype: torch.dtype) -> _Moments:
        return _Moments(self.values.to(dtype), None if self.basis is None else self.basis.to(dtype), self.bulk)


def _refit_history(
    history: list[tuple[torch.Tensor, torch.Tensor]], ratio: torch.Tensor, shift: torch.Tensor, C: float,
    n_fit: int, n_all: int,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Curvature pairs of the fit on the fitting part -> approximate pairs for the refit on all of train.

    The refit's variables are the fit's under the change of standardisation θ' = Tθ, Wᵀ' = Wᵀ diag(ratio),
    b' = b + Wᵀ shift (the start of the refit), so a step maps to Ts and a gradient change to T⁻ᵀy, which keeps
    sᵀy; the penalty's part of y is exchanged for the refit's exactly, and the cross-entropy's part is the
    fitting part's curvature standing in for all of train's. On the quickstart's DINOv2 features the refit
    took 58 loss evaluations from the transformed start alone, 50 with these pairs. Pairs that lose positive
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


def _class_preconditioner(A: torch.Tensor, moments: _Moments, penalty: float):
    """v -> P v (rows of v) with P ≈ the inverse Hessian of the objective; A: (F, F) mean softmax curvature at
    the start.

    The weight block of the Hessian, mean_n (diag p_n - p_n p_nᵀ) ⊗ x_n x_nᵀ + penalty · I, is approximated by
    A ⊗ M + penalty · I with M the features' second-moment matrix (`_Moments`: its diagonal, or a low-rank
    eigenbasis plus a bulk level) -- the softmax curvature and the features taken as independent -- whose
    inverse is cheap in the eigenbases of A and M; the intercept block by A (plus a multiple of 11ᵀ on the one
    direction the softmax cannot see). It only shapes L-BFGS's first guess of the inverse Hessian, so the
    optimum is unchanged. With the diagonal alone it saves about an eighth of the loss evaluations over the
    default grid on 8000 × 768 isotropic features; `_feature_moments` says what the eigenbasis adds.
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


def _feature_moments(x: torch.Tensor, *, max_rows: int = 2048, max_dim: int = 1024) -> _Moments:
    """The features' second-moment matrix xᵀx / N for `_class_preconditioner`, from at most `max_rows` evenly
    spaced rows: the eigenvectors whose eigenvalues lie outside the Marchenko-Pastur band of isotropic noise,
    and one level for the rest; just the diagonal when D > max_dim.

    Standardised backbone features are strongly correlated, and L-BFGS spends most of its iterations on the
    directions the correlations squeeze; the eigenbasis lets the preconditioner undo them. On the quickstart's
    DINOv2 features (1078 × 384) the grid at tol 1e-6 takes 211 loss evaluations instead of 431 with the
    diagonal. Sample eigenvalues of isotropic features still spread over the band σ²(1 ± sqrt(D / rows))²;
    taken at face value they precondition noise (8000 × 768 isotropic features: 238 → 282 evaluations), so
    the ones inside it are replaced by their mean (233). A preconditioner needs only the shape of the
    Hessian, so a subsample of rows is enough, and it is computed once per probe. Above `max_dim` the dense
    eigendecomposition (~0.15 s at D = 1024 on one core) stops paying for itself.
    """
    n, d = x.shape
    if d > max_dim:
        return _Moments(torch.linalg.vector_norm(x, dim=0) ** 2 / n)
    rows = x[:: max(1, n // max_rows)]
    eigenvalues, eigenvectors = torch.linalg.eigh(rows.T @ rows / rows.shape[0])
    eigenvalues = eigenvalues.clamp_min(0)
    ratio, level = d / rows.shape[0], eigenvalues.mean()
    inside = (eigenvalues >= level * (1 - ratio**0.5) ** 2) & (eigenvalues <= level * (1 + ratio**0.5) ** 2)
    bulk = eigenvalues[inside].mean().item() if inside.any() else 0.0
    return _Moments(eigenvalues[~inside], eigenvectors[:, ~inside], bulk)


def _one_hot(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """y: (N,) class indices -> (K, N) float64 one-hot targets, the layout `_loss_and_grad` takes."""
    return F.one_hot(y.long(), num_classes).T.to(torch.float64, memory_format=torch.contiguous_format)


@torch.no_grad()
def _loss_and_grad(
    x: torch.Tensor,
    targets: torch.Tensor,
    Wt: torch.Tensor,
    b: torch.Tensor,
    C: float,
    binary: bool,
    *,
    curvature: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Mean cross-entropy + ‖W‖² / (2 C N) and its gradient; x: (N, D), targets: (K, N) one-hot (`_one_hot`),
    Wt: (F, D), b: (F,) -> (float64 loss, (F, D) grad of Wt, (F,) grad of b, A), with F = K, or 1 for K = 2
    (class 0 fixed at 0). With `curvature`, A is the (F, F) float64 mean softmax Hessian in the logits,
    mean_n diag(p_n) - p_n p_nᵀ (for `_class_preconditioner`), otherwise None. The products run in Wt's
    dtype; row blocks of x in another dtype are converted as they are read.

    Written out rather than left to autograd: it reads x once per product with no saved activations, and
    takes the softmax, the loss and its sum in float64. In float32 the loss is resolved only to ~1e-7 of its
    value, so L-BFGS's line search stalls before sklearn's gradient test (max |grad| ≤ tol) is met -- at
    max |grad| ~2e-5 for C = 1e-4 on 8000 × 768 features -- and burns evaluations there; the (K, N) logits are
    small, so float64 there costs nothing measurable. Targets are one-hot rather than indices: a product with
    them is two plain element-wise operations per block, where indexing by (label, row) pairs took ~1 ms per
    evaluation at 8000 × 10.
    """
    n = x.shape[0]
    # Row blocks of ~4 MiB: the block is still in cache for the second product (gᵀx), so x is read from memory
    # once per evaluation instead of twice (6.8 against 9.2 ms for the whole evaluation at 8000 × 768 × 10 on one
    # core; 1 and 64 MiB blocks take 8.9 and 9.2 ms). On a GPU one block holds everything.
    step = n if x.is_cuda else max(256, 2**22 // max(1, x.shape[1] * x.element_size()))
    log_likelihood = torch.zeros((), dtype=torch.float64, device=x.device)
    grad_w = Wt / (C * n)
    grad_b = torch.zeros_like(b)
    A = torch.zeros(targets.shape[0], targets.shape[0], dtype=torch.float64, device=x.device)
    for start in range(0, n, step):
        block, target = x[start : start + step], targets[:, start : start + step]
        block = block.to(Wt.dtype)  # a float64 finish of float32 features (see _fit); otherwise a no-op
        z = torch.addmm(b[:, None], Wt, block.T)
        if binary:
            z = torch.cat([torch.zeros_like(z), z])
        log_p = z.log_softmax(dim=0, dtype=torch.float64)
        log_likelihood += (log_p * target).sum()
        p = log_p.exp_()
        if curvature:
            A += torch.diag(p.sum(dim=1)) - p @ p.T
        g = p.sub_(target)
        g = (g[1:] if binary else g).to(Wt.dtype)
        grad_w.addmm_(g, block, alpha=1 / n)
        grad_b.add_(g.sum(dim=1), alpha=1 / n)
    penalty = torch.linalg.vector_norm(Wt, dtype=torch.float64) ** 2 / (2 * C * n)
    loss = penalty - log_likelihood / n
    return loss, grad_w, grad_b, ((A[1:, 1:] if binary else A) / n if curvature else None)


def _standardizer(x: torch.Tensor, enabled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x: (N, D) -> (mean (D,), scale (D,)) such that (x - mean) / scale has zero mean and unit variance."""
    if not enabled:
        return torch.zeros_like(x[0]), torch.ones_like(x[0])
    std, mean = torch.std_mean(x, dim=0, correction=0)
    # A constant feature's computed std is rounding noise of order eps·|mean|; dividing by it would blow
    # that noise up to unit variance, so such features are only centred (much like sklearn's StandardScaler).
    constant = std <= 10 * torch.finfo(x.dtype).eps * mean.abs().clamp_min(1e-30)
    return mean, torch.where(constant, torch.ones_like(std), std)


def _path_start(
    path: list[tuple[torch.Tensor, torch.Tensor]], grid: Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Warm start for the fit at grid[-1], given the solutions `path` at the C values before it.

    The solution moves smoothly with log C, so the secant through the last two solutions, extended to the new
    log C, starts closer than the last solution alone: on 8000 × 768 features, 269 instead of 345 loss
    evaluations over the 8 C values of the default grid (sklearn starts every C from zero). The problem is
    strictly convex, so the start changes only the work, not the optimum the fit converges to.
    """
    if len(path) < 2:
        return path[-1] if path else None
    (W0, b0), (W1, b1) = path[-2], path[-1]
    c0, c1, c2 = (math.log(c) for c in grid[-3:])
    step = (c2 - c1) / (c1 - c0)
    return W1 + step * (W1 - W0), b1 + step * (b1 - b0)


def _accuracy_count(x: torch.Tensor, y: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> int:
    return int(((x @ W + b).argmax(dim=1) == y).sum())


def linear_probe(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    C_grid: Sequence[float] = tuple(10.0**k for k in range(-4, 4)),
    val_fraction: float = 0.2,
    standardize: bool = True,
    seed: int = 0,
    max_iter: int = 1000,
    tol: float = 1e-6,
    val_features: torch.Tensor | None = None,
    val_labels: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> LinearProbeResult:
    """Linear-probe accuracy with the regularisation strength C chosen on validation data only.

    train_features: (N, D), train_labels: (N,), test_features: (M, D), test_labels: (M,);
    labels are class indices 0..K-1 with K = 1 + the largest training label, and every class must occur
    in training.

    Protocol:
    1. Validation data: a stratified `val_fraction` of train (sklearn `train_test_split`,
       `random_state=seed`), or `val_features`/`val_labels` when given.
    2. For each C in ascending order: standardise with the fitting part's mean/std, fit sklearn's objective to
       `tol` (as `fit_logistic` does, warm-started along the path: see the module docstring), and score
       accuracy on validation. How each fit went is in protocol["fits"].
    3. Choose the C with the best validation accuracy; ties go to the smaller C.
    4. Refit with that C on all of `train_features` (re-standardised on them). Given explicit validation
       data, the step-2 fit already is that model; validation data is never trained on then.
    5. Score once on test. Test data influences nothing before this step.
    """
    _check_split("train", train_features, train_labels)
    _check_split("test", test_features, test_labels)
    if (val_features is None) != (val_labels is None):
        raise ValueError(
            "pass val_features and val_labels together, or neither to split validation off train."
        )
    if val_features is not None:
        _check_split("val", val_features, val_labels)
    for name, feats in (("test", test_features), ("val", val_features)):
        if feats is not None and feats.shape[1] != train_features.shape[1]:
            raise ValueError(
                f"train_features has dimension {train_features.shape[1]} but {name}_features has "
                f"{feats.shape[1]}; all splits must come from the same backbone and pooling."
            )
    grid = sorted(float(c) for c in C_grid)
    if not grid or grid[0] <= 0 or len(set(grid)) != len(grid):
        raise ValueError(f"C_grid must be non-empty, positive and free of duplicates but got {list(C_grid)}.")

    num_classes = int(train_labels.max()) + 1
    counts = torch.bincount(train_labels.cpu().long(), minlength=num_classes)
    if (counts == 0).any():
        missing = (counts == 0).nonzero().flatten().tolist()
        raise ValueError(
            f"classes {missing} have no training samples; remap labels to contiguous indices 0..K-1 "
            "over the classes present in train."
        )
    if num_classes < 2:
        raise ValueError("train_labels hold a single class; a classifier needs at least two.")
    for name, labels in (("test", test_labels), ("val", val_labels)):
        if labels is not None and int(labels.max()) >= num_classes:
            raise ValueError(
                f"{name}_labels contain class {int(labels.max())}, which never occurs in training "
                f"(classes 0..{num_classes - 1}); the probe could never predict it."
            )

    device = torch.device(device) if device is not None else train_features.device
    dtype = _work_dtype(train_features)
    x_all = train_features.to(device, dtype)
    y_all = train_labels.to(device, torch.int64)

    if val_features is None:
        if not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must lie strictly between 0 and 1 but got {val_fraction}.")
        if counts.min() < 2:
            rare = (counts < 2).nonzero().flatten().tolist()
            raise ValueError(
                f"classes {rare} have fewer than 2 training samples, so a stratified validation split cannot "
                "hold them out; drop those classes or pass val_features/val_labels."
            )
        from sklearn.model_selection import train_test_split

        try:
            fit_idx, val_idx = train_test_split(
                torch.arange(len(y_all)).numpy(),
                test_size=val_fraction,
                stratify=train_labels.cpu().numpy(),
                random_state=seed,
            )
        except ValueError as err:
            raise ValueError(
                f"the stratified validation split failed ({err}); adjust val_fraction so both parts can hold "
                f"every one of the {num_classes} classes, or pass val_features/val_labels."
            ) from err
        fit_idx, val_idx = torch.from_numpy(fit_idx).to(device), torch.from_numpy(val_idx).to(device)
        x_fit, y_fit, x_val, y_val = x_all[fit_idx], y_all[fit_idx], x_all[val_idx], y_all[val_idx]
        absent = sorted(set(range(num_classes)) - set(y_fit.unique().tolist()))
        if absent:
            raise ValueError(
                f"after the validation split, classes {absent} have no samples left to fit on; use a smaller "
                "val_fraction or pass val_features/val_labels."
            )
    else:
        x_fit, y_fit = x_all, y_all
        x_val, y_val = val_features.to(device, dtype), val_labels.to(device, torch.int64)

    mean, scale = _standardizer(x_fit, standardize)
    # Rows taken by the split are fresh copies, standardised in place; given tensors are never written to.
    fresh = val_features is None
    x_fit = (x_fit.sub_(mean) if fresh else x_fit - mean).div_(scale)
    x_val = (x_val.sub_(mean) if fresh else x_val - mean).div_(scale)
    binary, size_w = num_classes == 2, x_fit.shape[1] * (1 if num_classes == 2 else num_classes)
    moments = _feature_moments(x_fit)
    val_correct: list[int] = []
    path: list[tuple[torch.Tensor, torch.Tensor]] = []
    fits: list[dict] = []
    history = None
    best = None
    for i, C in enumerate(grid):
        if history:
            history = _shift_history(history, grid[i - 1], C, len(y_fit), size_w)
        W, b, history, fit = _fit(
            x_fit, y_fit, C, *_free_start(_path_start(path, grid[: i + 1]), x_fit, num_classes), binary,
            max_iter=max_iter, tol=tol, history=history, moments=moments,
        )
        params = _canonical(W, b, binary)
        path.append(params)
        fits.append(fit.record())
        val_correct.append(_accuracy_count(x_val, y_val, *params))
        if best is None or val_correct[-1] > val_correct[best[0]]:
            best = (len(val_correct) - 1, params, history)
    best_index, (W, b), best_history = best
    chosen_C = grid[best_index]

    if val_features is None:
        new_mean, new_scale = _standardizer(x_all, standardize)
        # Start the refit from the same logits, in the new standardisation:
        # ((x - m) / s) W + b = ((x - m') / s') (diag(s' / s) W) + b + ((m' - m) / s) W.
        ratio, shift = new_scale / scale, (new_mean - mean) / scale
        W, b = W * ratio[:, None], b + shift @ W
        history = _refit_history(best_history, ratio, shift, chosen_C, len(y_fit), len(y_all))
        mean, scale = new_mean, new_scale
        x_all = torch.sub(x_all, mean).div_(scale)
        W, b, _, fit = _fit(
            x_all, y_all, chosen_C, *_free_start((W, b), x_all, num_classes), binary, max_iter=max_iter, tol=tol,
            moments=moments,  # of the fitting part: close enough to shape a preconditioner
            history=history,
        )
        W, b = _canonical(W, b, binary)
        fits.append(fit.record() | {"refit": True})

    logits = (test_features.to(device, dtype) - mean) / scale @ W + b
    probabilities = torch.softmax(logits, dim=1).float().cpu()
    predictions = logits.argmax(dim=1).cpu()
    val_accuracy = [c / len(y_val) for c in val_correct]
    test_accuracy = (predictions == test_labels.cpu().long()).double().mean().item()
    protocol = {
        "C_grid": grid,
        "chosen_C": chosen_C,
        "val_accuracy": val_accuracy,
        "val_source": "split" if val_features is None else "given",
        "val_fraction": val_fraction if val_features is None else None,
        "standardize": standardize,
        "max_iter": max_iter,
        "tol": tol,
        "seed": seed,
        "dtype": str(dtype).removeprefix("torch."),
        "n_train": len(y_all),
        "n_fit": len(y_fit),
        "n_val": len(y_val),
        "n_test": len(test_labels),
        "n_classes": num_classes,
        "fits": fits,
    }
    metrics = {"linear.acc": test_accuracy, "linear.val_acc": val_accuracy[best_index], "linear.C": chosen_C}
    return LinearProbeResult(
        metrics=metrics, predictions=predictions, probabilities=probabilities, protocol=protocol
    )
