"""The buffer verdict: did this head behave as a geometric buffer on this run, beyond the noise?

A head is a buffer when the backbone is more informative than the head output (class probes,
rotation probe, augmentation R², label MI) and the head output is more invariant to the
augmentations (alignment, scale-free orbit spread, view MI relative to its ceiling). Each piece of
evidence is the signed margin in the direction the claim predicts (positive = as predicted), with a
95% interval from a paired bootstrap over the units both taps were measured on (`headprobe.stats`).
A piece is resolved "for" or "against" only when its Holm-adjusted p-value over that head's pieces of
evidence is below 0.05; pieces without per-unit values stay "unresolved" and say why.
"""

from __future__ import annotations

import torch

from .stats import ALPHA, PerUnit, Resamples, bootstrap_p_value, holm, percentile_interval, resampled_means

# Information the backbone should keep and the head lose: higher at the backbone supports the claim.
INFORMATION = ("linear.acc", "rotation.acc", "rotation.mlp.acc", "aug_r2.mean", "mi.label")
# For invariance the head should show: lower alignment distance, higher view cosine, lower relative spread.
INVARIANCE_LOWER_IS_MORE = ("align", "orbit.spread_rel")
INVARIANCE_HIGHER_IS_MORE = ("view_cos",)
# The orbits probe names its metrics `<sweep>.orbit.spread_rel` (rotation45, hue, blur, ...): every sweep is
# its own piece of evidence, lower at the head = more invariant.
ORBIT_SPREAD_SUFFIX = ".orbit.spread_rel"


def _lower_is_more(before: dict, after: dict) -> list[str]:
    sweeps = sorted(m for m in before if m.endswith(ORBIT_SPREAD_SUFFIX) and m in after)
    return [m for m in INVARIANCE_LOWER_IS_MORE if m in before and m in after] + sweeps


VERDICTS = ("buffer", "no-buffer", "mixed", "inconclusive")


def _pieces(before: dict, after: dict) -> dict[str, tuple[float, float, float, str]]:
    """{metric: (backbone value, head value, sign, claim)}; margin = sign · (backbone − head)."""
    pieces: dict[str, tuple] = {}
    for metric in INFORMATION:
        if metric in before and metric in after:
            pieces[metric] = (before[metric], after[metric], 1.0, "backbone keeps more")
    for metric in _lower_is_more(before, after):
        pieces[metric] = (before[metric], after[metric], 1.0, "head more invariant")
    for metric in INVARIANCE_HIGHER_IS_MORE:
        if metric in before and metric in after:
            pieces[metric] = (before[metric], after[metric], -1.0, "head more invariant")
    if "mi.infonce" in before and "mi.infonce" in after and before.get("mi.infonce.ceiling"):
        # Invariance: views of one image should be more mutually predictable after the head.
        b = before["mi.infonce"] / before["mi.infonce.ceiling"]
        h = after["mi.infonce"] / after["mi.infonce.ceiling"]
        pieces["mi.infonce/ceiling"] = (b, h, -1.0, "head more invariant")
    return pieces


# Features are float32: per-unit differences within a few float32 round-offs of the values are ties, not evidence
# (an orthogonal head's alignment differs from the backbone's by ~1e-8 on every image, always the same sign).
ROUNDOFF = 16 * 2.0**-23


def _paired_difference(backbone: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    b, h = backbone.detach().double().cpu(), head.detach().double().cpu()
    difference = b - h
    return torch.where(difference.abs() <= ROUNDOFF * (b.abs() + h.abs()), 0.0, difference)


def _seed_margins(before: dict, seeds: dict[str, dict], metric: str) -> list[float]:
    """The margin of `metric` at each seed's retrained head (the backbone is the same for every seed)."""
    margins = []
    for record in seeds.values():
        pieces = _pieces(before, record.get("metrics", {}))
        if metric in pieces:
            b, h, sign, _ = pieces[metric]
            margins.append(sign * (b - h))
    return margins


def _seed_test(margins: list[float]) -> dict:
    """A one-sample t test of "mean margin = 0" over seeds, with its 95% t interval."""
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


def buffer_verdict(taps: dict, head: str, samples: dict[str, dict[str, PerUnit]] | None = None,
                   resamples: dict[str, Resamples] | None = None) -> dict:
    """Compare tap "backbone" with tap `head` (the head output). Returns the verdict and its evidence.

    samples: {tap: {metric: PerUnit}} per-unit values of the metrics that are means over units;
    resamples: {unit: (n_boot, n) indices} shared by every tap (`stats.bootstrap_resamples`).
    evidence[M]: backbone, head, margin (as the claim predicts when positive), claim, ci95 of the margin (paired
    bootstrap of the per-unit differences) or null, p and p_holm, resolved ("for" | "against" | "unresolved")
    and, when unresolved for want of an interval, why.
    verdict: "buffer" (≥ 1 resolved for, none against), "no-buffer" (≥ 1 against, none for), "mixed" (both),
    "inconclusive" (nothing resolved, or no shared metric).
    """
    before, after = taps["backbone"]["metrics"], taps[head]["metrics"]
    samples, resamples = samples or {}, resamples or {}
    evidence: dict[str, dict] = {}
    p_values: dict[str, float] = {}
    for metric, (b, h, sign, claim) in _pieces(before, after).items():
        entry = {"backbone": b, "head": h, "margin": sign * (b - h), "claim": claim, "ci95": None,
                 "p": None, "p_holm": None}
        pb, ph = samples.get("backbone", {}).get(metric), samples.get(head, {}).get(metric)
        if pb is not None and ph is not None and pb.unit == ph.unit and pb.unit in resamples:
            if isinstance(pb, PerUnit) and isinstance(ph, PerUnit):
                boot = sign * resampled_means(_paired_difference(pb.values, ph.values), resamples[pb.unit])
            else:  # a statistic recomputed on each resample (an orbit spread ratio): the same resamples for both
                boot = sign * _paired_difference(pb.replicates(resamples[pb.unit]), ph.replicates(resamples[pb.unit]))
            entry |= {"ci95": percentile_interval(boot), "method": f"paired bootstrap over {pb.unit}",
                      "n_boot": int(boot.numel())}
            p_values[metric] = entry["p"] = bootstrap_p_value(boot)
        elif len(margins := _seed_margins(before, taps[head].get("seeds") or {}, metric)) >= 2:
            entry |= _seed_test(margins)
            p_values[metric] = entry["p"]
        else:
            entry["why_unresolved"] = ("no per-unit values to pair (not a mean over images or views) and fewer "
                                       "than 2 seeds; add `seeds: [0, 1, 2]` for an interval over retrainings")
        evidence[metric] = entry
    adjusted = holm(p_values)
    for metric, entry in evidence.items():
        entry["p_holm"] = adjusted.get(metric)
        resolved = metric in adjusted and adjusted[metric] < ALPHA
        entry["resolved"] = ("for" if entry["margin"] > 0 else "against") if resolved else "unresolved"
    support = sum(e["resolved"] == "for" for e in evidence.values())
    against = sum(e["resolved"] == "against" for e in evidence.values())
    verdict = ("mixed" if support and against else "buffer" if support else "no-buffer" if against
               else "inconclusive")
    return {"verdict": verdict, "evidence": evidence, "support": support, "against": against,
            "unresolved": len(evidence) - support - against,
            "rule": f"resolved when the Holm-adjusted paired-bootstrap p-value over this head's {len(p_values)} "
                    f"testable pieces of evidence is below {ALPHA}"}
