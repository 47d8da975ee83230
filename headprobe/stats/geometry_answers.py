"""The geometry questions' answers as typed values (`stats.geometry_claims`, `stats.whiten_claim`,
`stats.metric_claim` return them), each with the `to_record()` that the record writer serialises into
results.json["claims"], beside the buffer questions' `stats.answers`.

A question's answers (`GeometryAnswers`) hold the question as the run asked it (its margin after the recipe's
override), the rules, one answer per head and what the question records of its own (the trends, the sizes, the
states). A head's answer is one of `WhitenAnswer` (Q-whiten), `MetricAnswer` and `TrendAnswer` (Q-metric),
`SplitAnswer` (Q-split) and `SaddleAnswer` (Q-saddle, a head type or the smooth − piecewise-linear difference).
Their intervals stay the records `stats.clustered` makes (value, ci95 and how); only `to_record()` knows the layout
of results.json (docs/reference.md), so a finished run's file is read as dicts, never as these types.

>>> list(SplitAnswer({"value": 0.0, "ci95": [0.0, 0.0]}, "M = 0", "M = 0", line="Q-split: ...").to_record())
['value', 'ci95', 'answer', 'predicted', 'line']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from headprobe.stats.geometry_claims import GeometryQuestion


class HeadRecord(Protocol):
    """What a geometry question's head answer offers: its answer, its sentence and its results.json record."""

    answer: str

    def to_record(self) -> dict: ...


@dataclass(frozen=True)
class SplitAnswer:
    """One head's Q-split answer in one BatchNorm mode: interval the mean's record (`geometry_claims.mean_interval`:
    value, ci95, max, n_seeds, n_units, unit, interval), answer and predicted ("M = 0" / "M > 0"), running the same
    on running statistics (the secondary), line its sentence (None for the secondary)."""

    interval: dict
    answer: str
    predicted: str
    running: SplitAnswer | None = None
    line: str | None = None

    def to_record(self) -> dict:
        """results.json["claims"]["Q-split"]["heads"][H]: the interval's keys, answer, predicted, secondary
        {"m_share.running": ...} and line, each where set."""
        out = {**self.interval, "answer": self.answer, "predicted": self.predicted}
        out |= {"secondary": {"m_share.running": self.running.to_record()}} if self.running is not None else {}
        return out | ({"line": self.line} if self.line is not None else {})


@dataclass(frozen=True)
class SaddleAnswer:
    """One head type's (or the difference's) Q-saddle answer under one loss: interval the proportion's record
    (`clustered.proportion_interval` or `difference_interval`), answer, counts the counts and medians over its
    collapsed states (n_negative, n_collapsed, ..., the interval's description), secondary {"negative_share.LOSS":
    SaddleAnswer} under the other losses (None for a secondary), line its sentence."""

    interval: dict
    answer: str
    counts: dict
    secondary: dict[str, SaddleAnswer] | None = None
    line: str | None = None

    def to_record(self) -> dict:
        """results.json["claims"]["Q-saddle"]["heads"][H]: the interval's keys, answer, the counts, secondary and
        line, each where set."""
        out = {**self.interval, "answer": self.answer, **self.counts}
        if self.secondary is not None:
            out["secondary"] = {loss: answer.to_record() for loss, answer in self.secondary.items()}
        return out | ({"line": self.line} if self.line is not None else {})


@dataclass(frozen=True)
class WhitenAnswer:
    """One linear head's Q-whiten answer: change the trained − init isotropy error's record (value, ci95, interval),
    trained and init their own {value, ci95}, per_seed {seed: {trained, init}}, the counts, the ranks r_i seen,
    captured (every block captured H_i), premise (`whiten_claim.premise` over every batch), answer, line."""

    change: dict
    trained: dict
    init: dict
    per_seed: dict[str, dict]
    n_seeds: int
    n_units: int
    unit: str
    rank: list[int]
    captured: bool
    premise: dict
    answer: str
    line: str = ""

    def to_record(self) -> dict:
        """results.json["claims"]["Q-whiten"]["heads"][H]."""
        return {**self.change, "trained": self.trained, "init": self.init, "per_seed": self.per_seed,
                "n_seeds": self.n_seeds, "n_units": self.n_units, "unit": self.unit, "rank": self.rank,
                "captured": self.captured, "premise": self.premise, "answer": self.answer, "line": self.line}


@dataclass(frozen=True)
class MetricAnswer:
    """One head's Q-metric answer: summary the adaptation's record (`metric_claim.summary`), answer, secondary
    {measure: record} (the distance with its change, the adaptation at init, ...), the head's arch, whether its
    Jacobian is constant, the ranks seen, line."""

    summary: dict
    answer: str
    secondary: dict[str, dict]
    arch: dict
    constant_jacobian: bool
    rank: list[int]
    line: str = ""

    def to_record(self) -> dict:
        """results.json["claims"]["Q-metric"]["heads"][H]."""
        return {**self.summary, "answer": self.answer, "secondary": self.secondary, "arch": self.arch,
                "constant_jacobian": self.constant_jacobian, "rank": self.rank, "line": self.line}


@dataclass(frozen=True)
class TrendAnswer:
    """One Q-metric trend: summary the slope's record, answer, what varies ("depth" / "width"), heads {head: its
    level}, per (what one step of the level is), unit, line."""

    summary: dict
    answer: str
    varying: str
    heads: dict[str, int]
    per: str
    unit: str
    line: str = ""

    def to_record(self) -> dict:
        """results.json["claims"]["Q-metric"]["heads"][TREND] (unit in the summary's place, as the trend's own)."""
        return {**self.summary, "answer": self.answer, "varying": self.varying, "heads": self.heads,
                "per": self.per, "unit": self.unit, "line": self.line}


@dataclass(frozen=True)
class GeometryAnswers:
    """One geometry question's answers: the question as asked (its margin after the recipe's override), the
    interval and answer rules, heads {head: answer}, and where the question has them: trends (Q-metric's trend
    names, answered among the heads), sizes (what was evaluated), paper (the paper's counts), states {loss: the
    constructed states, each with `.record()`}, time_s, override (the recipe's `claims:` entry)."""

    question: GeometryQuestion
    interval_rule: str
    answer_rule: str
    heads: Mapping[str, HeadRecord]
    trends: tuple[str, ...] | None = None
    sizes: str | None = None
    paper: str | None = None
    states: Mapping[str, Sequence[Any]] | None = None
    time_s: float | None = None
    override: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.question.key

    def to_record(self) -> dict:
        """results.json["claims"][Q]: asks, claim, primary, measure, kind, margin, regime, trends, interval_rule,
        answer_rule, heads, sizes, paper, states, time_s, override, each where set."""
        q = self.question
        out = {"asks": q.asks, "claim": q.claim, "primary": q.primary, "measure": q.measure, "kind": "value",
               "margin": q.margin, "regime": q.regime}
        out |= {"trends": list(self.trends)} if self.trends is not None else {}
        out |= {"interval_rule": self.interval_rule, "answer_rule": self.answer_rule,
                "heads": {head: answer.to_record() for head, answer in self.heads.items()}}
        out |= {"sizes": self.sizes} if self.sizes is not None else {}
        out |= {"paper": self.paper} if self.paper is not None else {}
        if self.states is not None:
            out["states"] = {loss: [s.record() for s in states] for loss, states in self.states.items()}
        out |= {"time_s": self.time_s} if self.time_s is not None else {}
        return out | ({"override": self.override} if self.override else {})


def geometry_record(answers: Mapping[str, GeometryAnswers]) -> dict:
    """results.json["claims"] entries of the geometry questions: {question: `GeometryAnswers.to_record()`}."""
    return {key: question.to_record() for key, question in answers.items()}
