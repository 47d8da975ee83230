"""What each metric of a run means: a sentence, its unit, which way is "more", and its chance level.

Each of them is what the probe that records the metric declares (`probes.declaration.Metric`, in the probe's own
module), read through the registry; this module only words them for the report. The report's glossary section and
the tooltips on metric names read `describe_metric`; the metric table and the heat-map leave out what
`is_protocol_value` names (hyper-parameters chosen on validation data and ceilings: they say how a number was
obtained, not what the tap holds), which go to a table of their own.

>>> describe_metric("knn.k20.acc", n_classes=10).chance
0.1
>>> describe_metric("rotation.acc").chance
0.25
>>> is_protocol_value("linear.C"), is_protocol_value("linear.acc")
(True, False)
"""

from __future__ import annotations

from dataclasses import dataclass

from headprobe.probes.declaration import PROTOCOL, metric_declaration

__all__ = ["MetricInfo", "describe_metric", "is_protocol_value", "metric_unit", "tooltip"]

# Metric-name endings that are protocol values (a chosen hyper-parameter, a validation score, a ceiling), for
# metrics no registered probe declares (a plug-in registered without a declaration).
PROTOCOL_SUFFIXES = ("C", "ceiling", "val_acc")


@dataclass(frozen=True)
class MetricInfo:
    """meaning: one sentence; unit: what the number counts; direction: what a higher value says; chance: the value
    with no information (None where there is no such level, e.g. ranks); note: how to read it (e.g. a caveat)."""

    meaning: str
    unit: str
    direction: str
    chance: float | None = None
    note: str = ""


def is_protocol_value(metric: str) -> bool:
    """True for protocol values recorded among the metrics: `linear.C`, `linear.val_acc`, `mi.infonce.ceiling` (what
    their probes declare; for an undeclared metric, its name's ending)."""
    found = metric_declaration(metric)
    if found is None:
        return metric.rsplit(".", 1)[-1] in PROTOCOL_SUFFIXES
    return found[0].role == PROTOCOL


def describe_metric(metric: str, n_classes: int | None = None) -> MetricInfo | None:
    """What `metric` means, from the declaration of the registered probe that records it, or None for a name no
    probe declares. n_classes sets the chance level of class accuracies (1/n_classes)."""
    found = metric_declaration(metric)
    if found is None:
        return None
    declared, groups = found
    return MetricInfo(declared.meaning_of(groups), declared.unit, declared.direction, declared.chance_of(n_classes),
                      declared.note)


def metric_unit(metric: str) -> str:
    """The unit of `metric` for an axis label; "value" when the glossary does not know it."""
    info = describe_metric(metric)
    return info.unit if info is not None else "value"


def tooltip(metric: str, n_classes: int | None = None) -> str:
    """One line for a title attribute: meaning; unit; direction; chance."""
    info = describe_metric(metric, n_classes)
    if info is None:
        return f"{metric}: not in the glossary (see the probe's docstring)"
    chance = f"; chance {info.chance:g}" if info.chance is not None else ""
    note = f"; {info.note}" if info.note else ""
    return f"{metric}: {info.meaning}; unit: {info.unit}; {info.direction}{chance}{note}"

