"""The buffer verdict: did this head behave as a geometric buffer on this run, beyond the noise?

A head is a buffer when the backbone keeps information the head output loses, and the head output is more
invariant to the augmentations. Which side of the claim a metric is evidence for is one rule,
`predicted_change(metric)`: the sign of (head − backbone) the claim predicts, or None for a description. The rule
is what each probe declares of its metrics (`probes.declaration.Metric`: `role` and `predicted`), read through the
registry when the verdict is taken; the verdict keeps no list of its own:

- Information (role "information"), predicted lower at the head (−1): every class probe — `linear.acc` and every
  k-NN accuracy `knn.k{k}.acc` alike (the claim says the backbone keeps what the head discards; picking only the
  probes that agree would be selective) — the label-MI bound `mi.label`, the rotation probes `rotation.acc` and
  `rotation.mlp.acc`, and `aug_r2.mean`.
- Invariance (role "invariance"), scale-free only: `view_spread_rel` (views' spread over random pairs' distance, in
  the tap's own space) and every `<sweep>.orbit.spread_rel`, predicted lower (−1); `mi.infonce/ceiling`, predicted
  higher (+1), but only where both taps' InfoNCE is > 0: a bound ≤ 0 means the critic does no better than chance
  there, so the piece is listed as unresolved, "critic uninformative", and left out of the test.
- Descriptions and protocol values, never evidence: raw `align` and `view_cos` (they change when the whole cloud
  bunches or spreads, without any view moving closer to its image's other views), `uniform`, `lidar`, the spectrum
  (`rankme`, `alpha_req`, `cond`, `eff_rank`), `mi.gaussian` (the views' true MI cannot grow through a
  deterministic head, by data processing, so a change in this Gaussian estimate on the top principal components
  reflects the approximation, not invariance), the per-parameter `aug_r2.*`, other orbit measures, `linear.C`,
  `linear.val_acc`, and every metric no registered probe declares.

Each piece of evidence is the signed margin in the direction the claim predicts (positive = as predicted),
with a 95% interval from a paired bootstrap over the units both taps were measured on (`headprobe.stats.bootstrap`;
for the rotation probes those are test images, each with its 4 rotations). A piece is resolved "for" or
"against" only when its Holm-adjusted p-value over that head's testable pieces is below 0.05; pieces without
per-unit values or seeds stay "unresolved" and say why (`why_unresolved`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headprobe.probes.declaration import INFORMATION, INVARIANCE, metric_declaration

if TYPE_CHECKING:  # torch loads when a verdict is computed, not when the report reads `predicted_change`
    import torch

    from headprobe.stats.bootstrap import Resamples
    from headprobe.stats.measures import Measures, TapMeasures, Value

# The verdict's piece for InfoNCE: the bound relative to its ceiling log B (declared by the view_mi probe; it is
# left out of the verdict where either tap's InfoNCE is ≤ 0, see `buffer_verdict`).
INFONCE_RATIO = "mi.infonce/ceiling"
INFORMATION_CLAIM, INVARIANCE_CLAIM = "backbone keeps more", "head more invariant"
# The side of the claim each evidence role (`probes.declaration`) stands for.
CLAIM_OF_ROLE = {INFORMATION: INFORMATION_CLAIM, INVARIANCE: INVARIANCE_CLAIM}


def evidence_rule(metric: str) -> tuple[int, str] | None:
    """(predicted sign of head − backbone, the side of the claim) for a metric that is evidence, else None: what
    the registered probe that records `metric` declares of it."""
    found = metric_declaration(metric)
    if found is None or found[0].role not in CLAIM_OF_ROLE:
        return None
    return found[0].predicted, CLAIM_OF_ROLE[found[0].role]


def predicted_change(metric: str) -> int | None:
    """The sign of (head − backbone) that the buffer claim predicts for `metric`: −1 where the head should read
    lower, +1 where higher; None where the metric is not evidence (a description such as `align`, `view_cos`,
    `uniform`, `rankme`, or a protocol value such as `linear.C`). The one rule the verdict uses."""
    rule = evidence_rule(metric)
    return None if rule is None else rule[0]


VERDICTS = ("buffer", "no-buffer", "mixed", "inconclusive")


def _pieces(before: Mapping[str, Value], after: Mapping[str, Value]) -> dict[str, tuple[float, float, float, str]]:
    """{metric: (backbone value, head value, sign, claim)}; margin = sign · (backbone − head) = −predicted · (head −
    backbone), positive when the change goes the way the claim predicts."""
    pieces: dict[str, tuple] = {}
    for metric in sorted(set(before) & set(after)):
        rule = evidence_rule(metric)
        if rule is not None and metric != "mi.infonce":  # InfoNCE counts relative to its ceiling, below
            pieces[metric] = (before[metric], after[metric], float(-rule[0]), rule[1])
    if "mi.infonce" in before and "mi.infonce" in after and before.get("mi.infonce.ceiling") \
            and after.get("mi.infonce.ceiling"):
        b = before["mi.infonce"] / before["mi.infonce.ceiling"]
        h = after["mi.infonce"] / after["mi.infonce.ceiling"]
        change, claim = evidence_rule(INFONCE_RATIO)
        pieces[INFONCE_RATIO] = (b, h, float(-change), claim)
    return pieces


# Features are float32: per-unit differences within a few float32 round-offs of the values are ties, not evidence
# (an orthogonal head's alignment differs from the backbone's by ~1e-8 on every image, always the same sign).
ROUNDOFF = 16 * 2.0**-23


def _paired_difference(backbone: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    import torch

    b, h = backbone.detach().double().cpu(), head.detach().double().cpu()
    difference = b - h
    return torch.where(difference.abs() <= ROUNDOFF * (b.abs() + h.abs()), 0.0, difference)


def _seed_margins(backbone: TapMeasures, seeds: Mapping[str, Measures], metric: str) -> list[float]:
    """The margin of `metric` at each seed's retrained head, against the backbone (its own seed's where the
    backbone was tuned per seed)."""
    margins = []
    own = backbone.seeds
    for seed, measured in seeds.items():
        before = own[seed].metrics if own else backbone.metrics
        pieces = _pieces(before, measured.metrics)
        if metric in pieces:
            b, h, sign, _ = pieces[metric]
            margins.append(sign * (b - h))
    return margins


def _seed_test(margins: list[float]) -> dict:
    """A one-sample t test of "mean margin = 0" over seeds, with its 95% t interval."""
    import torch
    from scipy import stats

    values = torch.tensor(margins, dtype=torch.float64)
    if float(values.std()) == 0.0:
        # Identical seeds carry no spread to test against (and say nothing of the test set's noise): unresolved.
        p, ci = 1.0, [float(values.mean())] * 2
    else:
        test = stats.ttest_1samp(values.numpy(), 0.0)
        p = float(test.pvalue)
        low, high = test.confidence_interval(0.95)
        ci = [float(low), float(high)]
    return {"ci95": ci, "method": f"t test over {len(margins)} seeds", "p": p, "margin_seeds": margins}


@dataclass(frozen=True)
class Evidence:
    """One piece of a head's buffer evidence: the backbone's and the head's value, the margin (positive as the
    claim predicts), the claim's side, the margin's 95% interval (None: unresolved for want of one), p before and
    p_holm after Holm's correction, how the interval was made (method, n_boot for a paired bootstrap, margin_seeds
    for a t test over seeds), why it is unresolved where it has no interval, and resolved ("for" | "against" |
    "unresolved")."""

    backbone: float
    head: float
    margin: float
    claim: str
    ci95: list[float] | None = None
    p: float | None = None
    p_holm: float | None = None
    method: str | None = None
    n_boot: int | None = None
    margin_seeds: list[float] | None = None
    why_unresolved: str | None = None
    resolved: str = "unresolved"

    def to_record(self) -> dict:
        """results.json["buffer"][H]["evidence"][M]: backbone, head, margin, claim, ci95, p, p_holm, then
        why_unresolved, method, n_boot, margin_seeds where set, and resolved."""
        out = {"backbone": self.backbone, "head": self.head, "margin": self.margin, "claim": self.claim,
               "ci95": self.ci95, "p": self.p, "p_holm": self.p_holm}
        for key in ("why_unresolved", "method", "n_boot", "margin_seeds"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out | {"resolved": self.resolved}


@dataclass(frozen=True)
class BufferVerdict:
    """A head's buffer verdict (`buffer_verdict`): the verdict (`VERDICTS`), evidence {metric: Evidence}, the
    counts of pieces resolved for and against and left unresolved, the rule that resolves a piece, and the tap the
    head is compared at where that is not the head's own output (None)."""

    verdict: str
    evidence: dict[str, Evidence]
    support: int
    against: int
    unresolved: int
    rule: str
    tap: str | None = None

    def to_record(self) -> dict:
        """results.json["buffer"][H]: verdict, evidence, support, against, unresolved, rule, and tap where set."""
        out = {"verdict": self.verdict, "evidence": {m: e.to_record() for m, e in self.evidence.items()},
               "support": self.support, "against": self.against, "unresolved": self.unresolved, "rule": self.rule}
        return out | ({"tap": self.tap} if self.tap is not None else {})


def buffer_verdict(taps: Mapping[str, TapMeasures], head: str, resamples: Mapping[str, Resamples] | None = None
                   ) -> BufferVerdict:
    """Compare tap "backbone" with tap `head` (the head output). Returns the verdict and its evidence.

    taps: {tap: TapMeasures} (`stats.measures`), whose per-unit statistics pair the taps unit by unit;
    resamples: {unit: (n_boot, n) indices} shared by every tap (`stats.bootstrap_resamples`).
    evidence[M] (`Evidence`): backbone, head, margin (as the claim predicts when positive), claim, ci95 of the
    margin (paired bootstrap of the per-unit differences) or None, p and p_holm, resolved ("for" | "against" |
    "unresolved") and, when unresolved for want of an interval, why.
    verdict: "buffer" (≥ 1 resolved for, none against), "no-buffer" (≥ 1 against, none for), "mixed" (both),
    "inconclusive" (nothing resolved, or no shared metric).
    """
    from headprobe.stats.bootstrap import (
        ALPHA,
        PerUnit,
        bootstrap_p_value,
        holm,
        percentile_interval,
        resampled_means,
    )

    before, after = taps["backbone"].metrics, taps[head].metrics
    resamples = resamples or {}
    found: dict[str, dict] = {}
    p_values: dict[str, float] = {}
    for metric, (b, h, sign, claim) in _pieces(before, after).items():
        entry: dict = {"backbone": b, "head": h, "margin": sign * (b - h), "claim": claim}
        pb, ph = taps["backbone"].per_unit.get(metric), taps[head].per_unit.get(metric)
        if metric == INFONCE_RATIO and min(before["mi.infonce"], after["mi.infonce"]) <= 0:
            entry["why_unresolved"] = (f"critic uninformative: mi.infonce is {before['mi.infonce']:.4g} at the "
                                       f"backbone and {after['mi.infonce']:.4g} at the head; a bound <= 0 (the "
                                       "critic does no better than chance) says nothing about the views' MI")
        elif pb is not None and ph is not None and pb.unit == ph.unit and pb.unit in resamples:
            if isinstance(pb, PerUnit) and isinstance(ph, PerUnit):
                boot = sign * resampled_means(_paired_difference(pb.values, ph.values), resamples[pb.unit])
            else:  # a statistic recomputed on each resample (an orbit spread ratio): the same resamples for both
                shared = resamples[pb.unit]
                boot = sign * _paired_difference(shared.replicates_of(pb), shared.replicates_of(ph))
            entry |= {"ci95": percentile_interval(boot), "method": f"paired bootstrap over {pb.unit}",
                      "n_boot": int(boot.numel())}
            p_values[metric] = entry["p"] = bootstrap_p_value(boot)
        elif len(margins := _seed_margins(taps["backbone"], taps[head].seeds, metric)) >= 2:
            entry |= _seed_test(margins)
            p_values[metric] = entry["p"]
        else:
            entry["why_unresolved"] = ("no per-unit values to pair (not a mean over images or views) and fewer "
                                       "than 2 seeds; add `seeds: [0, 1, 2]` for an interval over retrainings")
        found[metric] = entry
    adjusted = holm(p_values)
    evidence = {}
    for metric, entry in found.items():
        resolved = metric in adjusted and adjusted[metric] < ALPHA
        evidence[metric] = Evidence(**entry, p_holm=adjusted.get(metric),
                                    resolved=("for" if entry["margin"] > 0 else "against") if resolved
                                    else "unresolved")
    support = sum(e.resolved == "for" for e in evidence.values())
    against = sum(e.resolved == "against" for e in evidence.values())
    verdict = ("mixed" if support and against else "buffer" if support else "no-buffer" if against
               else "inconclusive")
    return BufferVerdict(verdict, evidence, support, against, len(evidence) - support - against,
                         f"resolved when the Holm-adjusted paired-bootstrap p-value over this head's "
                         f"{len(p_values)} testable pieces of evidence is below {ALPHA}")
