"""Multinomial L2-regularised logistic-regression probe on frozen features.

The solver is written in torch rather than calling sklearn: it runs full-batch on the features' device
(a GPU when there is one) in float32, and walks the C grid as one regularisation path instead of
restarting from zero per C as sklearn does. Each fit starts from the secant through the previous two
solutions, keeps the previous fit's L-BFGS curvature pairs (exactly corrected for the new C), and is
preconditioned in class space. It still minimises exactly sklearn's `LogisticRegression(solver="lbfgs")`
objective, to sklearn's stopping rule, so its numbers can be checked against sklearn's. The objective and one
fit are in `headprobe.probes.logistic`, the L-BFGS iteration in `headprobe.probes.lbfgs`; this module is the
protocol (validation split, C path, refit, test). Measured (`benchmarks/results/linear.json`, 8 C values, N = 10,000,
D = 768, 10 classes): 3.19x scikit-learn warm-started along the grid and 5.41x restarted at every C, the same C and
test accuracy (67.75 vs 67.75; that benchmark runs the standardised probe, `whiten=False`).

By default the features are whitened on the train rows' support first (`headprobe.probes.whitening`), so that a
lossless linear map of the features cannot move the answer: per-coordinate standardisation followed by an L2
penalty is not invariant to maps that mix coordinates. On the quickstart's split of the digits (1,347 / 450), five
draws each of a random orthogonal, invertible (I + G/√D) and injective (into 2,048-d) map changed 2 to 17 of the
standardised probe's test predictions (its correct count by −7 to +2 on the 64 raw pixels, −7 to 0 on DINOv2
ViT-S/14 features) and often its C; the whitened probe's changed at most one prediction and never its correct
count or C (tests/test_linear_invariance.py). The price: every direction of the features' support counts alike,
however little it varies, so the whitened probe reads somewhat lower where low-variance directions are noise
(0.960 against 0.971 on the pixels, 0.973 against 0.982 on the DINOv2 features), and more so as D approaches N
(`headprobe.probes.whitening`). `whiten=False` is the standardised probe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headprobe.checks import as_tensor
from headprobe.probes import row_blocks
from headprobe.probes.logistic import (
    canonical_parameters,
    feature_moments,
    fit_free_parameters,
    fit_logistic,
    free_parameters,
    refit_curvature_pairs,
    shift_curvature_pairs,
    solver_dtype,
)
from headprobe.probes.logistic_blocks import predict, standardizer, validation_scores
from headprobe.probes.row_blocks import Rows, check_labelled_rows
from headprobe.probes.whitening import whiten as whiten_features
from headprobe.probes.whitening import whitening_of_rows

# fit_logistic: also importable from here
__all__ = ["LinearProbeResult", "fit_logistic", "grouped_validation_split", "linear_probe"]


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


def grouped_validation_split(groups: torch.Tensor, val_fraction: float, seed: int):
    """(fit indices, validation indices) as int64 NumPy arrays over the rows of `groups` (N,): a random
    round(val_fraction · G) of the G distinct groups (at least 1, at most G − 1, drawn with `seed`) goes to
    validation with all its rows, the rest to fitting. Rows of one group never land on both sides."""
    import numpy as np

    labels = torch.as_tensor(groups).cpu().numpy()
    if labels.ndim != 1:
        raise ValueError(f"groups must be 1-D (one group per training row), got shape {labels.shape}.")
    unique = np.unique(labels)
    if len(unique) < 2:
        raise ValueError(f"groups hold {len(unique)} distinct value(s); a grouped validation split needs at "
                         "least 2 groups (e.g. 2 source images).")
    n_val = min(len(unique) - 1, max(1, round(val_fraction * len(unique))))
    held_out = np.random.default_rng(seed).permutation(unique)[:n_val]
    is_val = np.isin(labels, held_out)
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


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
    groups: torch.Tensor | None = None,
    whiten: bool = True,
    block_rows: int | None = None,
) -> LinearProbeResult:
    """Linear-probe accuracy with the regularisation strength C chosen on validation data only.

    train_features: (N, D), train_labels: (N,), test_features: (M, D), test_labels: (M,);
    labels are class indices 0..K-1 with K = 1 + the largest training label, and every class must occur
    in training.

    Protocol:
    0. With `whiten` (the default): map every split by the whitening of all of `train_features`
       (`headprobe.probes.whitening`: centred on the train mean, identity covariance on the train rows' support,
       float64, no labels), fitted once before the validation split. An L2 penalty with an unpenalised intercept
       is rotation-invariant in those coordinates, so no invertible linear map of the features changes the
       answer beyond rounding, nor any map injective on the train rows' span for rows inside it; validation rows
       are train rows, so the choice of C is invariant too (but uninformed at rank N − 1, fewer images than
       dimensions: see `headprobe.probes.whitening`). `standardize` is then moot (standardising is one such
       map). protocol["whiten"] records the rank kept, the tolerance, N and D.
    1. Validation data: a stratified `val_fraction` of train (sklearn `train_test_split`,
       `random_state=seed`), or `val_features`/`val_labels` when given. With `groups` (N,) (e.g. the source
       image of each row, when rows are rotated copies of one image) the split is by group instead
       (`grouped_validation_split`): no group has rows on both sides, so C is not chosen on near-copies of
       fitted rows.
    2. For each C in ascending order: without `whiten`, standardise with the fitting part's mean/std (with
       `standardize`); fit sklearn's objective to
       `tol` (as `fit_logistic` does, warm-started along the path: see the module docstring), and score
       accuracy on validation. How each fit went is in protocol["fits"].
    3. Choose the C with the best validation accuracy; ties go to the smaller C. (The validation cross-entropy of
       every C is recorded too, protocol["val_log_loss"], for a caller that wants the best-calibrated C.)
    4. Refit with that C on all of `train_features` (re-standardised on them without `whiten`). Given explicit
       validation data, the step-2 fit already is that model; validation data is never trained on then.
    5. Score once on test. Test data influences nothing before this step.

    Features are read in blocks of at most `block_rows` rows (default `row_blocks.BLOCK_ROWS`, read at the call):
    when every split fits in one block (by default: has at most `row_blocks.WHOLE_ROWS` rows), as a whole matrix
    with a whitened copy (earlier versions' numbers, bit for bit); otherwise each fit, score and whitening reads its
    rows block by block (`x[i:j]` or `x[index]`) and never holds more than a block of them, whitening by folding the
    map into the weights (float64 products), so the numbers agree with the whole computation to rounding. Features
    may be tensors (also memory-mapped float16 ones), NumPy arrays or row sources with `len`, `.shape`, `.dtype` and
    such row indexing.
    """
    whole_rows = row_blocks.WHOLE_ROWS if block_rows is None else int(block_rows)
    block_rows = row_blocks.BLOCK_ROWS if block_rows is None else int(block_rows)
    if block_rows < 1:
        raise ValueError(f"block_rows must be positive but got {block_rows}.")
    train_features, train_labels, test_features, test_labels, val_features, val_labels = (
        value if hasattr(value, "shape") and not isinstance(value, torch.Tensor) and name.endswith("features")
        and not hasattr(value, "__array__") else as_tensor(name, value) for name, value in (
            ("train_features", train_features), ("train_labels", train_labels), ("test_features", test_features),
            ("test_labels", test_labels), ("val_features", val_features), ("val_labels", val_labels))
    )
    check_labelled_rows("train", train_features, train_labels, block_rows)
    check_labelled_rows("test", test_features, test_labels, block_rows)
    if (val_features is None) != (val_labels is None):
        raise ValueError(
            "pass val_features and val_labels together, or neither to split validation off train."
        )
    if val_features is not None:
        check_labelled_rows("val", val_features, val_labels, block_rows)
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

    device = torch.device(device) if device is not None else getattr(train_features, "device", torch.device("cpu"))
    dtype = solver_dtype(train_features)
    # Every split whole, as before (a whitened copy; a row source's one block is read as a tensor): up to
    # `row_blocks.WHOLE_ROWS` rows by default, up to `block_rows` when the caller sets it.
    whole = max(len(f) for f in (train_features, val_features, test_features) if f is not None) <= max(
        block_rows, whole_rows)
    if whole:
        train_features, val_features, test_features = (
            f if f is None or isinstance(f, torch.Tensor) else f[0 : len(f)]
            for f in (train_features, val_features, test_features))
    whitening = None
    if whole and whiten:
        # Fitted once on all training rows (no labels), applied to every split; standardising is then moot.
        (x_all, val_features, test_features), whitening = whiten_features(
            train_features.to(device), None if val_features is None else val_features.to(device),
            test_features.to(device), dtype=dtype)
    elif whole:
        x_all = train_features.to(device, dtype)
    all_rows, test_rows, val_rows = (None if f is None else Rows.of(f, device, dtype, block_rows) for f in (
        x_all if whole else train_features, test_features, val_features))
    if whiten and not whole:
        # The map, not the whitened rows: each block is whitened through the weights as it is read.
        fold, whitening = whitening_of_rows(all_rows)
        all_rows, test_rows = all_rows.whitened(fold), test_rows.whitened(fold)
        val_rows = None if val_rows is None else val_rows.whitened(fold)
    standardize = standardize and not whiten
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

        if groups is not None:
            if len(groups) != len(y_all):
                raise ValueError(f"groups has {len(groups)} entries for {len(y_all)} training rows; give one "
                                 "group (source image) per row.")
            fit_idx, val_idx = grouped_validation_split(groups, val_fraction, seed)
        else:
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
        fit_idx, val_idx = torch.from_numpy(fit_idx), torch.from_numpy(val_idx)
        if whole:
            fit_idx, val_idx = fit_idx.to(device), val_idx.to(device)
            x_fit, x_val = x_all[fit_idx], x_all[val_idx]
        else:  # in the tap's order, so blocks of a memory-mapped tap are read front to back
            fit_idx, val_idx = fit_idx.sort().values, val_idx.sort().values
            fit_rows, val_rows = all_rows.take(fit_idx), all_rows.take(val_idx)
        y_fit, y_val = y_all[fit_idx.to(device)], y_all[val_idx.to(device)]
        absent = sorted(set(range(num_classes)) - set(y_fit.unique().tolist()))
        if absent:
            raise ValueError(
                f"after the validation split, classes {absent} have no samples left to fit on; use a smaller "
                "val_fraction or pass val_features/val_labels."
            )
    else:
        fit_rows, y_fit, y_val = all_rows, y_all, val_labels.to(device, torch.int64)
        if whole:
            x_fit, x_val = x_all, val_features.to(device, dtype)

    if whole:
        mean, scale = standardizer(Rows.of(x_fit, block_rows=block_rows), standardize)
        # Rows taken by the split are fresh copies, standardised in place; given tensors are never written to.
        fresh = val_features is None
        x_fit = (x_fit.sub_(mean) if fresh else x_fit - mean).div_(scale)
        x_val = (x_val.sub_(mean) if fresh else x_val - mean).div_(scale)
        fit_rows, val_rows = Rows.of(x_fit, block_rows=block_rows), Rows.of(x_val, block_rows=block_rows)
    else:
        mean, scale = standardizer(fit_rows, standardize)
        if standardize:
            fit_rows, val_rows = fit_rows.standardized(mean, scale), val_rows.standardized(mean, scale)
    binary, size_w = num_classes == 2, fit_rows.dim * (1 if num_classes == 2 else num_classes)
    moments = feature_moments(fit_rows)
    val_correct: list[int] = []
    val_log_loss: list[float] = []
    path: list[tuple[torch.Tensor, torch.Tensor]] = []
    fits: list[dict] = []
    history = None
    best = None
    for i, C in enumerate(grid):
        if history:
            history = shift_curvature_pairs(history, grid[i - 1], C, len(y_fit), size_w)
        W, b, history, fit = fit_free_parameters(
            fit_rows, y_fit, C, *free_parameters(_path_start(path, grid[: i + 1]), fit_rows, num_classes), binary,
            max_iter=max_iter, tol=tol, history=history, moments=moments,
        )
        params = canonical_parameters(W, b, binary)
        path.append(params)
        fits.append(fit.record())
        correct, log_loss = validation_scores(val_rows, y_val, *params)
        val_correct.append(correct)
        val_log_loss.append(log_loss)
        if best is None or val_correct[-1] > val_correct[best[0]]:
            best = (len(val_correct) - 1, params, history)
    best_index, (W, b), best_history = best
    chosen_C = grid[best_index]

    if val_features is None:
        n_fit = len(y_fit)
        if whole:
            # The split's copies are done with: free them before the refit's standardised copy of every row (one
            # copy of the tap less at the peak: 1M x 768 float32 is 3 GiB).
            del x_fit, x_val
        fit_rows = val_rows = None
        new_mean, new_scale = standardizer(Rows.of(x_all, block_rows=block_rows) if whole else all_rows, standardize)
        # Start the refit from the same logits, in the new standardisation:
        # ((x - m) / s) W + b = ((x - m') / s') (diag(s' / s) W) + b + ((m' - m) / s) W.
        ratio, shift = new_scale / scale, (new_mean - mean) / scale
        W, b = W * ratio[:, None], b + shift @ W
        history = refit_curvature_pairs(best_history, ratio, shift, chosen_C, n_fit, len(y_all))
        mean, scale = new_mean, new_scale
        if whole:
            # Whitened rows are this function's own copy (standardised in place); given rows are never written to.
            x_all = (x_all.sub_(mean) if whiten else torch.sub(x_all, mean)).div_(scale)
            all_rows = Rows.of(x_all, block_rows=block_rows)
        elif standardize:
            all_rows = all_rows.standardized(mean, scale)
        W, b, _, fit = fit_free_parameters(
            all_rows, y_all, chosen_C, *free_parameters((W, b), all_rows, num_classes), binary, max_iter=max_iter,
            tol=tol, moments=moments,  # of the fitting part: close enough to shape a preconditioner
            history=history,
        )
        W, b = canonical_parameters(W, b, binary)
        fits.append(fit.record() | {"refit": True})

    predictions, probabilities = predict(test_rows.standardized(mean, scale) if whole or standardize else test_rows,
                                         W, b)
    val_accuracy = [c / len(y_val) for c in val_correct]
    test_accuracy = (predictions == test_labels.cpu().long()).double().mean().item()
    protocol = {
        "C_grid": grid,
        "chosen_C": chosen_C,
        "val_accuracy": val_accuracy,
        "val_log_loss": val_log_loss,
        "val_source": "split" if val_features is None else "given",
        "val_fraction": val_fraction if val_features is None else None,
        "val_split": ("given" if val_features is not None else "grouped by source (no group on both sides)"
                      if groups is not None else "stratified by class"),
        "whiten": whitening,
        "standardize": standardize,
        "block_rows": None if whole else block_rows,
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
