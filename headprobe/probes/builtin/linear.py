"""The linear probe: class accuracy of a multinomial L2 logistic regression on the whitened features (C chosen on a
validation split of the training images), the label-MI lower bound I(Z;Y) >= H(Y) - CE of that probe, in nats,
and, as a description, the same regression on per-coordinate standardised features (`linear.standardized.*`).

The whitened probe is the primary (Q-class reads `linear.acc`): no invertible linear map of the features, nor one
injective on the span of the training features, changes it beyond rounding (`headprobe.probes.whitening`), so a head
that is such a map cannot be read as losing class information. The standardised probe is the one headprobe reported
as `linear.acc` before; it is kept as a description because an L2 penalty after per-coordinate scaling depends on
the coordinates (a random invertible map of the 64 digit pixels moves it by a few test images). `standardized_probe:
false` skips it, which about halves the probe's time per tap (figures: `benchmarks/README.md`, "Measurements quoted
by the modules")."""

from __future__ import annotations

from dataclasses import dataclass, field

from headprobe.registry import POSITIVE, at_least

from ..declaration import CHUNKS, CLASS_CHANCE, INFORMATION, PROTOCOL, Metric, Probe, TrainImages
from ..tap_data import ProbeOutput, TapData


@dataclass
class LinearProbeSpec:
    C_grid: list[float] = field(default_factory=lambda: [10.0**k for k in range(-4, 4)], metadata=POSITIVE)
    # The standardised probe's scaling (the whitened primary needs none): false fits its raw coordinates.
    standardize: bool = True
    # Also fit the standardised probe, reported as the description linear.standardized.{acc,val_acc,C}.
    standardized_probe: bool = True
    max_iter: int = field(default=1000, metadata=at_least(1))
    # At scikit-learn's default 1e-4 the answer depends on where each fit starts: the path-warm-started fits at
    # large C already meet it at their start, so another C can win than sklearn's from zero. At 1e-6 headprobe and
    # sklearn agree on every validation accuracy, the C and the test accuracy, for a little more time (figures:
    # benchmarks/README.md, "Measurements quoted by the modules").
    tol: float = field(default=1e-6, metadata=POSITIVE)


def check_linear(options: LinearProbeSpec, train: TrainImages) -> None:
    if not options.C_grid:
        raise ValueError("probes.linear.C_grid is empty; give at least one C, e.g. [0.1, 1, 10].")


def measure_linear(tap: TapData, *, standardize: bool, standardized_probe: bool, **options) -> ProbeOutput:
    """Linear probe on the whitened features (class accuracy), the label-MI lower bound I(Z;Y) ≥ H(Y) − CE of that
    probe, in nats, and (with `standardized_probe`) the probe on standardised features as a description."""
    import torch

    from headprobe.stats.bootstrap import TEST_IMAGES, PerUnit

    from ..label_mi import label_mi_lower_bound
    from ..linear import linear_probe

    split = {"val_fraction": tap.val_fraction, "seed": tap.seed} | options
    result = linear_probe(tap.train_x, tap.train_y, tap.test_x, tap.test_y, **split)
    # The bound is a held-out log-likelihood: its C is the one of the best validation log-likelihood, not accuracy.
    # On whitened features accuracy peaks at small C, where the probabilities are far from confident (quickstart's
    # DINOv2 features: C = 0.001, bound 0.79 nats; at the best log-likelihood, C = 10: 2.19 nats).
    grid = result.protocol["C_grid"]
    bound_C = grid[min(range(len(grid)), key=result.protocol["val_log_loss"].__getitem__)]
    calibrated = result if bound_C == result.metrics["linear.C"] else linear_probe(
        tap.train_x, tap.train_y, tap.test_x, tap.test_y, **(split | {"C_grid": [bound_C]}))
    bound = label_mi_lower_bound(calibrated.probabilities, tap.test_y)
    metrics = dict(result.metrics) | {"mi.label": bound["mi_lower_bound"]}
    protocol = result.protocol | {"mi.label": {k: v for k, v in bound.items() if k != "mi_lower_bound"}
                                  | {"C": bound_C, "C_chosen_by": "validation log-likelihood"}}
    y = tap.test_y.cpu().long()
    # H(Y) + log q(y_i | z_i) per image: its mean is the bound (H(Y) is fixed under a class-stratified resample).
    log_q = calibrated.probabilities.double()[torch.arange(len(y)), y].clamp_min(bound["eps"]).log()
    per_unit = {"linear.acc": PerUnit((result.predictions == y).double(), TEST_IMAGES),
                "mi.label": PerUnit(bound["entropy_y"] + log_q, TEST_IMAGES)}
    if standardized_probe:
        second = linear_probe(tap.train_x, tap.train_y, tap.test_x, tap.test_y, whiten=False, standardize=standardize,
                              **split)
        metrics |= {name.replace("linear.", "linear.standardized.", 1): value
                    for name, value in second.metrics.items()}
        protocol["standardized"] = second.protocol
        per_unit["linear.standardized.acc"] = PerUnit((second.predictions == y).double(), TEST_IMAGES)
    return ProbeOutput(metrics, protocol, per_unit)


LINEAR = Probe(
    "linear", measure_linear,
    "multinomial L2 logistic regression (C chosen on a validation split of train) + label-MI lower bound",
    options=LinearProbeSpec, check=check_linear, reads=CHUNKS,
    reads_why="row_blocks.BLOCK_ROWS rows at a time (taps of at most row_blocks.WHOLE_ROWS rows whole); holds "
              "the labels and split indices (N,), the whitening's mean and (D, r) map, the (D + 1, K) weights and "
              "L-BFGS's pairs, and per test image its prediction and class probabilities (M, K)",
    cost=6.7, cost_source="benchmarks/results/probe_costs.json",
    metrics=(
        Metric("linear.acc", "test accuracy of a linear probe (logistic regression on the features whitened with "
               "the train covariance, C chosen on a validation split of train) predicting the class",
               "fraction of test images", "higher = more class information", CLASS_CHANCE,
               note="no invertible linear map of the features changes it beyond rounding", role=INFORMATION,
               predicted=-1, answers=("Q-class",), headline=1),
        Metric("linear.val_acc", "validation accuracy of the linear probe at the chosen C (protocol)",
               "fraction of validation images", "used to choose C; not a measurement", CLASS_CHANCE, role=PROTOCOL),
        Metric("linear.C", "inverse L2 strength of the linear probe, chosen on validation (protocol)",
               "1/regularisation", "a setting, not a measurement", role=PROTOCOL),
        Metric("linear.standardized.acc", "test accuracy of the linear probe on per-coordinate standardised "
               "features instead of whitened ones (headprobe's linear.acc before whitening)",
               "fraction of test images", "higher = more class information", CLASS_CHANCE,
               note="a description, not evidence: a linear map that mixes coordinates moves it",
               shown_with=("Q-class",)),
        Metric("linear.standardized.val_acc", "validation accuracy of the standardised linear probe at its chosen C "
               "(protocol)", "fraction of validation images", "used to choose C; not a measurement", CLASS_CHANCE,
               role=PROTOCOL),
        Metric("linear.standardized.C", "inverse L2 strength of the standardised linear probe, chosen on validation "
               "(protocol)", "1/regularisation", "a setting, not a measurement", role=PROTOCOL),
        Metric("mi.label", "lower bound on the mutual information between the tap and the class label, from "
               "the (whitened) linear probe's held-out log-likelihood, at the C of the best validation "
               "log-likelihood", "nats (at most log n_classes)",
               "higher = more class information", 0.0, role=INFORMATION, predicted=-1, answers=("Q-class",),
               headline=3),
    ),
)
