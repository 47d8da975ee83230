"""Claim 2 as a declared question, answered per head with an interval, and its depth and width trends
(results.json["claims"]["Q-metric"]).

**Q-metric** "Does a nonlinear head adapt its local metric to the one the loss asks for, and how do depth and width
change how far it is?" ("Nonlinear heads adapt a local metric; a constant W cannot be isotropic everywhere when
the loss metric is curved. Depth/width limit how well an MLP approximates the ideal metric", PAPER.md claim 2.)
The measures are `geometry.local_metric`'s, per sampled sample i of each evaluation batch: the distance d_i of
the head's local metric G_i = J_iᵀ (∂²L/∂h_i²) J_i from the metric the loss asks for (isotropic on the r_i
directions the loss sees: claim 1's target at every z), and the adaptation a_i = d_i(J_j) − d_i(J_i), how much
closer the head's own Jacobian at z_i brings it than its Jacobian at another image z_j. A head with the same
Jacobian everywhere (linear, or one affine layer) has a_i = 0 exactly: the null by construction.

- **Per head** (primary `metric_adaptation` of the trained head, mean over rows, then batches and seeds): "adapts"
  when the 95% interval lies above the margin, "does not adapt" when below it, "undecided" otherwise. Beside it
  (secondary) `metric_distance` trained and at initialisation (the head rebuilt at the weights it started from, as
  Q-whiten does) and its change trained − init: "closer" (interval below −margin), "farther" (above +margin),
  "unchanged" (inside ±margin), "undecided"; the adaptation at initialisation; `loss_metric_change` (how much
  the loss metric differs between the paired samples: with a flat loss metric there is nothing to adapt to) and
  `negative_share` (of the local metric's top eigenvalues below 0: the loss's indefiniteness) as descriptions.
- **Trends** (records named "depth slope (…)" / "width slope (…)" beside the heads): among heads that differ only
  in depth (or only in hidden width, depth ≥ 2), the least-squares slope of the trained distance on depth (on
  log2 width: per doubling), per (seed, evaluation batch) — the same batches for every head —, answered by the
  closer / farther / unchanged / undecided rule with the same margin per layer (per doubling).

Interval: the wider of the two-stage cluster bootstrap over seeds and batches and the t interval over the per-seed
means (`stats.clustered.mean_interval`); with one seed, the batches only (said so).

>>> Q_METRIC.margin, Q_METRIC.primary
(0.05, 'metric_adaptation')
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from headprobe.stats.geometry_answers import GeometryAnswers, MetricAnswer, TrendAnswer
from headprobe.stats.geometry_claims import GeometryQuestion

Q_METRIC = GeometryQuestion(
    "Q-metric", 2, "Does a nonlinear head adapt its local metric to the one the loss asks for, and how do depth "
    "and width change how far it is?", "metric_adaptation",
    "d_i(J_h(z_j)) − d_i(J_h(z_i)): the distance of the local metric J_iᵀ(∂²L/∂h_i²)J_i from isotropy on its "
    "top-r_i eigenspace with another image's Jacobian against the head's own (0 for a constant Jacobian)", 0.05,
    "the run's trained heads, every seed, against their initial weights, on evaluation batches of its cached views "
    "(geometry.final, geometry.metric_*); trends over heads that differ only in depth or width")
CHANGE_ANSWERS = ("closer", "farther", "unchanged", "undecided")


@dataclass(frozen=True)
class MetricMeasure:
    """One head's Q-metric values, each {seed: the mean over sampled rows per evaluation batch} on the same batches
    for every head: `adaptation` and `distance` of the trained head and of the head at initialisation (`*_init`),
    and the trained head's `loss_metric_change` and `negative_share`. arch: {"kind", "act", "depth", "width",
    "out_dim", "bn_hidden"} (the trends group on it); constant: the head's Jacobian is the same at every z
    (linear, or one affine layer)."""

    head: str
    adaptation: dict[int, list[float]]
    distance: dict[int, list[float]]
    adaptation_init: dict[int, list[float]] = field(default_factory=dict)
    distance_init: dict[int, list[float]] = field(default_factory=dict)
    loss_metric_change: dict[int, list[float]] = field(default_factory=dict)
    negative_share: dict[int, list[float]] = field(default_factory=dict)
    arch: dict = field(default_factory=dict)
    constant: bool = False
    ranks: tuple[int, ...] = ()


def _summary(by_seed: dict[int, list[float]], seed: int) -> dict | None:
    from headprobe.stats.clustered import mean_interval  # torch: on use, not when `list` reads the questions

    clusters = [v for _, v in sorted(by_seed.items()) if v]
    if not clusters:
        return None
    ci, how = mean_interval(clusters, seed)
    return {"value": statistics.fmean(x for c in clusters for x in c), "ci95": ci, "interval": how,
            "n_seeds": len(clusters), "n_units": len(clusters[0]), "unit": "evaluation batches"}


def change_answer(ci: list[float], margin: float) -> str:
    """closer (below −margin) / farther (above +margin) / unchanged (inside ±margin) / undecided."""
    low, high = ci
    return ("closer" if high < -margin else "farther" if low > margin else
            "unchanged" if -margin < low and high < margin else "undecided")


def _adaptation_answer(ci: list[float], margin: float) -> str:
    low, high = ci
    return "adapts" if low > margin else "does not adapt" if high < margin else "undecided"


def _paired(first: dict[int, list[float]], second: dict[int, list[float]]) -> dict[int, list[float]]:
    return {s: [a - b for a, b in zip(first[s], second[s], strict=True)] for s in first if s in second}


def _head_answer(m: MetricMeasure, question: GeometryQuestion, seed: int) -> MetricAnswer | None:
    summary = _summary(m.adaptation, seed)
    if summary is None:
        return None
    secondary = {}
    trained, init = _summary(m.distance, seed), _summary(m.distance_init, seed)
    if trained is not None:
        distance = trained | {"init": init}
        change = _summary(_paired(m.distance, m.distance_init), seed) if init is not None else None
        if change is not None:
            distance["change"] = change | {"answer": change_answer(change["ci95"], question.margin)}
        secondary["metric_distance"] = distance
    for name, values in (("metric_adaptation.init", m.adaptation_init), ("loss_metric_change", m.loss_metric_change),
                         ("negative_share", m.negative_share)):
        measured = _summary(values, seed)
        if measured is not None:
            secondary[name] = measured
    answer = MetricAnswer(summary, _adaptation_answer(summary["ci95"], question.margin), secondary, m.arch,
                          m.constant, sorted(set(m.ranks)))
    return dataclasses.replace(answer, line=metric_line(question, m.head, answer))


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def _groups(measures: list[MetricMeasure], varying: str) -> dict[str, list[MetricMeasure]]:
    """Heads that differ only in `varying` ("depth" or "width"; width only among heads with a hidden layer), keyed
    by the trend's name; groups of fewer than two distinct levels are left out."""
    groups: dict[tuple, list[MetricMeasure]] = {}
    for m in measures:
        if not m.arch or (varying == "width" and m.arch.get("depth", 1) < 2):
            continue
        key = tuple(sorted((k, v) for k, v in m.arch.items() if k != varying))
        groups.setdefault(key, []).append(m)
    out = {}
    for key, members in groups.items():
        if len({m.arch[varying] for m in members}) < 2:
            continue
        fixed = dict(key)
        bn = "+BN" if fixed.get("bn_hidden") else ""
        act = "linear" if fixed.get("kind") == "linear" else f"{fixed.get('act')}{bn}"
        other = f"depth {fixed['depth']}" if varying == "width" else f"width {fixed.get('width')}"
        out[f"{varying} slope ({act}, {other}, out {fixed.get('out_dim')})"] = members
    return out


def _trend(name: str, members: list[MetricMeasure], varying: str, question: GeometryQuestion,
           seed: int) -> TrendAnswer | None:
    def level(m: MetricMeasure) -> float:
        return float(m.arch[varying]) if varying == "depth" else math.log2(m.arch[varying])

    seeds = sorted(set.intersection(*(set(m.distance) for m in members)))
    slopes = {}
    for s in seeds:
        n = min(len(m.distance[s]) for m in members)
        slopes[s] = [_slope([level(m) for m in members], [m.distance[s][j] for m in members]) for j in range(n)]
    summary = _summary(slopes, seed)
    if summary is None:
        return None
    answer = TrendAnswer(summary, change_answer(summary["ci95"], question.margin), varying,
                         {m.head: m.arch[varying] for m in members},
                         "layer" if varying == "depth" else "doubling of the hidden width",
                         "evaluation batches (the same for every head)")
    return dataclasses.replace(answer, line=trend_line(question, name, answer))


def answer_metric(measures: list[MetricMeasure], question: GeometryQuestion = Q_METRIC,
                  seed: int = 0) -> GeometryAnswers:
    """Q-metric's answers from each head's `MetricMeasure`: one per head, then one per trend."""
    heads: dict[str, MetricAnswer | TrendAnswer] = {}
    for m in measures:
        answer = _head_answer(m, question, seed)
        if answer is not None:
            heads[m.head] = answer
    trends = []
    for varying in ("depth", "width"):
        for name, members in _groups([m for m in measures if m.head in heads], varying).items():
            trend = _trend(name, members, varying, question, seed)
            if trend is not None:
                heads[name] = trend
                trends.append(name)
    return GeometryAnswers(
        question,
        "mean over sampled rows per evaluation batch, then batches and seeds; 95%: the wider of the cluster "
        "bootstrap over seeds and batches and the t interval over the per-seed means (batches only with one seed); "
        "a trend: the least-squares slope over the group's heads per (seed, batch)",
        f"per head: adapts when the adaptation's interval lies above {question.margin:g}, does not adapt when "
        f"below, undecided otherwise; the distance's change (trained − init) and each trend's slope: closer below "
        f"−{question.margin:g}, farther above +{question.margin:g}, unchanged inside ±margin, undecided otherwise",
        heads, trends=tuple(trends))


def _number(value: float) -> str:
    return f"{value:.3g}".replace("-", "−")


def _interval(record: Mapping[str, Any]) -> str:
    low, high = record["ci95"]
    return f"{_number(record['value'])} [{_number(low)}, {_number(high)}]"


def metric_line(question: GeometryQuestion, head: str, answer: MetricAnswer) -> str:
    """"Q-metric: swish2 head adaptation 0.12 [0.08, 0.16], distance 0.31 trained vs 0.45 at init (change −0.14
    [−0.2, −0.09], closer), 3 seeds × 4 evaluation batches — adapts"."""
    record = answer.summary
    seeds = f"{record['n_seeds']} seed{'s' if record['n_seeds'] != 1 else ''}"
    distance = answer.secondary.get("metric_distance")
    text = f"{question.key}: {head} head adaptation {_interval(record)}"
    if distance is not None:
        text += f", distance {_number(distance['value'])} trained"
        if distance.get("change") is not None:
            text += (f" vs {_number(distance['init']['value'])} at init (change {_interval(distance['change'])}, "
                     f"{distance['change']['answer']})")
    null = " (one Jacobian at every z: the null, 0 by construction)" if answer.constant_jacobian else ""
    return f"{text}, {seeds} × {record['n_units']} evaluation batches — {answer.answer}{null}"


def trend_line(question: GeometryQuestion, name: str, answer: TrendAnswer) -> str:
    """"Q-metric: depth slope (swish, width 64, out 64) of the trained distance per layer: −0.05 [−0.08, −0.02]
    over depths 1/2/3 (d1, d2, d3), 3 seeds × 4 evaluation batches — closer"."""
    record = answer.summary
    levels = "/".join(str(v) for v in sorted(set(answer.heads.values())))
    seeds = f"{record['n_seeds']} seed{'s' if record['n_seeds'] != 1 else ''}"
    return (f"{question.key}: {name} of the trained distance per {answer.per}: {_interval(record)} over "
            f"{answer.varying}s "
            f"{levels} ({', '.join(answer.heads)}), {seeds} × {record['n_units']} evaluation batches — "
            f"{answer.answer}")
