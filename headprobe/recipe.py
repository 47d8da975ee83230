"""Recipes: YAML → typed, validated objects, with ``--set key.sub=value`` overrides.

Everything is checked before a model loads: unknown keys, wrong types and
unknown registered names raise `RecipeError`, whose message names the key
path, the bad value, the allowed values and a "did you mean".
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from .registry import (
    POOLINGS,
    PROBES,
    Registry,
    did_you_mean,
)
from .safe_yaml import AliasLimitError, BoundedAliasLoader


class RecipeError(ValueError):
    """A recipe or override that cannot be run; the message says where and how to fix it."""


class _NotFinite(RecipeError):
    """A NaN or infinite number where a finite one is needed; raised through unions (never a type mismatch)."""


# --- the schema ---------------------------------------------------------------------------


@dataclass
class LoraSpec:
    """LoRA adapters for `tune: lora` (peft): rank, scaling alpha, dropout on the adapter input."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    # Module names (or name suffixes) to adapt; null: attention q/v for ViT-style models, convolutions for CNNs.
    target_modules: list[str] | None = None


@dataclass
class BackboneSpec:
    id: str = "offline:dinov2-vits14"
    pooling: str = field(default="cls", metadata={"registry": POOLINGS})
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


@dataclass
class LimitSpec:
    train: int | None = None
    test: int | None = None


@dataclass
class DataSpec:
    source: str = "sklearn-digits"
    image_column: str = "image"
    label_column: str = "label"
    train_split: str = "train"
    test_split: str = "test"
    # Used only when the source has no `test_split`: a stratified split of train.
    test_fraction: float = 0.25
    split_seed: int = 0
    limit: LimitSpec = field(default_factory=LimitSpec)
    # Part of train held out to choose hyper-parameters (never the test split).
    val_fraction: float = 0.2


@dataclass
class FeatureSpec:
    batch_size: int = 64
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    cache: bool = True
    num_workers: int = 0


@dataclass
class LinearProbeSpec:
    C_grid: list[float] = field(default_factory=lambda: [10.0**k for k in range(-4, 4)])
    standardize: bool = True
    max_iter: int = 1000
    # At scikit-learn's default 1e-4 the answer depends on where each fit starts: on the quickstart's backbone,
    # the path-warm-started fits at large C already meet it at their start, so C = 100 won (linear.acc 0.973)
    # where sklearn from zero picks C = 1 (0.980). At 1e-6 headprobe and sklearn agree on every validation
    # accuracy, the C and the test accuracy; it costs ~0.3 s per tap there, against 0.21 s at 1e-4.
    tol: float = 1e-6


@dataclass
class KnnSpec:
    ks: list[int] = field(default_factory=lambda: [10, 20, 100, 200])
    temperature: float = 0.07
    weighting: Literal["exp", "uniform"] = "exp"
    chunk_size: int = 1024


@dataclass
class SpectrumSpec:
    # Condition number on the top-k eigenvalues; null = decided from samples vs dimension.
    top_k: int | None = None


@dataclass
class InvarianceSpec:
    uniformity_t: float = 2.0


@dataclass
class ViewMISpec:
    batch_size: int = 128
    temperature: float = 0.1
    pca_dims: int = 32
    # InfoNCE critic: the fixed cosine/temperature one, or a separable (linear + MLP) critic trained on half the
    # pairs, early-stopped on a quarter of those, and evaluated on the other half; critic_steps is its maximum.
    critic: Literal["cosine", "separable"] = "cosine"
    critic_steps: int = 1000


@dataclass
class AugmentR2Spec:
    alphas: list[float] | None = None  # ridge penalties tried per parameter (None: 1e-3 … 1e6, half-decade steps)
    folds: int = 5  # cross-validation folds on the training images that choose each parameter's penalty
    test_fraction: float = 0.25


@dataclass
class RotationSpec:
    C_grid: list[float] | None = None
    mlp_hidden: int = 256
    mlp_epochs: int = 100


@dataclass
class OrbitSpec:
    sweeps: list[str] = field(default_factory=lambda: ["rotation45", "rotation360"])
    n_images: int = 64
    pca_images: int = 8


PROBE_SPECS: dict[str, type] = {
    "linear": LinearProbeSpec, "knn": KnnSpec, "spectrum": SpectrumSpec, "invariance": InvarianceSpec,
    "view_mi": ViewMISpec, "augment_r2": AugmentR2Spec, "rotation": RotationSpec, "orbits": OrbitSpec,
}


@dataclass
class HeadSpec:
    """One projection head; `name` labels its taps (`NAME@i`, `NAME`) in results.json."""

    name: str = "head"
    type: Literal["identity", "linear", "mlp"] = "mlp"
    depth: int = 2
    width: int = 2048
    out_dim: int | None = None
    act: Literal["relu", "gelu", "swish", "silu", "tanh", "none"] = "relu"
    bn_hidden: bool = True
    bn_out: bool = False
    l2_out: bool = False
    init_scale: float = 1.0
    # Width of a SimSiam/BYOL predictor on top of the head (needed by `simsiam`); null = none.
    predictor: int | None = None


@dataclass
class ObjectiveSpec:
    name: str = "vicreg"
    # Keyword arguments of the objective function (e.g. temperature, sim_weight); checked by name.
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class AugmentRecipe:
    preset: str = "simclr"
    # Augmented views extracted once per training image (frozen backbone); each step draws two.
    views: int = 8
    # Knobs of the preset to change (e.g. crop_scale: [0.2, 1.0]); checked by name.
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainSpec:
    epochs: int = 10
    # Total optimisation steps; overrides epochs when set.
    steps: int | None = None
    batch_size: int = 256
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 1e-4
    momentum: float = 0.9
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_steps: int = 0
    # Accumulate the gradients of N consecutive batches per optimiser update (batch statistics stay per batch).
    grad_accum: int = 1
    log_every: int = 10
    # Save heads, optimisers and the step every N steps (and always at the end); null = only at the end.
    checkpoint_every: int | None = None


@dataclass
class GeometrySpec:
    """The paper's geometric objects per head: at the end of training, and tracked during it."""

    # Pull-back metric, augmentation degeneracy, effective Hessian (G/M terms), curvature and SLQ density.
    final: bool = False
    rows: int = 256
    # Every N steps log λ_min/λ_max of the loss Hessian w.r.t. the representation batch (Lanczos); null = off.
    track_every: int | None = None
    track_rows: int = 64
    track_max_iter: int = 20
    # Split each tracked λ_min into G-term (the loss seen through J_h), M-term (the head's curvature) and ∇²_h L.
    track_split: bool = True
    # Claim 4's start: a number c starts every head collapsed by `geometry.tracking.collapsed_init` (first layer
    # scaled by collapse_scale plus a shared offset c per unit); null = heads as built (init_scale and all).
    collapse_offset: float | None = None
    collapse_scale: float = 0.01
    # Step 0 counts as "collapsed" iff out_std ≤ collapse_threshold/√out (recorded in protocol.train.collapse_start).
    collapse_threshold: float = 0.1


@dataclass
class Recipe:
    name: str = "run"
    seed: int = 0
    # Retrain the heads once per seed on the same backbone features and views (null: the one `seed`); every head
    # tap metric is then the mean over seeds, with the per-seed values and their spread kept.
    seeds: list[int] | None = None
    backbone: BackboneSpec = field(default_factory=BackboneSpec)
    data: DataSpec = field(default_factory=DataSpec)
    features: FeatureSpec = field(default_factory=FeatureSpec)
    probes: dict[str, Any] = field(
        default_factory=lambda: {"linear": LinearProbeSpec(), "knn": KnnSpec()},
        metadata={"registry": PROBES, "specs": PROBE_SPECS},
    )
    heads: list[HeadSpec] = field(default_factory=list)
    objective: ObjectiveSpec = field(default_factory=ObjectiveSpec)
    augment: AugmentRecipe = field(default_factory=AugmentRecipe)
    train: TrainSpec = field(default_factory=TrainSpec)
    geometry: GeometrySpec = field(default_factory=GeometrySpec)
    # Write report.html and plots/ at the end of the run (`headprobe report RUN_DIR` makes them later too).
    report: bool = True
    # {override key: [values]}: one run per combination, then a comparison (e.g. {heads.0.act: [relu, swish]}).
    sweep: dict[str, list[Any]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return _to_plain(self)

    @property
    def seed_list(self) -> list[int]:
        """The seeds the heads are trained with: `seeds`, or the one `seed`."""
        return list(self.seeds) if self.seeds else [self.seed]


# --- loading ------------------------------------------------------------------------------


def load_recipe(
    source: str | Path | dict, overrides: list[str] | None = None, values: dict[str, Any] | None = None
) -> Recipe:
    """Read a recipe file (or dict), apply ``KEY=VALUE`` overrides, validate, return a `Recipe`.

    `values` are overrides given as Python objects (``{"train.epochs": 1}``), applied after `overrides`.
    A recipe with a `sweep:` has every combination validated here too, exactly as `expand_sweep` makes them.
    """
    return _from_data(resolve_recipe_data(source, overrides, values))


# A run's name becomes a folder name under runs/: one path component, no separators, no leading dot.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"


def _default_name(stem: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).lstrip("._-")[:128]
    return name or "run"


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, line: int) -> None:
        super().__init__(f"duplicate key {key!r} at line {line} (first given at line {first}); keep one of them")
        self.key, self.first, self.line = key, first, line


class _RecipeLoader(BoundedAliasLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping (PyYAML keeps the last silently) and
    aliases that expand past `safe_yaml.MAX_ALIAS_NODES` nodes (`safe_yaml.BoundedAliasLoader`)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    continue
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise _DuplicateKey(key, seen[key], line)
                seen[key] = line
        return super().construct_mapping(node, deep)


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_RecipeLoader)  # noqa: S506 (a SafeLoader subclass)


def resolve_recipe_data(source: str | Path | dict, overrides: list[str] | None, values: dict[str, Any] | None) -> dict:
    """The recipe's plain data with defaults and overrides applied, not yet validated."""
    if isinstance(source, dict):
        data, default_name = copy.deepcopy(source), "run"
    else:
        path = Path(source)
        if not path.is_file():
            raise RecipeError(f"recipe file {str(path)!r} does not exist; pass the path to a .yaml recipe.")
        try:
            data = _yaml_load(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise RecipeError(f"recipe {str(path)!r} is not UTF-8 text (byte {err.start} cannot be decoded); "
                              "save it as UTF-8 YAML, e.g. recipes/quickstart.yaml.") from None
        except OSError as err:
            raise RecipeError(f"recipe {str(path)!r} cannot be read ({err.strerror or err}); check that it is "
                              "a readable file.") from None
        except (_DuplicateKey, AliasLimitError) as err:
            raise RecipeError(f"recipe {str(path)!r}: {err}.") from None
        except yaml.YAMLError as err:
            raise RecipeError(f"recipe {str(path)!r} is not valid YAML: {err}") from None
        if data is None:
            raise RecipeError(f"recipe {str(path)!r} is empty; a recipe is a mapping of keys to values, "
                              "e.g. `backbone: {id: scratch:vit-tiny}` (see recipes/quickstart.yaml).")
        default_name = _default_name(path.stem)
    if not isinstance(data, dict):
        raise RecipeError(f"a recipe must be a mapping of keys to values, got {type(data).__name__}.")
    data.setdefault("name", default_name)
    # Overrides refine the default probe set instead of replacing it.
    data.setdefault("probes", {name: {} for name in Recipe().probes})
    for item in overrides or []:
        apply_override(data, item)
    for key, value in (values or {}).items():
        set_value(data, key, copy.deepcopy(value), f"override {key}={value!r}")
    return data


def _from_data(data: dict) -> Recipe:
    from .recipe_checks import check_recipe  # imported here: recipe_checks imports this module's classes

    recipe = _build(Recipe, data, "")
    check_recipe(recipe)
    for label, items in _sweep_items(recipe):
        combo = copy.deepcopy(data)
        try:
            for item in items:
                apply_override(combo, item)
            combo["sweep"] = {}
            _from_data(combo)
        except RecipeError as err:
            raise RecipeError(f"sweep combination {label}: {err}") from None
    return recipe


def _sweep_items(recipe: Recipe) -> list[tuple[str, list[str]]]:
    """[(label, ["key=value", ...])] for every combination of `recipe.sweep` (cartesian product, keys in order)."""
    import itertools

    if not recipe.sweep:
        return []
    for key, values in recipe.sweep.items():
        if not isinstance(values, list) or not values:
            raise RecipeError(f"sweep.{key} must be a non-empty list of values, got {values!r}.")
    keys = list(recipe.sweep)
    out = []
    for combo in itertools.product(*(recipe.sweep[k] for k in keys)):
        items = [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                 for k, v in zip(keys, combo, strict=True)]
        label = "-".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, combo, strict=True))
        out.append((label, items))
    return out


def expand_sweep(source: str | Path | dict, overrides: list[str] | None = None) -> list[tuple[str, list[str]]]:
    """A recipe with `sweep: {key: [values], ...}` → [(label, overrides)], one per combination (cartesian
    product, keys in order). Every combination is validated (by `load_recipe`), before anything runs. A recipe
    without a sweep gives one entry with label ""."""
    recipe = load_recipe(source, overrides)
    if not recipe.sweep:
        return [("", list(overrides or []))]
    return [(sweep_folder_name(label), list(overrides or []) + items + ["sweep={}"])
            for label, items in _sweep_items(recipe)]


# Folder names are at most 255 bytes on common file systems; a longer sweep label is cut with a hash.
MAX_FOLDER_BYTES = 200


def sweep_folder_name(label: str) -> str:
    """A sweep combination's label → its run folder's name: '/' replaced, and a label over `MAX_FOLDER_BYTES`
    bytes cut and suffixed with a hash of the whole label (each run's config.yaml and results.json keep the full
    values)."""
    import hashlib

    name = label.replace("/", "_").replace("\0", "_")
    raw = name.encode()
    if len(raw) <= MAX_FOLDER_BYTES:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:12]
    head = raw[: MAX_FOLDER_BYTES - len(digest) - 1].decode(errors="ignore")
    return f"{head}-{digest}"


def apply_override(data: dict, item: str) -> None:
    """Apply one ``a.b.c=value`` (value parsed as YAML) to a nested dict in place; ``heads.0.act=swish``
    indexes a list."""
    key, sep, raw = item.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise RecipeError(
            f"override {item!r} is not KEY=VALUE; write e.g. --set backbone.pooling=mean "
            "or --set probes.knn.ks=[10,20]."
        )
    try:
        value = _yaml_load(raw) if raw.strip() else None
    except (_DuplicateKey, AliasLimitError) as err:
        raise RecipeError(f"override {item!r}: {err}.") from None
    except yaml.YAMLError as err:
        raise RecipeError(f"override {item!r}: the value is not valid YAML ({err}).") from None
    set_value(data, key, value, f"override {item!r}")


def set_value(data: dict, key: str, value: Any, label: str | None = None) -> None:
    """Set ``a.b.c`` (a Python value, not parsed) in a nested dict in place; ``heads.0.act`` indexes a list."""
    label = label or f"override {key!r}"
    if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
        raise RecipeError(f"{label}: {key!r} is not a dotted key such as train.epochs.")
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts):
        where = ".".join(parts[: i + 1])
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise RecipeError(f"{label}: {where} is not an index of a list of {len(node)} items "
                                  f"(use 0 to {len(node) - 1}).")
            part = int(part)
        elif not isinstance(node, dict):
            parent = ".".join(parts[:i])
            raise RecipeError(f"{label}: {parent} is {node!r}, not a section with keys.")
        if last:
            node[part] = value
            return
        if isinstance(node, dict) and node.get(part) is None:
            node[part] = {}
        node = node[part]


def _build(cls: type, data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path or 'recipe'} must be a mapping of keys, got {data!r}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        where = f"{path}.{key}" if path else str(key)
        guess = did_you_mean(str(key), list(fields))
        hint = f" Did you mean {guess!r}?" if guess else ""
        raise RecipeError(f"unknown key {where!r}; allowed keys here: {', '.join(fields)}.{hint}")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            continue
        where = f"{path}.{name}" if path else name
        if "specs" in f.metadata:
            kwargs[name] = _build_named_section(data[name], where, f.metadata["registry"], f.metadata["specs"])
        else:
            kwargs[name] = _coerce(hints[name], data[name], where)
    return cls(**kwargs)


def _build_named_section(value: Any, path: str, registry: Registry, specs: dict[str, type]) -> dict:
    """``probes: {linear: {...}, knn: null}``: each key a registered name, each value its options."""
    if isinstance(value, list):
        value = {name: None for name in value}
    if not isinstance(value, dict):
        raise RecipeError(f"{path} must map {registry.family} names to options, got {value!r}.")
    out = {}
    for name, options in value.items():
        if name not in registry:
            guess = did_you_mean(str(name), registry.names())
            hint = f" Did you mean {guess!r}?" if guess else ""
            raise RecipeError(
                f"{path}.{name}: unknown {registry.family} {name!r}; allowed: {', '.join(registry.names())}.{hint}"
            )
        out[name] = _build(specs.get(name) or registry.entry(name).load_options() or NoOptions, options,
                           f"{path}.{name}")
    return out


@dataclass
class NoOptions:
    """The options of a plug-in registered without an options class: none."""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(arg, value, path)
            except _NotFinite:
                raise
            except RecipeError:
                continue
        raise RecipeError(f"{path} = {value!r} has the wrong type; expected {_type_name(tp)}.")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            guess = did_you_mean(str(value), [str(a) for a in allowed])
            hint = f" Did you mean {guess!r}?" if guess else ""
            raise RecipeError(f"{path} = {value!r} is not allowed; allowed: {', '.join(map(str, allowed))}.{hint}")
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise RecipeError(f"{path} = {value!r} has the wrong type; expected {_type_name(tp)}.")
        return [_coerce(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is Any:
        return value
    if tp is type(None):
        if value is not None:
            raise RecipeError(f"{path} = {value!r}: expected null.")
        return None
    if tp is bool:
        if not isinstance(value, bool):
            raise RecipeError(f"{path} = {value!r} has the wrong type; expected true or false.")
        return value
    if tp is int:
        if isinstance(value, float) and not math.isfinite(value):
            raise _NotFinite(f"{path} = {value!r} is not a finite number; give an integer.")
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecipeError(f"{path} = {value!r} has the wrong type; expected an integer.")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecipeError(f"{path} = {value!r} has the wrong type; expected a number.")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise _NotFinite(f"{path} = {value!r} is not a finite number; give an ordinary number "
                             "(NaN and infinities are not accepted).")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise RecipeError(f"{path} = {value!r} has the wrong type; expected a string.")
        return value
    raise TypeError(f"recipe schema type {tp!r} at {path} is not supported")


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_plain(v) for v in obj]
    return obj


def dump_recipe(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False)
