"""The rotation probe (the paper's "guillotine" measurement): 4-way rotation prediction (0/90/180/270°) from each
tap, by a linear (logistic) probe and a one-hidden-layer MLP probe, scored per test image. The linear probe is
`linear_probe`'s whitened one (`rotation.acc`, Q-aug's primary: no invertible linear map of the features moves it
beyond rounding); the standardised one, `rotation.acc` before whitening, is the description
`rotation.standardized.acc` (`standardized_probe: false` skips it).

Rows of rotated copies: `stages.extract_features` stacks the N images of a split at 0°, 90°, 180° and 270°, angle
by angle: row r holds image r mod N rotated by 90°·(r div N), and its label is r div N. The probe splits, and its
intervals resample, by image: rotated copies of one image are near-duplicates (`rotated_image_index`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from headprobe.registry import POSITIVE, at_least

from ..declaration import INFORMATION, WHOLE, Metric, Probe, TrainImages
from ..tap_data import MissingInputError, ProbeOutput, TapData

if TYPE_CHECKING:  # torch loads when the probe runs, not when `list` or `validate` reads its declaration
    import torch


@dataclass
class RotationSpec:
    # null: the linear probe's C grid (`probes.linear.C_grid`'s default).
    C_grid: list[float] | None = field(default=None, metadata=POSITIVE)
    mlp_hidden: int = field(default=256, metadata=at_least(1))
    mlp_epochs: int = field(default=100, metadata=at_least(1))
    # Also fit the linear probe on standardised features: the description rotation.standardized.acc.
    standardized_probe: bool = True


def check_rotation(options: RotationSpec, train: TrainImages) -> None:
    if options.C_grid is not None and not options.C_grid:
        raise ValueError("probes.rotation.C_grid is empty; give at least one C, e.g. [0.1, 1, 10], "
                         "or null for the linear probe's default grid.")


ANGLES = 4


def rotated_image_index(labels: torch.Tensor) -> torch.Tensor:
    """The source image (0..N−1) of each row of rotated features whose rotation labels are `labels` (4N,), laid
    out angle by angle as `stages.extract_features` makes them: (4N,) int64."""
    import torch

    labels = torch.as_tensor(labels).cpu().long()
    n, rest = divmod(len(labels), ANGLES)
    expected = torch.arange(ANGLES).repeat_interleave(n)
    if rest or n == 0 or not torch.equal(labels, expected):
        raise ValueError(f"rotated features have {len(labels)} rows whose labels are not 0…0 1…1 2…2 3…3 in "
                         "equal blocks (N images at 0°, then at 90°, 180°, 270°, as stages.extract_features "
                         "stacks them); the source image of each row cannot be read from the layout.")
    return torch.arange(ANGLES * n) % n


def per_image_accuracy(correct: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """correct: (4N,) whether each rotated row was predicted right -> (N,) float64, each image's mean over its 4
    rotations; their mean is the accuracy over all 4N rows."""
    import torch

    image = rotated_image_index(labels)
    n = len(image) // ANGLES
    return torch.zeros(n, dtype=torch.float64).index_add_(0, image, correct.detach().cpu().double()) / ANGLES


def measure_rotation(tap: TapData, *, C_grid: list[float] | None, mlp_hidden: int, mlp_epochs: int,
                     standardized_probe: bool) -> ProbeOutput:
    """4-way rotation prediction (0/90/180/270°, chance 0.25) from each tap: a linear (logistic) probe on the
    whitened features with C chosen on validation (and, with `standardized_probe`, the same on standardised
    features), and a one-hidden-layer MLP probe — the paper's "guillotine" measurement."""
    from headprobe.stats.bootstrap import TEST_IMAGES, PerUnit

    from ..linear import linear_probe

    if tap.rotated_train_x is None:
        raise MissingInputError("probe 'rotation' needs rotated images; the pipeline extracts them when "
                                "probes.rotation is in the recipe.")
    kwargs = {"C_grid": C_grid} if C_grid else {}
    # The 4 rotated copies of one image are near-duplicates: C is chosen on a validation split by image.
    groups = rotated_image_index(tap.rotated_train_y)
    y_test = tap.rotated_test_y.cpu()
    linear = {"rotation.acc": linear_probe(tap.rotated_train_x, tap.rotated_train_y, tap.rotated_test_x,
                                           tap.rotated_test_y, val_fraction=tap.val_fraction, seed=tap.seed,
                                           groups=groups, **kwargs)}
    if standardized_probe:
        linear["rotation.standardized.acc"] = linear_probe(
            tap.rotated_train_x, tap.rotated_train_y, tap.rotated_test_x, tap.rotated_test_y,
            val_fraction=tap.val_fraction, seed=tap.seed, groups=groups, whiten=False, **kwargs)
    mlp_pred = _mlp_probe(tap, mlp_hidden, mlp_epochs)
    n_images = len(y_test) // 4
    # Intervals resample the N test images (each with its 4 rotations), not the 4N rows.
    per_unit = {name: PerUnit(per_image_accuracy(lin.predictions == y_test, y_test), TEST_IMAGES)
                for name, lin in linear.items()}
    per_unit["rotation.mlp.acc"] = PerUnit(per_image_accuracy(mlp_pred == y_test, y_test), TEST_IMAGES)
    metrics = {name: lin.metrics["linear.acc"] for name, lin in linear.items()}
    protocol = {"linear": linear["rotation.acc"].protocol}
    if standardized_probe:
        protocol["linear_standardized"] = linear["rotation.standardized.acc"].protocol
    return ProbeOutput(metrics | {"rotation.mlp.acc": (mlp_pred == y_test).double().mean().item()},
                       protocol | {"mlp": {"hidden": mlp_hidden, "epochs": mlp_epochs,
                                           "optimizer": "adam lr 1e-3, full batch", "standardize": True},
                                   "chance": 0.25,
                                   "rows": f"{len(y_test)} test rows from {n_images} test images (each at "
                                           f"0/90/180/270°) and {len(groups)} training rows from {len(groups) // 4} "
                                           "training images",
                                   "validation": "C chosen on a validation split grouped by image (an image's 4 "
                                                 "rotations are all on one side)",
                                   "unit": "test images: an image's score is the mean correctness of its 4 "
                                           "rotations"},
                       per_unit)


def _mlp_probe(tap: TapData, hidden: int, epochs: int) -> torch.Tensor:
    """The MLP probe's predicted rotations of the rotated test rows: (4M,) int64 on the CPU (fixed epochs, no
    validation split to group)."""
    import torch

    x, y = tap.rotated_train_x.float(), tap.rotated_train_y
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    g = torch.Generator().manual_seed(tap.seed)
    torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 4))
    net = net.to(x.device)  # initialised on the CPU from the seed, so every device starts from the same weights
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-4)
    xs = (x - mean) / std
    for _ in range(epochs):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xs), y).backward()
        opt.step()
    with torch.no_grad():
        return net((tap.rotated_test_x.float() - mean) / std).argmax(1).cpu()


ROTATION = Probe(
    "rotation", measure_rotation,
    "4-way rotation prediction (0/90/180/270°), linear and MLP: the paper's guillotine measure",
    options=RotationSpec, needs=("rotated",), check=check_rotation, cost=115.0, reads=WHOLE,
    reads_why="the full-batch MLP needs every rotated row at once (the logistic fits read row blocks, as the "
              "linear probe's do)",
    cost_source="benchmarks/results/probe_costs.json",
    metrics=(
        Metric("rotation.acc", "test accuracy of a linear probe (logistic regression on the features whitened "
               "with the train covariance) predicting the image's rotation (0/90/180/270°)",
               "fraction of test rows (4 per image)", "higher = more orientation information (less invariance)",
               0.25, note="no invertible linear map of the features changes it beyond rounding", role=INFORMATION,
               predicted=-1, answers=("Q-aug",), headline=4),
        Metric("rotation.standardized.acc", "test accuracy of the linear rotation probe on per-coordinate "
               "standardised features instead of whitened ones (headprobe's rotation.acc before whitening)",
               "fraction of test rows (4 per image)", "higher = more orientation information (less invariance)",
               0.25, note="a description, not evidence: a linear map that mixes coordinates moves it",
               shown_with=("Q-aug",)),
        Metric("rotation.mlp.acc", "test accuracy of a small MLP predicting the image's rotation",
               "fraction of test rows (4 per image)", "higher = more orientation information (less invariance)",
               0.25, role=INFORMATION, predicted=-1, answers=("Q-aug",)),
    ),
)
