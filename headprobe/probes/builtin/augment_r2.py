"""The augment_r2 probe: how much of each augmentation parameter a tap's view features still carry (ridge R² on
held-out images, the penalty chosen by grouped cross-validation)."""

from __future__ import annotations

from dataclasses import dataclass, field

from headprobe.registry import FRACTION, POSITIVE, at_least

from ..declaration import DESCRIPTION, INFORMATION, WHOLE, Metric, Probe, TrainImages
from ..tap_data import ProbeOutput, TapData, need_views

# Ridge penalties searched by augment_r2 (standardised features): 1e-3 … 1e6, half a decade apart.
AUG_R2_ALPHAS = tuple(float(10.0**e) for e in [x / 2 for x in range(-6, 13)])


def grouped_ridge_cv(x, y, groups, alphas, folds: int, seed: int):
    """Validation mean squared error (len(alphas), T) of ridge (intercept, features standardised on each
    fitting part) under K-fold cross-validation that keeps all rows of a group (an image) in one fold.
    x: (n, d), y: (n, T), groups: (n,) ints. One eigendecomposition of the fitting part's Gram matrix per fold
    serves every alpha and every target, faster than an SVD (`benchmarks/README.md`, "Measurements quoted by the
    modules") and as accurate as sklearn's own ridge solver (it factors the same X^T X + αI), whose relative error
    ~ε·λ_max/α reaches ~1e-8 only at the grid's smallest α on a ReLU tap, 1e-16 at the largest, where near-ties
    between α are decided."""
    import numpy as np

    unique = np.unique(groups)
    fold_of = dict(zip(np.random.default_rng(seed).permutation(unique).tolist(),
                       np.arange(len(unique)) % folds, strict=True))
    fold = np.array([fold_of[g] for g in groups.tolist()])
    sq_err = np.zeros((len(alphas), y.shape[1]))
    for f in range(folds):
        fit, val = fold != f, fold == f
        mean, std = x[fit].mean(0), x[fit].std(0)
        std[std <= 1e-12 * np.maximum(np.abs(mean), 1.0)] = 1.0  # constant features are only centred
        xf, xv = (x[fit] - mean) / std, (x[val] - mean) / std
        y_mean = y[fit].mean(0)
        eigenvalues, v = np.linalg.eigh(xf.T @ xf)
        vty, xvv = v.T @ (xf.T @ (y[fit] - y_mean)), xv @ v
        for i, alpha in enumerate(alphas):
            pred = xvv @ ((1 / (eigenvalues.clip(min=0) + alpha))[:, None] * vty) + y_mean
            sq_err[i] += ((pred - y[val]) ** 2).sum(0)
    return sq_err / len(x)


def ridge_predictions(x_fit, y_fit, x_eval, alphas):
    """Predictions (m, T) at x_eval (m, d) of ridge regressions with intercept fitted on x_fit (n, d), y_fit (n, T),
    target t with penalty alphas[t]: what sklearn's `Ridge(alpha=alphas[t]).fit(x_fit, y_fit[:, t]).predict(x_eval)`
    gives (to rounding), from one SVD of the centred x_fit for every target and penalty. Why not sklearn: it factors
    X^T X + αI once per target, which costs several times this one SVD (`benchmarks/README.md`, "Measurements quoted
    by the modules")."""
    import numpy as np

    mean, y_mean = x_fit.mean(0), y_fit.mean(0)
    u, sv, vt = np.linalg.svd(x_fit - mean, full_matrices=False)
    shrink = sv[:, None] / (sv[:, None] ** 2 + np.asarray(alphas, dtype=float)[None, :])
    return ((x_eval - mean) @ vt.T) @ (shrink * (u.T @ (y_fit - y_mean))) + y_mean


@dataclass
class AugmentR2Spec:
    # Ridge penalties tried per parameter (None: AUG_R2_ALPHAS, 1e-3 … 1e6, half-decade steps).
    alphas: list[float] | None = field(default=None, metadata=POSITIVE)
    # Cross-validation folds on the training images that choose each parameter's penalty (2 at least).
    folds: int = field(default=5, metadata=at_least(2))
    test_fraction: float = field(default=0.25, metadata=FRACTION)


def check_augment_r2(options: AugmentR2Spec, train: TrainImages) -> None:
    if options.alphas is not None and not options.alphas:
        raise ValueError("probes.augment_r2.alphas is empty; give ridge penalties such as [0.1, 1, 10], "
                         "or null for the default grid.")


def measure_augment_r2(tap: TapData, *, alphas: list[float] | None, test_fraction: float, folds: int) -> ProbeOutput:
    """How much of each augmentation parameter a view's representation keeps: ridge regression R² on
    held-out images (split by image, so no image's views are on both sides).

    Features are standardised on the training images (as the linear probe does). Each parameter's ridge
    penalty is chosen from the log grid `alphas` (default `AUG_R2_ALPHAS`) by `folds`-fold cross-validation on
    the training images only, grouped by image; the model is then refitted on all training images with that
    penalty and scored on the held-out images. Parameters that are constant on the training or held-out views
    (R² undefined), or listed in `tap.inert_params`, are skipped with the reason and left out of aug_r2.mean.
    (A fixed alpha = 1, as before, gave R² down to −4 on the quickstart's views.)
    """
    import numpy as np
    import torch
    from sklearn.metrics import r2_score
    from sklearn.preprocessing import StandardScaler

    from headprobe.data.augment import PARAM_NAMES

    views = need_views(tap, "augment_r2").cpu()  # ridge and R² run in NumPy / scikit-learn, on the host
    grid = sorted(float(a) for a in (AUG_R2_ALPHAS if alphas is None else alphas))
    if not grid or min(grid) <= 0:
        raise ValueError(f"augment_r2 alphas must be a non-empty list of positive numbers, got {alphas!r}.")
    n, k, d = views.shape
    order = torch.randperm(n, generator=torch.Generator().manual_seed(tap.seed))
    n_test = max(1, int(round(test_fraction * n)))
    test_idx, train_idx = order[:n_test], order[n_test:]
    folds = min(folds, len(train_idx))
    if folds < 2:
        raise ValueError(f"augment_r2 needs at least 2 training images to choose alpha, got {len(train_idx)}.")
    x_tr = views[train_idx].reshape(-1, d).double().numpy()
    x_te = views[test_idx].reshape(-1, d).double().numpy()
    groups = np.repeat(np.arange(len(train_idx)), k)
    params = tap.view_params.cpu()
    inert = tap.inert_params or {}
    skipped, targets = {}, []
    for j, name in enumerate(PARAM_NAMES):
        y_tr = params[train_idx, :, j].reshape(-1).double().numpy()
        y_te = params[test_idx, :, j].reshape(-1).double().numpy()
        if name in inert:
            skipped[name] = f"cannot change these images: {inert[name]}"
        elif y_tr.std() < 1e-9 and y_te.std() < 1e-9:
            skipped[name] = f"constant ({y_tr[0]:g}) on every view: the augmentation never varies it"
        elif y_tr.std() < 1e-9:
            skipped[name] = "constant on the training images: nothing to regress"
        elif y_te.std() < 1e-9:
            skipped[name] = "constant on the held-out images: R² is undefined"
        else:
            targets.append((name, y_tr, y_te))
    metrics, chosen, edge = {}, {}, []
    if targets:
        y_all = np.stack([t[1] for t in targets], axis=1)
        cv_mse = grouped_ridge_cv(x_tr, y_all, groups, grid, folds, tap.seed)
        scaler = StandardScaler().fit(x_tr)
        xs_tr, xs_te = scaler.transform(x_tr), scaler.transform(x_te)
        for t, (name, *_) in enumerate(targets):
            # The largest penalty among those within rounding of the best error: the simplest model that fits.
            best = max(i for i in range(len(grid)) if cv_mse[i, t] <= cv_mse[:, t].min() * (1 + 1e-12))
            chosen[name] = grid[best]
            if len(grid) > 1 and best in (0, len(grid) - 1):
                edge.append(name)
        pred = ridge_predictions(xs_tr, y_all, xs_te, [chosen[name] for name, *_ in targets])
        for t, (name, _, y_te) in enumerate(targets):
            metrics[f"aug_r2.{name}"] = float(r2_score(y_te, pred[:, t]))
        metrics["aug_r2.mean"] = sum(metrics[f"aug_r2.{name}"] for name, *_ in targets) / len(targets)
    protocol = {"model": "ridge", "standardize": True, "alpha_grid": grid, "alpha": chosen,
                "alpha_selection": f"{folds}-fold CV on the training images only, grouped by image "
                                   "(mean squared error)",
                "alpha_at_grid_edge": edge, "params": [name for name, *_ in targets], "skipped": skipped,
                "mean_over": "params (skipped ones excluded)",
                "n_train_images": len(train_idx), "n_test_images": n_test, "views": k, "split_seed": tap.seed}
    return ProbeOutput(metrics, protocol)


AUGMENT_R2 = Probe(
    "augment_r2", measure_augment_r2,
    "R² of a ridge regression of each augmentation parameter from a view's representation",
    options=AugmentR2Spec, needs=("views",), check=check_augment_r2, cost=4.6, reads=WHOLE,
    reads_why="grouped cross-validated ridge in NumPy: each fold's Gram eigendecomposition and the refit's SVD take "
              "every view at once",
    cost_source="benchmarks/results/probe_costs.json",
    metrics=(
        Metric("aug_r2.mean", "R² of ridge regressions predicting the augmentation parameters of a view, averaged "
               "over parameters", "R² (1 = exact, 0 = the mean's guess)",
               "higher = more augmentation information (less invariance)", 0.0, role=INFORMATION, predicted=-1,
               answers=("Q-aug",), headline=5),
        Metric("aug_r2.{param}", "R² of a ridge regression predicting the augmentation parameter '{param}' of a view",
               "R² (1 = exact, 0 = the mean's guess)",
               "higher = more information about it (less invariance; a description)", 0.0, role=DESCRIPTION,
               shown_with=("Q-aug",)),
    ),
)
