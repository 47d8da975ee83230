"""What a probe declares about itself, in its own module: `Probe` (name, function, inputs, options, metrics, cost
prior, checks, how it reads its tap) and `Metric` (what one of its numbers means, which way is "more", its chance
level, its role as evidence and the claim questions it bears on, its place in the headline plot).

The readers read these declarations through the registry (`registry.PROBES`), never a list of their own: the recipe
validator (options, ranges, `Probe.check`), `headprobe list` (`help`, `usage`, `reading`), the pipeline (`needs`), the
scheduler of several processes (`cost`), the report's glossary, tooltips and headline plot (`describe_metric`
reads `Metric`), the buffer verdict's evidence rule and the claims' measures (`role`, `predicted`, `answers`).

A plug-in probe registered the old way (`PROBES.add(name, "pkg.mod:function", help, needs=..., options=...)`) is
read as a `Probe` with no metrics declared (`declared_probe`): it runs, validates and lists as before; its metrics
are described as unknown and are never evidence.

>>> acc = Metric("knn.k{k}.acc", "test accuracy of a weighted {k}-nearest-neighbour vote", "fraction of test images",
...              "higher = more class information", chance=CLASS_CHANCE, role=INFORMATION, predicted=-1)
>>> acc.match("knn.k20.acc"), acc.match("knn.k20.val_acc")
({'k': '20'}, None)
>>> acc.meaning_of({"k": "20"}), acc.chance_of(10)
('test accuracy of a weighted 20-nearest-neighbour vote', 0.1)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from headprobe.registry import PROBE_INPUTS, PROBE_QUESTIONS, PROBES, Registry, UnavailablePluginError

# A metric's role: evidence about the head (information the backbone should keep, invariance the head should gain),
# a description (reported, never evidence), or a protocol value (a chosen hyper-parameter, a validation score, a
# ceiling: how a number was obtained, not what the tap holds).
INFORMATION, INVARIANCE, DESCRIPTION, PROTOCOL = "information", "invariance", "description", "protocol"
ROLES = (INFORMATION, INVARIANCE, DESCRIPTION, PROTOCOL)
EVIDENCE_ROLES = (INFORMATION, INVARIANCE)
# The chance level of a class accuracy: 1 / the run's number of classes.
CLASS_CHANCE = "1/n_classes"
# How a probe reads its tap: in bounded blocks of rows (memory flat in N beyond what it returns), or whole (its
# math needs every row at once; `Probe.reads_why` says why).
CHUNKS, WHOLE = "chunks", "whole"
READS = (CHUNKS, WHOLE)

# "{k}" in a metric's name is one dotless part of the name; "[{sweep}.]" is an optional part.
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_OPTIONAL = re.compile(r"\[([^\[\]]*\{\w+\}[^\[\]]*)\]")


@lru_cache(maxsize=512)
def _pattern(name: str) -> re.Pattern:
    out, last = [], 0
    for part in _OPTIONAL.finditer(name):
        out.append(_fixed_part(name[last:part.start()]))
        out.append(f"(?:{_fixed_part(part.group(1))})?")
        last = part.end()
    out.append(_fixed_part(name[last:]))
    return re.compile("".join(out))


def _fixed_part(text: str) -> str:
    pieces = _PLACEHOLDER.split(text)  # text, group, text, group, ...
    return "".join(f"(?P<{p}>[^.]+)" if i % 2 else re.escape(p) for i, p in enumerate(pieces))


def fill(template: str, groups: dict[str, str | None]) -> str:
    """`template` with its placeholders filled from `groups`; an optional part "[...]" is kept only where every
    placeholder in it has a value.

    >>> fill("spread[ ({sweep} sweep)]", {"sweep": None}), fill("spread[ ({sweep} sweep)]", {"sweep": "hue"})
    ('spread', 'spread (hue sweep)')
    """
    kept = _OPTIONAL.sub(lambda m: m.group(1) if all(groups.get(g) for g in _PLACEHOLDER.findall(m.group(1)))
                         else "", template)
    return _PLACEHOLDER.sub(lambda m: str(groups.get(m.group(1)) or ""), kept)


@dataclass(frozen=True)
class TrainImages:
    """What a probe's `check` knows of the training images before anything loads: how many (None when the data's
    size is unknown until it loads) and where they come from, for its message ("data.limit.train", the source)."""

    count: int | None
    source: str


@dataclass(frozen=True)
class Metric:
    """One number (or family of numbers) a probe records.

    name: the metric's name, or a pattern of names: "{k}" stands for one dotless part ("knn.k{k}.acc"), "[...]"
    for an optional part ("[{sweep}.]orbit.spread_rel"). meaning: one sentence (placeholders filled from the name);
    unit: what the number counts; direction: what a higher value says; chance: the value with no information, or
    CLASS_CHANCE (1/n_classes), or None; note: how to read it. role: INFORMATION, INVARIANCE (evidence for the
    buffer verdict), DESCRIPTION or PROTOCOL; predicted: for evidence, the sign of head − backbone the buffer claim
    predicts (−1 lower at the head, +1 higher). answers: the claim questions it may answer as their primary measure;
    shown_with: the questions it is shown with as a description. headline: its place in the headline plot (lower
    first; None: not a headline metric); headline_name: the one name of a pattern that is the headline (e.g.
    "knn.k20.acc"), None for every name it matches."""

    name: str
    meaning: str
    unit: str
    direction: str
    chance: float | str | None = None
    note: str = ""
    role: str = DESCRIPTION
    predicted: int | None = None
    answers: tuple[str, ...] = ()
    shown_with: tuple[str, ...] = ()
    headline: float | None = None
    headline_name: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"metric {self.name!r} has role {self.role!r}; choose one of {', '.join(ROLES)}.")
        if (self.role in EVIDENCE_ROLES) != (self.predicted in (-1, 1)):
            raise ValueError(f"metric {self.name!r} ({self.role}): evidence ({' or '.join(EVIDENCE_ROLES)}) "
                             "declares predicted = -1 or +1 (the sign of head - backbone the buffer claim predicts), "
                             "and nothing else may.")
        if isinstance(self.chance, str) and self.chance != CLASS_CHANCE:
            raise ValueError(f"metric {self.name!r} has chance {self.chance!r}; give a number, None or "
                             f"CLASS_CHANCE ({CLASS_CHANCE!r}).")
        unknown = [q for q in self.answers + self.shown_with if q not in PROBE_QUESTIONS]
        if unknown:
            raise ValueError(f"metric {self.name!r} bears on {unknown}; the questions are "
                             f"{', '.join(PROBE_QUESTIONS)}.")

    @property
    def pattern(self) -> str:
        """The regular expression of the names this declaration covers."""
        return _pattern(self.name).pattern

    def match(self, metric: str) -> dict[str, str | None] | None:
        """The placeholders' values when `metric` is one of this declaration's names, else None."""
        found = _pattern(self.name).fullmatch(metric)
        return None if found is None else found.groupdict()

    def meaning_of(self, groups: dict[str, str | None]) -> str:
        return fill(self.meaning, groups)

    def chance_of(self, n_classes: int | None) -> float | None:
        if self.chance == CLASS_CHANCE:
            return 1 / n_classes if isinstance(n_classes, int) and n_classes > 0 else None
        return self.chance

    def is_headline(self, metric: str) -> bool:
        return self.headline is not None and (self.headline_name is None or metric == self.headline_name)


@dataclass(frozen=True)
class Probe:
    """A probe: its registry name, the function `(tap: TapData, **options) -> ProbeOutput`, one line of help, the
    inputs it needs beyond the clean features (from `registry.PROBE_INPUTS`), its options dataclass (each option's
    default and range written once, there), its metrics, and its cost prior: seconds per tap relative to the k-NN
    probe (the scheduler of several processes shares the probes out by it until each has been timed;
    `cost_source` names the measurement in benchmarks/results/). `check(options, train: TrainImages)` raises
    ValueError for options the ranges cannot refuse alone (an empty list, a k above the training images).
    `reads`: CHUNKS (the probe reads its tap in bounded blocks of rows, so its memory beyond what it returns is
    flat in N) or WHOLE (its math needs every row at once), with `reads_why` one line saying why (required for
    WHOLE; for CHUNKS, what it still holds whole, if anything); None only for a plug-in registered the old way.
    `shards_bank`: the processes of a multi-process run may run it together, each over 1/W of the training bank
    (its function takes `processes=(rank, world)`; its option `shard_bank` says whether they do, null: from
    `pipeline.probe_sharing.SHARD_BANK_ROWS` training rows). A probe that needs orbits names them in its options
    (`sweeps`, `n_images`: `recipe.probe_inputs.orbit_request`).

    Calling a Probe calls its function with the options' defaults filled in for those not given."""

    name: str
    function: Callable[..., Any]
    help: str
    options: type | None = None
    needs: tuple[str, ...] = ()
    metrics: tuple[Metric, ...] = ()
    cost: float = 1.0
    cost_source: str = ""
    check: Callable[[Any, TrainImages], None] | None = None
    usage: str | None = None
    reads: str | None = None
    reads_why: str = ""
    shards_bank: bool = False

    def __post_init__(self) -> None:
        if self.reads is not None and self.reads not in READS:
            raise ValueError(f"probe {self.name!r} reads its tap {self.reads!r}; choose one of {', '.join(READS)}.")
        if self.reads == WHOLE and not self.reads_why:
            raise ValueError(f"probe {self.name!r} reads its tap whole; say why in one line (reads_why=...), "
                             f"or read it in chunks (reads={CHUNKS!r}).")
        unknown = set(self.needs) - set(PROBE_INPUTS)
        if unknown:
            raise ValueError(f"probe {self.name!r} needs {sorted(unknown)}, which no stage produces; "
                             f"allowed: {', '.join(PROBE_INPUTS)}.")
        if self.options is not None and not dataclasses.is_dataclass(self.options):
            raise ValueError(f"probe {self.name!r}: options must be a dataclass (each option a field with its "
                             f"default), got {self.options!r}.")
        if self.shards_bank and "shard_bank" not in self.defaults():
            raise ValueError(f"probe {self.name!r} shards its bank, so its options declare `shard_bank` (whether "
                             "the processes share each bank; null: from its size).")
        if not self.cost > 0:
            raise ValueError(f"probe {self.name!r}: cost {self.cost!r} must be > 0 (seconds per tap, k-NN = 1).")

    @property
    def reading(self) -> str:
        """How the probe reads its tap, in one line for `headprobe list` and the docs."""
        if self.reads is None:
            return "reads its tap: undeclared"
        return ("reads its tap in chunks" if self.reads == CHUNKS else "reads its tap whole") + (
            f": {self.reads_why}" if self.reads_why else "")

    def defaults(self) -> dict[str, Any]:
        return {} if self.options is None else dataclasses.asdict(self.options())

    def __call__(self, tap, **options):
        return self.function(tap, **(self.defaults() | options))


def declared_probe(name: str, registry: Registry = PROBES) -> Probe:
    """The declaration of probe `name`: its own `Probe`, or for a plug-in registered the old way (a bare function)
    one read from its registry entry, with no metrics declared."""
    entry = registry.entry(name)
    target = registry.load_entry(name)
    if isinstance(target, Probe):
        return target
    return Probe(name, target, entry.help, entry.load_options(), entry.needs, usage=entry.usage)


def declared_probes(registry: Registry = PROBES) -> list[Probe]:
    """Every registered probe's declaration; a plug-in that cannot be imported is left out (one warning)."""
    return [probe for name in registry.names() if (probe := _available(name, registry)) is not None]


def _available(name: str, registry: Registry) -> Probe | None:
    """`declared_probe`, or None for a plug-in that cannot be imported (taken out of the registry, with one
    warning: a broken plug-in never fails a run that does not name it)."""
    try:
        return declared_probe(name, registry)
    except UnavailablePluginError:
        return None


def declared_metrics(registry: Registry = PROBES) -> tuple[Metric, ...]:
    """Every registered probe's declared metrics, in registration order (an unavailable plug-in's left out)."""
    return _metrics(tuple((name, registry.entry(name).target) for name in registry.names()), registry)


def metric_declaration(metric: str, registry: Registry = PROBES) -> tuple[Metric, dict[str, str | None]] | None:
    """(the declaration of `metric`, its placeholders' values), from the first registered probe that declares it
    (in registration order; within a probe, its first matching metric), or None."""
    for declared in declared_metrics(registry):
        groups = declared.match(metric)
        if groups is not None:
            return declared, groups
    return None


@lru_cache(maxsize=8)
def _metrics(entries: tuple[tuple[str, str], ...], registry: Registry) -> tuple[Metric, ...]:
    """Every registered probe's metrics, in order; cached by the registry's (name, target) pairs, so a probe
    registered or removed later is seen."""
    return tuple(m for name, _ in entries if (probe := _available(name, registry)) is not None for m in probe.metrics)
