"""Rows of rotated copies: which source image each row of a rotation probe's features comes from.

`stages.extract_features` stacks the N images of a split at 0°, 90°, 180° and 270°, angle by angle: row r holds
image r mod N rotated by 90°·(r div N), and its label is r div N. A probe whose rows share source images must
split, and resample, by image: rotated copies of one image are near-duplicates.
"""

from __future__ import annotations

import torch

ANGLES = 4


def rotated_image_index(labels: torch.Tensor) -> torch.Tensor:
    """The source image (0..N−1) of each row of rotated features whose rotation labels are `labels` (4N,), laid
    out angle by angle as `stages.extract_features` makes them: (4N,) int64."""
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
    image = rotated_image_index(labels)
    n = len(image) // ANGLES
    return torch.zeros(n, dtype=torch.float64).index_add_(0, image, correct.detach().cpu().double()) / ANGLES
