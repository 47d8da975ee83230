"""Multinomial L2-regularised logistic-regression probe on frozen features.

The solver is written in torch rather than calling sklearn: it runs full-batch on the features' device
(a GPU when there is one) in float32, and warm-starts each C from the previous one along the grid instead
of restarting from zero as sklearn does per C. It still minimises exactly sklearn's
`LogisticRegression(solver="lbfgs")` objective, so its numbers can be checked against sklearn's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

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

    dtype = _work_dtype(x)
    x = x.to(dtype)
    y = y.to(x.device, torch.int64)
    n, d = x.shape
    binary = num_classes == 2
    free_classes = 1 if binary else num_classes
    if init is None:
        W = torch.zeros(d, free_classes, dtype=dtype, device=x.device)
        b = torch.zeros(free_classes, dtype=dtype, device=x.device)
    else:
        W0, b0 = (t.to(x.device, dtype) for t in init)
        if W0.shape != (d, num_classes) or b0.shape != (num_classes,):
            raise ValueError(
                f"init must be (W: ({d}, {num_classes}), b: ({num_classes},)) but got "
                f"W {tuple(W0.shape)}, b {tuple(b0.shape)}."
            )
        # The softmax only sees logit differences, so class 0's column is folded into the binary weights.
        W, b = (W0[:, 1:] - W0[:, :1], b0[1:] - b0[:1]) if binary else (W0.clone(), b0.clone())
    # The solver's variable is Wᵀ, (K, D): the logits are then formed as Wᵀxᵀ, (K, N), and the weight gradient
    # as gᵀx, the two products CPU BLAS runs fastest for a handful of classes (3.9 and 3.4 ms at 8000 × 768 × 10,
    # against 6.3 and 20 ms for x W and xᵀg). L-BFGS only takes dot products of the flattened variables, so the
    # layout does not change the iterates.
    Wt = W.T.contiguous()
    rows = torch.arange(n, device=x.device)
    optimizer = torch.optim.LBFGS(
        [Wt, b],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=tol,
        # torch's loss-change and step-size stops use an absolute threshold that would halt far from the optimum
        # once the loss is small (large C). Without them the fit ends on sklearn's gradient test, on a line
        # search that can no longer move, or at the evaluation cap (1.25 · max_iter).
        tolerance_change=0.0,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        loss, Wt.grad, b.grad = _loss_and_grad(x, y, rows, Wt, b, C, binary)
        return loss

    optimizer.step(closure)
    W = Wt.T.contiguous()
    if binary:
        return torch.cat([torch.zeros_like(W), W], dim=1), torch.cat([torch.zeros_like(b), b])
    # The loss is invariant to adding a constant to every intercept; pin the one sklearn reports.
    return W, b - b.mean()


@torch.no_grad()
def _loss_and_grad(
    x: torch.Tensor,
    y: torch.Tensor,
    rows: torch.Tensor,
    Wt: torch.Tensor,
    b: torch.Tensor,
    C: float,
    binary: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean cross-entropy + ‖W‖² / (2 C N) and its gradient; x: (N, D), y: (N,), rows: arange(N), Wt: (F, D),
    b: (F,) -> (float64 loss, (F, D) grad of Wt, (F,) grad of b), with F = K, or 1 for K = 2 (class 0 fixed at 0).

    Written out rather than left to autograd: it reads x once per product with no saved activations, and
    takes the softmax, the loss and its sum in float64. In float32 the loss is resolved only to ~1e-7 of its
    value, so L-BFGS's line search stalls before sklearn's gradient test (max |grad| ≤ tol) is met -- at
    max |grad| ~2e-5 for C = 1e-4 on 8000 × 768 features -- and burns evaluations there; the (K, N) logits are
    small, so float64 there costs nothing measurable.
    """
    n = x.shape[0]
    # Row blocks of ~4 MiB: the block is still in cache for the second product (gᵀx), so x is read from memory
    # once per evaluation instead of twice (6.8 against 9.2 ms for the whole evaluation at 8000 × 768 × 10 on one
    # core; 1 and 64 MiB blocks take 8.9 and 9.2 ms). On a GPU one block holds everything.
    step = n if x.is_cuda else max(256, 2**22 // max(1, x.shape[1] * x.element_size()))
    loss = Wt.double().pow(2).sum() / (2 * C * n)
    grad_w = Wt / (C * n)
    grad_b = torch.zeros_like(b)
    for start in range(0, n, step):
        block, labels, index = x[start : start + step], y[start : start + step], rows[: min(step, n - start)]
        z = torch.addmm(b[:, None], Wt, block.T).double()
        if binary:
            z = torch.cat([torch.zeros_like(z), z])
        log_p = z.log_softmax(dim=0)
        loss = loss - log_p[labels, index].sum() / n
        g = log_p.exp_()
        g[labels, index] -= 1
        g = (g[1:] if binary else g).div_(n).to(x.dtype)
        grad_w.addmm_(g, block)
        grad_b += g.sum(dim=1)
    return loss, grad_w, grad_b


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
    2. For each C in ascending order: standardise with the fitting part's mean/std, fit `fit_logistic`
       (warm-started from the previous C), and score accuracy on validation.
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
    x_fit, x_val = (x_fit - mean) / scale, (x_val - mean) / scale
    val_correct: list[int] = []
    path: list[tuple[torch.Tensor, torch.Tensor]] = []
    best = None
    for i, C in enumerate(grid):
        params = fit_logistic(
            x_fit, y_fit, C, num_classes, max_iter=max_iter, tol=tol, init=_path_start(path, grid[: i + 1])
        )
        path.append(params)
        val_correct.append(_accuracy_count(x_val, y_val, *params))
        if best is None or val_correct[-1] > val_correct[best[0]]:
            best = (len(val_correct) - 1, params)
    best_index, (W, b) = best
    chosen_C = grid[best_index]

    if val_features is None:
        mean, scale = _standardizer(x_all, standardize)
        x_all = (x_all - mean) / scale
        W, b = fit_logistic(x_all, y_all, chosen_C, num_classes, max_iter=max_iter, tol=tol, init=(W, b))

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
    }
    metrics = {"linear.acc": test_accuracy, "linear.val_acc": val_accuracy[best_index], "linear.C": chosen_C}
    return LinearProbeResult(
        metrics=metrics, predictions=predictions, probabilities=probabilities, protocol=protocol
    )
