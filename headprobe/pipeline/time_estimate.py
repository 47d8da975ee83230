"""The remaining-time lines `headprobe run` prints once a stage has been timed: measured seconds × the work left.

Recipe headers' timings were 3–6× off on a loaded machine, so a run states its own estimate from what it measured,
at two points: after the first tap is probed (the backbone: its probe time × the head taps to come, training
still ahead) and after training. Each head tap is taken to cost what the backbone tap cost: an upper estimate,
since the first probing also pays one-off start-up costs and the backbone is usually wider than a head. Training
is timed by its own progress bar; the final geometry is not estimated (its cost depends on the head, not on the
taps).

>>> from headprobe.recipe import load_recipe
>>> r = load_recipe({"name": "x", "heads": [{"name": "h", "depth": 2}]})
>>> remaining_estimate(r, {"probe_s": 4.0}, first_probe_s=4.0, head_taps_done=0, after="training")
'time estimate: ~8 s more: probing 2 head taps (4.0 s per tap, measured on the first tap probed)'
"""

from __future__ import annotations

__all__ = ["AFTER", "head_tap_count", "remaining_estimate"]

AFTER = ("probing", "training")


def head_tap_count(recipe) -> int:
    """How many head taps the recipe probes: each head's probed layers (`taps`, else every layer; identity heads
    have none), once per training seed."""
    per_seed = 0
    for head in recipe.heads:
        if head.taps is not None:
            per_seed += len(head.taps)
        elif head.type != "identity":
            per_seed += head.depth
    return per_seed * len(recipe.seed_list)


def remaining_estimate(recipe, timing: dict, first_probe_s: float | None, head_taps_done: int,
                       after: str) -> str | None:
    """The line to print after `after` (one of AFTER: the first tap probed, or training), from the seconds the
    first probed tap took; None when nothing measured says how long the rest takes (or no head tap is left)."""
    if after not in AFTER:
        raise ValueError(f"after={after!r} is not a point of the run the estimate knows; use one of {AFTER}.")
    left = head_tap_count(recipe) - head_taps_done
    if not first_probe_s or left <= 0:
        return None
    line = (f"time estimate: ~{first_probe_s * left:.0f} s more: probing {left} head tap{'s' if left > 1 else ''} "
            f"({first_probe_s:.1f} s per tap, measured on the first tap probed)")
    if after == "probing":
        line += ", after training the heads (its progress bar times it)"
    elif after == "training" and "train_s" in timing:
        line = f"training took {timing['train_s']:.0f} s; " + line
    if recipe.geometry.final:
        line += "; plus the final geometry of each head (not estimated)"
    return line
