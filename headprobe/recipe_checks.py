"""The recipe checks that need no model library: registered names, value ranges, the backbone's options and the
heads, run by `load_recipe` on every recipe (split from recipe.py, which keeps the schema, YAML and overrides)."""

from __future__ import annotations

import re

from .recipe import NAME_PATTERN, BackboneSpec, LoraSpec, Recipe, RecipeError
from .registry import (
    BACKBONES,
    DATA_SOURCES,
    OBJECTIVES,
    OFFLINE_MODELS,
    ORBIT_SWEEPS,
    POOLINGS,
    SCRATCH_MODELS,
    Registry,
    did_you_mean,
    unknown_name_message,
)


def check_recipe(recipe: Recipe) -> None:
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
        # The registry's names (kept equal to probes/orbits.py's by a test): no torch import to validate.
        sweeps = ORBIT_SWEEPS.names()
        if not orbits.sweeps:
            raise RecipeError(f"probes.orbits.sweeps is empty; give at least one of: {', '.join(sweeps)}.")
        for i, sweep in enumerate(orbits.sweeps):
            if sweep not in ORBIT_SWEEPS:
                raise RecipeError(f"probes.orbits.sweeps[{i}] = {sweep!r}: "
                                  + unknown_name_message("orbit sweep", sweep, sweeps))
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
