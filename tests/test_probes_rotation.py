"""The rotation probe: rows of one image stay on one side of the validation split, and its intervals resample
images (each with its 4 rotations), not rows."""

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from sklearn_whitening import Whitener

from headprobe.probes.builtin.rotation import ROTATION as rotation
from headprobe.probes.builtin.rotation import per_image_accuracy, rotated_image_index
from headprobe.probes.linear import grouped_validation_split
from headprobe.probes.tap_data import TapData
from headprobe.stats.bootstrap import TEST_IMAGES

pytestmark = pytest.mark.usefixtures("single_thread")
GRID = [1e-3, 1e-1, 10.0]


def rotated_rows(n: int, seed: int, d: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows laid out as `stages.extract_features` stacks them: n images at 0°, then 90°, 180°, 270°. Each row is
    its image's content (shared by its 4 rotations) plus a weak direction per angle and noise."""
    g = torch.Generator().manual_seed(seed)
    content = 3.0 * torch.randn(n, d, generator=g, dtype=torch.float64)
    angle_direction = torch.randn(4, d, generator=g, dtype=torch.float64)
    labels = torch.arange(4).repeat_interleave(n)
    x = content.repeat(4, 1) + angle_direction[labels] + torch.randn(4 * n, d, generator=g, dtype=torch.float64)
    return x, labels


def make_tap(n_train=60, n_test=40):
    x_train, y_train = rotated_rows(n_train, 0)
    x_test, y_test = rotated_rows(n_test, 1)
    clean_y = torch.arange(n_test) % 2
    return TapData("backbone", x_train[:n_train], torch.arange(n_train) % 2, x_test[:n_test], clean_y, 2, seed=3,
                   rotated_train_x=x_train, rotated_train_y=y_train, rotated_test_x=x_test, rotated_test_y=y_test)


def test_the_source_image_of_each_row_is_read_from_the_stacking_layout():
    labels = torch.arange(4).repeat_interleave(3)
    assert rotated_image_index(labels).tolist() == [0, 1, 2] * 4
    with pytest.raises(ValueError, match="equal blocks"):
        rotated_image_index(torch.tensor([0, 1, 2, 3, 0, 1, 2, 3]))  # interleaved: not the layout we stack
    correct = torch.zeros(12, dtype=torch.bool)
    correct[[0, 3, 6, 9, 1, 4, 2, 5, 8]] = True  # image 0: all 4 rotations right, image 1: 2, image 2: 3
    assert per_image_accuracy(correct, labels).tolist() == [1.0, 0.5, 0.75]


def test_rotation_probe_chooses_C_on_a_split_grouped_by_image():
    tap = make_tap()
    out = rotation(tap, C_grid=GRID, mlp_epochs=5, mlp_hidden=16)
    groups = rotated_image_index(tap.rotated_train_y)
    fit_idx, val_idx = grouped_validation_split(groups, tap.val_fraction, tap.seed)
    assert not set(groups[fit_idx].tolist()) & set(groups[val_idx].tolist())
    x, y = tap.rotated_train_x.numpy(), tap.rotated_train_y.numpy()
    # The primary whitens on all training rows before the split; the standardised description scales on the
    # fitting part (tests/test_probes_linear.py checks both protocols against sklearn in full).
    for key, scaler in (("linear", Whitener(x)), ("linear_standardized", StandardScaler().fit(x[fit_idx]))):
        val_accuracy = [LogisticRegression(C=C, tol=1e-10, max_iter=10000)
                        .fit(scaler.transform(x[fit_idx]), y[fit_idx]).score(scaler.transform(x[val_idx]), y[val_idx])
                        for C in GRID]
        protocol = out.protocol[key]
        assert protocol["val_accuracy"] == pytest.approx(val_accuracy, abs=1e-9), key
        assert protocol["chosen_C"] == GRID[int(np.argmax(val_accuracy))]
        assert protocol["n_val"] % 4 == 0 and protocol["val_split"].startswith("grouped")
    assert "160 test rows from 40 test images" in out.protocol["rows"]


def test_rotation_accuracies_carry_per_image_values_over_the_test_images():
    out = rotation(make_tap(), C_grid=GRID, mlp_epochs=5, mlp_hidden=16)
    for metric in ("rotation.acc", "rotation.standardized.acc", "rotation.mlp.acc"):
        per_image = out.per_unit[metric]
        assert per_image.unit == TEST_IMAGES and per_image.values.shape == (40,)
        assert set(per_image.values.mul(4).round().tolist()) <= {0.0, 1.0, 2.0, 3.0, 4.0}  # k of 4 rotations right
        assert per_image.value() == pytest.approx(out.metrics[metric], abs=1e-12)


def test_an_invertible_map_of_the_features_leaves_rotation_acc_and_moves_only_the_standardised_description():
    tap = make_tap()
    g = torch.Generator().manual_seed(0)
    A = torch.eye(6, dtype=torch.float64) + torch.randn(6, 6, generator=g, dtype=torch.float64) / 6**0.5
    moved = TapData("h", tap.train_x @ A, tap.train_y, tap.test_x @ A, tap.test_y, 2, seed=3,
                    rotated_train_x=tap.rotated_train_x @ A, rotated_train_y=tap.rotated_train_y,
                    rotated_test_x=tap.rotated_test_x @ A, rotated_test_y=tap.rotated_test_y)
    before, after = (rotation(t, C_grid=GRID, mlp_epochs=5, mlp_hidden=16) for t in (tap, moved))
    assert after.protocol["linear"]["val_accuracy"] == pytest.approx(before.protocol["linear"]["val_accuracy"])
    assert after.metrics["rotation.acc"] == before.metrics["rotation.acc"]
    torch.testing.assert_close(after.per_unit["rotation.acc"].values, before.per_unit["rotation.acc"].values)
    # The standardised description moves: 45 → 47 of the 160 test rows right with this map.
    assert after.metrics["rotation.standardized.acc"] != before.metrics["rotation.standardized.acc"]
    assert "rotation.standardized.acc" not in rotation(tap, C_grid=GRID, mlp_epochs=5, mlp_hidden=16,
                                                       standardized_probe=False).metrics
