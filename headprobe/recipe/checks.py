"""The recipe checks that relate fields to each other, or need facts the schema does not declare: prefixed
registered names (``offline:NAME``), the backbone's layers, tune policy and LoRA options, the heads against the
objective and the data, the probes against the training set. Run by `load_recipe` on every recipe, after every
field's own type, range and registered names (`recipe.schema`); none imports a model library."""

from __future__ import annotations

import math
import re
import warnings

from ..registry import (
    BACKBONES,
    DATA_SOURCES,
    OBJECTIVES,
    OFFLINE_MODELS,
    SCRATCH_MODELS,
    UNTRAINED_HEAD_TYPES,
    Registry,
    UnavailablePluginError,
)
from .folder_names import folder_name_problem
from .objective_inputs import parameter_names, takes_predictor
from .pretrained_heads import check_pretrained_heads
from .probe_inputs import orbit_request
from .schema import (
    NAME_PATTERN,
    BackboneSpec,
    DataSpec,
    LoraSpec,
    Recipe,
    RecipeError,
    not_allowed,
    unknown_name,
    unregistered,
)


def check_recipe(recipe: Recipe) -> None:
    """Checks across fields and registered names, without importing any model library (but torch, to inspect an
    ssl: checkpoint's keys)."""
    if not re.fullmatch(NAME_PATTERN, recipe.name):
        raise RecipeError(f"name = {recipe.name!r} is not allowed: it names the run's folder, so it must match "
                          f"{NAME_PATTERN} (letters, digits, '.', '_', '-'; no '/', no leading dot), "
                          "e.g. name: my_study.")
    if recipe.backbone.id.startswith("module:") and "module" not in BACKBONES:
        raise RecipeError(f"backbone.id = {recipe.backbone.id!r} names a network that was passed from Python "
                          "(headprobe.run(recipe, backbone=net)); pass it that way again, or make it a plug-in "
                          "(an entry point in the group headprobe.backbones, see headprobe/plugins.py) so that "
                          "`headprobe run` can load it by name.")
    _check_prefixed("backbone.id", recipe.backbone.id, BACKBONES)
    _check_backbone(recipe.backbone, has_heads=bool(recipe.heads))
    _check_prefixed("data.source", recipe.data.source, DATA_SOURCES)
    src_prefix, src_rest = recipe.data.source.partition(":")[::2]
    if src_prefix in ("imagefolder", "hf") and not src_rest:
        raise RecipeError(f"data.source = {recipe.data.source!r} needs a path or id after ':'.")
    _check_hub_options(recipe.data, src_prefix)
    _check_seeds(recipe)
    _check_heads(recipe)
    _check_probes(recipe, known_train_size(recipe.data)[0])
    n_classes = known_train_size(recipe.data)[1]
    limit = recipe.data.limit.train
    if limit is not None and n_classes is not None and limit < n_classes:
        raise RecipeError(f"data.limit.train = {limit} is below the number of classes of {recipe.data.source} "
                          f"({n_classes}): a class-stratified subset needs at least one image of every class; "
                          f"raise data.limit.train to at least {n_classes} (a few per class, e.g. "
                          f"{10 * n_classes}, for the probes' validation split).")
    check_pretrained_heads(recipe)
    _check_claims(recipe)
    _check_trackers(recipe)


def _check_claims(recipe: Recipe) -> None:
    """The `claims:` overrides name known questions, a primary among each question's measures, a margin >= 0."""
    from ..stats.claims import check_claims_section

    try:
        check_claims_section(recipe.claims)
    except ValueError as err:
        raise RecipeError(str(err)) from None
    chosen = {key: override["primary"] for key, override in recipe.claims.items() if "primary" in override}
    if not chosen:
        return
    from headprobe.probes.declaration import declared_probes

    for key, primary in chosen.items():
        owners = [p.name for p in declared_probes() if any(m.match(primary) is not None for m in p.metrics)]
        if owners and not set(owners) & set(recipe.probes):
            raise RecipeError(f"claims.{key}.primary = {primary!r} is measured by probe {owners[0]}, which the "
                              f"recipe does not run (its probes: {', '.join(recipe.probes)}); add probes.{owners[0]}, "
                              "or choose a primary one of its probes measures.")


def _check_trackers(recipe: Recipe) -> None:
    """Every tracker of report_to is installed (they are optional packages); said before anything runs."""
    if not recipe.report_to:
        return
    from .trackers import missing_packages, mlflow_store_problem

    if len(set(recipe.report_to)) != len(recipe.report_to):
        raise RecipeError(f"report_to = {recipe.report_to} names a tracker twice; list each once.")
    missing = missing_packages(recipe.report_to)
    if missing:
        raise RecipeError(f"report_to = {recipe.report_to} needs {', '.join(missing)}, which is not installed; "
                          f"`pip install {' '.join(missing)}`, or remove it from report_to.")
    if "mlflow" in recipe.report_to and (problem := mlflow_store_problem()) is not None:
        raise RecipeError(problem)


def _check_hub_options(data: DataSpec, prefix: str) -> None:
    """data.config, data.streaming and data.revision belong to hf: sources (fashion-mnist's hub fallback takes a
    revision too); streaming reads the first limit.train / limit.test examples, so it needs both."""
    hub = prefix == "hf"
    for key, value in (("config", data.config), ("streaming", data.streaming),
                       ("revision", data.revision if prefix != "fashion-mnist" else None)):
        if value and not hub:
            raise RecipeError(f"data.{key} = {value!r} applies to hf: sources (datasets.load_dataset), not to "
                              f"data.source = {data.source!r}; remove it.")
    if data.streaming and (data.limit.train is None or data.limit.test is None):
        raise RecipeError("data.streaming: true reads only the first data.limit.train and data.limit.test examples "
                          "of the dataset; set both (e.g. data.limit: {train: 5000, test: 1000}) or stream nothing.")


def _check_prefixed(path: str, value: str, registry: Registry) -> None:
    """``PREFIX:rest`` or a bare name of `registry`; the allowed values are written as the entries' usages."""
    prefix, sep, _ = value.partition(":")
    name = prefix if sep else value
    if name not in registry:
        raise unregistered(f"{path} = {value!r}", registry, name, {e.name: e.usage for e in registry})


def _check_seeds(recipe: Recipe) -> None:
    if recipe.seeds is None:
        return
    if not recipe.seeds:
        raise RecipeError("seeds = [] is empty; list the seeds to train the heads with (e.g. seeds: [0, 1, 2]) or "
                          "remove the key to use `seed` alone.")
    if len(set(recipe.seeds)) != len(recipe.seeds):
        raise RecipeError(f"seeds = {recipe.seeds} repeats a seed; each retraining needs its own seed.")


# Training images of the built-in sources (their `train` split), and their classes: what validate can know
# about the data without loading it.
_BUILTIN_SIZES = {"sklearn-digits": (1797, 10, ()), "fashion-mnist": (60000, 10, ("test",))}


def known_train_size(data: DataSpec) -> tuple[int | None, int | None]:
    """(an upper bound on the training images, the number of classes) of `data`, each None where it cannot be
    known without loading the data; data.limit.train bounds the images of any source."""
    prefix = data.source.partition(":")[0]
    n, classes = None, None
    if prefix in _BUILTIN_SIZES and data.train_split == "train":
        total, classes, test_splits = _BUILTIN_SIZES[prefix]
        # load_data holds out a stratified test_fraction (sklearn rounds the test part up) without a test split.
        n = total if data.test_split in test_splits else total - math.ceil(data.test_fraction * total)
    limit = data.limit.train
    if limit is not None:
        n = limit if n is None else min(n, limit)
    return n, classes


def _check_probes(recipe: Recipe, n_train: int | None) -> None:
    """The probes' options that each field's range cannot say alone (empty or repeated lists, k against the
    training images): each probe's own declared `check` (`probes.declaration.Probe.check`); the probes that need
    orbits ask for the same ones (`probe_inputs.orbit_request`)."""
    from headprobe.probes.declaration import TrainImages, declared_probe

    images = ("data.limit.train" if recipe.data.limit.train is not None and n_train == recipe.data.limit.train
              else recipe.data.source)
    for name, options in recipe.probes.items():
        try:
            check = declared_probe(name).check
        except UnavailablePluginError as err:  # its module fails on import: taken out, with its first line
            raise RecipeError(f"probes.{name}: {err}") from None
        if check is None:
            continue
        try:
            check(options, TrainImages(n_train, images))
        except ValueError as err:
            raise RecipeError(str(err)) from None
    orbit_request(recipe)


# Registered CNN backbones (their loaders reject token poolings too; this catches it before loading).
_CNN_IDS = ("scratch:resnet18-cifar", "offline:efficientnet-lite0")
# Backbone sources whose models are registered by name (`offline:NAME`, `scratch:NAME`).
_NAMED_MODELS = {"offline": OFFLINE_MODELS, "scratch": SCRATCH_MODELS}
# The tune policies; `last:N` with N >= 1 blocks.
_TUNE = ("frozen", "lora", "full")


def _check_backbone(spec: BackboneSpec, has_heads: bool = True) -> None:
    """Source names, layers, tune policy and LoRA options of `backbone`."""
    prefix, rest = spec.id.partition(":")[::2]
    if prefix == "hf" and not rest:
        raise RecipeError("backbone.id = 'hf:' needs a hub id or a local dir, e.g. hf:facebook/dinov2-small.")
    if prefix in ("open_clip", "timm") and not rest:
        raise RecipeError(f"backbone.id = {spec.id!r} needs a model name, e.g. open_clip:ViT-B-32/openai or "
                          "timm:vit_small_patch14_dinov2.lvd142m.")
    models = _NAMED_MODELS.get(prefix)
    if models is not None and rest not in models:
        raise unknown_name(f"backbone.id = {spec.id!r}", models.family, rest, models.names(),
                               {e.name: e.usage for e in models})
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
    if spec.tune not in _TUNE and not (kind == "last" and sep and n.isdigit() and int(n) >= 1):
        raise not_allowed("backbone.tune", spec.tune, ["frozen", "last:N (N >= 1 blocks)", "lora", "full"],
                          [*_TUNE, "last:1"])
    if spec.tune != "frozen" and not has_heads:
        raise RecipeError(f"backbone.tune = {spec.tune!r} trains the backbone through projection heads, but the "
                          "recipe has none; add a `heads:` section (an identity head trains with no projector) "
                          "or set backbone.tune: frozen.")
    if spec.tune != "lora" and spec.lora != LoraSpec():
        raise RecipeError(f"backbone.lora is set but backbone.tune = {spec.tune!r}; set backbone.tune: lora "
                          "or remove backbone.lora.")
    if spec.lora.target_modules is not None and not spec.lora.target_modules:
        raise RecipeError("backbone.lora.target_modules is empty; give module names, or null for the defaults.")


# No image model here sees anything in fewer pixels; below this a resolution is a typo.
MIN_RESOLUTION = 8


def declared_shape(backbone_id: str) -> dict:
    """What the registry declares of `backbone_id`'s architecture (blocks, patch size), else {}: the model's own
    entry (`offline:<name>`, `scratch:<name>`) or its family's name pattern (`timm:`, `open_clip:`)."""
    prefix, _, rest = backbone_id.partition(":")
    models = _NAMED_MODELS.get(prefix)
    if models is not None and rest in models:
        return dict(models.entry(rest).shape or {})
    if prefix in BACKBONES:
        pattern = (BACKBONES.entry(prefix).shape or {}).get("patch_pattern")
        found = re.search(pattern, rest) if pattern else None
        return {"patch": int(found.group(1))} if found else {}
    return {}


def patch_size(backbone_id: str) -> int | None:
    """The ViT patch size of `backbone_id` where the registry declares it, else None."""
    return declared_shape(backbone_id).get("patch")


def _check_layers_and_resolution(spec: BackboneSpec) -> None:
    res = spec.resolution
    if res is not None:
        patch = patch_size(spec.id)
        if res < max(MIN_RESOLUTION, patch or 0):
            why = (f"below the patch size {patch} of {spec.id} (the patch embedding would see no whole patch)"
                   if patch and res < patch else f"below {MIN_RESOLUTION} pixels")
            raise RecipeError(f"backbone.resolution = {res} is {why}; use at least {max(MIN_RESOLUTION, patch or 0)}"
                              ", or null for the checkpoint's own crop size.")
        if declared_shape(spec.id).get("whole_patches") and res % patch:
            raise RecipeError(f"backbone.resolution = {res} is not a multiple of the patch size {patch} of "
                              f"{spec.id}; use e.g. {res - res % patch or patch} or {res + patch - res % patch}.")
    blocks = declared_shape(spec.id).get("blocks")
    if blocks is None:
        return
    chosen = spec.layers if spec.layers is not None else [spec.layer]
    key = "backbone.layers" if spec.layers is not None else "backbone.layer"
    for i in chosen:
        if i != -1 and not -blocks <= i < blocks:
            raise RecipeError(f"{key} names block {i}, but {spec.id} has {blocks} blocks; use -{blocks}..{blocks - 1} "
                              "(-1: the final features).")


def _check_heads(recipe: Recipe) -> None:
    """Head names, the objective's options and the augmentation knobs against the heads and the data."""
    part = recipe.backbone.part
    if part is not None and (part not in ("teacher", "student") or not recipe.backbone.id.startswith("ssl:")):
        raise RecipeError(f"backbone.part = {part!r}: a part is `teacher` or `student`, and only ssl:<format>:<path> "
                          "backbones (DINO-style checkpoints hold both networks) take one; remove it otherwise.")
    names = [h.name for h in recipe.heads]
    for i, head in enumerate(recipe.heads):
        if head.name == "backbone" or not head.name or "@" in head.name:
            raise RecipeError(f"heads[{i}].name = {head.name!r} is reserved or invalid; use e.g. 'mlp_relu'.")
        if (problem := folder_name_problem(head.name)) is not None or head.name.startswith("."):
            raise RecipeError(f"heads[{i}].name = {head.name!r} {problem or 'starts with a dot'}; it names the head's "
                              "files inside the run folder (per_unit/HEAD.safetensors), so use e.g. 'mlp_relu'.")
        if names.count(head.name) > 1:
            raise RecipeError(f"heads[{i}].name = {head.name!r} is used twice; each head needs its own name.")
        if head.type == "pretrained" and not recipe.backbone.id.startswith(("ssl:", "hf:", "open_clip:")):
            raise RecipeError(f"heads[{i}] ({head.name}) is `type: pretrained`, the head stored in the backbone's "
                              f"self-supervised checkpoint or a CLIP model's image projection, but backbone.id = "
                              f"{recipe.backbone.id!r} is neither; use backbone.id: ssl:<format>:<path> (e.g. "
                              "ssl:dino:ckpt.pth), an hf: or open_clip: CLIP model, or another head type.")
        if head.taps is not None and head.type != "pretrained" and (not head.taps or max(head.taps) > head.depth):
            raise RecipeError(f"heads[{i}].taps = {head.taps} must name layers among 1..{head.depth} (the head's "
                              f"depth; {head.depth} is its output), or be null for every layer.")
        if head.type == "pretrained" and recipe.backbone.tune != "frozen":
            raise RecipeError(f"heads[{i}] ({head.name}) is `type: pretrained` with backbone.tune = "
                              f"{recipe.backbone.tune!r}; a checkpoint's own head is probed on its frozen backbone.")
        if head.init_of is not None:
            twin = next((h for h in recipe.heads if h.name == head.init_of), None)
            if twin is None or twin.type in UNTRAINED_HEAD_TYPES or twin.init_of is not None:
                trained = [h.name for h in recipe.heads
                           if h.type not in UNTRAINED_HEAD_TYPES and h.init_of is None]
                raise RecipeError(f"heads[{i}].init_of = {head.init_of!r} must name a trained head of this recipe "
                                  f"(its copy at initialisation is the null); trained heads: "
                                  f"{', '.join(trained) or 'none'}.")
        if head.init_of is not None and recipe.backbone.tune != "frozen":
            raise RecipeError(f"heads[{i}] ({head.name}) is a null head (init_of), which is probed on a frozen "
                              f"backbone's features; with backbone.tune = {recipe.backbone.tune!r} every head trains "
                              "the backbone, so remove it (and null_heads: init); for a null arm across runs use a "
                              "run whose only head is `type: random` (the backbone trained through a fixed random "
                              "injective map).")
        if head.type == "pretrained":
            continue
        predictor = takes_predictor(recipe.objective.name)
        if predictor and head.predictor is None and head.type != "random":
            raise RecipeError(f"heads[{i}] ({head.name}) has no predictor, which objective "
                              f"{recipe.objective.name} needs; set heads[{i}].predictor to a width, e.g. 512.")
        if not predictor and head.predictor is not None:
            raise RecipeError(f"heads[{i}].predictor = {head.predictor}, but objective {recipe.objective.name} "
                              "takes no predictor (only an objective of predictor outputs, such as simsiam, does); "
                              f"remove heads[{i}].predictor, or use objective: {{name: simsiam}}.")
    objective = recipe.objective
    if objective.options:  # checked whether or not heads use them: a typo is a typo
        params = parameter_names(OBJECTIVES.entry(objective.name).target)[2:]
        # gather_distributed is the run's to decide (per step source), not the recipe's
        params = [p for p in params if p not in ("p1", "p2", "z1", "z2", "gather_distributed")]
        for key in objective.options:
            if key not in params:
                raise unknown_name(f"objective.options.{key}", f"{objective.name} option", key, params)
    for section, options in (("objective.options", objective.options), ("augment.options", recipe.augment.options)):
        for key, value in options.items():
            _check_finite(f"{section}.{key}", value)
    from ..data.augment import augment_spec

    try:
        augment_spec(recipe.augment.preset, **recipe.augment.options)
    except (ValueError, TypeError) as err:
        raise RecipeError(f"augment: {err}") from None
    unknown = [h for h in recipe.geometry.collapse_heads or [] if h not in names]
    if unknown:
        raise RecipeError(f"geometry.collapse_heads names {', '.join(map(repr, unknown))}, not a head of this "
                          f"recipe; heads: {', '.join(names) or 'none'}.")
    inert = [key for key, given in (("geometry.final", recipe.geometry.final),
                                    ("train.checkpoint_every", recipe.train.checkpoint_every is not None)) if given]
    if inert and not recipe.heads:
        warnings.warn(f"{' and '.join(inert)} {'has' if len(inert) == 1 else 'have'} no effect without heads "
                      "(heads: []); remove it, or add a head.", stacklevel=2)
    train, limit = recipe.train, recipe.data.limit.train
    if recipe.heads and limit is not None and limit < train.batch_size:
        # The rule training applies (train.train_heads / train_tuned): every batch is train.batch_size images
        # of the training split (data.limit.train of them at most; no validation part is taken off).
        raise RecipeError(f"train.batch_size = {train.batch_size} is larger than the {limit} training images of "
                          f"data.limit.train = {limit}; lower train.batch_size to at most {limit} or raise "
                          f"data.limit.train to at least {train.batch_size}.")


def _check_finite(path: str, value) -> None:
    """Free-form options (objective.options, augment.options) hold no NaN or infinity, at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        raise RecipeError(f"{path} = {value!r} is not a finite number; give an ordinary number "
                          "(NaN and infinities are not accepted).")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(f"{path}.{key}", item)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_finite(f"{path}[{i}]", item)
