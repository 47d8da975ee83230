"""Checks on the tensors passed to probes, objectives and geometry, each failing with a sentence for the user.

One place for the sentences that several modules used to write out each: a tensor that is not 2-D (N, D), not
floating-point or not finite, and a probe's split of features and labels.
"""

from __future__ import annotations

import numpy as np
import torch


def as_tensor(name: str, value) -> torch.Tensor | None:
    """A probe input as a tensor: tensors (and taps read by rows, `reads_by_rows`) pass through, NumPy arrays are
    wrapped without a copy, None stays None.

    >>> as_tensor("x", np.zeros(3)).dtype
    torch.float64
    """
    if value is None or isinstance(value, torch.Tensor) or reads_by_rows(value):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))  # shares memory unless the array is reversed/strided
    raise TypeError(f"{name} must be a torch.Tensor or a NumPy array but is a {type(value).__name__}; "
                    f"convert it with torch.as_tensor(...) first.")


def reads_by_rows(value) -> bool:
    """Whether `value` is a tap read by rows (`features.rows.TapRows`): no tensor, but sliced and indexed like one."""
    return bool(getattr(value, "reads_by_rows", False))


def check_floating(name: str, t: torch.Tensor, what: str = "features") -> None:
    """Raise ValueError unless t is floating-point; `what` names what the caller expects ("features", ...).

    >>> check_floating("z", torch.ones(2, dtype=torch.long))
    Traceback (most recent call last):
    ValueError: z has dtype torch.int64; pass floating-point features.
    """
    if not t.dtype.is_floating_point:
        raise ValueError(f"{name} has dtype {t.dtype}; pass floating-point {what}.")


def check_finite(name: str, t: torch.Tensor, advice: str = "check the features (e.g. fp16 overflow)") -> None:
    """Raise ValueError if t holds a NaN or an infinity; `advice` says where to look. A tap read by rows
    (`reads_by_rows`) is not read whole here: it checks each block as a probe reads it."""
    if reads_by_rows(t):
        return
    # A sum is NaN or infinite whenever a term is, and a sum of 4 bytes per entry is much cheaper than a
    # boolean mask of every entry; only when it is not finite (or overflows) is the full test needed.
    if not torch.isfinite(t.sum()) and not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or infinite values; {advice}.")


def check_features(name: str, z: torch.Tensor, *, min_rows: int = 1) -> None:
    """Raise ValueError unless z: (N, D) finite floats with N ≥ min_rows and D ≥ 1.

    >>> check_features("z", torch.zeros(3))
    Traceback (most recent call last):
    ValueError: z must be 2-D (N, D) but has shape (3,); pool to one vector per sample.
    """
    if z.ndim != 2:
        raise ValueError(f"{name} must be 2-D (N, D) but has shape {tuple(z.shape)}; pool to one vector per sample.")
    if z.shape[0] < min_rows or z.shape[1] == 0:
        raise ValueError(f"{name} has shape {tuple(z.shape)}; this measure needs N ≥ {min_rows} rows and D ≥ 1.")
    check_floating(name, z)
    check_finite(name, z)


def check_labelled_split(name: str, features: torch.Tensor, labels: torch.Tensor) -> None:
    """Raise ValueError unless features: (N, D) finite floats, labels: (N,) non-negative integers, N > 0;
    `name` is the split ("train", "test", "val"), the arguments' names are `{name}_features`, `{name}_labels`."""
    if features.ndim != 2:
        raise ValueError(
            f"{name}_features must be 2-D (N, D) but has shape {tuple(features.shape)}; "
            "flatten or pool the features to one vector per sample first."
        )
    if labels.ndim != 1:
        raise ValueError(
            f"{name}_labels must be 1-D (N,) but has shape {tuple(labels.shape)}; "
            "pass one class index per sample."
        )
    if features.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{name}_features has {features.shape[0]} rows but {name}_labels has {labels.shape[0]} entries; "
            "they must describe the same samples."
        )
    if features.shape[0] == 0 or features.shape[1] == 0:
        raise ValueError(f"{name}_features is empty (shape {tuple(features.shape)}); the probe needs data.")
    check_floating(f"{name}_features", features)
    if torch.is_floating_point(labels) or torch.is_complex(labels) or labels.dtype == torch.bool:
        raise ValueError(
            f"{name}_labels has dtype {labels.dtype}; pass integer class indices (e.g. labels.long())."
        )
    check_finite(f"{name}_features", features, "check the backbone's output (e.g. for fp16 overflow)")
    if labels.min() < 0:
        raise ValueError(
            f"{name}_labels contains the negative label {int(labels.min())}; "
            "labels must be class indices 0..K-1."
        )
