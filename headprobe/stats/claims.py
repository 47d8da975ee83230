"""The questions the paper asks of a head, each answered on its own from one pre-declared primary measure.

The buffer claim (PAPER.md, claim 5) is three questions, not one vote over every metric:

- **Q-aug** "Does the head discard augmentation information the backbone keeps?" Primary: `rotation.acc`, the
  linear rotation probe (the paper's own measure), predicted lower at the head. Secondary: `rotation.mlp.acc`,
  `aug_r2.mean` and every per-parameter `aug_r2.*`.
- **Q-inv** "Is the head more invariant, scale-free?" Primary: `view_spread_rel`, predicted lower. Secondary:
  every `<sweep>.orbit.spread_rel`.
- **Q-class** "Does the head keep the class information?" An equivalence question on `linear.acc` with a stated
  margin (default ±0.02 accuracy): equivalent / lost / gained / undecided. Secondary: the k-NN accuracies,
  `mi.label`, `align`, `uniform`, `rankme` — descriptions (k-NN reads neighbourhood geometry, which a more
  invariant head improves; it is not information).

Which measures bear on a question is what the probes declare of their metrics (`probes.declaration.Metric`:
`answers` for those that may be its primary, `shown_with` for descriptions), read through the registry: a probe
that adds a measure of a question adds it in its own module.

Each question's change is head − backbone at the head's output tap, with the 95% interval of
`stats.retraining.change_interval` (seeds and test images together with several seeds; test images only with
one, said so). Answers are read at two-sided α = 0.05 after Holm's correction across the heads of one question
(never across questions or metrics):

- direction questions (margin m ≥ 0, predicted sign d): "yes" when d·change > m is resolved (the test of
  "change = d·m" rejects on the predicted side), "no" when d·change < −m is resolved (the head goes the other way),
  "undecided" otherwise;
- the equivalence question (margin m): "equivalent" when both "change = −m" and "change = +m" are rejected with
  the change between them (the 95% interval lies inside ±m), "lost" when the change is resolved below −m,
  "gained" above +m, "undecided" otherwise.

A recipe may override a question's primary measure (among the question's own measures) or margin:
``claims: {Q-class: {margin: 0.03}, Q-aug: {primary: rotation.mlp.acc}}``; the override is recorded. The answers
across the runs of a head ablation (`stats.cross_run`) ask the same questions of arms, through `answer_heads`.

>>> QUESTIONS["Q-class"].margin, QUESTIONS["Q-aug"].primary
(0.02, 'rotation.acc')
>>> check_claims_section({"Q-class": {"margin": -1}})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: claims.Q-class.margin = -1 is out of range; it must be a number >= 0 (in the primary ...
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headprobe.probes.declaration import Metric, declared_metrics
from headprobe.registry import PROBE_QUESTIONS
from headprobe.registry import QUESTIONS as DECLARED
from headprobe.stats.answer_text import answer_line
from headprobe.stats.answers import HeadAnswer, NullAnswer, QuestionAnswers

if TYPE_CHECKING:
    from headprobe.stats.bootstrap import Resamples
    from headprobe.stats.measures import TapMeasures
    from headprobe.stats.retraining import Change

DIRECTION, EQUIVALENCE = "direction", "equivalence"
# A head's answer where the question's primary measure was not measured (its secondary measures are still shown).
NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class Question:
    """key: "Q-aug"; asks: the question; finding: what a "yes" says of a head ("discards augmentation
    information"); primary: the measure answering it; kind: DIRECTION or EQUIVALENCE; predicted: the sign of
    head − backbone the buffer claim predicts (−1 lower, +1 higher; 0 for an equivalence); margin: the smallest
    change that counts (direction) or the equivalence bound, in the primary's units; subject: what is compared
    with the backbone ("the head"), family: what one Holm correction runs across ("heads").

    Which measures bear on it is what the probes declare of their metrics (`probes.declaration.Metric`: `answers`,
    `shown_with`), read through the registry: `candidates` may be chosen as primary, `secondary` are shown with
    it."""

    key: str
    asks: str
    finding: str
    primary: str
    kind: str
    predicted: int
    margin: float
    subject: str = "the head"
    family: str = "heads"
    claim: int = 5

    # What the QUESTIONS registry reads of a declaration (`headprobe list questions`), as of a probe's.
    needs = ()
    options = None

    @property
    def is_equivalence(self) -> bool:
        return self.kind == EQUIVALENCE

    @property
    def name(self) -> str:
        return self.key

    @property
    def usage(self) -> str:
        return self.key

    @property
    def help(self) -> str:
        rule = (f"equivalence: |head − backbone| < {self.margin:g}" if self.kind == EQUIVALENCE else
                f"direction: head − backbone {'<' if self.predicted < 0 else '>'} "
                f"{'−' if self.predicted < 0 and self.margin else ''}{self.margin:g}")
        return (f"claim {self.claim}: {self.asks} primary {self.primary}; {rule}; every probed head against its "
                "backbone, over seeds (the probe stage)")

    @property
    def candidates(self) -> tuple[Metric, ...]:
        """The declared metrics a recipe may choose as this question's primary, in registration order."""
        return tuple(m for m in declared_metrics() if self.key in m.answers)

    @property
    def primaries(self) -> tuple[str, ...]:
        """The regular expressions of the names of `candidates`."""
        return tuple(m.pattern for m in self.candidates)

    @property
    def secondary(self) -> tuple[str, ...]:
        """The regular expressions of the measures shown with it: its candidates, then its descriptions."""
        return tuple(m.pattern for m in declared_metrics() if self.key in m.answers + m.shown_with)


Q_AUG = Question("Q-aug", "Does the head discard augmentation information the backbone keeps?",
                 "discards augmentation information", "rotation.acc", DIRECTION, -1, 0.0)
Q_INV = Question("Q-inv", "Is the head more invariant, scale-free?", "is more invariant", "view_spread_rel",
                 DIRECTION, -1, 0.0)
Q_CLASS = Question("Q-class", "Does the head keep the class information?", "keeps the class information",
                   "linear.acc", EQUIVALENCE, 0, 0.02)
# Claim 5's questions as the registry declares them (`registry.PROBE_QUESTIONS`, each entry pointing at one of the
# Questions above), the keys the metrics' declarations name.
QUESTIONS: dict[str, Question] = {key: DECLARED.get(key) for key in PROBE_QUESTIONS}
OVERRIDABLE = ("primary", "margin")


def check_claims_section(section) -> None:
    """Raise ValueError with a sentence for a recipe's `claims:` section that is not {question: {primary?,
    margin?}} with known questions, a primary among the question's measures and a margin >= 0."""
    if not isinstance(section, dict):
        raise ValueError(f"claims must map questions ({', '.join(QUESTIONS)}) to overrides, e.g. "
                         f"claims: {{Q-class: {{margin: 0.03}}}}; got {section!r}.")
    from headprobe.stats.geometry_claims import GEOMETRY_OVERRIDABLE

    for key, override in section.items():
        if key not in QUESTIONS and key not in DECLARED:
            raise ValueError(f"claims.{key} is not a question; the questions are {', '.join(DECLARED.names())}.")
        allowed = OVERRIDABLE if key in QUESTIONS else GEOMETRY_OVERRIDABLE
        if not isinstance(override, dict):
            raise ValueError(f"claims.{key} must map {' and/or '.join(allowed)} to a value, got {override!r}.")
        unknown = [k for k in override if k not in allowed]
        if unknown:
            raise ValueError(f"claims.{key}.{unknown[0]} cannot be set; a recipe may set {', '.join(allowed)}.")
        if key not in QUESTIONS:
            _check_margin(key, override.get("margin", 0.0))
            continue
        question = QUESTIONS[key]
        if "primary" in override and not (isinstance(override["primary"], str) and any(
                re.fullmatch(p, override["primary"]) for p in question.primaries)):
            allowed = ", ".join(m.name for m in question.candidates)
            raise ValueError(f"claims.{key}.primary = {override['primary']!r} does not answer {key}; choose among "
                             f"{allowed}.")
        _check_margin(key, override.get("margin", 0.0))


def _check_margin(key: str, margin) -> None:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin < 0:
        raise ValueError(f"claims.{key}.margin = {margin!r} is out of range; it must be a number >= 0 (in the "
                         "primary measure's units, e.g. 0.02 accuracy).")


def questions(overrides: dict | None = None) -> list[Question]:
    """The questions with a recipe's `claims:` overrides applied (checked by `check_claims_section`)."""
    overrides = overrides or {}
    check_claims_section(overrides)
    return [dataclasses.replace(q, **overrides.get(key, {})) for key, q in QUESTIONS.items()]


def interval_rule() -> str:
    return ("change = head − backbone at the head's output tap; 95% interval: with several seeds the wider of a "
            "hierarchical bootstrap (seeds drawn with replacement and test images resampled together, the "
            "backbone on the same images) and a t interval over the per-seed changes; with one seed a paired "
            "bootstrap over test images only (it does not cover retraining); without per-image values the t "
            "interval over seeds, else none")


def answer_rule(question: Question) -> str:
    m, family = question.margin, question.family
    if question.kind == EQUIVALENCE:
        return (f"equivalent: the 95% interval lies inside ±{m:g}; lost: below −{m:g}; gained: above +{m:g} "
                f"(each resolved at α = 0.05 after Holm across this question's {family}); undecided otherwise")
    side = "lower" if question.predicted < 0 else "higher"
    beyond = f" by more than {m:g}" if m else ""
    return (f"yes: {question.subject} reads {side}{beyond}, resolved (95% interval, α = 0.05 after Holm across "
            f"this question's {family}); no: resolved the other way; undecided otherwise")


def question_entry(question: Question, override: dict | None = None, rule: str | None = None) -> dict:
    """A question's record before its answers: asks, primary, kind, predicted, margin, interval_rule (`rule`, by
    default `interval_rule()`), answer_rule and the recipe's override where there is one."""
    predicted = "no change" if question.predicted == 0 else \
        f"{'lower' if question.predicted < 0 else 'higher'} at {question.subject}"
    entry = {"asks": question.asks, "primary": question.primary, "kind": question.kind, "predicted": predicted,
             "margin": question.margin, "interval_rule": rule or interval_rule(), "answer_rule": answer_rule(question)}
    return entry | ({"override": dict(override)} if override else {})


def decide(question: Question, change) -> tuple[str, float | None]:
    """(the answer this head's interval points to, its p-value), before the Holm correction."""
    c, m = change.change, question.margin
    if change.p_value() is None:
        return "undecided", None
    if question.kind == EQUIVALENCE:
        if c < -m:
            return "lost", change.p_value(-m)
        if c > m:
            return "gained", change.p_value(m)
        return "equivalent", max(change.p_value(-m), change.p_value(m))
    d = question.predicted
    if d * c > m:
        return "yes", change.p_value(d * m)
    if d * c < -m:
        return "no", change.p_value(-d * m)
    return "undecided", 1.0


def secondary_measures(question: Question, names: list[str]) -> list[str]:
    """The names among `names` of the measures shown with the question (its `secondary` patterns, in their order),
    its primary left out."""
    out: list[str] = []
    names = [n for n in names if n != question.primary]
    for pattern in question.secondary:
        out += [n for n in names if re.fullmatch(pattern, n) and n not in out]
    return out


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def metric_change(taps: Mapping[str, TapMeasures], resamples: Mapping[str, Resamples], tap: str, metric: str,
                  seed: int = 0) -> Change | None:
    """`retraining.Change` of `metric` from the backbone to `tap`, or None when either tap lacks it. A tap probed
    per seed (`TapMeasures.seeds`) uses each seed's value and per-unit statistic; where the backbone was tuned per
    seed too, each seed's head is compared with its own."""
    from .retraining import change_interval

    b, measured = taps["backbone"].metrics.get(metric), taps[tap]
    if not _finite(b) or not _finite(measured.metrics.get(metric)):
        return None
    seeds = measured.seeds
    values = [seeds[s].metrics.get(metric) for s in seeds]
    b_stat = taps["backbone"].per_unit.get(metric)
    if len(seeds) > 1 and all(_finite(v) for v in values):
        stats = [seeds[s].per_unit.get(metric) for s in seeds]
        own = taps["backbone"].seeds
        if own:  # the paper's regime: each seed's head against the backbone tuned with it
            b = [own[s].metrics.get(metric) for s in seeds]
            if not all(_finite(v) for v in b):
                return None
            b_stat = [own[s].per_unit.get(metric) for s in seeds]
            b_stat = b_stat if all(x is not None for x in b_stat) else None
    else:
        values, stats = [measured.metrics[metric]], [measured.per_unit.get(metric)]
    return change_interval(b, values, b_stat, stats if all(x is not None for x in stats) else None, resamples, seed)


def apply_holm(heads: dict[str, HeadAnswer], p_values: dict[str, float]) -> dict[str, HeadAnswer]:
    """Holm's correction across one family of answers (the heads, or the arms, of one question; never across
    questions or metrics): `heads` with each answer of `p_values`' keys given its p_holm, and "undecided" where
    p_holm ≥ α."""
    from headprobe.stats.bootstrap import ALPHA, holm

    out = dict(heads)
    for head, p_holm in holm(p_values).items():
        out[head] = dataclasses.replace(out[head], p_holm=p_holm,
                                        **({"answer": "undecided"} if p_holm >= ALPHA else {}))
    return out


def _with_lines(question: Question, heads: dict[str, HeadAnswer]) -> dict[str, HeadAnswer]:
    """Each answer with its sentence (`answer_line`)."""
    return {head: dataclasses.replace(a, line=answer_line(question, head, a.to_record())) for head, a in heads.items()}


def answer_heads(question: Question, measured: dict[str, dict]) -> dict[str, HeadAnswer]:
    """Each head's (or arm's) answer to one question from its primary's change, `decide` then `apply_holm` across
    them all, as `answer_questions` answers a run's heads. measured: {head: {"tap": the tap compared, "change": the
    primary's `retraining.Change` or None (not measured), "secondary": {metric: Change.record()}}} -> {head:
    `HeadAnswer`}; a head whose primary was not measured answers NOT_MEASURED (left out when it has no secondary
    measure either)."""
    heads, p_values = {}, {}
    for head, item in measured.items():
        change, secondary = item["change"], item.get("secondary") or {}
        if change is None:  # no answer; the secondary measures are still shown
            if secondary:
                heads[head] = HeadAnswer(item["tap"], NOT_MEASURED, secondary)
            continue
        answer, p = decide(question, change)
        heads[head] = HeadAnswer(item["tap"], answer, secondary, change, p)
        if p is not None:
            p_values[head] = p
    return _with_lines(question, apply_holm(heads, p_values))


def answer_questions(taps: Mapping[str, TapMeasures], resamples: Mapping[str, Resamples], compared: dict[str, str],
                     overrides: dict | None = None, seed: int = 0, nulls: dict[str, str] | None = None,
                     null_heads: tuple[str, ...] = ()) -> dict[str, QuestionAnswers]:
    """{question: `QuestionAnswers`} (`to_record()` of each is results.json["claims"][question]): per question its
    primary, margin, rules and, per head (compared: {head: the tap it is compared at}), a `HeadAnswer`: the
    primary change with its interval, p, p_holm, the answer, its one-line sentence and the secondary measures'
    changes (a head without the primary: answer NOT_MEASURED and its secondary measures).
    taps: {tap: TapMeasures} (`stats.measures`: a run's, or `tap_measures` of a finished run's results.json);
    resamples: {unit: Resamples} shared by every tap; seed: the seeds' bootstrap draws; nulls: {head: its null
    head}; null_heads: the heads that are nulls (`recipe.null_heads`).

    A head with a null also gets `vs_null`, its change against the null's (`stats.against_null`), and a direction
    question is decided on that (`decided_on`): "more invariant" means more invariant than the same head untrained.
    The equivalence question stays decided on head − backbone (it asks what the backbone's information became) and
    shows the change against the null beside it. The null heads are answered too, as a family of their own for Holm."""
    from headprobe.stats.against_null import change_against

    nulls = {h: n for h, n in (nulls or {}).items() if h in compared and n in compared}
    null_heads = set(null_heads) | set(nulls.values())

    out = {}
    for question in questions(overrides):
        heads, p_values = {}, {}
        for head, tap in compared.items():
            if tap not in taps or "backbone" not in taps:
                continue
            secondary = {m: c.record() for m in secondary_measures(question, list(taps[tap].metrics))
                         if (c := metric_change(taps, resamples, tap, m, seed))}
            change = metric_change(taps, resamples, tap, question.primary, seed)
            if change is None:  # no answer; the secondary measures are still shown
                if secondary:
                    heads[head] = HeadAnswer(tap, NOT_MEASURED, secondary)
                continue
            answer, p = decide(question, change)
            decided_on, vs_null = "head − backbone", None
            against = (change_against(taps, resamples, tap, compared[nulls[head]], question.primary, seed)
                       if head in nulls else None)
            if against is not None:
                vs_answer, vs_p = decide(question, against)
                vs_null = NullAnswer(nulls[head], compared[nulls[head]], against, vs_answer, vs_p)
                if question.kind == DIRECTION:
                    answer, p, decided_on = vs_answer, vs_p, "head − null"
            elif head in nulls:
                vs_null = NullAnswer(nulls[head], unavailable=f"{question.primary} not at both taps")
            heads[head] = HeadAnswer(tap, answer, secondary, change, p, decided_on=decided_on,
                                     is_null=head in null_heads, vs_null=vs_null)
            if p is not None:
                p_values[head] = p
        for family in ({h: p for h, p in p_values.items() if h not in null_heads},
                       {h: p for h, p in p_values.items() if h in null_heads}):
            heads = apply_holm(heads, family)
        heads = _with_lines(question, heads)
        not_measured = (f"{question.primary} was not measured at the backbone and a head's output; add the probe "
                        "that measures it to the recipe"
                        if all(a.answer == NOT_MEASURED for a in heads.values()) else None)
        out[question.key] = QuestionAnswers(**question_entry(question, (overrides or {}).get(question.key)),
                                            heads=heads, not_measured=not_measured)
    return out
