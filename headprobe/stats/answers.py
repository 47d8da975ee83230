"""The answers to the paper's questions as typed values (`stats.claims.answer_questions` returns them), each with the
`to_record()` that the record writer serialises into results.json["claims"].

A question's answers (`QuestionAnswers`) hold its entry (what it asks, its primary measure, margin and rules) and
one `HeadAnswer` per head: the primary's change (`stats.retraining.Change`, None where it was not measured), the
answer, its p before and after Holm's correction, the secondary measures' change records, what the answer was
decided on, and against the head's null (`NullAnswer`). Statistics compute these; only `to_record()` knows the
layout of results.json (docs/reference.md), so a finished run's file is read as dicts, never as these types.

>>> list(HeadAnswer("h", "not measured", line="Q-aug: h head: rotation.acc was not measured").to_record())
['tap', 'answer', 'secondary', 'line']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headprobe.stats.retraining import Change


@dataclass(frozen=True)
class NullAnswer:
    """A head's primary change against its null head (`stats.against_null.change_against`): null the null head's
    name, tap the null's tap, change its `Change` (None: not measured at both taps, `unavailable` says why), and the
    answer and p that change points to (`claims.decide`)."""

    null: str
    tap: str | None = None
    change: Change | None = None
    answer: str | None = None
    p: float | None = None
    unavailable: str | None = None

    def to_record(self) -> dict:
        """results.json["claims"][Q]["heads"][H]["vs_null"]: the change's record with `null_value` for `backbone`
        (`against_null.null_record`), the answer and p; or {"null", "unavailable"}."""
        if self.change is None:
            return {"null": self.null, "unavailable": self.unavailable}
        from headprobe.stats.against_null import null_record

        return null_record(self.change, self.null, self.tap) | {"answer": self.answer, "p": self.p}


@dataclass(frozen=True)
class HeadAnswer:
    """One head's (or arm's) answer to one question: tap the tap compared; answer ("yes", "no", "equivalent",
    "lost", "gained", "undecided" or "not measured"); secondary {metric: `Change.record()`} of the measures shown
    with it; change the primary's `Change` (None: not measured); p before and p_holm after Holm's correction across
    the question's heads; decided_on "head − backbone" or "head − null" (None where the caller does not say, as
    `claims.answer_heads`); is_null for a null head; vs_null its change against its null; line its sentence
    (`answer_text.answer_line`)."""

    tap: str
    answer: str
    secondary: dict[str, dict] = field(default_factory=dict)
    change: Change | None = None
    p: float | None = None
    p_holm: float | None = None
    decided_on: str | None = None
    is_null: bool = False
    vs_null: NullAnswer | None = None
    line: str = ""

    @property
    def ci95(self) -> list[float] | None:
        return self.change.ci95 if self.change is not None else None

    @property
    def n_seeds(self) -> int | None:
        return self.change.n_seeds if self.change is not None else None

    def to_record(self) -> dict:
        """results.json["claims"][Q]["heads"][H]: tap, the change's record (backbone, head, change, ci95, interval,
        how, n_seeds, n_units, unit, per_seed_change, per_seed_backbone), answer, p, p_holm, secondary, decided_on,
        is_null, vs_null, line — each where it is set; a head not measured: tap, answer, secondary, line."""
        if self.change is None:
            return {"tap": self.tap, "answer": self.answer, "secondary": self.secondary, "line": self.line}
        out = {"tap": self.tap, **self.change.record(), "answer": self.answer, "p": self.p, "p_holm": self.p_holm,
               "secondary": self.secondary}
        out |= {"decided_on": self.decided_on} if self.decided_on is not None else {}
        out |= {"is_null": True} if self.is_null else {}
        out |= {"vs_null": self.vs_null.to_record()} if self.vs_null is not None else {}
        return out | {"line": self.line}


@dataclass(frozen=True)
class QuestionAnswers:
    """One question's answers: its entry (`claims.question_entry`: asks, primary, kind, predicted, margin,
    interval_rule, answer_rule, the recipe's override or None), heads {head: HeadAnswer}, and not_measured (why no
    head was answered) or None."""

    asks: str
    primary: str
    kind: str
    predicted: str
    margin: float
    interval_rule: str
    answer_rule: str
    heads: dict[str, HeadAnswer]
    override: dict | None = None
    not_measured: str | None = None

    def to_record(self) -> dict:
        """results.json["claims"][Q]: asks, primary, kind, predicted, margin, interval_rule, answer_rule, override
        (where there is one), heads {head: `HeadAnswer.to_record()`}, not_measured (where set)."""
        out = {"asks": self.asks, "primary": self.primary, "kind": self.kind, "predicted": self.predicted,
               "margin": self.margin, "interval_rule": self.interval_rule, "answer_rule": self.answer_rule}
        out |= {"override": self.override} if self.override else {}
        out["heads"] = {head: answer.to_record() for head, answer in self.heads.items()}
        return out | ({"not_measured": self.not_measured} if self.not_measured is not None else {})


def claims_record(answers: Mapping[str, QuestionAnswers]) -> dict:
    """results.json["claims"] of `stats.claims.answer_questions`' answers: {question: `QuestionAnswers.to_record()`}
    (what `record.writer.RecordWriter.put` writes of them: `_serialised`)."""
    return {key: question.to_record() for key, question in answers.items()}
