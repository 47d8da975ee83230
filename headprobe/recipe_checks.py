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
        _closed("seed", recipe.seed, 0, MAX_SEED),
        # 0 would leave no test images when the source has no test split (sklearn refuses such a split).
        _fraction("data.test_fraction", recipe.data.test_fraction),
        # 0 leaves no validation images to choose C on; 1 leaves none to fit on.
        _fraction("data.val_fraction", recipe.data.val_fraction),
        _closed("data.split_seed", recipe.data.split_seed, 0, MAX_SEED),
        _at_least("features.batch_size", recipe.features.batch_size, 1),
        _at_least("features.num_workers", recipe.features.num_workers, 0),
    ]
    for split in ("train", "test"):
        limit = getattr(recipe.data.limit, split)
        if limit is not None:
            ranges.append(_at_least(f"data.limit.{split}", limit, 1))
    for entry in ranges:
        _check_range(*entry)
    _check_seeds(recipe)
    # Checked once the data options are known to be in range: the probes' limits depend on them.
    n_train, n_classes = known_train_size(recipe.data)
    for entry in _check_heads(recipe) + _check_probes(recipe, n_train):
        _check_range(*entry)
    limit = recipe.data.limit.train
    if limit is not None and n_classes is not None and limit < n_classes:
        raise RecipeError(f"data.limit.train = {limit} is below the number of classes of {recipe.data.source} "
                          f"({n_classes}): a class-stratified subset needs at least one image of every class; "
                          f"raise data.limit.train to at least {n_classes} (a few per class, e.g. "
                          f"{10 * n_classes}, for the probes' validation split).")


def _check_seeds(recipe: Recipe) -> None:
    if recipe.seeds is None:
        return
    if not recipe.seeds:
        raise RecipeError("seeds = [] is empty; list the seeds to train the heads with (e.g. seeds: [0, 1, 2]) or "
                          "remove the key to use `seed` alone.")
    for i, seed in enumerate(recipe.seeds):
        _check_range(*_closed(f"seeds[{i}]", seed, 0, MAX_SEED))
    if len(set(recipe.seeds)) != len(recipe.seeds):
        raise RecipeError(f"seeds = {recipe.seeds} repeats a seed; each retraining needs its own seed.")
    if len(recipe.seeds) > 1 and recipe.backbone.tune != "frozen":
        raise RecipeError(f"seeds = {recipe.seeds} with backbone.tune = {recipe.backbone.tune!r}: several seeds "
                          "retrain the heads on one set of cached backbone features, which a tuned backbone does not "
                          "have; use one seed, or run one recipe per seed (sweep: {seed: [0, 1, 2]}).")


# numpy's (and so `accelerate.set_seed`'s) seed range.
MAX_SEED = 2**32 - 1
# Plausibility bounds: past these a run would not finish (10^7 steps of a tiny head is days of compute).
MAX_EPOCHS = 100_000
MAX_STEPS = 10_000_000

# Training images of the built-in sources (their `train` split), and their classes: what validate can know
# about the data without loading it.
_BUILTIN_SIZES = {"sklearn-digits": (1797, 10, ()), "fashion-mnist": (60000, 10, ("test",))}


def known_train_size(data) -> tuple[int | None, int | None]:
    """(an upper bound on the training images, the number of classes) of `data` (a `DataSpec`), each None
    where it cannot be known without loading the data; data.limit.train bounds the images of any source."""
    import math

    prefix, sep, _ = data.source.partition(":")
    n, classes = None, None
    if prefix in _BUILTIN_SIZES and data.train_split == "train":
        total, classes, test_splits = _BUILTIN_SIZES[prefix]
        # load_data holds out a stratified test_fraction (sklearn rounds the test part up) without a test split.
        n = total if data.test_split in test_splits else total - math.ceil(data.test_fraction * total)
    limit = data.limit.train
    if limit is not None:
        n = limit if n is None else min(n, limit)
    return n, classes


def _at_least(path: str, value, low) -> tuple:
    return path, value, low, None, False, False


def _positive(path: str, value) -> tuple:
    return path, value, 0, None, True, False


def _closed(path: str, value, low, high) -> tuple:
    return path, value, low, high, False, False


def _fraction(path: str, value) -> tuple:
    return path, value, 0, 1, True, True


def _check_range(path: str, value, low, high, open_low: bool, open_high: bool) -> None:
    below = value <= low if open_low else value < low
    above = high is not None and (value >= high if open_high else value > high)
    if below or above:
        if high is None:
            bound = f"> {low:g}" if open_low else f">= {low}"
        else:
            bound = f"in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
            if not open_low and not open_high and isinstance(high, int):
                bound = f"in [{low}, {high}]"
        raise RecipeError(f"{path} = {value!r} is out of range; it must be {bound}.")


def _check_probes(recipe: Recipe, n_train: int | None) -> list[tuple]:
    """Every probe's options: the ranges the probe itself would refuse at run time, checked here instead."""
    probes, ranges = recipe.probes, []
    images = ("data.limit.train" if recipe.data.limit.train is not None and n_train == recipe.data.limit.train
              else recipe.data.source)
    knn = probes.get("knn")
    if knn is not None:
        if not knn.ks:
            raise RecipeError("probes.knn.ks is empty; give at least one k, e.g. [10, 20].")
        if len(set(knn.ks)) != len(knn.ks):
            raise RecipeError(f"probes.knn.ks = {knn.ks} lists a k twice; list each neighbour count once.")
        ranges += [_at_least(f"probes.knn.ks[{i}]", k, 1) for i, k in enumerate(knn.ks)]
        ranges += [_positive("probes.knn.temperature", knn.temperature),
                   _at_least("probes.knn.chunk_size", knn.chunk_size, 1)]
        if n_train is not None:
            for i, k in enumerate(knn.ks):
                if k > n_train:
                    raise RecipeError(f"probes.knn.ks[{i}] = {k} is more neighbours than the {n_train} training "
                                      f"images ({images}); use ks of at most {n_train}, e.g. "
                                      f"probes.knn.ks=[{min(10, n_train)}], or train on more images.")
    linear = probes.get("linear")
    if linear is not None:
        if not linear.C_grid:
            raise RecipeError("probes.linear.C_grid is empty; give at least one C, e.g. [0.1, 1, 10].")
        ranges += [_positive(f"probes.linear.C_grid[{i}]", c) for i, c in enumerate(linear.C_grid)]
        ranges += [_at_least("probes.linear.max_iter", linear.max_iter, 1), _positive("probes.linear.tol", linear.tol)]
    spectrum = probes.get("spectrum")
    if spectrum is not None and spectrum.top_k is not None:
        ranges.append(_at_least("probes.spectrum.top_k", spectrum.top_k, 1))
    invariance = probes.get("invariance")
    if invariance is not None:
        ranges.append(_positive("probes.invariance.uniformity_t", invariance.uniformity_t))
    view_mi = probes.get("view_mi")
    if view_mi is not None:
        # InfoNCE needs negatives: a batch of at least 2 pairs (probes.information.mutual_information).
        ranges += [_at_least("probes.view_mi.batch_size", view_mi.batch_size, 2),
                   _positive("probes.view_mi.temperature", view_mi.temperature),
                   _at_least("probes.view_mi.pca_dims", view_mi.pca_dims, 1),
                   _at_least("probes.view_mi.critic_steps", view_mi.critic_steps, 1)]
    aug = probes.get("augment_r2")
    if aug is not None:
        if aug.alphas is not None:
            if not aug.alphas:
                raise RecipeError("probes.augment_r2.alphas is empty; give ridge penalties such as [0.1, 1, 10], "
                                  "or null for the default grid.")
            ranges += [_positive(f"probes.augment_r2.alphas[{i}]", a) for i, a in enumerate(aug.alphas)]
        # Cross-validation that chooses each penalty needs 2 folds at least.
        ranges += [_at_least("probes.augment_r2.folds", aug.folds, 2),
                   _fraction("probes.augment_r2.test_fraction", aug.test_fraction)]
    rotation = probes.get("rotation")
    if rotation is not None:
        if rotation.C_grid is not None:
            if not rotation.C_grid:
                raise RecipeError("probes.rotation.C_grid is empty; give at least one C, e.g. [0.1, 1, 10], "
                                  "or null for the linear probe's default grid.")
            ranges += [_positive(f"probes.rotation.C_grid[{i}]", c) for i, c in enumerate(rotation.C_grid)]
        ranges += [_at_least("probes.rotation.mlp_hidden", rotation.mlp_hidden, 1),
                   _at_least("probes.rotation.mlp_epochs", rotation.mlp_epochs, 1)]
    orbits = probes.get("orbits")
    if orbits is not None:
        # The registry's names (kept equal to probes/orbits.py's by a test): no torch import to validate.
        sweeps = ORBIT_SWEEPS.names()
        if not orbits.sweeps:
            raise RecipeError(f"probes.orbits.sweeps is empty; give at least one of: {', '.join(sweeps)}.")
        for i, sweep in enumerate(orbits.sweeps):
            if sweep not in ORBIT_SWEEPS:
                raise RecipeError(f"probes.orbits.sweeps[{i}] = {sweep!r}: "
                                  + unknown_name_message("orbit sweep", sweep, sweeps))
        ranges += [_at_least("probes.orbits.n_images", orbits.n_images, 1),
                   _at_least("probes.orbits.pca_images", orbits.pca_images, 1)]
    return ranges


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
    _check_layers_and_resolution(spec)
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


# Blocks and patch size of the registered models whose architecture is fixed (kept equal to the models by
# tests/test_validate_audit.py): validate checks backbone.layer/layers and resolution against them unloaded.
KNOWN_BLOCKS = {"offline:dinov2-vits14": 12, "offline:efficientnet-lite0": 16, "scratch:resnet18-cifar": 8,
                "scratch:vit-tiny": 3}
KNOWN_PATCH = {"offline:dinov2-vits14": 14, "scratch:vit-tiny": 4}
# No image model here sees anything in fewer pixels; below this a resolution is a typo.
MIN_RESOLUTION = 8


def patch_size(backbone_id: str) -> int | None:
    """The ViT patch size of `backbone_id` where its name or the registry says it, else None."""
    if backbone_id in KNOWN_PATCH:
        return KNOWN_PATCH[backbone_id]
    prefix, _, rest = backbone_id.partition(":")
    if prefix == "open_clip":
        found = re.match(r"(?:EVA\d*-)?ViT-[A-Za-z0-9]+-(\d+)", rest)
    elif prefix == "timm":
        found = re.search(r"patch(\d+)", rest)
    else:
        found = None
    return int(found.group(1)) if found else None


def _check_layers_and_resolution(spec: BackboneSpec) -> None:
    res = spec.resolution
    if res is not None:
        patch = patch_size(spec.id)
        if res < max(MIN_RESOLUTION, patch or 0):
            why = (f"below the patch size {patch} of {spec.id} (the patch embedding would see no whole patch)"
                   if patch and res < patch else f"below {MIN_RESOLUTION} pixels")
            raise RecipeError(f"backbone.resolution = {res} is {why}; use at least {max(MIN_RESOLUTION, patch or 0)}"
                              ", or null for the checkpoint's own crop size.")
        if spec.id == "scratch:vit-tiny" and res % 4:
            raise RecipeError(f"backbone.resolution = {res} is not a multiple of the patch size 4 of "
                              f"scratch:vit-tiny; use e.g. {res - res % 4 or 4} or {res + 4 - res % 4}.")
    blocks = KNOWN_BLOCKS.get(spec.id)
    if blocks is None:
        return
    chosen = spec.layers if spec.layers is not None else [spec.layer]
    key = "backbone.layers" if spec.layers is not None else "backbone.layer"
    for i in chosen:
        if i != -1 and not -blocks <= i < blocks:
            raise RecipeError(f"{key} names block {i}, but {spec.id} has {blocks} blocks; use -{blocks}..{blocks - 1} "
                              "(-1: the final features).")


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
        ranges += [_at_least(f"heads[{i}].depth", head.depth, 1), _at_least(f"heads[{i}].width", head.width, 1),
                   _positive(f"heads[{i}].init_scale", head.init_scale)]
        if head.out_dim is not None:
            ranges.append(_at_least(f"heads[{i}].out_dim", head.out_dim, 1))
        if head.predictor is not None:
            ranges.append(_at_least(f"heads[{i}].predictor", head.predictor, 1))
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
    for section, options in (("objective.options", objective.options), ("augment.options", recipe.augment.options)):
        for key, value in options.items():
            _check_finite(f"{section}.{key}", value)
    if recipe.heads:
        from .data.augment import augment_spec

        try:
            augment_spec(recipe.augment.preset, **recipe.augment.options)
        except (ValueError, TypeError) as err:
            raise RecipeError(f"augment: {err}") from None
    train = recipe.train
    ranges += [_at_least("augment.views", recipe.augment.views, 2),
               _closed("train.epochs", train.epochs, 1, MAX_EPOCHS),
               _at_least("train.batch_size", train.batch_size, 2), _at_least("train.lr", train.lr, 0.0),
               _at_least("train.weight_decay", train.weight_decay, 0.0),
               # torch.optim.SGD refuses a negative momentum; 1 or more never forgets a gradient (diverges).
               ("train.momentum", train.momentum, 0, 1, False, True),
               _at_least("train.log_every", train.log_every, 1),
               _at_least("train.warmup_steps", train.warmup_steps, 0),
               _at_least("train.grad_accum", train.grad_accum, 1)]
    if train.steps is not None:
        ranges.append(_closed("train.steps", train.steps, 1, MAX_STEPS))
    limit = recipe.data.limit.train
    if recipe.heads and limit is not None and 2 <= train.batch_size and limit < train.batch_size:
        # The rule training applies (train.train_heads / train_tuned): every batch is train.batch_size images
        # of the training split (data.limit.train of them at most; no validation part is taken off).
        raise RecipeError(f"train.batch_size = {train.batch_size} is larger than the {limit} training images of "
                          f"data.limit.train = {limit}; lower train.batch_size to at most {limit} or raise "
                          f"data.limit.train to at least {train.batch_size}.")
    geo = recipe.geometry
    ranges += [_at_least("geometry.rows", geo.rows, 2), _at_least("geometry.track_rows", geo.track_rows, 2),
               _at_least("geometry.track_max_iter", geo.track_max_iter, 2)]
    if geo.track_every is not None:
        ranges.append(_at_least("geometry.track_every", geo.track_every, 1))
    if train.checkpoint_every is not None:
        ranges.append(_at_least("train.checkpoint_every", train.checkpoint_every, 1))
    return ranges


def _check_finite(path: str, value) -> None:
    """Free-form options (objective.options, augment.options) hold no NaN or infinity, at any depth."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        raise RecipeError(f"{path} = {value!r} is not a finite number; give an ordinary number "
                          "(NaN and infinities are not accepted).")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(f"{path}.{key}", item)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_finite(f"{path}[{i}]", item)


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
