"""Taps compared across runs: z of run A vs z of run B, paired on the same test images, over seeds.

The buffer claim in the paper's own regime is causal: "the backbone trained with a depth-d head keeps more
augmentation / class information and is less invariant than the one trained without a head" (the guillotine
experiment: SimCLR's Table 3, Guillotine Regularization). Within one run, backbone and head taps are paired on the
same test images (`stats`); across runs they can be too, when the runs probed the same test images and views: the
same data (source, fingerprint, limit, split seed) and, per seed, the same held-out views. Each run keeps its
probes' per-image values in ``per_unit/TAP.safetensors`` (`stats.save_per_unit`).

`group_runs` sorts a sweep's runs into arms (their head configuration) keyed by seed; `cross_run_difference`
takes the runs of two arms that share a seed, and estimates mean_s [m(A_s) − m(B_s)] (m: the metric of a tap) with
a two-level bootstrap: each replicate draws the seeds with replacement and, within each drawn seed, the test
images (the same draw for A and B: paired); a ratio (`view_spread_rel`) is recomputed on each resample. With few
seeds the seed level is coarse, so the record also gives the t interval over the per-seed differences and each
seed's own paired interval over images. `compare_arms` does it for every metric two taps share, with the direction
the buffer claim predicts and a Holm correction over those metrics; a difference is resolved only where the t
interval over seeds agrees with the bootstrap.

>>> arms = group_runs(["runs/sweep/a", "runs/sweep/b"])  # doctest: +SKIP
>>> compare_arms(arms["mlp d2"], arms["no head"], tap="backbone")["metrics"]["rotation.acc"]["ci95"]  # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from headprobe.stats.bootstrap import (
    ALPHA,
    N_BOOT,
    bootstrap_p_value,
    bootstrap_resamples,
    holm,
    load_per_unit,
    n_units,
    percentile_interval,
    seed_interval,
)

# Metrics the claim predicts to be HIGHER at the backbone trained with a head than without: more augmentation
# information (rotation), more class information, less invariance (a larger relative view spread).
PREDICTED_HIGHER = ("rotation.acc", "rotation.mlp.acc", "linear.acc", "mi.label", "view_spread_rel")
PREDICTED_PREFIX = ("knn.",)
# What must match for two runs to have probed the same test images and views.
SAME_DATA = ("source", "fingerprint", "limit", "split_seed", "n_test")
SAME_VIEWS = ("split", "n_images", "views", "seed")


def arm_label(results: dict) -> str:
    """A run's head configuration in words: "no head" (identity heads only), e.g. "mlp d2 relu", "linear d2"; "" for
    a run that trained no head at all (it is no arm of a head ablation)."""
    heads = (results.get("recipe") or {}).get("heads") or []
    if not heads:
        return ""
    if all(h.get("type") == "identity" for h in heads):
        return "no head"
    words = []
    for h in heads:
        if h.get("type") == "identity":
            continue
        word = f"{h.get('type')} d{h.get('depth')}"
        if h.get("type") == "mlp":
            word += f" {h.get('act')}" + (" bn" if h.get("bn_hidden") else "")
        words.append(word)
    return " + ".join(words)


def run_arms(run_dirs: Sequence[str | Path]) -> list[tuple[str, int, Path]]:
    """(arm label, seed, run directory) of each finished run (results.json with "status": "complete" and a recipe
    seed); other runs are left out."""
    out = []
    for path in map(Path, run_dirs):
        results = json.loads((path / "results.json").read_text())
        seed = (results.get("recipe") or {}).get("seed")
        label = arm_label(results)
        if results.get("status") == "complete" and isinstance(seed, int) and label:
            out.append((label, seed, path))
    return out


def group_runs(run_dirs: Sequence[str | Path]) -> dict[str, dict[int, Path]]:
    """{arm label: {seed: run directory}} for finished runs (`run_arms`); a run whose arm already has its seed is
    an error (two runs cannot both be that seed's arm)."""
    arms: dict[str, dict[int, Path]] = {}
    for label, seed, path in run_arms(run_dirs):
        if seed in arms.setdefault(label, {}):
            raise ValueError(f"runs {arms[label][seed]} and {path} are both arm {label!r} at seed {seed}; pass "
                             "one run per arm and seed.")
        arms[label][seed] = path
    return arms


def check_same_units(a: Path, b: Path) -> None:
    """Raise a ValueError naming the field when runs a and b did not probe the same test images and views."""
    ra, rb = (json.loads((p / "results.json").read_text()) for p in (a, b))
    for field in SAME_DATA:
        if ra.get("data", {}).get(field) != rb.get("data", {}).get(field):
            raise ValueError(f"runs {a} and {b} probed different test images (data.{field}: "
                             f"{ra.get('data', {}).get(field)!r} vs {rb.get('data', {}).get(field)!r}); compare "
                             "runs of one recipe that differ only in their heads.")
    va, vb = (r.get("protocol", {}).get("views_probed") or {} for r in (ra, rb))
    for field in SAME_VIEWS:
        if va.get(field) != vb.get(field):
            raise ValueError(f"runs {a} and {b} probed different views (protocol.views_probed.{field}: "
                             f"{va.get(field)!r} vs {vb.get(field)!r}); pair runs of the same seed.")


def tap_values(run: Path, tap: str) -> dict:
    """The per-unit statistics of `tap` in a run (`stats.load_per_unit`); a ValueError when there are none."""
    path = run / "per_unit" / f"{tap}.safetensors"
    values = load_per_unit(path)
    if not values:
        raise ValueError(f"{path} is missing or unreadable: run {run} kept no per-image values for tap {tap!r}; "
                         "pick a tap the run probed (see its results.json 'taps').")
    return values


def cross_run_difference(pairs: Sequence[tuple[int, dict, dict]], metric: str, n_boot: int = N_BOOT,
                         seed: int = 0) -> dict:
    """mean_s [m(A_s) − m(B_s)] over pairs (seed, statistics of A, statistics of B) for one metric, paired on units.

    Returns {"a", "b" (seed means), "difference", "ci95" (two-level bootstrap: seeds with replacement, then units
    within each, the same units for A and B), "p" (its two-sided bootstrap p-value), "ci95_seeds" (t interval over
    the per-seed differences; null with one seed), "per_seed" [{"seed", "a", "b", "difference", "ci95_images"}],
    "n_seeds", "n_units", "unit", "n_boot", "method"}."""
    if not pairs:
        raise ValueError(f"no pair of runs shares a seed for {metric!r}; run both arms with the same seeds.")
    per_seed, replicates = [], []
    for s, a, b in pairs:
        if a.unit != b.unit or n_units(a) != n_units(b):
            raise ValueError(f"{metric} at seed {s}: {n_units(a)} {a.unit} vs {n_units(b)} {b.unit}; the runs did "
                             "not measure the same units.")
        resamples = bootstrap_resamples(n_units(a), n_boot, seed=seed + 7919 * s)
        diff = resamples.replicates_of(a) - resamples.replicates_of(b)
        replicates.append(diff)
        per_seed.append({"seed": s, "a": a.value(), "b": b.value(), "difference": a.value() - b.value(),
                         "ci95_images": percentile_interval(diff)})
    stacked = torch.stack(replicates)  # (S, n_boot)
    k = len(pairs)
    gen = torch.Generator().manual_seed(seed + 1)
    drawn = torch.randint(k, (k, n_boot), generator=gen)
    # Position i of a replicate reads its seed's image resample from its own permutation of the replicates, so a
    # seed drawn twice gets two independent image resamples.
    columns = torch.stack([torch.randperm(n_boot, generator=gen) for _ in range(k)])
    boot = stacked[drawn, columns].mean(0) if k > 1 else stacked[0]
    differences = [p["difference"] for p in per_seed]
    return {
        "a": sum(p["a"] for p in per_seed) / k, "b": sum(p["b"] for p in per_seed) / k,
        "difference": sum(differences) / k, "ci95": percentile_interval(boot), "p": bootstrap_p_value(boot),
        "ci95_seeds": seed_interval(differences)["ci95"] if k > 1 else None, "per_seed": per_seed,
        "n_seeds": k, "n_units": n_units(pairs[0][1]), "unit": pairs[0][1].unit, "n_boot": n_boot,
        "method": f"two-level bootstrap: {k} seed(s) drawn with replacement, then the {pairs[0][1].unit} within each "
                  "(the same draw for both runs: paired); ratios recomputed per resample; percentile interval",
    }


def predicted_higher(metric: str) -> bool:
    """Whether the claim predicts the metric higher at the backbone trained with a head (else: a description)."""
    return metric in PREDICTED_HIGHER or (metric.startswith(PREDICTED_PREFIX) and metric.endswith(".acc"))


def compare_arms(runs_a: Mapping[int, Path], runs_b: Mapping[int, Path], tap: str = "backbone",
                 tap_b: str | None = None, metrics: Sequence[str] | None = None, n_boot: int = N_BOOT) -> dict:
    """Every metric `tap` of arm A and `tap_b` (default the same) of arm B share, on the seeds both arms ran:
    {"tap_a", "tap_b", "seeds", "metrics": {metric: `cross_run_difference` + "claim" ("higher with a head" or
    "description") and, for evidence, "p_holm" and "resolved" ("for" / "against": Holm-adjusted p < 0.05 over the
    evidence metrics, and both the bootstrap interval and, with 2+ seeds, the t interval over seeds exclude 0;
    else "unresolved")}}."""
    tap_b = tap_b or tap
    seeds = sorted(set(runs_a) & set(runs_b))
    if not seeds:
        raise ValueError(f"the arms share no seed (A: {sorted(runs_a)}, B: {sorted(runs_b)}); run both with the "
                         "same seeds.")
    for s in seeds:
        check_same_units(runs_a[s], runs_b[s])
    values = {s: (tap_values(runs_a[s], tap), tap_values(runs_b[s], tap_b)) for s in seeds}
    shared = set.intersection(*(set(a) & set(b) for a, b in values.values()))
    names = [m for m in (metrics or sorted(shared)) if m in shared]
    out = {}
    for m in names:
        record = cross_run_difference([(s, values[s][0][m], values[s][1][m]) for s in seeds], m, n_boot)
        record["claim"] = "higher with a head" if predicted_higher(m) else "description"
        out[m] = record
    evidence = {m: r["p"] for m, r in out.items() if r["claim"] != "description"}
    for m, p in holm(evidence).items():
        # With few seeds, resampling them gives a narrow interval (3 seeds: 10 distinct draws), so a difference
        # counts only where the t interval over the per-seed differences excludes 0 too.
        intervals = [out[m]["ci95"]] + ([out[m]["ci95_seeds"]] if out[m]["ci95_seeds"] else [])
        resolved = p < ALPHA and all(not (low <= 0 <= high) for low, high in intervals)
        out[m]["p_holm"] = p
        out[m]["resolved"] = ("for" if out[m]["difference"] > 0 else "against") if resolved else "unresolved"
    return {"tap_a": tap, "tap_b": tap_b, "seeds": seeds, "metrics": out}


def compare_sweep(run_dirs: Sequence[str | Path], tap: str = "backbone", reference: str = "no head",
                  n_boot: int = N_BOOT) -> dict | None:
    """Each arm of a sweep against the reference arm ("no head") at `tap`, paired by seed and test image: {"tap",
    "reference", "arms": {label: `compare_arms`(arm, reference)}}; None when the runs hold no reference arm or no
    other arm sharing a seed with it, or when two runs share an arm and a seed (a sweep over something else)."""
    keys = [(label, seed) for label, seed, _ in run_arms(run_dirs)]
    if reference not in {label for label, _ in keys} or len(set(keys)) < len(keys):
        return None  # no reference arm, or runs that differ in more than their heads and seed
    arms = group_runs(run_dirs)
    base = arms[reference]
    others = {label: runs for label, runs in arms.items() if label != reference and set(runs) & set(base)}
    if not others:
        return None
    return {"tap": tap, "reference": reference,
            "arms": {label: compare_arms(runs, base, tap, n_boot=n_boot) for label, runs in others.items()}}


def answer_lines(comparison: Mapping) -> list[str]:
    """One line per (arm, evidence metric): "mlp d2 vs no head, backbone rotation.acc: +0.0310 [+0.0100, +0.0520],
    t over seeds [+0.0050, +0.0570] (3 seeds × 400 test images) for"."""
    lines = []
    for label, arm in comparison["arms"].items():
        for metric, r in arm["metrics"].items():
            if r["claim"] == "description":
                continue
            low, high = r["ci95"]
            seeds = f"{r['n_seeds']} seed{'s' if r['n_seeds'] != 1 else ''}"
            t = r["ci95_seeds"]
            t_text = f", t over seeds [{t[0]:+.4f}, {t[1]:+.4f}]" if t else ""
            lines.append(f"{label} vs {comparison['reference']}, {arm['tap_a']} {metric}: {r['difference']:+.4f} "
                         f"[{low:+.4f}, {high:+.4f}]{t_text} ({seeds} × {r['n_units']} {r['unit']}) {r['resolved']}")
    return lines

