"""Claim 5 across runs: the arms and seeds of a head ablation, and the per-arm answers of `headprobe claims`.

The buffer claim in the paper's own regime is causal: "the backbone trained with a depth-d head keeps more
augmentation / class information and is less invariant than the one trained without a head" (the guillotine
experiment: SimCLR's Table 3, Guillotine Regularization). With `backbone.tune: full` each seed is its own run, so
the answer pools runs: `group_runs` sorts a sweep's runs into arms (their head configuration) keyed by seed, the
"no head" arm (identity heads) the reference. Runs of one seed probed the same test images and views (the same
data, the same held-out views: `check_same_units`), and each keeps its probes' per-image values in
``per_unit/TAP.safetensors`` (`stats.save_per_unit`), so across runs the taps pair up image by image. A run that
tuned its backbone once per seed (`seeds: [0, 1, 2]` with `backbone.tune`: per-seed taps, ``TAP.seed-S``) counts
as its seeds, each the run with that one seed.

`cross_run_answers` reads each run folder once (`read_run`: a `FinishedRun`) and `answer_arms` answers from those,
per arm, the questions of `stats.claims` with the same machinery (`answer_heads`:
the primary measure decides, Holm across the arms of one question, never across metrics; k-NN accuracies, label
MI and the other secondary measures are descriptions):

- **within the arm** ("within"): z → h at each run's head output tap, pooled over the arm's runs, each seed
  against its own backbone; the questions of `stats.claims.QUESTIONS` as they are;
- **across runs** ("across"): the arm's backbone minus the no-head backbone of the same seed, paired on the same
  test images; Q-aug "keeps more augmentation information" (`rotation.acc` predicted higher), Q-inv "is less
  invariant" (`view_spread_rel` higher), Q-class "keeps the class information" (the equivalence on `linear.acc`
  with its margin).

Both use `stats.retraining.change_interval` with one reference per seed: the wider of the crossed bootstrap
(seeds drawn with replacement and ONE resample of the units read by every drawn seed and both runs of a seed:
`retraining.hierarchical_replicates`) and the t interval over the per-seed differences; an image's effect that
repeats in every seed then counts once per replicate (tests/test_cross_run_coverage.py: ≥ 95% coverage of a zero
difference whether images or seeds dominate, against 91% with an independent image draw per seed).

>>> answers = cross_run_answers(["runs/sweep/a", "runs/sweep/b"])  # doctest: +SKIP
>>> answers["across"]["Q-aug"]["arms"]["mlp d2 relu bn"]["answer"]  # doctest: +SKIP
'yes'
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headprobe.stats.answer_text import answer_line
from headprobe.stats.bootstrap import N_BOOT, bootstrap_resamples, load_per_unit, n_units
from headprobe.stats.claims import (
    Question,
    answer_heads,
    question_entry,
    questions,
    secondary_measures,
)
from headprobe.stats.measures import Measures, TapMeasures, seed_unit
from headprobe.stats.retraining import Change, change_interval

REFERENCE = "no head"
MORE_SEEDS = "run the sweep with seed: [0, 1, 2]"
# What must match for two runs to have probed the same test images and views.
SAME_DATA = ("source", "fingerprint", "limit", "split_seed", "n_test")
SAME_VIEWS = ("split", "n_images", "views", "seed")
# The questions across runs: what a "yes" says of the backbone trained with a head, and the sign predicted.
ACROSS = {
    "Q-aug": ("Does the backbone trained with the head keep more augmentation information than the no-head "
              "backbone of the same seed?", "keeps more augmentation information than the no-head backbone", 1),
    "Q-inv": ("Is the backbone trained with the head less invariant than the no-head backbone of the same seed?",
              "is less invariant than the no-head backbone", 1),
    "Q-class": ("Does the backbone trained with the head keep the class information of the no-head backbone of the "
                "same seed?", "keeps the class information of the no-head backbone", 0),
}
_INTERVAL = ("95% interval: the wider of a crossed bootstrap (seeds drawn with replacement and one resample of the "
             "test images read by every drawn seed, paired per seed) and a t interval over the per-seed changes; "
             "with one seed the paired bootstrap over test images only; without per-image values the t interval "
             "over seeds")
ACROSS_RULE = ("change = the backbone of the run trained with the head − the no-head backbone of the same seed, on "
               "the same test images, averaged over the seeds both arms ran; " + _INTERVAL)
WITHIN_RULE = ("change = head − backbone at each run's head output tap, averaged over the arm's runs (one per "
               "seed, each against its own backbone); " + _INTERVAL)


def across_questions(overrides: dict | None = None) -> list[Question]:
    """The questions asked of the backbone trained with a head against the no-head backbone (`ACROSS`), with the
    runs' `claims:` overrides (primary, margin) applied."""
    return [dataclasses.replace(q, asks=ACROSS[q.key][0], finding=ACROSS[q.key][1], predicted=ACROSS[q.key][2],
                                subject="the backbone trained with the head", family="arms")
            for q in questions(overrides)]


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
        if h.get("type") == "mlp" and (h.get("depth") or 2) > 1:  # one layer has no hidden activation or BN
            word += f" {h.get('act')}" + (" bn" if h.get("bn_hidden") else "")
        if h.get("type") == "mlp" and h.get("bn_out"):
            word += " bn-out"
        words.append(word)
    return " + ".join(words)


def tuned_seeds(results: dict) -> list[int] | None:
    """The seeds of a run whose backbone was tuned once per seed (`seeds: [0, 1, 2]` with `backbone.tune`: per-seed
    backbone taps, taps["backbone"]["seeds"]); None for a run with one backbone."""
    seeds = (((results.get("taps") or {}).get("backbone") or {}).get("seeds")) or {}
    return sorted(int(s) for s in seeds) if len(seeds) > 1 else None


@dataclass(frozen=True)
class FinishedRun:
    """What the answers across runs read of one run folder (`read_run`): its status, recipe seed, arm
    (`arm_label`), seeds tuned one by one (`tuned_seeds`), the data and held-out views it probed (results.json's
    `data` and `protocol.views_probed`), its recipe's `claims:` overrides, the tap each trained head is answered at
    (`head_taps`) and the measurements of the taps the answers read (`TapMeasures`, per-unit values included)."""

    path: Path
    status: str | None
    seed: int | None
    arm: str
    tuned: list[int] | None
    data: Mapping[str, Any]
    views_probed: Mapping[str, Any]
    overrides: Mapping[str, Any]
    heads: Mapping[str, str]
    taps: Mapping[str, TapMeasures]


def read_run(run: str | Path, tap: str = "backbone") -> FinishedRun:
    """One run folder as the answers across runs read it: results.json once, and for a finished run the per-unit
    stores (``per_unit/TAP.safetensors``, ``TAP.seed-S`` per tuned seed; {} where missing) of `tap`, the backbone
    and every head's answered tap."""
    path = Path(run)
    results = json.loads((path / "results.json").read_text())
    recipe = results.get("recipe") or {}
    seed, arm, tuned, heads = recipe.get("seed"), arm_label(results), tuned_seeds(results), head_taps(results)
    taps = {}
    if results.get("status") == "complete" and isinstance(seed, int) and arm:
        recorded = results.get("taps") or {}
        for name in dict.fromkeys([tap, "backbone", *heads.values()]):
            entry = recorded.get(name) or {}
            seeds = entry.get("seeds") or {}
            taps[name] = TapMeasures(
                entry.get("metrics") or {}, load_per_unit(path / "per_unit" / f"{name}.safetensors"),
                seeds={str(s): Measures((seeds.get(str(s)) or {}).get("metrics") or {},
                                        load_per_unit(path / "per_unit" / f"{seed_unit(name, s)}.safetensors"))
                       for s in tuned or []},
                head=entry.get("head"))
    return FinishedRun(path, results.get("status"), seed, arm, tuned, results.get("data") or {},
                       (results.get("protocol") or {}).get("views_probed") or {}, recipe.get("claims") or {}, heads,
                       taps)


def run_arms(runs: Sequence[FinishedRun]) -> list[tuple[str, int, FinishedRun]]:
    """(arm label, seed, run) of each finished run ("status": "complete" and a recipe seed), once per seed for a
    run that tuned its backbone per seed (`tuned_seeds`: seed s of it is the run with seeds: [s]); other runs are
    left out."""
    out = []
    for run in runs:
        if run.status == "complete" and isinstance(run.seed, int) and run.arm:
            out += [(run.arm, s, run) for s in run.tuned or [run.seed]]
    return out


def group_runs(runs: Sequence[FinishedRun]) -> dict[str, dict[int, FinishedRun]]:
    """{arm label: {seed: run}} for finished runs (`run_arms`); a run whose arm already has its seed is an error
    (two runs cannot both be that seed's arm)."""
    arms: dict[str, dict[int, FinishedRun]] = {}
    for label, seed, run in run_arms(runs):
        if seed in arms.setdefault(label, {}):
            raise ValueError(f"runs {arms[label][seed].path} and {run.path} are both arm {label!r} at seed {seed}; "
                             "pass one run per arm and seed.")
        arms[label][seed] = run
    return arms


def check_same_units(a: FinishedRun, b: FinishedRun) -> None:
    """Raise a ValueError naming the field when runs a and b did not probe the same test images and views."""
    for field in SAME_DATA:
        if a.data.get(field) != b.data.get(field):
            raise ValueError(f"runs {a.path} and {b.path} probed different test images (data.{field}: "
                             f"{a.data.get(field)!r} vs {b.data.get(field)!r}); compare runs of one recipe that "
                             "differ only in their heads.")
    for field in SAME_VIEWS:
        if a.views_probed.get(field) != b.views_probed.get(field):
            raise ValueError(f"runs {a.path} and {b.path} probed different views (protocol.views_probed.{field}: "
                             f"{a.views_probed.get(field)!r} vs {b.views_probed.get(field)!r}); pair runs of the "
                             "same seed.")


def tap_record(run: FinishedRun, tap: str, seed: int | None = None) -> tuple[dict[str, float], Mapping]:
    """(metrics, per-unit statistics) of `tap` in a run (`read_run`), of its seed `seed` where the run tuned its
    backbone per seed: results.json's metrics (a per-unit store's means where results.json has none) and the
    per-unit statistics ({} when the store is missing: those metrics get the t interval over seeds); a ValueError
    when the run has neither."""
    measured: Measures = run.taps.get(tap) or TapMeasures({})
    name = tap
    if seed is not None and run.tuned:
        measured, name = run.taps.get(tap, TapMeasures({})).seeds.get(str(seed)) or Measures({}), seed_unit(tap, seed)
    stats = measured.per_unit
    metrics = {m: x.value() for m, x in stats.items()} | dict(measured.metrics)
    metrics = {m: v for m, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and math.isfinite(v)}
    if not metrics:
        raise ValueError(f"run {run.path} has no metrics for tap {name!r}; pick a tap the run probed (see its "
                         "results.json 'taps').")
    return metrics, stats


def paired_changes(pairs: Sequence[tuple[int, tuple[dict, dict], tuple[dict, dict]]], n_boot: int = N_BOOT,
                   seed: int = 0, compared: str = "each seed's backbone against the no-head backbone of its seed"
                   ) -> dict[str, Change]:
    """{metric: `retraining.Change`} of mean_s [m(A_s) − m(B_s)] for every metric all the pairs measured; pairs:
    (seed, `tap_record` of A, `tap_record` of B) of the runs of one seed. One resample of each kind of unit is
    drawn for every seed and both runs (the crossed bootstrap, `change_interval` with one reference per seed);
    compared: what is compared with what, in the interval's `how`."""
    if not pairs:
        raise ValueError("no pair of runs shares a seed; run both arms with the same seeds.")
    names = [m for m in pairs[0][1][0] if all(m in a[0] and m in b[0] for _, a, b in pairs)]
    drawn, out = {}, {}  # (unit, n) -> Resamples: one draw per kind of unit, read by every metric, seed and run
    for m in names:
        stats_a, stats_b = [a[1].get(m) for _, a, _ in pairs], [b[1].get(m) for _, _, b in pairs]
        per_unit = all(x is not None for x in stats_a + stats_b)
        resamples = {}
        if per_unit:
            units = {(x.unit, n_units(x)) for x in stats_a + stats_b}
            if len(units) > 1:
                raise ValueError(f"{m}: the runs measured different units ({sorted(units)}); pair runs of one "
                                 "recipe that differ only in their heads.")
            unit, n = key = units.pop()
            if key not in drawn:
                drawn[key] = bootstrap_resamples(n, n_boot, seed)
            resamples[unit] = drawn[key]
        out[m] = change_interval([b[0][m] for _, _, b in pairs], [a[0][m] for _, a, _ in pairs],
                                 stats_b if per_unit else None, stats_a if per_unit else None, resamples, seed,
                                 reference=compared, more_seeds=MORE_SEEDS)
    return out


def head_taps(results: Mapping) -> dict[str, str]:
    """{head: the tap its answers are read at} of a run's trained heads (results.json["claims"]; identity and null
    heads left out); {} for a run without answers."""
    identity = {h.get("name") for h in (results.get("recipe") or {}).get("heads") or [] if h.get("type") == "identity"}
    out: dict[str, str] = {}
    for claim in (results.get("claims") or {}).values():
        for head, record in ((claim or {}).get("heads") or {}).items():
            if head not in identity and isinstance(record, dict) and record.get("tap") and not record.get("is_null"):
                out.setdefault(head, record["tap"])
    return out


def shared_overrides(runs: Sequence[FinishedRun]) -> dict:
    """The `claims:` overrides every run's recipe set ({} for none); a ValueError where they differ."""
    found = {json.dumps(dict(run.overrides), sort_keys=True) for run in runs}
    if len(found) > 1:
        raise ValueError(f"the runs set different claims: overrides ({', '.join(sorted(found))}); pool runs of one "
                         "recipe.")
    return json.loads(found.pop()) if found else {}


def _answers(asked: list[Question], measured: Mapping[str, tuple[str, list[int], dict[str, Change]]], rule: str,
             overrides: dict, subject: str | None = None) -> dict:
    """{question: its entry and "arms": {label: the answer}} (`claims.answer_heads`, Holm across the labels);
    measured: {label: (tap, seeds, {metric: Change})}; subject: the line's subject for a label ("{}" the label)."""
    out = {}
    for question in asked:
        entry = question_entry(question, overrides.get(question.key), rule)
        arms = answer_heads(question, {
            label: {"tap": tap, "change": changes.get(question.primary),
                    "secondary": {m: changes[m].record() for m in secondary_measures(question, list(changes))}}
            for label, (tap, _, changes) in measured.items()})
        records = {}
        for label, answer in arms.items():
            record = records[label] = answer.to_record() | {"seeds": measured[label][1]}
            if subject:
                record["line"] = answer_line(question, subject.format(label), record)
        out[question.key] = entry | {"arms": records}
    return out


def cross_run_answers(run_dirs: Sequence[str | Path], reference: str = REFERENCE, tap: str = "backbone",
                      n_boot: int = N_BOOT, seed: int = 0) -> dict | None:
    """`answer_arms` of the run folders `run_dirs`, each read once (`read_run`)."""
    return answer_arms([read_run(path, tap) for path in run_dirs], reference, tap, n_boot, seed)


def answer_arms(runs: Sequence[FinishedRun], reference: str = REFERENCE, tap: str = "backbone",
                n_boot: int = N_BOOT, seed: int = 0) -> dict | None:
    """The per-arm answers of a head ablation (module docstring): {"reference", "tap", "arms": {label: {"seeds",
    "runs"}}, "within": {question: entry + "arms"}, "across": {question: entry + "arms"}}; None when the runs hold
    no reference arm, no other arm sharing a seed with it, or two runs of one arm and seed (a sweep over something
    else). runs: `read_run` of each run folder, with `tap`'s measurements."""
    keys = [(label, s) for label, s, _ in run_arms(runs)]
    if reference not in {label for label, _ in keys} or len(set(keys)) < len(keys):
        return None
    arms = group_runs(runs)
    base = arms[reference]
    others = {label: runs for label, runs in arms.items() if label != reference and set(runs) & set(base)}
    if not others:
        return None
    overrides = shared_overrides([run for runs in arms.values() for run in runs.values()])
    across, within, described = {}, {}, {}
    for label, runs in others.items():
        seeds = sorted(set(runs) & set(base))
        for s in seeds:
            check_same_units(runs[s], base[s])
        across[label] = (tap, seeds, paired_changes([(s, tap_record(runs[s], tap, s), tap_record(base[s], tap, s))
                                                     for s in seeds], n_boot, seed))
        taps = runs[min(runs)].heads
        for head, head_tap in taps.items():
            name = label if len(taps) == 1 else f"{label} · {head}"
            within[name] = (head_tap, sorted(runs), paired_changes(
                [(s, tap_record(runs[s], head_tap, s), tap_record(runs[s], "backbone", s)) for s in sorted(runs)],
                n_boot, seed, compared="each run's head against its own backbone"))
        described[label] = {"seeds": seeds, "runs": {s: str(runs[s].path) for s in sorted(runs)}}
    within_questions = [dataclasses.replace(q, family="arms") for q in questions(overrides)]
    out = {"reference": reference, "tap": tap, "arms": described,
           "within": _answers(within_questions, within, WITHIN_RULE, overrides),
           "across": _answers(across_questions(overrides), across, ACROSS_RULE, overrides,
                              subject="backbone trained with the {}")}
    # The null arm (the backbone trained through a fixed random injective map, `type: random`): every other arm's
    # backbone against it, seed by seed, by the same rule — what a trained head does beyond a map that loses nothing.
    null = next((label for label in others if label.startswith("random d")), None)
    if null is not None:
        against = {}
        for label, runs in others.items():
            seeds = sorted(set(runs) & set(arms[null])) if label != null else []
            if seeds:
                against[label] = (tap, seeds, paired_changes(
                    [(s, tap_record(runs[s], tap, s), tap_record(arms[null][s], tap, s)) for s in seeds], n_boot, seed))
        out["null_arm"] = null
        rule = ("change = the backbone of the run trained with the head − the backbone trained through the fixed "
                "random map (the null arm) of the same seed, on the same test images, averaged over the seeds both "
                "ran; " + _INTERVAL)
        out["against_null"] = _answers(across_questions(overrides), against, rule,
                                       overrides, subject="backbone trained with the {}, against the null arm's,")
    return out


def answer_lines(answers: Mapping) -> list[str]:
    """The answer lines of `cross_run_answers`, within the arms, then across runs, each part under a heading."""
    lines = []
    for part, heading in (("within", "within each arm, pooled over its runs (z → h):"),
                          ("across", f"across runs, each arm's {answers['tap']} against the {answers['tap']} of the "
                                     f"{answers['reference']} arm of the same seed:"),
                          ("against_null", f"across runs, each arm's {answers['tap']} against the {answers['tap']} "
                                           f"of the null arm ({answers.get('null_arm')}, a fixed random map) of the "
                                           "same seed:")):
        found = [record["line"] for claim in (answers.get(part) or {}).values()
                 for record in claim["arms"].values() if "line" in record]
        lines += [heading, *found] if found else []
    return lines
