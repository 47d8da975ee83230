"""Linear probe: headprobe `linear_probe` against scikit-learn `LogisticRegression(solver="lbfgs")` over one C grid,
restarted from zero at every C and, the fair baseline, with `warm_start=True` along the grid.

Synthetic features (only the probe is measured): N train, D dims, 10 overlapping Gaussian classes. Both sides run
the same protocol -- a stratified 20 % validation split of train (same seed), standardise on the fitting part,
fit every C of the grid, pick the best validation accuracy (ties to the smaller C), refit on all of train with
that C, score test once -- with the same stopping rule (gradient tolerance 1e-6, at most 1000 iterations).
sklearn restarts every C from zero, or (`warm_start=True`, what a user who knows the trick writes) starts each C
from the previous C's solution and the refit from the chosen C's; headprobe walks the grid as one regularisation
path (warm starts, carried L-BFGS curvature pairs, a class-space preconditioner) to the same stopping rule.

    python benchmarks/bench_linear.py [--quick]
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from _common import Report, device, interleaved, parse_args

CLASSES = 10
C_GRID = tuple(10.0**k for k in range(-4, 4))
TOL, MAX_ITER, VAL_FRACTION, SEED = 1e-6, 1000, 0.2, 0
SPEED_TARGET, WARM_TARGET, ACCURACY_POINTS = 3.0, 3.0, 0.5


def make_data(n: int, m: int, d: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Overlapping Gaussian classes: test accuracy around 0.7, so the choice of C matters."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(CLASSES, d, generator=g)
    y = torch.randint(CLASSES, (n,), generator=g)
    yq = torch.randint(CLASSES, (m,), generator=g)
    scale = 0.08 * (768 / d) ** 0.5  # the same difficulty at every D
    x = scale * centres[y] + torch.randn(n, d, generator=g)
    q = scale * centres[yq] + torch.randn(m, d, generator=g)
    return x, y, q, yq


def headprobe_probe(x: torch.Tensor, y: torch.Tensor, q: torch.Tensor, yq: torch.Tensor) -> dict:
    from headprobe.probes.linear import linear_probe

    out = linear_probe(x, y, q, yq, C_grid=C_GRID, val_fraction=VAL_FRACTION, seed=SEED, max_iter=MAX_ITER,
                       tol=TOL, device=device(), whiten=False)  # the standardised protocol sklearn runs here
    return {"acc": out.metrics["linear.acc"], "C": out.metrics["linear.C"], "val": out.protocol["val_accuracy"],
            "fits": out.protocol["fits"]}


def sklearn_probe(x: torch.Tensor, y: torch.Tensor, q: torch.Tensor, yq: torch.Tensor, warm_start: bool = False
                  ) -> dict:
    """What a user writes with scikit-learn for the same protocol; `warm_start`: one model carried along the grid
    (ascending C), and the refit started from the chosen C's coefficients."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    x, y, q, yq = x.numpy(), y.numpy(), q.numpy(), yq.numpy()
    fit_idx, val_idx = train_test_split(np.arange(len(y)), test_size=VAL_FRACTION, stratify=y, random_state=SEED)
    scaler = StandardScaler().fit(x[fit_idx])
    x_fit, x_val = scaler.transform(x[fit_idx]), scaler.transform(x[val_idx])
    val, unconverged = [], 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        path = LogisticRegression(solver="lbfgs", tol=TOL, max_iter=MAX_ITER, warm_start=True)
        solutions = []
        for c in C_GRID:
            model = path.set_params(C=c) if warm_start else LogisticRegression(C=c, solver="lbfgs", tol=TOL,
                                                                                 max_iter=MAX_ITER)
            model.fit(x_fit, y[fit_idx])
            val.append(model.score(x_val, y[val_idx]))
            solutions.append((model.coef_.copy(), model.intercept_.copy()))
        best = C_GRID[int(np.argmax(val))]  # argmax takes the first, i.e. the smallest C, on ties
        scaler = StandardScaler().fit(x)
        model = LogisticRegression(C=best, solver="lbfgs", tol=TOL, max_iter=MAX_ITER, warm_start=warm_start)
        if warm_start:  # sklearn starts a warm_start fit from the coefficients the model already holds
            model.coef_, model.intercept_ = solutions[int(np.argmax(val))]
        model.fit(scaler.transform(x), y)
        unconverged = sum(issubclass(w.category, ConvergenceWarning) for w in caught)
    return {"acc": float(model.score(scaler.transform(q), yq)), "C": best, "val": val, "unconverged": unconverged}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    n, m, d = (2_000, 500, 64) if args.quick else (10_000, 2_000, 768)
    report = Report("linear", args, {"n_train": n, "n_test": m, "dim": d, "classes": CLASSES, "C_grid": C_GRID,
                                     "tol": TOL, "max_iter": MAX_ITER, "val_fraction": VAL_FRACTION})
    x, y, q, yq = make_data(n, m, d)
    small = make_data(200, 50, 16, seed=1)
    headprobe_probe(*small)  # warm-up: imports, thread pools
    sklearn_probe(*small)
    sklearn_probe(*small, warm_start=True)
    times, results = interleaved({"headprobe": lambda: headprobe_probe(x, y, q, yq),
                                  "sklearn": lambda: sklearn_probe(x, y, q, yq),
                                  "sklearn_warm": lambda: sklearn_probe(x, y, q, yq, warm_start=True)}, args.repeats)
    t_hp = report.timing("headprobe linear_probe (C grid + refit)", times["headprobe"])
    t_sk = report.timing("sklearn LogisticRegression lbfgs (C grid + refit)", times["sklearn"])
    t_warm = report.timing("sklearn LogisticRegression lbfgs, warm_start=True along the grid (+ warm refit)",
                           times["sklearn_warm"])
    ours, theirs, warm = results["headprobe"], results["sklearn"], results["sklearn_warm"]
    ratio = t_sk / t_hp
    report.check(f"linear probe, {len(C_GRID)} C values (N={n:,}, D={d}, {CLASSES} classes)",
                 "sklearn LogisticRegression(lbfgs) over the grid", f">= {SPEED_TARGET:g}x faster",
                 f"{ratio:.2f}x faster", ratio >= SPEED_TARGET, ratio=ratio)
    ratio = t_warm / t_hp
    report.check(f"linear probe, {len(C_GRID)} C values (N={n:,}, D={d}, {CLASSES} classes)",
                 "sklearn LogisticRegression(lbfgs, warm_start=True) along the grid", f">= {WARM_TARGET:g}x faster",
                 f"{ratio:.2f}x faster", ratio >= WARM_TARGET, ratio=ratio)
    diff = 100 * (warm["acc"] - theirs["acc"])
    report.check("sklearn warm-started test accuracy", "sklearn restarted at every C",
                 f"within {ACCURACY_POINTS} points",
                 f"{100 * warm['acc']:.2f} vs {100 * theirs['acc']:.2f} (C {warm['C']:g} vs {theirs['C']:g})",
                 abs(diff) <= ACCURACY_POINTS, accuracy_warm=warm["acc"], chosen_C_warm=warm["C"])
    diff = 100 * (ours["acc"] - theirs["acc"])
    report.check("linear probe test accuracy", "sklearn's test accuracy", f"within {ACCURACY_POINTS} points",
                 f"{100 * ours['acc']:.2f} vs {100 * theirs['acc']:.2f} ({diff:+.2f} points; "
                 f"C {ours['C']:g} vs {theirs['C']:g})",
                 abs(diff) <= ACCURACY_POINTS, accuracy_headprobe=ours["acc"], accuracy_sklearn=theirs["acc"],
                 chosen_C_headprobe=ours["C"], chosen_C_sklearn=theirs["C"])
    report.extra["validation_accuracy"] = {"headprobe": ours["val"], "sklearn": theirs["val"],
                                           "sklearn_warm_start": warm["val"]}
    report.extra["headprobe_fits"] = ours["fits"]  # evaluations, iterations and final max |grad| per C
    report.note(f"headprobe: {sum(f['evaluations'] for f in ours['fits'])} loss evaluations over the grid and the "
                f"refit; every fit stopped on {sorted({f['stop'] for f in ours['fits']})}.")
    for name, record in (("sklearn", theirs), ("sklearn warm_start", warm)):
        if record["unconverged"]:
            report.note(f"{name} warned of non-convergence {record['unconverged']} times (max_iter={MAX_ITER}).")
    report.finish()


if __name__ == "__main__":
    main()
