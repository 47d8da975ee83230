"""The recipe schema: one dataclass per section, each field with its default and, where it has one, the range
of values it takes (`Range` in the field's metadata) or the registry its names come from (`registered`).

The loader (`recipe.loading`) reads both declarations for every field, so a range or a name list is written
once, here or in `headprobe.registry`; the checks that relate several fields live in `recipe.checks`.

>>> HeadSpec(depth=3).width, dataclasses.fields(HeadSpec)[2].metadata["range"].describe()
(2048, '>= 1')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..registry import (
    ACTIVATIONS,
    AUGMENT_PRESETS,
    HEADS,
    OBJECTIVES,
    POOLINGS,
    PROBES,
    did_you_mean,
    unknown_name_message,
)

# RecipeError, Range, at_least and within are part of the schema's API (imported from here by the others).
from .fields import FRACTION, POSITIVE, Range, RecipeError, at_least, registered, within  # noqa: F401


@dataclass
class NoOptions:
    """The options of a probe declared without an options class: none."""


def default_probes() -> dict[str, Any]:
    """A recipe's probes when it names none: linear and k-NN, each with its declared options' defaults (read from
    the probes' own declarations, through the registry, when a recipe is built)."""
    return {name: (PROBES.entry(name).load_options() or NoOptions)() for name in ("linear", "knn")}


def did_you_mean_hint(name: str, allowed: Sequence[str], shown: Mapping[str, str] | None = None) -> str:
    """" Did you mean 'x'?" for the allowed name closest to `name` (written as `shown` has it), or ""."""
    guess = did_you_mean(str(name), [str(a) for a in allowed])
    if guess is None:
        return ""
    return f" Did you mean {(shown or {}).get(guess, guess)!r}?"


def unknown_name(where: str, family: str, name: str, allowed: Sequence[str],
                 shown: Mapping[str, str] | None = None) -> RecipeError:
    """`where: unknown FAMILY 'name'; allowed: ...` with a "did you mean" (`registry.unknown_name_message`).

    `shown` maps a name to how a recipe writes it (a registry entry's usage, e.g. 'offline:dinov2-vits14'): the
    allowed values and the guess are then written that way, and the name, part of a value `where` quotes, is not
    repeated."""
    if shown is None:
        return RecipeError(f"{where}: {unknown_name_message(family, str(name), [str(a) for a in allowed])}")
    listed = ", ".join(shown.get(a, a) for a in allowed)
    return RecipeError(f"{where}: unknown {family}; allowed: {listed}.{did_you_mean_hint(name, allowed, shown)}")


def unregistered(where: str, registry: Any, name: str, shown: Mapping[str, str] | None = None) -> RecipeError:
    """`unknown_name` for a name `registry` does not hold, or, for a plug-in taken out because it cannot be imported
    (`Registry.set_unavailable`), the import error's first line."""
    if registry.unavailable(name) is not None:
        return RecipeError(f"{where}: {registry.unavailable_sentence(name)}")
    return unknown_name(where, registry.family, name, registry.names(), shown)


def not_allowed(where: str, value: Any, allowed: Sequence[str], guesses: Sequence[str] | None = None) -> RecipeError:
    """`where = value is not allowed; allowed: ...` for a fixed set of values, guessing among `guesses`
    (default: `allowed`)."""
    hint = did_you_mean_hint(str(value), list(guesses if guesses is not None else allowed))
    return RecipeError(f"{where} = {value!r} is not allowed; allowed: {', '.join(map(str, allowed))}.{hint}")


# --- declared ranges and names ------------------------------------------------------------


# numpy's (and so `accelerate.set_seed`'s) seed range.
MAX_SEED = 2**32 - 1
SEED = within(0, MAX_SEED)
# Plausibility bounds: past these a run would not finish (10^7 steps of a tiny head is days of compute).
MAX_EPOCHS = 100_000
MAX_STEPS = 10_000_000

# A run's name becomes a folder name under runs/: one path component, no separators, no leading dot.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"


# --- the schema ---------------------------------------------------------------------------


@dataclass
class LoraSpec:
    """LoRA adapters for `tune: lora` (peft): rank, scaling alpha, dropout on the adapter input."""

    r: int = field(default=8, metadata=at_least(1))
    alpha: float = field(default=16.0, metadata=POSITIVE)
    dropout: float = field(default=0.0, metadata=within(0, 1, open_high=True))
    # Module names (or name suffixes) to adapt; null: attention q/v for ViT-style models, convolutions for CNNs.
    target_modules: list[str] | None = None


@dataclass
class BackboneSpec:
    id: str = "offline:dinov2-vits14"
    pooling: str = field(default="cls", metadata=registered(POOLINGS))
    # Overrides the checkpoint's crop size (resize keeps its ratio); ViTs interpolate positions.
    resolution: int | None = None
    revision: str | None = None
    # -1: the final features; i: the output of block i (through the final norm for transformers).
    layer: int = -1
    # Several blocks, each pooled, concatenated in this order (e.g. [-4, -1]); replaces `layer`.
    layers: list[int] | None = None
    # frozen | last:N (last N blocks + final norm) | lora | full
    tune: str = "frozen"
    lora: LoraSpec = field(default_factory=LoraSpec)
    # ssl: checkpoints with both networks (DINO): which one to load, teacher (default) or student.
    part: str | None = None
    # ssl: ViTs whose attention-head count is not in the checkpoint's args (DINO's vit_tiny/small/base are).
    num_heads: int | None = field(default=None, metadata=at_least(1))


@dataclass
class LimitSpec:
    train: int | None = field(default=None, metadata=at_least(1))
    test: int | None = field(default=None, metadata=at_least(1))


@dataclass
class DataSpec:
    source: str = "sklearn-digits"
    image_column: str = "image"
    label_column: str = "label"
    train_split: str = "train"
    test_split: str = "test"
    # Used only when the source has no `test_split`: a stratified split of train (0 would leave no test images).
    test_fraction: float = field(default=0.25, metadata=FRACTION)
    split_seed: int = field(default=0, metadata=SEED)
    limit: LimitSpec = field(default_factory=LimitSpec)
    # hf: sources only. The dataset's configuration name (datasets.load_dataset(id, name=...)), a hub branch, tag or
    # commit, and streaming: read only the first limit.train / limit.test examples (both limits needed) instead of
    # downloading the whole dataset first.
    config: str | None = None
    revision: str | None = None
    streaming: bool = False
    # Part of train held out to choose hyper-parameters (never the test split); 1 would leave none to fit on.
    val_fraction: float = field(default=0.2, metadata=FRACTION)


@dataclass
class FeatureSpec:
    batch_size: int = field(default=64, metadata=at_least(1))
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    cache: bool = True
    # DataLoader worker processes decoding and augmenting; null: chosen from the machine (`data.loader.auto_workers`).
    # Results are the same for any count.
    num_workers: int | None = field(default=None, metadata=at_least(0))
    # Cache hits are memory-mapped from their files rather than loaded whole (a view cache larger than memory trains).
    memory_map: bool = True
    # The dtype the feature cache stores features in (half the bytes at float16/bfloat16); probes, heads and
    # geometry get them back as float32 (upcast on read), and the dtype is part of the cache key.
    store_dtype: Literal["float32", "float16", "bfloat16"] = "float32"


# The widest head layer (or predictor) a recipe may ask for: 2**20 units.
MAX_WIDTH = 1 << 20


@dataclass
class HeadSpec:
    """One projection head; `name` labels its taps (`NAME@i`, `NAME`) in results.json."""

    name: str = "head"
    type: str = field(default="mlp", metadata=registered(HEADS))
    depth: int = field(default=2, metadata=at_least(1))
    # Widths up to MAX_WIDTH: a wider layer (with a backbone's 384-1024 inputs, gigabytes of weights) is a typo, and
    # refused before torch's allocator is asked for it.
    width: int = field(default=2048, metadata=within(1, MAX_WIDTH))
    out_dim: int | None = field(default=None, metadata=within(1, MAX_WIDTH))
    # The names the ACTIVATIONS registry holds; null: relu for a trained head. On a `type: pretrained` head it says the
    # activation a checkpoint cannot show (lightly's heads: an activation has no tensors); null there: read it.
    act: str | None = field(default=None, metadata=registered(ACTIVATIONS))
    bn_hidden: bool = True
    bn_out: bool = False
    l2_out: bool = False
    init_scale: float = field(default=1.0, metadata=POSITIVE)
    # Width of a SimSiam/BYOL predictor on top of the head (needed by `simsiam`); null = none.
    predictor: int | None = field(default=None, metadata=within(1, MAX_WIDTH))
    # The layers to probe (1 = the first hidden layer … depth = the output), e.g. [1, 3] to skip a pretrained DINO
    # head's 65,536-d prototype logits; null = every layer. The verdict compares the deepest probed layer.
    taps: list[int] | None = field(default=None, metadata=at_least(1))
    # A null head: the untrained copy of head NAME at its initialisation (NAME's weights before training, every
    # setting of NAME's), probed like any head and never trained (`headprobe.recipe.null_heads`).
    init_of: str | None = None

    def __post_init__(self) -> None:
        if self.act is None and self.type != "pretrained":
            self.act = "relu"
        if self.type == "random":  # one linear map: its depth is not a choice
            self.depth = 1


@dataclass
class ObjectiveSpec:
    name: str = field(default="vicreg", metadata=registered(OBJECTIVES))
    # Keyword arguments of the objective function (e.g. temperature, sim_weight); checked by name.
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class AugmentRecipe:
    preset: str = field(default="simclr", metadata=registered(AUGMENT_PRESETS))
    # Augmented views extracted once per training image (frozen backbone); each step draws two.
    views: int = field(default=8, metadata=at_least(2))
    # The images whose views the view probes (invariance, view_mi, augment_r2) measure: the test images (views
    # the heads never trained on, drawn from their own stream) or the training images the heads trained on.
    probe_views: Literal["test", "train"] = "test"
    # Knobs of the preset to change (e.g. crop_scale: [0.2, 1.0]); checked by name.
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainSpec:
    epochs: int = field(default=10, metadata=within(1, MAX_EPOCHS))
    # Total optimisation steps; overrides epochs when set.
    steps: int | None = field(default=None, metadata=within(1, MAX_STEPS))
    batch_size: int = field(default=256, metadata=at_least(2))
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = field(default=1e-3, metadata=at_least(0.0))
    weight_decay: float = field(default=1e-4, metadata=at_least(0.0))
    # torch.optim.SGD refuses a negative momentum; 1 or more never forgets a gradient (diverges).
    momentum: float = field(default=0.9, metadata=within(0, 1, open_high=True))
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_steps: int = field(default=0, metadata=at_least(0))
    # Accumulate the gradients of N consecutive batches per optimiser update (batch statistics stay per batch).
    grad_accum: int = field(default=1, metadata=at_least(1))
    log_every: int = field(default=10, metadata=at_least(1))
    # Save heads, optimisers and the step every N steps (and always at the end); null = only at the end.
    checkpoint_every: int | None = field(default=None, metadata=at_least(1))


@dataclass
class GeometrySpec:
    """The paper's geometric objects per head: at the end of training, and tracked during it."""

    # Pull-back metric, augmentation degeneracy, effective Hessian (G/M terms), curvature and SLQ density.
    final: bool = False
    rows: int = field(default=256, metadata=at_least(2))
    # Every N steps log λ_min/λ_max of the loss Hessian w.r.t. the representation batch (Lanczos); null = off.
    track_every: int | None = field(default=None, metadata=at_least(1))
    track_rows: int = field(default=64, metadata=at_least(2))
    # Lanczos products per tracked Hessian at most; it stops once both ends converge (20 left λ_min unconverged at
    # about half the points of offline_collapse; each record says "lambda_min_converged").
    track_max_iter: int = field(default=200, metadata=at_least(2))
    # out_std and RankMe of each tracked record on this many cached view rows, the same rows at every tracked step.
    track_stat_rows: int = field(default=1024, metadata=at_least(2))
    # Split each tracked λ_min into G-term (the loss seen through J_h), M-term (the head's curvature) and ∇²_h L.
    track_split: bool = True
    # At each tracked point also the controls of `geometry.controls` at the same state: the predictor removed, the
    # head's activation swapped (piecewise-linear ↔ smooth) at the same weights, and a loss convex in h whose
    # gradient does not vanish at collapse (½‖h − t‖², fixed random t). About 3 more Lanczos runs per point.
    track_controls: bool = False
    # Claim 4's start: a number c starts every head collapsed by `geometry.collapse.collapsed_init` (first layer
    # scaled by collapse_scale plus a shared offset c per unit); null = heads as built (init_scale and all).
    collapse_offset: float | None = None
    collapse_scale: float = 0.01
    # The heads collapse_offset starts collapsed (by name); null = every head. The others start as built (claim 4's
    # "normal start" beside the collapsed one in one run: `stats.saddle_grid`).
    collapse_heads: list[str] | None = None
    # Step 0 counts as "collapsed" iff out_std ≤ collapse_threshold/√out (recorded in protocol.train.collapse_start).
    collapse_threshold: float = 0.1
    # Q-saddle (claim 4, `geometry.saddle`) with `final`: this many constructed collapsed states per seed, 3 seeds,
    # for each head type of saddle_heads and BatchNorm arm of saddle_arms (tiny heads); 0 = not asked.
    saddle_states: int = field(default=50, metadata=at_least(0))
    saddle_heads: list[Literal["linear", "relu", "swish", "gelu"]] = field(
        default_factory=lambda: ["linear", "relu", "swish", "gelu"])
    # BatchNorm on batch statistics: none, in the head (after its hidden layer), in the SimSiam predictor, or both;
    # each arm is answered on its own (the default keeps Q-saddle's cost: each arm costs as much again).
    saddle_arms: list[Literal["none", "bn_head", "bn_predictor", "bn_both"]] = field(default_factory=lambda: ["none"])
    # Q-metric (claim 2, `geometry.local_metric`) with `final`: per head, seed and state (trained, at init), this many
    # disjoint evaluation batches of up to metric_batch images (two views each), the local metric at metric_rows
    # sampled images per batch (each row: ∂²L/∂h_i² from `out` loss products and J_h by reverse mode); 0 = not asked.
    metric_batches: int = field(default=4, metadata=at_least(0))
    metric_batch: int = field(default=64, metadata=at_least(2))
    metric_rows: int = field(default=4, metadata=at_least(2))


@dataclass
class RuntimeSpec:
    """How the run uses the machine (`headprobe.parallel.threads`)."""

    # Intra-op CPU threads; null: chosen from the CPUs the process may use (never from the machine's load). The
    # environment variable HEADPROBE_THREADS overrides it; an explicit OMP_NUM_THREADS counts when this is null.
    threads: int | None = field(default=None, metadata=at_least(1))
    # The longest wait, in seconds, for one call to an experiment tracker of report_to (its server); a tracker that
    # takes longer or fails is dropped with one warning, and the run goes on (`report.trackers`).
    tracker_timeout_s: float = field(default=30.0, metadata={"range": Range(0, 86400, open_low=True)})


@dataclass
class Recipe:
    name: str = "run"
    seed: int = field(default=0, metadata=SEED)
    # Retrain the heads once per seed on the same backbone features and views (null: the one `seed`); every head
    # tap metric is then the mean over seeds, with the per-seed values and their spread kept.
    seeds: list[int] | None = field(default=None, metadata=SEED)
    backbone: BackboneSpec = field(default_factory=BackboneSpec)
    data: DataSpec = field(default_factory=DataSpec)
    features: FeatureSpec = field(default_factory=FeatureSpec)
    # {probe name: its options}: each probe's options class, defaults and ranges are its own declaration's
    # (`probes.declaration.Probe.options`, read through the registry).
    probes: dict[str, Any] = field(default_factory=default_probes, metadata={"registry": PROBES, "named": True})
    heads: list[HeadSpec] = field(default_factory=list)
    # Null heads added to `heads`, probed like every head and never trained, that each answer is read against:
    # `init` an untrained copy NAME.init of every trained head at its initialisation, `random` one fixed random
    # injective linear map (`headprobe.recipe.null_heads`).
    null_heads: list[Literal["init", "random"]] = field(default_factory=list)
    objective: ObjectiveSpec = field(default_factory=ObjectiveSpec)
    augment: AugmentRecipe = field(default_factory=AugmentRecipe)
    train: TrainSpec = field(default_factory=TrainSpec)
    geometry: GeometrySpec = field(default_factory=GeometrySpec)
    # Overrides of a question's primary measure or margin (`headprobe.stats.claims.QUESTIONS`), recorded in
    # results.json["claims"], e.g. {Q-class: {margin: 0.03}, Q-aug: {primary: rotation.mlp.acc}}.
    claims: dict[str, Any] = field(default_factory=dict)
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)
    # Write report.html and plots/ at the end of the run (`headprobe report RUN_DIR` makes them later too).
    report: bool = True
    # Experiment trackers that get the training curves and every tap's final metrics with intervals
    # (`report.trackers`; Accelerate's log_with names; each an optional package).
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = field(default_factory=list)
    # {override key: [values]}: one run per combination, then a comparison (e.g. {heads.0.act: [relu, swish]});
    # a key may be nested ({backbone: {id: [...]}}) and a value a whole block ({backbone: [{...}, {...}]}).
    sweep: dict[str, Any] = field(default_factory=dict)
    # {override key: [values]} taken together, the i-th value of each key in one run (lists equally long); with
    # `sweep` too, every zipped run is combined with every combination of `sweep` (`recipe.sweeps`).
    sweep_zip: dict[str, Any] = field(default_factory=dict)
    # Names of the sweep's runs (their folders and compare labels), one per run in order; null: derived from values.
    sweep_labels: list[str] | None = None

    def to_dict(self) -> dict:
        return to_plain(self)

    @property
    def seed_list(self) -> list[int]:
        """The seeds the heads are trained with: `seeds`, or the one `seed`."""
        return list(self.seeds) if self.seeds else [self.seed]


def to_plain(obj: Any) -> Any:
    """A schema object as plain dicts, lists and scalars (what YAML and JSON hold)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    return obj
