"""augment_r2: headprobe's probe against what a user writes with scikit-learn for the same protocol.

The probe: for each augmentation parameter, ridge regression from a view's representation (features standardised on
the fitting part), its penalty chosen from a 19-value log grid by 5-fold cross-validation grouped by image (pooled
squared error), refitted on all training images and scored by R² on held-out images. The baseline does exactly that
with scikit-learn, parameter by parameter: `GridSearchCV(make_pipeline(StandardScaler(), Ridge()))` over the same
grid, on the same folds (`PredefinedSplit`), selecting by the same pooled error (a `refit` callable) and refitting.
Both must choose the same penalties and give the same R².

Features: a ReLU head's views at the quickstart's scale (450 images × 4 views, 512 units of which a third are dead,
16 parameters linear in a few feature directions plus noise; --quick: 120 images, 64 units).

    python benchmarks/bench_augment_r2.py [--quick]
"""

from __future__ import annotations

import numpy as np
import torch
from _common import Report, interleaved, parse_args

from headprobe.data.augment import PARAM_NAMES
from headprobe.probes.builtin.augment_r2 import AUG_R2_ALPHAS
from headprobe.probes.builtin.augment_r2 import AUGMENT_R2 as augment_r2
from headprobe.probes.tap_data import TapData

FOLDS = 5


def relu_views(n_images: int, views: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(views (n, K, dim) float32, parameters (n, K, P)): a random ReLU layer over correlated 384-d features, the
    later units biased dead; each parameter a random mix of 6 feature directions plus unit noise."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n_images * views, 384)) @ rng.normal(size=(384, 384)) / 20
    x = np.maximum(base @ rng.normal(size=(384, dim)) / 20 - np.linspace(0, 4.5, dim), 0)
    y = base[:, :6] @ rng.normal(size=(6, len(PARAM_NAMES))) + rng.normal(size=(n_images * views, len(PARAM_NAMES)))
    return (torch.tensor(x, dtype=torch.float32).reshape(n_images, views, dim),
            torch.tensor(y).reshape(n_images, views, -1))


def sklearn_augment_r2(views: torch.Tensor, params: torch.Tensor, seed: int = 0, alphas=AUG_R2_ALPHAS
                       ) -> dict[str, tuple[float, float]]:
    """{parameter: (chosen alpha, held-out R²)} by scikit-learn, with the probe's split, folds and selection rule
    (tests/test_bench_augment_r2.py checks the probe against it at a small size)."""
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score
    from sklearn.model_selection import GridSearchCV, PredefinedSplit
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    n, k, d = views.shape
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test = max(1, round(0.25 * n))
    test_idx, train_idx = order[:n_test], order[n_test:]
    x_tr, x_te = views[train_idx].reshape(-1, d).double().numpy(), views[test_idx].reshape(-1, d).double().numpy()
    groups = np.repeat(np.arange(len(train_idx)), k)
    # The probe's folds: a seeded permutation of the training images, dealt round-robin.
    fold_of = dict(zip(np.random.default_rng(seed).permutation(np.arange(len(train_idx))).tolist(),
                       np.arange(len(train_idx)) % FOLDS, strict=True))
    folds = np.array([fold_of[g] for g in groups.tolist()])
    sizes = np.bincount(folds, minlength=FOLDS)
    grid = sorted(alphas)

    def pooled_choice(results: dict) -> int:
        """The largest alpha within rounding of the smallest pooled squared error (the probe's rule)."""
        pooled = -sum(results[f"split{f}_test_score"] * sizes[f] for f in range(FOLDS)) / sizes.sum()
        return int(max(np.flatnonzero(pooled <= pooled.min() * (1 + 1e-12))))

    out = {}
    for j, name in enumerate(PARAM_NAMES):
        y_tr = params[train_idx, :, j].reshape(-1).double().numpy()
        y_te = params[test_idx, :, j].reshape(-1).double().numpy()
        search = GridSearchCV(make_pipeline(StandardScaler(), Ridge()), {"ridge__alpha": grid},
                              scoring="neg_mean_squared_error", cv=PredefinedSplit(folds), refit=pooled_choice)
        search.fit(x_tr, y_tr)
        out[name] = (search.best_params_["ridge__alpha"], float(r2_score(y_te, search.predict(x_te))))
    return out


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    n_images, dim = (120, 64) if args.quick else (450, 512)
    views, params = relu_views(n_images, 4, dim)
    report = Report("augment_r2", args, {"images": n_images, "views": 4, "dim": dim, "params": len(PARAM_NAMES),
                                         "alphas": len(AUG_R2_ALPHAS), "folds": FOLDS})
    empty, labels = torch.zeros(2, dim), torch.zeros(2, dtype=torch.long)
    tap = TapData("relu", empty, labels, empty, labels, 2, views=views, view_params=params)
    augment_r2(tap)  # warm-up: imports, thread pools
    times, results = interleaved({"headprobe": lambda: augment_r2(tap),
                                  "sklearn": lambda: sklearn_augment_r2(views, params)}, args.repeats)
    ours = report.timing("headprobe augment_r2", times["headprobe"])
    theirs = report.timing("sklearn GridSearchCV(StandardScaler + Ridge) per parameter, same folds and rule",
                           times["sklearn"])
    ratio = theirs / ours
    size = f"{n_images} images x 4 views, {dim}-d, {len(PARAM_NAMES)} parameters, {len(AUG_R2_ALPHAS)} alphas"
    report.check(f"augment_r2 ({size})", "sklearn GridSearchCV(StandardScaler + Ridge), same folds and selection",
                 "— (faster than the sklearn formulation)", f"{ratio:.1f}x faster ({ours:.2f} s vs {theirs:.2f} s)",
                 ratio > 1, ratio=ratio)
    probe, reference = results["headprobe"], results["sklearn"]
    same_alpha = [name for name in probe.protocol["params"] if probe.protocol["alpha"][name] == reference[name][0]]
    worst = max(abs(probe.metrics[f"aug_r2.{name}"] - reference[name][1]) for name in probe.protocol["params"])
    report.check("augment_r2 chosen alphas and R²", "sklearn's", "same alphas, R² within 1e-6",
                 f"{len(same_alpha)}/{len(probe.protocol['params'])} alphas equal; largest R² difference {worst:.1e}",
                 len(same_alpha) == len(probe.protocol["params"]) and worst < 1e-6, largest_r2_difference=worst)
    report.finish()


if __name__ == "__main__":
    main()
