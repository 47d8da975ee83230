"""Statistics logged at each training step: collapse (std of L2-normalised outputs, RankMe) and the update size."""

from __future__ import annotations

import math

import torch
from torch import nn

from headprobe.probes.spectrum import rankme


def collapse_stats(h: torch.Tensor) -> dict[str, float]:
    """Std of L2-normalised outputs (≈ 1/√d when spread, → 0 at collapse) and RankMe of h: (B, d).

    RankMe is `probes.spectrum.rankme` on the uncentred outputs, as in Garrido et al. and as the probes and the
    geometry records compute it, so the training log, `metrics.jsonl`'s geometry records and the tap metric
    agree on the same matrix. NaN where undefined (non-finite or all-zero outputs; logged as null)."""

    with torch.no_grad():
        hn = nn.functional.normalize(h.float(), dim=1)
        try:
            value = rankme(h.detach())
        except ValueError:
            value = math.nan
        return {"out_std": hn.std(0).mean().item(), "rankme": value}


def update_stats(params: list[torch.Tensor], lr: float) -> tuple[float, float]:
    """(gradient norm, relative update lr·‖g‖/‖w‖) of `params`, before the optimiser step."""
    with torch.no_grad():
        g = torch.sqrt(sum(((p.grad.float() ** 2).sum() for p in params if p.grad is not None),
                           torch.zeros((), device=params[0].device))).item()
        w = torch.sqrt(sum((p.detach().float() ** 2).sum() for p in params)).item()
    return g, lr * g / max(w, 1e-12)
