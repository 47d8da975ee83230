"""Claims 3 and 4 as declared questions, answered per head with an interval (results.json["claims"], beside the
buffer questions of `stats.claims`).

- **Q-split** (claim 3) "Is the effective Hessian's M-term zero for piecewise-linear heads, and not for smooth
  ones?" Primary: ‖M‖_F/‖H_eff‖_F (`geometry.split_share`) with BatchNorm on batch statistics, as in the training
  step, per evaluation batch of the run's trained heads (every seed). Each head's structure predicts "M = 0" (no
  smooth activation, no L2 output, no BatchNorm on batch statistics) or "M > 0" (`split_share.predicts_zero_m`):
  a ReLU+BN head on batch statistics is predicted M > 0. Answer: "M = 0" when the 95% interval's upper end is
  ≤ the margin, "M > 0" when its lower end is above it, "undecided" otherwise; the line says whether it is the
  predicted one. Interval: the two-stage cluster bootstrap of the mean over seeds and batches
  (`stats.clustered`); with one seed, over the evaluation batches only (said so).
- **Q-saddle** (claim 4) "Is collapse a strict saddle only for smooth heads?" Primary: the proportion of
  constructed collapsed states (`geometry.saddle`) with λ_min < −bound, under the paper's SimSiam loss; secondary:
  the same under the target loss, where only the head's M-term can make λ_min negative. Per head "saddle" when the
  interval lies above one half (most collapsed states), "not a saddle" when below, "undecided" otherwise; and the
  smooth (Swish, GELU) − piecewise-linear (linear, ReLU) difference: "yes" when its interval lies above the
  margin, "no" when below, "undecided" otherwise. Interval: the envelope of Wilson at the design-effect size and
  the cluster bootstrap over seeds (Newcombe's interval and the paired bootstrap for the difference). Each
  BatchNorm arm (`geometry.saddle.ARMS`) is answered on its own, under "relu" (no BatchNorm), "relu+bn_head",
  "relu+bn_predictor", "relu+bn_both" (and the difference "smooth − piecewise-linear+bn_head", ...), with the
  head BatchNorm's own share of vᵀMv and of λ_min (`geometry.bn_share`); the target loss has no predictor, so its
  secondary answer for a predictor arm is the arm with the same head BatchNorm.

>>> Q_SPLIT.margin, Q_SADDLE.primary
(1e-06, 'negative_share.simsiam')
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from headprobe.stats.geometry_answers import GeometryAnswers, SaddleAnswer, SplitAnswer

# Where most collapsed states are strict saddles: a head type "is a saddle at collapse".
MAJORITY = 0.5
DIFFERENCE = "smooth − piecewise-linear"
PAPER_COUNTS = ("the paper: λ_min < 0 in 72/100 epochs (Swish, collapsed start), 69/100 (Swish, normal start), "
                "1/100 (ReLU, collapsed start), over 3 seeds (PAPER.md)")


@dataclass(frozen=True)
class GeometryQuestion:
    """key: "Q-split"; claim: the paper's claim number; asks: the question; primary: the measure answering it;
    measure: what that measure is; margin: in its units; regime: what it is measured on. `help` and `usage` are
    what `headprobe list questions` prints (the registry's declaration)."""

    key: str
    claim: int
    asks: str
    primary: str
    measure: str
    margin: float
    regime: str

    @property
    def name(self) -> str:
        return self.key

    @property
    def usage(self) -> str:
        return self.key

    @property
    def help(self) -> str:
        return (f"claim {self.claim}: {self.asks} primary {self.primary} ({self.measure}); margin {self.margin:g}; "
                f"{self.regime}")

    needs: tuple[str, ...] = ()
    options: None = None


Q_SPLIT = GeometryQuestion(
    "Q-split", 3, "Is the M-term zero for linear and ReLU heads and not for smooth heads?", "m_share.batch",
    "‖M‖_F/‖H_eff‖_F, BatchNorm on batch statistics", 1e-6,
    "the run's trained heads, every seed, on evaluation batches of its cached views (geometry.final)")
Q_SADDLE = GeometryQuestion(
    "Q-saddle", 4, "Is collapse a strict saddle only for smooth heads?", "negative_share.simsiam",
    "share of collapsed states with λ_min < −bound, SimSiam loss", 0.25,
    "constructed collapsed states of tiny heads, 50 per seed × 3 seeds per head type and BatchNorm arm (none, in "
    "the head, in the predictor, both; geometry.saddle_arms)")


# What a recipe's `claims:` may set for a geometry question (`stats.claims.check_claims_section` checks it).
GEOMETRY_OVERRIDABLE = ("margin",)


def with_override(question: GeometryQuestion, section: dict | None) -> tuple[GeometryQuestion, tuple[str, dict]]:
    """The question with the recipe's `claims: {KEY: {margin: m}}` applied, and (key, that override) to record."""
    override = dict((section or {}).get(question.key) or {})
    return (dataclasses.replace(question, **override) if override else question), (question.key, override)


@dataclass(frozen=True)
class SplitMeasure:
    """One head's Q-split values: {seed: the share per evaluation batch} with BatchNorm on batch statistics
    (`batch`) and on running statistics (`running`), and what its structure predicts in each mode."""

    head: str
    batch: dict[int, list[float]]
    running: dict[int, list[float]]
    predicted_zero_batch: bool
    predicted_zero_running: bool


def _mean_interval(by_seed: dict[int, list[float]], seed: int) -> dict:
    from headprobe.stats.clustered import cluster_bootstrap  # torch: on use, not when `list` reads the questions

    clusters = [values for values in by_seed.values() if values]
    values = [v for c in clusters for v in c]
    return {"value": statistics.fmean(values), "ci95": list(cluster_bootstrap(clusters, seed=seed)),
            "max": max(values), "n_seeds": len(clusters), "n_units": len(values) // len(clusters),
            "unit": "evaluation batches",
            "interval": ("cluster bootstrap over seeds and batches" if len(clusters) > 1
                         else "evaluation batches only (one seed: it does not cover retraining)")}


def _split_answer(record: dict, margin: float) -> str:
    low, high = record["ci95"]
    return "M = 0" if high <= margin else "M > 0" if low > margin else "undecided"


def answer_split(measures: Sequence[SplitMeasure], question: GeometryQuestion = Q_SPLIT,
                 seed: int = 0) -> GeometryAnswers:
    """Q-split's answers from each head's `SplitMeasure`."""
    heads = {}
    for m in measures:
        interval, running = _mean_interval(m.batch, seed), _mean_interval(m.running, seed)
        running_answer = SplitAnswer(running, _split_answer(running, question.margin),
                                     "M = 0" if m.predicted_zero_running else "M > 0")
        answer = SplitAnswer(interval, _split_answer(interval, question.margin),
                             "M = 0" if m.predicted_zero_batch else "M > 0", running_answer)
        heads[m.head] = dataclasses.replace(answer, line=split_line(question, m.head, answer))
    return GeometryAnswers(question, "mean over evaluation batches; 95% two-stage cluster bootstrap over seeds and "
                           "batches (batches only with one seed)",
                           "M = 0: the 95% interval's upper end ≤ the margin; M > 0: its lower end above it; "
                           "undecided otherwise; predicted from the head's structure", heads)


def _number(value: float) -> str:
    return f"{value:.3g}".replace("-", "−")


def split_line(question: GeometryQuestion, head: str, answer: SplitAnswer) -> str:
    """"Q-split: relu head ‖M‖_F/‖H_eff‖_F, BatchNorm on batch statistics: 0 [0, 0], 3 seeds × 8 evaluation
    batches — M = 0 (predicted M = 0)"."""
    record = answer.interval
    low, high = record["ci95"]
    seeds = f"{record['n_seeds']} seed{'s' if record['n_seeds'] != 1 else ''}"
    verdict = "as predicted" if answer.answer == answer.predicted else f"predicted {answer.predicted}"
    return (f"{question.key}: {head} head {question.measure}: {_number(record['value'])} [{_number(low)}, "
            f"{_number(high)}], {seeds} × {record['n_units']} {record['unit']} — {answer.answer} ({verdict})")


def _arm(state) -> str:
    return getattr(state, "arm", "none")


def _collapsed_by_seed(states, head: str | Sequence[str], arm: str = "none") -> list[list[float]]:
    """0/1 (λ_min < −bound) of the collapsed states of `head` (or of several head types pooled) in BatchNorm arm
    `arm`, one list per seed, seeds in order; seeds without a collapsed state are left out."""
    names = (head,) if isinstance(head, str) else tuple(head)
    seeds = sorted({s.seed for s in states})
    clusters = [[float(s.negative) for s in states
                 if s.seed == seed and s.head in names and _arm(s) == arm and s.collapsed] for seed in seeds]
    return [c for c in clusters if c]


def _median_ratio(numerators: list[float], denominators: list[float]) -> float | None:
    ratios = [a / b for a, b in zip(numerators, denominators, strict=True) if b != 0]
    return statistics.median(ratios) if ratios else None


def _saddle_answer(states, head: str, arm: str, threshold: float, seed: int) -> SaddleAnswer | None:
    clusters = _collapsed_by_seed(states, head, arm)
    if not clusters:
        return None
    from headprobe.stats.clustered import proportion_interval

    own = [s for s in states if s.head == head and _arm(s) == arm]
    collapsed = [s for s in own if s.collapsed]
    bn = [getattr(s, "rayleigh_head_bn", 0.0) for s in collapsed]
    interval = proportion_interval(clusters, seed=seed)
    low, high = interval["ci95"]
    counts = {"n_negative": int(sum(map(sum, clusters))), "n_collapsed": len(collapsed), "n_states": len(own),
              "n_seeds": len(clusters), "n_units": len(collapsed) // len(clusters), "unit": "collapsed states",
              "lambda_min_median": statistics.median(s.lambda_min for s in collapsed),
              "lambda_max_median": statistics.median(s.lambda_max for s in collapsed),
              "bound_max": max(s.bound for s in collapsed),
              "rayleigh_head_median": statistics.median(s.rayleigh_head for s in collapsed),
              "arm": arm, "rayleigh_head_bn_median": statistics.median(bn),
              "rayleigh_head_act_median": statistics.median(getattr(s, "rayleigh_head_act", s.rayleigh_head)
                                                            for s in collapsed),
              # The head's BatchNorm's share of its M-term (vᵀM_bn v / vᵀMv) and of λ_min (vᵀM_bn v / λ_min).
              "head_bn_share_of_m_median": _median_ratio(bn, [s.rayleigh_head for s in collapsed]),
              "head_bn_share_of_lambda_min_median": _median_ratio(bn, [s.lambda_min for s in collapsed]),
              "lambda_ratio_median": _median_ratio([s.lambda_min for s in collapsed],
                                                   [s.lambda_max for s in collapsed]),
              "interval": "Wilson at n/deff and cluster bootstrap over seeds, their envelope"}
    answer = "saddle" if low > threshold else "not a saddle" if high < threshold else "undecided"
    return SaddleAnswer(interval, answer, counts)


def _difference(states, arm: str, margin: float, seed: int) -> SaddleAnswer | None:
    smooth, linear = (_collapsed_by_seed(states, group, arm) for group in (("swish", "gelu"), ("linear", "relu")))
    if not smooth or not linear or len(smooth) != len(linear):
        return None
    from headprobe.stats.clustered import difference_interval

    interval = difference_interval(smooth, linear, seed=seed)
    low, high = interval["ci95"]
    counts = {"n_seeds": len(smooth), "n_units": sum(map(len, smooth)) // len(smooth),
              "unit": "collapsed smooth-head states",
              "interval": "Newcombe (Wilson at n/deff) and paired cluster bootstrap over seeds, their envelope"}
    return SaddleAnswer(interval, "yes" if low > margin else "no" if high < margin else "undecided", counts)


def answer_saddle(states_by_loss: Mapping[str, Sequence], sizes: str, question: GeometryQuestion = Q_SADDLE,
                  seed: int = 0) -> GeometryAnswers:
    """Q-saddle's answers from {loss: [SaddleState]} ("simsiam" the primary, "target" secondary); `sizes` says what
    was constructed (`SaddleSpec.sizes`). The states are kept with the answers (results.json: their records under
    "states")."""
    primary = question.primary.split(".")[-1]
    cells = list(dict.fromkeys((s.head, _arm(s)) for s in states_by_loss[primary]))
    arms = list(dict.fromkeys(arm for _, arm in cells))
    available = {loss: {_arm(s) for s in states} for loss, states in states_by_loss.items()}
    heads = {}
    for head, arm in [*cells, *((DIFFERENCE, arm) for arm in arms)]:
        name = head if arm == "none" else f"{head}+{arm}"
        per_loss = {loss: (_difference(states, _loss_arm(arm, available[loss]), question.margin, seed)
                           if head == DIFFERENCE
                           else _saddle_answer(states, head, _loss_arm(arm, available[loss]), MAJORITY, seed))
                    for loss, states in states_by_loss.items()}
        if per_loss.get(primary) is None:
            continue
        answer = per_loss.pop(primary)
        secondary = {f"negative_share.{loss}": dataclasses.replace(r, line=saddle_line(question, name, r,
                                                                                        loss))
                     for loss, r in per_loss.items() if r is not None}
        lines = [saddle_line(question, name, answer, primary)]
        lines += [r.line.split(": ", 1)[1] for r in secondary.values()]
        heads[name] = dataclasses.replace(answer, secondary=secondary, line="; ".join(lines))
    return GeometryAnswers(
        question,
        "collapsed states grouped by seed: the envelope of Wilson at the effective size n/deff (Kish's design effect, "
        "ANOVA intra-seed correlation) and the two-stage cluster bootstrap over seeds; the difference: Newcombe's "
        "hybrid score interval and the paired cluster bootstrap",
        f"per head: saddle when the 95% interval lies above {MAJORITY:g}, not a saddle when below, undecided "
        f"otherwise; {DIFFERENCE}: yes when its interval lies above {question.margin:g}, no when below, undecided "
        "otherwise", heads, sizes=sizes, paper=PAPER_COUNTS, states=dict(states_by_loss))


def _loss_arm(arm: str, available: set[str]) -> str:
    """The arm a secondary loss answers `arm` with: the same, or, where that loss has no predictor (the target
    loss), the arm with the same head BatchNorm ("bn_both" → "bn_head", "bn_predictor" → "none")."""
    if arm in available:
        return arm
    return "bn_head" if arm == "bn_both" else "none"


def saddle_line(question: GeometryQuestion, head: str, answer: SaddleAnswer, loss: str) -> str:
    """"Q-saddle: swish head, simsiam loss: 148/150 collapsed states with λ_min < −bound, 0.987 [0.93, 1], 3 seeds
    — saddle"; the difference line gives the difference of the two proportions. A head's recorded line appends its
    secondary losses' (after "; ")."""
    low, high = answer.interval["ci95"]
    counts = answer.counts
    interval = f"{_number(answer.interval['value'])} [{_number(low)}, {_number(high)}], {counts['n_seeds']} seeds"
    if head.startswith(DIFFERENCE):
        return f"{question.key}: {head}, {loss} loss: {interval} — {answer.answer}"
    return (f"{question.key}: {head} head, {loss} loss: {counts['n_negative']}/{counts['n_collapsed']} collapsed "
            f"states with λ_min < −bound, {interval} — {answer.answer}")
