"""The run record: the typed layout of `results.json` (schema_version 3), one class per level.

`results.json` stays plain JSON (a researcher reads it with `json.load`), so the record is a set of
`TypedDict`s rather than objects: `directory.new_results` builds a `RunRecord`, `directory.read_results` checks a
file against it (`check_version`, `check_record`), and the report, `headprobe compare` and the tests read the same
names. The example in docs/reference.md ("results.json") is checked against these classes by `tests/test_record.py`, and
every key a real run writes must be one of them (`tests/test_runs.py`).
"""

from __future__ import annotations

import typing
from typing import Any, Literal, TypedDict

SCHEMA_VERSION = 3

Verdict = Literal["buffer", "no-buffer", "mixed", "inconclusive"]
Resolved = Literal["for", "against", "unresolved"]


class Uncertainty(TypedDict, total=False):
    """taps[T]["uncertainty"][M]: the 95% interval of metric M at tap T and how it was obtained."""

    ci95: list[float] | None
    method: str
    n_boot: int
    n_units: int
    unit: str
    se: float
    per_seed: list[float]
    sd_seeds: float
    n_seeds: int
    ci95_seeds: list[float] | None


class SeedRecord(TypedDict, total=False):
    """taps[T]["seeds"][S]: one seed's retrained head probed at tap T."""

    metrics: dict[str, float | None]
    protocol: dict[str, Any]


class TapRecord(TypedDict, total=False):
    """taps[T]: one probed representation (the backbone, a head's output or one of its hidden layers)."""

    head: str | None
    depth: int
    metrics: dict[str, float | None]
    uncertainty: dict[str, Uncertainty]
    protocol: dict[str, Any]
    seeds: dict[str, SeedRecord]
    # A sweep's run that took this tap from an earlier run of the same backbone-tap inputs (`probing.reuse_tap`): that
    # run's folder, relative to this one.
    reused_from: str


class Evidence(TypedDict, total=False):
    """buffer[H]["evidence"][M]: one metric's margin between the backbone and head H, as the claim predicts."""

    backbone: float
    head: float
    margin: float
    claim: str
    ci95: list[float] | None
    p: float | None
    p_holm: float | None
    resolved: Resolved
    method: str
    n_boot: int
    why_unresolved: str
    margin_seeds: list[float]


class BufferVerdict(TypedDict, total=False):
    """buffer[H]: the verdict on head H, decided from its resolved evidence."""

    verdict: Verdict
    support: int
    against: int
    unresolved: int
    rule: str
    evidence: dict[str, Evidence]
    tap: str


class ClaimChange(TypedDict, total=False):
    """claims[Q]["heads"][H] and its ["secondary"][M]: one metric's change head − backbone and its 95% interval
    (`stats.retraining.Change.record`)."""

    backbone: float
    head: float
    change: float
    ci95: list[float] | None
    interval: Literal["hierarchical bootstrap", "t over seeds", "test images only", "none"]
    how: str
    n_seeds: int
    n_units: int | None
    unit: str | None
    per_seed_change: list[float]
    per_seed_backbone: list[float]


class ClaimAnswer(ClaimChange, total=False):
    """claims[Q]["heads"][H]: question Q answered for head H from its primary measure."""

    tap: str
    answer: Literal["yes", "no", "equivalent", "lost", "gained", "undecided", "not measured"]
    p: float | None
    p_holm: float | None
    line: str
    secondary: dict[str, ClaimChange]
    decided_on: str  # "head − backbone" or "head − null"
    is_null: bool
    vs_null: dict[str, Any]


class Claim(TypedDict, total=False):
    """claims[Q]: one question of the paper (`stats.claims.QUESTIONS`), its rules and its answer per head."""

    asks: str
    primary: str
    kind: Literal["direction", "equivalence"]
    predicted: str
    margin: float
    interval_rule: str
    answer_rule: str
    override: dict[str, Any]
    heads: dict[str, ClaimAnswer]
    not_measured: str


class RunRecord(TypedDict, total=False):
    """results.json. The first twelve keys exist in every run; the rest only where docs/reference.md says."""

    headprobe_version: str
    schema_version: int
    status: Literal["running", "complete", "failed", "interrupted"]
    recipe: dict[str, Any]
    backbone: dict[str, Any]
    data: dict[str, Any]
    taps: dict[str, TapRecord]
    heads: dict[str, dict[str, Any]]
    buffer: dict[str, BufferVerdict]
    protocol: dict[str, Any]
    timing: dict[str, float]
    environment: dict[str, Any]
    # Written by some runs only.
    claims: dict[str, Claim]
    orbits: dict[str, Any]
    timing_ratios: dict[str, Any]
    error: dict[str, Any]
    backbone_tuned: dict[str, Any]
    geometry_from: str
    geometry_timing: dict[str, Any]
    # One entry per `headprobe run` invocation of the run (a resumed run has several): started, resume, status and
    # the seconds of each stage that invocation ran.
    invocations: list[dict[str, Any]]


ALWAYS = ("headprobe_version", "schema_version", "status", "recipe", "backbone", "data", "taps", "heads", "buffer",
          "protocol", "timing", "environment")


def fields(cls: type) -> dict[str, Any]:
    """The keys of a record class with their types (evaluated, so `dict[...]` can be told from a scalar)."""
    return typing.get_type_hints(cls)


def _is_mapping(hint: Any) -> bool:
    return typing.get_origin(hint) is dict or (isinstance(hint, type) and issubclass(hint, dict))


def check_version(results: dict, where: str) -> None:
    """Raise ValueError with a sentence when `results` was written with a layout older than `SCHEMA_VERSION` (or
    says none): headprobe is an unreleased 0.x and reads no earlier layout."""
    version = results.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version >= SCHEMA_VERSION:
        return
    written = "no schema_version" if version is None else f"schema_version {version!r}"
    by = results.get("headprobe_version")
    raise ValueError(f"{where} has {written}{f' (headprobe {by})' if by else ''}, and this headprobe reads only "
                     f"schema_version {SCHEMA_VERSION}: run the study again with this version "
                     "(`headprobe run RECIPE --out NEW_DIR`).")


def check_record(results: Any, where: str) -> None:
    """Raise ValueError with a sentence when `results` does not have the shape every reader relies on: a mapping
    whose mapping-typed keys (`taps`, `heads`, `buffer`, ...) are mappings (or null), each tap a mapping with a
    `metrics` mapping. Unknown keys are allowed (a newer headprobe may add some)."""
    fix = "it was not written by `headprobe run`, or was edited; restore it or rerun the study."
    if not isinstance(results, dict):
        raise ValueError(f"{where} holds a {type(results).__name__}, not the mapping of a run's results; {fix}")
    for key, hint in fields(RunRecord).items():
        if _is_mapping(hint) and key in results and not isinstance(results[key], (dict, type(None))):
            raise ValueError(f"{where}: {key!r} is a {type(results[key]).__name__}, not a mapping; {fix}")
    for name, tap in (results.get("taps") or {}).items():
        if not isinstance(tap, dict):
            raise ValueError(f"{where}: tap {name!r} is a {type(tap).__name__}, not a mapping; {fix}")
        for key, hint in fields(TapRecord).items():
            if _is_mapping(hint) and not isinstance(tap.get(key, {}), dict):
                raise ValueError(f"{where}: taps.{name}.{key} is a {type(tap[key]).__name__}, not a mapping; {fix}")
