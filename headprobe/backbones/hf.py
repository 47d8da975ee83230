"""Hugging Face `transformers` image encoders: `hf:<hub id or local dir>`.

Resolution order (offline first): a local directory; the local Hugging Face
cache (`local_files_only=True`); the network, unless `HF_HUB_OFFLINE=1`.
Preprocessing is read from the checkpoint's own image-processor config, so
weights and preprocessing travel together.
"""

from __future__ import annotations

import inspect
import os
from functools import partial
from pathlib import Path

import torch
from torch import nn

from ..registry import POOLINGS
from .base import IMAGENET_MEAN, IMAGENET_STD, Backbone, BackboneNotFoundError, Preprocess

# PIL resampling codes used by transformers' image processors.
_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}
# Vision towers without a class token: the sequence is patch tokens only.
_NO_CLS_TOKEN = {"siglip_vision_model", "siglip2_vision_model"}


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def _from_pretrained(loader, ref: str, revision: str | None):
    """Local dir or cache first, then the network; one clear sentence when neither works."""
    if Path(ref).is_dir():
        return loader(ref)
    try:
        return loader(ref, revision=revision, local_files_only=True)
    except OSError as cached_err:
        if _offline():
            raise BackboneNotFoundError(
                f"hf:{ref} is not a local directory and is not in the Hugging Face cache "
                f"({os.environ.get('HF_HOME', '~/.cache/huggingface')}), and HF_HUB_OFFLINE=1 forbids "
                f"downloading it; run `hf download {ref}` on a machine with network, copy the "
                "cache here, or point backbone.id at a local dir (hf:/path/to/model)."
            ) from cached_err
    try:
        return loader(ref, revision=revision)
    except OSError as err:
        raise BackboneNotFoundError(
            f"hf:{ref} was not found as a local directory, in the Hugging Face cache, or on the hub "
            f"({type(err).__name__}: {str(err).splitlines()[0]}); check the id, or download it where there "
            "is network and load it from a local dir (hf:/path/to/model)."
        ) from err


def _preprocess_from_processor(ref: str, revision: str | None, config) -> tuple[Preprocess, str]:
    from transformers import AutoImageProcessor

    try:
        proc = _from_pretrained(AutoImageProcessor.from_pretrained, ref, revision)
    except (BackboneNotFoundError, OSError, ValueError):
        size = getattr(config, "image_size", 224)
        return (
            Preprocess(resize=size, crop=size, mean=IMAGENET_MEAN, std=IMAGENET_STD),
            "default: the checkpoint has no image-processor config, so ImageNet mean/std at config.image_size",
        )
    size = proc.size
    crop = getattr(proc, "crop_size", None) if getattr(proc, "do_center_crop", False) else None
    if getattr(size, "shortest_edge", None) or (isinstance(size, dict) and size.get("shortest_edge")):
        resize = size["shortest_edge"]
        mode = "shortest"
    else:
        resize, mode = size["height"], "square"
    crop_px = crop["height"] if crop is not None else resize
    resample = proc.resample
    interpolation = _RESAMPLE.get(int(getattr(resample, "value", resample)), "bicubic")
    pre = Preprocess(
        resize=resize,
        crop=crop_px,
        mean=tuple(float(m) for m in proc.image_mean),
        std=tuple(float(s) for s in proc.image_std),
        interpolation=interpolation,
        resize_mode=mode,
    )
    return pre, f"{type(proc).__name__} of the checkpoint"


def _vision_tower(model: nn.Module) -> nn.Module:
    """The image encoder of a full CLIP/SigLIP checkpoint, or the model itself."""
    if hasattr(model, "vision_model") and hasattr(model.config, "vision_config"):
        return model.vision_model
    return model


def _blocks(model: nn.Module) -> list[nn.Module]:
    encoder = getattr(model, "encoder", None)
    for name in ("layer", "layers"):
        blocks = getattr(encoder, name, None)
        if isinstance(blocks, nn.ModuleList):
            return list(blocks)
    return []


def encode_tokens(
    model: nn.Module, pixels: torch.Tensor, *, pool, n_prefix: int, interpolate: bool
) -> torch.Tensor:
    """pixels: (B, 3, H, W) → pooled (B, D') from the last hidden state (post-norm applied)."""
    kwargs = {"interpolate_pos_encoding": True} if interpolate else {}
    tokens = model(pixel_values=pixels, **kwargs).last_hidden_state
    # CLIP-style towers normalise only the pooled token; apply that norm to every token.
    post = getattr(model, "post_layernorm", None)
    if post is not None:
        tokens = post(tokens)
    return pool(tokens, n_prefix)


def wrap_vit(
    model: nn.Module,
    *,
    id: str,
    pooling: str,
    preprocess: Preprocess,
    resolution: int | None,
    description: str,
    options: dict,
) -> Backbone:
    """Wrap a transformers ViT-family model (DINOv2, ViT, CLIP/SigLIP vision) as a `Backbone`."""
    from .pooling import POOL_WIDTH

    config = model.config
    n_prefix = 0 if config.model_type in _NO_CLS_TOKEN else 1 + int(getattr(config, "num_register_tokens", 0) or 0)
    if pooling in ("cls", "cls+mean") and n_prefix == 0:
        raise ValueError(f"{id} has no class token, so pooling {pooling!r} is undefined; use pooling: mean.")
    if resolution is not None:
        preprocess = preprocess.with_resolution(resolution)
    native = getattr(config, "image_size", preprocess.crop)
    patch = getattr(config, "patch_size", 1)
    if preprocess.crop % patch:
        raise ValueError(f"{id}: image size {preprocess.crop} is not a multiple of the patch size {patch}.")
    accepts = "interpolate_pos_encoding" in inspect.signature(model.forward).parameters
    interpolate = accepts and preprocess.crop != native and config.model_type != "dinov2"
    encode = partial(encode_tokens, pool=POOLINGS.get(pooling), n_prefix=n_prefix, interpolate=interpolate)
    model.eval()
    return Backbone(
        model,
        encode,
        id=id,
        dim=config.hidden_size * POOL_WIDTH[pooling],
        preprocess=preprocess,
        blocks=_blocks(model),
        description=description,
        options=options,
    )


def load_hf(ref: str, *, pooling: str = "cls", resolution: int | None = None, revision: str | None = None) -> Backbone:
    """Load `hf:<ref>`; `ref` is a hub id or a local directory saved with `save_pretrained`."""
    from transformers import AutoModel

    model = _vision_tower(_from_pretrained(AutoModel.from_pretrained, ref, revision))
    preprocess, source = _preprocess_from_processor(ref, revision, model.config)
    return wrap_vit(
        model,
        id=f"hf:{ref}",
        pooling=pooling,
        preprocess=preprocess,
        resolution=resolution,
        description=f"{type(model).__name__} via transformers; preprocessing: {source}",
        options={"pooling": pooling, "resolution": resolution, "revision": revision},
    )
