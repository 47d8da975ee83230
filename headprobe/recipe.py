"""Recipes: YAML → typed, validated objects, with ``--set key.sub=value`` overrides.

Everything is checked before a model loads: unknown keys, wrong types and
unknown registered names raise `RecipeError`, whose message names the key
path, the bad value, the allowed values and a "did you mean".
"""

from __future__ import annotations

import copy
import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from .registry import (
    BACKBONES,
    DATA_SOURCES,
    OBJECTIVES,
    OFFLINE_MODELS,
    POOLINGS,
    PROBES,
    SCRATCH_MODELS,
    Registry,
    did_you_mean,
    unknown_name_message,
)


class RecipeError(ValueError):
    """A recipe or override that cannot be run; the message says where and how to fix it."""


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
    # InfoNCE critic: the fixed cosine/temperature one, or a separable MLP critic trained on half the pairs
    # and evaluated on the other half.
    critic: Literal["cosine", "separable"] = "cosine"
    critic_steps: int = 400


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


@dataclass
class Recipe:
    name: str = "run"
    seed: int = 0
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


# --- loading ------------------------------------------------------------------------------


def load_recipe(
    source: str | Path | dict, overrides: list[str] | None = None, values: dict[str, Any] | None = None
) -> Recipe:
    """Read a recipe file (or dict), apply ``KEY=VALUE`` overrides, validate, return a `Recipe`.

    `values` are overrides given as Python objects (``{"train.epochs": 1}``), applied after `overrides`.
    A recipe with a `sweep:` has every combination validated here too, exactly as `expand_sweep` makes them.
    """
    return _from_data(_resolve(source, overrides, values))


# A run's name becomes a folder name under runs/: one path component, no separators, no leading dot.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"


def _default_name(stem: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).lstrip("._-")[:128]
    return name or "run"


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, line: int) -> None:
        super().__init__(f"duplicate key {key!r} at line {line} (first given at line {first}); keep one of them")
        self.key, self.first, self.line = key, first, line


class _RecipeLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

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


def _resolve(source: str | Path | dict, overrides: list[str] | None, values: dict[str, Any] | None) -> dict:
    """The recipe's plain data with defaults and overrides applied, not yet validated."""
    if isinstance(source, dict):
        data, default_name = copy.deepcopy(source), "run"
    else:
        path = Path(source)
        if not path.is_file():
            raise RecipeError(f"recipe file {str(path)!r} does not exist; pass the path to a .yaml recipe.")
        try:
            data = _yaml_load(path.read_text())
        except _DuplicateKey as err:
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
    recipe = _build(Recipe, data, "")
    _check_names(recipe)
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
    return [(label.replace("/", "_"), list(overrides or []) + items + ["sweep={}"])
            for label, items in _sweep_items(recipe)]


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
    except _DuplicateKey as err:
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
        out[name] = _build(specs[name], options, f"{path}.{name}")
    return out


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
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecipeError(f"{path} = {value!r} has the wrong type; expected an integer.")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecipeError(f"{path} = {value!r} has the wrong type; expected a number.")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise RecipeError(f"{path} = {value!r} has the wrong type; expected a string.")
        return value
    raise TypeError(f"recipe schema type {tp!r} at {path} is not supported")


def _check_names(recipe: Recipe) -> None:
    """Registered names and value ranges, checked without importing any model library."""
    if not re.fullmatch(NAME_PATTERN, recipe.name):
        raise RecipeError(f"name = {recipe.name!r} is not allowed: it names the run's folder, so it must match "
                          f"{NAME_PATTERN} (letters, digits, '.', '_', '-'; no '/', no leading dot), "
                          "e.g. name: my_study.")
    _check_prefixed("backbone.id", recipe.backbone.id, BACKBONES)
    prefix, rest = recipe.backbone.id.partition(":")[::2]
    if prefix == "offline" and rest not in OFFLINE_MODELS:
        guess = did_you_mean(rest, OFFLINE_MODELS.names())
        hint = f" Did you mean 'offline:{guess}'?" if guess else ""
        allowed = ", ".join(f"offline:{n}" for n in OFFLINE_MODELS.names())
        raise RecipeError(f"backbone.id = {recipe.backbone.id!r}: unknown offline backbone; allowed: {allowed}.{hint}")
    if prefix == "hf" and not rest:
        raise RecipeError("backbone.id = 'hf:' needs a hub id or a local dir, e.g. hf:facebook/dinov2-small.")
    pooling = recipe.backbone.pooling
    if pooling not in POOLINGS:
        guess = did_you_mean(pooling, POOLINGS.names())
        hint = f" Did you mean {guess!r}?" if guess else ""
        allowed = ", ".join(POOLINGS.names())
        raise RecipeError(f"backbone.pooling = {pooling!r} is not allowed; allowed: {allowed}.{hint}")
    _check_backbone(recipe.backbone, has_heads=bool(recipe.heads))
    _check_prefixed("data.source", recipe.data.source, DATA_SOURCES)
    src_prefix, src_rest = recipe.data.source.partition(":")[::2]
    if src_prefix in ("imagefolder", "hf") and not src_rest:
        raise RecipeError(f"data.source = {recipe.data.source!r} needs a path or id after ':'.")
    ranges = [
        ("seed", recipe.seed, 0, None),
        # 0 would leave no test images when the source has no test split (sklearn refuses such a split).
        ("data.test_fraction", recipe.data.test_fraction, 1e-300, 1.0),
        ("data.val_fraction", recipe.data.val_fraction, 0.0, 1.0),
        ("features.batch_size", recipe.features.batch_size, 1, None),
        ("features.num_workers", recipe.features.num_workers, 0, None),
    ]
    if recipe.backbone.resolution is not None:
        ranges.append(("backbone.resolution", recipe.backbone.resolution, 1, None))
    for split in ("train", "test"):
        limit = getattr(recipe.data.limit, split)
        if limit is not None:
            ranges.append((f"data.limit.{split}", limit, 1, None))
    knn = recipe.probes.get("knn")
    if knn is not None:
        ranges += [(f"probes.knn.ks[{i}]", k, 1, None) for i, k in enumerate(knn.ks)]
        ranges += [("probes.knn.temperature", knn.temperature, 1e-12, None)]
        ranges += [("probes.knn.chunk_size", knn.chunk_size, 1, None)]
        if not knn.ks:
            raise RecipeError("probes.knn.ks is empty; give at least one k, e.g. [10, 20].")
    linear = recipe.probes.get("linear")
    if linear is not None:
        ranges += [(f"probes.linear.C_grid[{i}]", c, 1e-300, None) for i, c in enumerate(linear.C_grid)]
        ranges += [("probes.linear.max_iter", linear.max_iter, 1, None)]
        if not linear.C_grid:
            raise RecipeError("probes.linear.C_grid is empty; give at least one C, e.g. [0.1, 1, 10].")
    orbits = recipe.probes.get("orbits")
    if orbits is not None:
        from .probes.orbits import ORBIT_SWEEPS

        if not orbits.sweeps:
            raise RecipeError(f"probes.orbits.sweeps is empty; give at least one of: {', '.join(ORBIT_SWEEPS)}.")
        for i, sweep in enumerate(orbits.sweeps):
            if sweep not in ORBIT_SWEEPS:
                raise RecipeError(f"probes.orbits.sweeps[{i}] = {sweep!r}: "
                                  + unknown_name_message("orbit sweep", sweep, list(ORBIT_SWEEPS)))
    ranges += _check_heads(recipe)
    for path, value, low, high in ranges:
        if value < low or (high is not None and value >= high and path.endswith("fraction")):
            if high is not None:
                bound = f"in (0, {high:g})" if 0 < low < 1e-100 else f"in [{low}, {high})"
            else:
                bound = f">= {low}"
            raise RecipeError(f"{path} = {value!r} is out of range; it must be {bound}.")


# Registered CNN backbones (their loaders reject token poolings too; this catches it before loading).
_CNN_IDS = ("scratch:resnet18-cifar", "offline:efficientnet-lite0")


def _check_backbone(spec: BackboneSpec, has_heads: bool = True) -> None:
    """Source names, layers, tune policy and LoRA options of `backbone`."""
    prefix, rest = spec.id.partition(":")[::2]
    if prefix in ("open_clip", "timm") and not rest:
        raise RecipeError(f"backbone.id = {spec.id!r} needs a model name, e.g. open_clip:ViT-B-32/openai or "
                          "timm:vit_small_patch14_dinov2.lvd142m.")
    if prefix == "scratch" and rest not in SCRATCH_MODELS:
        guess = did_you_mean(rest, SCRATCH_MODELS.names())
        hint = f" Did you mean 'scratch:{guess}'?" if guess else ""
        allowed = ", ".join(f"scratch:{n}" for n in SCRATCH_MODELS.names())
        raise RecipeError(f"backbone.id = {spec.id!r}: unknown scratch backbone; allowed: {allowed}.{hint}")
    if spec.layers is not None:
        if not spec.layers:
            raise RecipeError("backbone.layers is empty; give block indices such as [-4, -1], or null.")
        if spec.layer != -1:
            raise RecipeError(f"backbone.layer = {spec.layer} and backbone.layers = {spec.layers} are both set; "
                              "keep one (layers replaces layer).")
        if len(set(spec.layers)) != len(spec.layers):
            raise RecipeError(f"backbone.layers = {spec.layers} names a block twice.")
    if spec.id in _CNN_IDS and spec.pooling != "mean":
        raise RecipeError(f"backbone.id = {spec.id!r} is a CNN: it has no class token, so backbone.pooling = "
                          f"{spec.pooling!r} is undefined; set backbone.pooling: mean (global average pooling).")
    if spec.pooling == "pooler" and (spec.layers is not None or spec.layer != -1):
        raise RecipeError("backbone.pooling = 'pooler' is the model's own head on the final layer; it cannot be "
                          "combined with backbone.layer/layers. Use cls, mean or cls+mean.")
    kind, sep, n = spec.tune.partition(":")
    if spec.tune not in ("frozen", "lora", "full") and not (kind == "last" and sep and n.isdigit() and int(n) >= 1):
        guess = did_you_mean(spec.tune, ["frozen", "lora", "full", "last:1"])
        hint = f" Did you mean {guess!r}?" if guess else ""
        raise RecipeError(f"backbone.tune = {spec.tune!r} is not allowed; allowed: frozen, last:N (N >= 1 blocks), "
                          f"lora, full.{hint}")
    if spec.tune != "frozen" and not has_heads:
        raise RecipeError(f"backbone.tune = {spec.tune!r} trains the backbone through projection heads, but the "
                          "recipe has none; add a `heads:` section (an identity head trains with no projector) "
                          "or set backbone.tune: frozen.")
    lora = spec.lora
    if spec.tune != "lora" and lora != LoraSpec():
        raise RecipeError(f"backbone.lora is set but backbone.tune = {spec.tune!r}; set backbone.tune: lora "
                          "or remove backbone.lora.")
    for key, value, low in (("r", lora.r, 1), ("alpha", lora.alpha, 1e-12), ("dropout", lora.dropout, 0.0)):
        if value < low or (key == "dropout" and value >= 1):
            bound = "in [0, 1)" if key == "dropout" else f">= {low:g}"
            raise RecipeError(f"backbone.lora.{key} = {value!r} is out of range; it must be {bound}.")
    if lora.target_modules is not None and not lora.target_modules:
        raise RecipeError("backbone.lora.target_modules is empty; give module names, or null for the defaults.")


def _check_heads(recipe: Recipe) -> list[tuple]:
    """Head names, objective and augmentation knobs; returns the numeric ranges to check."""
    import inspect

    ranges: list[tuple] = []
    names = [h.name for h in recipe.heads]
    for i, head in enumerate(recipe.heads):
        if head.name == "backbone" or not head.name or "@" in head.name:
            raise RecipeError(f"heads[{i}].name = {head.name!r} is reserved or invalid; use e.g. 'mlp_relu'.")
        if names.count(head.name) > 1:
            raise RecipeError(f"heads[{i}].name = {head.name!r} is used twice; each head needs its own name.")
        ranges += [(f"heads[{i}].depth", head.depth, 1, None), (f"heads[{i}].width", head.width, 1, None),
                   (f"heads[{i}].init_scale", head.init_scale, 1e-300, None)]
        if recipe.objective.name == "simsiam" and head.predictor is None:
            raise RecipeError(f"heads[{i}] ({head.name}) has no predictor, which objective simsiam needs; "
                              "set heads[{i}].predictor to a width, e.g. 512.".replace("{i}", str(i)))
    objective = recipe.objective
    if objective.name not in OBJECTIVES:
        guess = did_you_mean(objective.name, OBJECTIVES.names())
        hint = f" Did you mean {guess!r}?" if guess else ""
        raise RecipeError(f"objective.name = {objective.name!r} is unknown; allowed: "
                          f"{', '.join(OBJECTIVES.names())}.{hint}")
    if recipe.heads and objective.options:
        params = [p for p in inspect.signature(OBJECTIVES.get(objective.name)).parameters][2:]
        params = [p for p in params if p not in ("p1", "p2", "z1", "z2")]
        for key in objective.options:
            if key not in params:
                guess = did_you_mean(key, params)
                hint = f" Did you mean {guess!r}?" if guess else ""
                raise RecipeError(f"objective.options.{key} is not an option of {objective.name}; "
                                  f"allowed: {', '.join(params)}.{hint}")
    if recipe.heads:
        from .data.augment import augment_spec

        try:
            augment_spec(recipe.augment.preset, **recipe.augment.options)
        except (ValueError, TypeError) as err:
            raise RecipeError(f"augment: {err}") from None
    train = recipe.train
    ranges += [("augment.views", recipe.augment.views, 2, None), ("train.epochs", train.epochs, 1, None),
               ("train.batch_size", train.batch_size, 2, None), ("train.lr", train.lr, 0.0, None),
               ("train.weight_decay", train.weight_decay, 0.0, None), ("train.log_every", train.log_every, 1, None),
               ("train.warmup_steps", train.warmup_steps, 0, None), ("train.grad_accum", train.grad_accum, 1, None)]
    if train.steps is not None:
        ranges.append(("train.steps", train.steps, 1, None))
    limit = recipe.data.limit.train
    if recipe.heads and limit is not None and 2 <= train.batch_size and limit < train.batch_size:
        # The rule training applies (train.train_heads / train_tuned): every batch is train.batch_size images
        # of the training split (data.limit.train of them at most; no validation part is taken off).
        raise RecipeError(f"train.batch_size = {train.batch_size} is larger than the {limit} training images of "
                          f"data.limit.train = {limit}; lower train.batch_size to at most {limit} or raise "
                          f"data.limit.train to at least {train.batch_size}.")
    geo = recipe.geometry
    ranges += [("geometry.rows", geo.rows, 2, None), ("geometry.track_rows", geo.track_rows, 2, None),
               ("geometry.track_max_iter", geo.track_max_iter, 2, None)]
    if geo.track_every is not None:
        ranges.append(("geometry.track_every", geo.track_every, 1, None))
    if train.checkpoint_every is not None:
        ranges.append(("train.checkpoint_every", train.checkpoint_every, 1, None))
    return ranges


def _check_prefixed(path: str, value: str, registry: Registry) -> None:
    prefix, sep, _ = value.partition(":")
    name = prefix if sep else value
    if name in registry:
        return
    usages = [e.usage for e in registry]
    guess = did_you_mean(name, registry.names())
    hint = ""
    if guess:
        hint = f" Did you mean {registry.entry(guess).usage!r}?"
    raise RecipeError(f"{path} = {value!r}: unknown {registry.family}; allowed: {', '.join(usages)}.{hint}")


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
