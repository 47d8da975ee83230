"""A lower bound on the label information of a representation from a probe's class probabilities."""

from __future__ import annotations

import torch

__all__ = ["label_mi_lower_bound"]


def label_mi_lower_bound(
    probabilities: torch.Tensor,
    labels: torch.Tensor,
    class_prior: torch.Tensor | None = None,
    eps: float = 1e-12,
) -> dict:
    """Lower bound I(Z; Y) ≥ H(Y) − CE in nats from a probe's class probabilities.

    probabilities: (N, C) rows summing to 1 (softmax outputs, not logits), labels: (N,) class indices,
    class_prior: optional (C,) p(y); by default H(Y) uses the label frequencies. Since the cross-entropy
    CE = −mean log q(y_i | z_i) of any probe q upper-bounds H(Y | Z), H(Y) − CE ≤ I(Z; Y) (Barber & Agakov).
    Probabilities are floored at `eps` inside the log. A negative value (a probe worse than the prior) is
    reported as is, not clamped, so miscalibration stays visible.

    >>> round(label_mi_lower_bound(torch.eye(2), torch.tensor([0, 1]))["mi_lower_bound"], 6)  # log 2
    0.693147
    """
    if probabilities.ndim != 2 or labels.ndim != 1 or probabilities.shape[0] != labels.shape[0]:
        raise ValueError(
            f"label_mi_lower_bound needs probabilities (N, C) and labels (N,) for the same N, but got "
            f"{tuple(probabilities.shape)} and {tuple(labels.shape)}."
        )
    if probabilities.shape[0] == 0:
        raise ValueError("probabilities is empty; the bound needs at least one sample.")
    if not torch.is_floating_point(probabilities) or not torch.isfinite(probabilities).all():
        raise ValueError("probabilities must be finite floating-point values.")
    if torch.is_floating_point(labels) or labels.dtype == torch.bool:
        raise ValueError(f"labels has dtype {labels.dtype}; pass integer class indices.")
    n, c = probabilities.shape
    p = probabilities.detach().double().cpu()
    labels = labels.cpu().long()
    if p.min() < 0 or (p.sum(dim=1) - 1).abs().max() > 1e-4:
        raise ValueError(
            "each row of probabilities must be non-negative and sum to 1; pass softmax(logits), not logits."
        )
    if labels.min() < 0 or labels.max() >= c:
        raise ValueError(f"labels must lie in 0..{c - 1} (the columns of probabilities).")
    if class_prior is None:
        prior, prior_source = torch.bincount(labels, minlength=c).double() / n, "label frequencies"
    else:
        prior, prior_source = class_prior.detach().double().cpu(), "given"
        if prior.shape != (c,) or prior.min() < 0 or abs(prior.sum().item() - 1) > 1e-6:
            raise ValueError(f"class_prior must be a ({c},) probability vector (non-negative, summing to 1).")
    entropy = float(-torch.special.xlogy(prior, prior).sum())
    cross_entropy = float(-p[torch.arange(n), labels].clamp_min(eps).log().mean())
    return {
        "mi_lower_bound": entropy - cross_entropy,
        "entropy_y": entropy,
        "cross_entropy": cross_entropy,
        "units": "nats",
        "n_samples": n,
        "n_classes": c,
        "prior": prior_source,
        "eps": eps,
    }
