"""timm models: `timm:<name>[/<weights file> or /random]`, classifier removed (`num_classes=0`).

Without a file the pretrained weights of `<name>` (a tag such as `.augreg_in21k` may be part of it) come from
the Hugging Face cache, then the hub unless `HF_HUB_OFFLINE=1`. A local file (`.safetensors`, `.pth`, `.bin`)
is loaded strictly: classifier weights are dropped, anything else missing or unexpected is an error.
`/random` builds the architecture randomly initialised from the seed. Preprocessing is timm's own transform for
the model's data config (`create_transform(**resolve_data_config(model=...))`), called on every image.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from torch import nn

from .base import Backbone, BackboneNotFoundError, Preprocess
from .blocks import wrap_blocks
from .hf import cache_first
from .pooling import FINAL
from .processor import processor_preprocess

_CROP_MODES = {"center": "shortest", "squash": "square"}


def preprocess_from_data_config(cfg: dict) -> Preprocess:
    """timm's `resolve_data_config(model=...)` → `timm.data.create_transform(**cfg)` (eval), with the resize, crop
    and normalisation it does."""
    _, height, width = cfg["input_size"]
    if height != width:
        raise ValueError(f"input size {height}x{width} is not square; only square crops are supported.")
    mode = cfg.get("crop_mode", "center")
    if mode not in _CROP_MODES:
        raise ValueError(f"timm crop_mode {mode!r} is not supported; supported: {', '.join(_CROP_MODES)}.")
    interpolation = cfg.get("interpolation", "bicubic")
    if interpolation not in ("bicubic", "bilinear", "nearest"):
        interpolation = "bicubic"
    crop_pct = cfg.get("crop_pct") or 1.0
    described = Preprocess(
        resize=math.floor(height / crop_pct),
        crop=height,
        mean=tuple(float(m) for m in cfg["mean"]),
        std=tuple(float(s) for s in cfg["std"]),
        interpolation=interpolation,
        resize_mode=_CROP_MODES[mode],
    )
    return processor_preprocess(described, "timm", dict(cfg))


def timm_blocks(model: nn.Module) -> list[nn.Module]:
    """The residual blocks in forward order: ViT `blocks`, staged `stages[i].blocks`, ResNet `layer1..4`."""
    if hasattr(model, "stages"):
        return [b for stage in model.stages for b in (stage.blocks if hasattr(stage, "blocks") else stage.children())]
    if isinstance(getattr(model, "blocks", None), nn.Module):
        children = list(model.blocks.children())
        if children and all(isinstance(c, nn.Sequential) for c in children):
            return [b for stage in children for b in stage.children()]
        return children
    layers = [getattr(model, f"layer{i}", None) for i in range(1, 5)]
    if all(isinstance(layer, nn.Sequential) for layer in layers):
        return [b for layer in layers for b in layer.children()]
    return []


def after_last_block(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """Top-level modules with weights registered after the one holding the last block (final norm, head conv)."""
    if not blocks:
        return []
    children = list(model.children())
    holder = next(i for i, c in enumerate(children) if any(m is blocks[-1] for m in c.modules()))
    return [c for c in children[holder + 1 :] if any(True for _ in c.parameters())]


def _forward_features(model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    return model.forward_features(pixels)


def _forward_pooled(model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    return model(pixels)


def wrap_timm_model(
    model: nn.Module,
    *,
    id: str,
    pooling: str,
    layer: int,
    layers: list[int] | None,
    preprocess: Preprocess,
    description: str,
    options: dict,
) -> Backbone:
    """A timm model built with `num_classes=0` as a `Backbone`: tokens for ViTs, NCHW maps for CNNs,
    `pooler` = timm's own `forward_head` (its global pool, and `fc_norm` where the model has one)."""
    blocks = timm_blocks(model)
    is_vit = hasattr(model, "num_prefix_tokens") and hasattr(model, "norm")
    if not is_vit:
        model.eval()
        with torch.no_grad():
            fmap = model.forward_features(torch.zeros(1, 3, preprocess.crop, preprocess.crop))
        if fmap.ndim != 4 or fmap.shape[1] != model.num_features:
            if pooling != "pooler" or layers is not None or layer != FINAL:
                raise ValueError(f"{id}: its features have shape {tuple(fmap.shape)} (neither ViT tokens nor an NCHW "
                                 "map), so only pooling 'pooler' (timm's own head) on the final layer is supported.")
            blocks = []
    return wrap_blocks(
        model,
        id=id,
        run=_forward_features,
        blocks=blocks,
        tokens=is_vit,
        pooling=pooling,
        layer=layer,
        layers=layers,
        preprocess=preprocess,
        description=description,
        options=options,
        norm=model.norm if is_vit else None,
        n_prefix=int(getattr(model, "num_prefix_tokens", 0)),
        has_cls=bool(getattr(model, "has_class_token", False)) if is_vit else False,
        pooler=_forward_pooled,
        after_blocks=after_last_block(model, blocks),
    )


def _load_file(model: nn.Module, path: Path, id: str) -> None:
    """Strict loading of a local weights file; the classifier's weights (if saved) are dropped."""
    import timm.models

    state = timm.models.load_state_dict(str(path))
    classifier = model.pretrained_cfg.get("classifier") or ()
    for name in (classifier,) if isinstance(classifier, str) else classifier:
        for key in [k for k in state if k.startswith(f"{name}.")]:
            del state[key]
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"{id}: the weights file does not match the architecture: missing {result.missing_keys[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}; save it from the same timm model (model.state_dict())."
        )


def _create(timm, name: str, id: str, *, pretrained: bool, resolution: int | None):
    kwargs = {"img_size": resolution} if resolution is not None else {}
    try:
        return timm.create_model(name, pretrained=pretrained, num_classes=0, **kwargs)
    except TypeError:
        if not kwargs:
            raise
        return timm.create_model(name, pretrained=pretrained, num_classes=0)  # CNNs take any size as it comes


def load_timm(
    ref: str,
    *,
    pooling: str = "cls",
    resolution: int | None = None,
    layer: int = FINAL,
    layers: list[int] | None = None,
    seed: int | None = None,
) -> Backbone:
    """Load `timm:<ref>`; see the module docstring for the forms of `ref`."""
    import timm

    id = f"timm:{ref}"
    if ref.startswith(("hf-hub:", "hf_hub:")):
        name, weights = ref, ""
    else:
        name, _, weights = ref.partition("/")
    arch = name.split(".")[0]
    if not name.startswith(("hf-hub:", "hf_hub:")) and not timm.is_model(arch):
        import difflib

        close = difflib.get_close_matches(arch, timm.list_models(), n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"{id}: timm has no architecture {arch!r} (see timm.list_models()).{hint}")
    if weights == "random":
        model = _create(timm, name, id, pretrained=False, resolution=resolution)
        source = f"randomly initialised (seed {seed})"
    elif weights:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise BackboneNotFoundError(f"{id}: weights file {str(path)!r} does not exist; give the path to a "
                                        "state dict saved from this timm model (.safetensors, .pth or .bin).")
        model = _create(timm, name, id, pretrained=False, resolution=resolution)
        _load_file(model, path, id)
        source = f"weights file {path}"
    else:

        try:
            model = cache_first(lambda: _create(timm, name, id, pretrained=True, resolution=resolution))
        except (OSError, RuntimeError) as err:
            raise BackboneNotFoundError(
                f"{id}: timm's pretrained weights for {name!r} are not in the Hugging Face cache "
                f"({os.environ.get('HF_HOME', '~/.cache/huggingface')}) and could not be downloaded "
                f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); on a machine with network "
                f"run `python -c \"import timm; timm.create_model('{name}', pretrained=True)\"` and copy the cache, "
                f"or save the weights to a file and use timm:{name}/<file>."
            ) from err
        source = f"pretrained ({model.pretrained_cfg.get('hf_hub_id') or name})"
    preprocess = preprocess_from_data_config(timm.data.resolve_data_config(model=model))
    if resolution is not None:
        preprocess = preprocess.with_resolution(resolution)
    return wrap_timm_model(
        model.eval(),
        id=id,
        pooling=pooling,
        layer=layer,
        layers=layers,
        preprocess=preprocess,
        description=f"timm {type(model).__name__} {name}, {source}; preprocessing: timm's own transform",
        options={"pooling": pooling, "resolution": resolution, "layer": layer, "layers": layers},
    )
