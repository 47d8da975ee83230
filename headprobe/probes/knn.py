"""Weighted k-nearest-neighbour probe on frozen features, following the DINO / DINOv2 protocol."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

_WEIGHTINGS = ("exp", "uniform")


@dataclass
class KnnResult:
    """What `knn` returns.

    metrics: {"knn.k{k}.acc": test accuracy in [0, 1]} for each requested k.
    predictions: requested k -> (M,) int64 predicted test labels, on the CPU.
    protocol: every knob that shaped the numbers, so a result can be reproduced from it alone.
    """

    metrics: dict[str, float]
    predictions: dict[int, torch.Tensor]
    protocol: dict


def _check_split(name: str, features: torch.Tensor, labels: torch.Tensor) -> None:
    """Raise ValueError unless features: (N, D) finite floats, labels: (N,) non-negative integers, N > 0."""
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
    if not torch.is_floating_point(features):
        raise ValueError(f"{name}_features has dtype {features.dtype}; pass floating-point features.")
    if torch.is_floating_point(labels) or torch.is_complex(labels) or labels.dtype == torch.bool:
        raise ValueError(
            f"{name}_labels has dtype {labels.dtype}; pass integer class indices (e.g. labels.long())."
        )
    if not torch.isfinite(features).all():
        raise ValueError(
            f"{name}_features contains NaN or infinite values; "
            "check the backbone's output (e.g. for fp16 overflow)."
        )
    if labels.min() < 0:
        raise ValueError(
            f"{name}_labels contains the negative label {int(labels.min())}; "
            "labels must be class indices 0..K-1."
        )


@torch.no_grad()
def knn(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    ks: Sequence[int] = (10, 20, 100, 200),
    temperature: float = 0.07,
    weighting: str = "exp",
    chunk_size: int = 1024,
    num_classes: int | None = None,
    device: torch.device | str | None = None,
) -> KnnResult:
    """Classify each test sample by a weighted vote of its nearest training samples.

    train_features: (N, D), train_labels: (N,), test_features: (M, D), test_labels: (M,).

    Protocol (DINO `eval_knn.py`, DINOv2 `eval/knn.py`): features are L2-normalised and compared by
    cosine similarity s; each query takes its top-k training neighbours, each neighbour votes for its own
    label with weight exp(s / temperature) ("exp") or 1 ("uniform"), and the class with the largest
    summed vote over the first k neighbours is the prediction (ties go to the smaller class index).

    A k larger than N is clamped to N; the clamp is recorded in `protocol["effective_ks"]`. Queries are
    processed `chunk_size` at a time, so memory is O(chunk_size × N), and everything is computed in float32
    on `device` (default: the device of `train_features`).
    """
    _check_split("train", train_features, train_labels)
    _check_split("test", test_features, test_labels)
    if train_features.shape[1] != test_features.shape[1]:
        raise ValueError(
            f"train_features has dimension {train_features.shape[1]} but test_features has "
            f"{test_features.shape[1]}; both must come from the same backbone and pooling."
        )
    ks = [int(k) for k in ks]
    if not ks:
        raise ValueError("ks is empty; pass at least one neighbour count, e.g. ks=(10, 20).")
    if min(ks) <= 0:
        raise ValueError(f"ks must be positive neighbour counts but got {ks}.")
    if len(set(ks)) != len(ks):
        raise ValueError(f"ks contains duplicates ({ks}); list each neighbour count once.")
    if weighting not in _WEIGHTINGS:
        raise ValueError(f"weighting {weighting!r} is not supported; use one of {_WEIGHTINGS}.")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive but got {temperature}; DINO uses 0.07.")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive but got {chunk_size}.")
    largest = int(max(train_labels.max(), test_labels.max()))
    if num_classes is None:
        num_classes = largest + 1
    elif largest >= num_classes:
        raise ValueError(
            f"a label equals {largest} but num_classes is {num_classes}; labels must lie in "
            "0..num_classes-1, so raise num_classes or remap the labels."
        )

    device = torch.device(device) if device is not None else train_features.device
    n_train, n_test = train_features.shape[0], test_features.shape[0]
    effective = {k: min(k, n_train) for k in ks}
    max_k = max(effective.values())

    bank = F.normalize(train_features.to(device, torch.float32), dim=1)
    bank_labels = train_labels.to(device, torch.int64)
    predictions = {k: torch.empty(n_test, dtype=torch.int64) for k in ks}
    for start in range(0, n_test, chunk_size):
        queries = F.normalize(test_features[start : start + chunk_size].to(device, torch.float32), dim=1)
        sims, idx = (queries @ bank.T).topk(max_k, dim=1)
        neighbour_labels = bank_labels[idx]
        if weighting == "exp":
            # Subtracting each row's top similarity rescales that query's votes by a constant, which leaves
            # the argmax unchanged but keeps exp() finite for small temperatures.
            weights = ((sims - sims[:, :1]) / temperature).exp()
        else:
            weights = torch.ones_like(sims)
        for k in ks:
            votes = torch.zeros(len(queries), num_classes, device=device)
            votes.scatter_add_(1, neighbour_labels[:, : effective[k]], weights[:, : effective[k]])
            predictions[k][start : start + len(queries)] = votes.argmax(dim=1).cpu()

    targets = test_labels.cpu().long()
    metrics = {f"knn.k{k}.acc": (predictions[k] == targets).double().mean().item() for k in ks}
    protocol = {
        "ks": ks,
        "effective_ks": {k: effective[k] for k in ks},
        "temperature": temperature,
        "weighting": weighting,
        "normalize": True,
        "chunk_size": chunk_size,
        "n_train": n_train,
        "n_test": n_test,
        "n_classes": num_classes,
    }
    return KnnResult(metrics=metrics, predictions=predictions, protocol=protocol)
