"""Did a head train? A verdict on its loss curve, shown next to its buffer verdict.

A head whose loss barely moved (VICReg 39 → 34.5 over 150 steps, the cosine schedule ending at 1e-7) has not
become the head the claim is about, so its buffer verdict says little. `training_convergence` reads the logged
loss of one head (metrics.jsonl "train" records) and applies RULE:

- start = mean loss of the first 10% of the logged points, end = mean of the last 25% (the tail, at least 3);
  relative decrease = (start − end) / |start|.
- The tail's least-squares slope b (loss per step) times its span in steps is what the loss still fell over the
  tail; its standard error comes from the residuals of that fit (the noise).
- "still falling": the tail fell by more than 2 standard errors AND more than 10% of the whole decrease.
- "barely trained": it is not still falling, but the relative decrease is below 20%.
- "converged": neither; "unknown": fewer than 6 logged points, or no finite loss.

>>> flat = [{"stage": "train", "head": "h", "step": s, "loss": 1.0 + 9.0 * (s < 5)} for s in range(1, 41)]
>>> training_convergence(flat)["status"]
'converged'
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["MIN_POINTS", "RULE", "tail_fit", "training_convergence"]

MIN_POINTS = 6
HEAD_FRACTION, TAIL_FRACTION = 0.10, 0.25
STILL_FALLING_SE, STILL_FALLING_SHARE, BARELY_TRAINED = 2.0, 0.10, 0.20
RULE = ("start = mean loss over the first 10% of logged steps, end = mean over the last 25% (the tail); "
        "still falling: the tail's least-squares slope × its span exceeds 2 standard errors and 10% of the whole "
        "decrease; barely trained: not still falling, but (start − end)/|start| < 20%; converged otherwise")


def tail_fit(steps: np.ndarray, loss: np.ndarray) -> tuple[float, float]:
    """(drop, se): −slope·span of the least-squares line through the tail, and its standard error."""
    x = steps - steps.mean()
    sxx = float((x**2).sum())
    if sxx == 0:
        return 0.0, 0.0
    slope = float((x * (loss - loss.mean())).sum() / sxx)
    residuals = loss - loss.mean() - slope * x
    dof = max(len(loss) - 2, 1)
    se_slope = math.sqrt(float((residuals**2).sum()) / dof / sxx)
    span = float(steps[-1] - steps[0])
    return -slope * span, se_slope * span


def training_convergence(records: Sequence[dict]) -> dict:
    """The loss-curve verdict of one head from its "train" records (any order; the ones with a finite "loss").

    Returns {"status": "converged" | "still falling" | "barely trained" | "unknown", "converged": bool | None,
    "n_points", "start", "end", "relative_decrease", "tail_drop", "tail_drop_se", "rule"} (numbers None when
    unknown)."""
    pairs = sorted((r["step"], float(r["loss"])) for r in records
                   if r.get("stage", "train") == "train" and isinstance(r.get("step"), (int, float))
                   and isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"]))
    out = {"status": "unknown", "converged": None, "n_points": len(pairs), "start": None, "end": None,
           "relative_decrease": None, "tail_drop": None, "tail_drop_se": None, "rule": RULE}
    if len(pairs) < MIN_POINTS:
        return out
    steps, loss = (np.array(v, dtype=float) for v in zip(*pairs, strict=True))
    n = len(loss)
    n_head, n_tail = max(1, round(HEAD_FRACTION * n)), max(3, round(TAIL_FRACTION * n))
    start, end = float(loss[:n_head].mean()), float(loss[-n_tail:].mean())
    decrease = start - end
    relative = decrease / abs(start) if start != 0 else (math.inf if decrease > 0 else 0.0)
    drop, se = tail_fit(steps[-n_tail:], loss[-n_tail:])
    falling = drop > STILL_FALLING_SE * se and drop > STILL_FALLING_SHARE * max(decrease, 0.0)
    status = "still falling" if falling else "barely trained" if relative < BARELY_TRAINED else "converged"
    return out | {"status": status, "converged": status == "converged", "start": start, "end": end,
                  "relative_decrease": relative, "tail_drop": drop, "tail_drop_se": se}
