"""The buffer verdict: did this head behave as a geometric buffer on this run?

A head is a buffer when the backbone is more informative than the head output (class probes,
rotation probe, augmentation R², label MI) and the head output is more invariant to the
augmentations (alignment, scale-free orbit spread, view MI relative to its ceiling). Each piece of
evidence is the signed margin in the direction the claim predicts (positive = as predicted);
margins within `tolerance` count as ties.
"""

from __future__ import annotations

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


def buffer_verdict(taps: dict, head: str, tolerance: float = 0.01) -> dict:
    """Compare tap "backbone" with tap `head` (the head output). Returns verdict + evidence.

    verdict: "buffer" if every available piece of evidence points the predicted way (or ties) and at
    least one is beyond the tolerance; "no-buffer" if every piece points the other way or ties;
    "mixed" otherwise; "insufficient" when no shared metric exists.
    """
    before, after = taps["backbone"]["metrics"], taps[head]["metrics"]
    evidence: dict[str, dict] = {}
    for metric in INFORMATION:
        if metric in before and metric in after:
            evidence[metric] = {"backbone": before[metric], "head": after[metric],
                                "margin": before[metric] - after[metric], "claim": "backbone keeps more"}
    for metric in _lower_is_more(before, after):
        evidence[metric] = {"backbone": before[metric], "head": after[metric],
                            "margin": before[metric] - after[metric], "claim": "head more invariant"}
    for metric in INVARIANCE_HIGHER_IS_MORE:
        if metric in before and metric in after:
            evidence[metric] = {"backbone": before[metric], "head": after[metric],
                                "margin": after[metric] - before[metric], "claim": "head more invariant"}
    if "mi.infonce" in before and "mi.infonce" in after and before.get("mi.infonce.ceiling"):
        b = before["mi.infonce"] / before["mi.infonce.ceiling"]
        h = after["mi.infonce"] / after["mi.infonce.ceiling"]
        # Invariance: views of one image should be more mutually predictable after the head.
        evidence["mi.infonce/ceiling"] = {"backbone": b, "head": h, "margin": h - b, "claim": "head more invariant"}
    if not evidence:
        return {"verdict": "insufficient", "evidence": {}, "tolerance": tolerance}
    signs = [0 if abs(e["margin"]) <= tolerance else (1 if e["margin"] > 0 else -1) for e in evidence.values()]
    if all(s >= 0 for s in signs) and any(s > 0 for s in signs):
        verdict = "buffer"
    elif all(s <= 0 for s in signs):
        verdict = "no-buffer"
    else:
        verdict = "mixed"
    return {"verdict": verdict, "evidence": evidence, "tolerance": tolerance,
            "support": sum(s > 0 for s in signs), "against": sum(s < 0 for s in signs)}
