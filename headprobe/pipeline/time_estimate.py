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

__all__ = ["AFTER", "geometry_estimate", "head_tap_count", "remaining_estimate", "views_estimate"]

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


def views_estimate(seconds: float, images: int, view_images: int) -> str | None:
    """The line said before the augmented views are extracted: `view_images` at the rate the clean extraction
    just measured (`images` in `seconds`; each view is one more forward pass of the backbone, plus its augmentation);
    None where nothing was extracted to time (every clean split came from the cache).

    >>> views_estimate(72.0, 1797, 10776).split(" (")[0]
    'time estimate: ~432 s for the augmented views next'
    """
    if images <= 0 or seconds <= 0 or view_images <= 0:
        return None
    rate = images / seconds
    return (f"time estimate: ~{view_images / rate:.0f} s for the augmented views next ({view_images:,} view images at "
            f"{rate:.0f} images/s, the clean extraction's rate; less from a warm view cache), then training and "
            "probing")


def geometry_estimate(results: dict, heads: int, rows: int) -> str:
    """What `headprobe geometry` will spend, said before it starts, from what the run recorded: loading the backbone
    and data and extracting the features and views again (the run's own seconds for them; less where its feature
    cache is still there), then `heads` heads at `rows` rows, timed per head where an earlier geometry of this run
    (`geometry_timing`, or the run's final geometry) was, else each head's sizes are said as it starts.

    >>> geometry_estimate({"timing": {"load_s": 3.0, "extract_s": 60.0, "extract_views_s": 200.0}}, 2, 64)[:56]
    'geometry estimate: loading and extracting again ≤ ~263 s'
    """
    timing = results.get("timing") or {}
    again = sum(float(timing.get(k) or 0.0) for k in ("load_s", "extract_s", "extract_views_s"))
    first = (f"loading and extracting again ≤ ~{again:.0f} s (what the run took; less from a warm feature cache)"
             if again else "loading and extracting again (not timed by the run)")
    earlier = results.get("geometry_timing") or {}
    seconds, analysed = earlier.get("geometry_s") or timing.get("geometry_s"), [
        h for h, entry in (results.get("heads") or {}).items() if (entry or {}).get("geometry")]
    plural = "s" if heads != 1 else ""
    if seconds and analysed:
        per_head = float(seconds) / len(analysed)
        then = (f"~{per_head * heads:.0f} s for {heads} head{plural} at {rows} rows ({per_head:.0f} s per head last "
                "time, at the rows it used then)")
    else:
        then = f"{heads} head{plural} at {rows} rows each (not timed before: each head says its sizes as it starts)"
    return f"geometry estimate: {first}, then {then}"
