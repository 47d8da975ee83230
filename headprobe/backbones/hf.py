"""Hugging Face `transformers` image encoders: `hf:<hub id or local dir>`.

Resolution order (offline first): a local directory; the local Hugging Face
cache (`local_files_only=True`); the network, unless `HF_HUB_OFFLINE=1`.
Preprocessing is the checkpoint's own image processor (`AutoImageProcessor`), called on every image, so
weights and preprocessing travel together; a checkpoint without one is warned about.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import torch
from torch import nn

from ..registry import POOLINGS
from .base import IMAGENET_MEAN, IMAGENET_STD, Backbone, BackboneNotFoundError, Preprocess
from .blocks import block_outputs
from .pooling import FINAL, POOL_WIDTH, check_pooling, pooled_output, resolve_layers
from .processor import processor_preprocess, transformers_settings

# PIL resampling codes used by transformers' image processors.
_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}
# Vision towers without a class token: the sequence is patch tokens only.
_NO_CLS_TOKEN = {"siglip_vision_model", "siglip2_vision_model"}


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


@contextlib.contextmanager
def _hub_cache_only() -> Iterator[None]:
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; its module constant is what its calls check.
    import huggingface_hub.constants as constants

    saved, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved


def cache_first(load: Callable):
    """`load()` from the local Hugging Face cache only; if that fails and HF_HUB_OFFLINE is not set, from the hub.

    For libraries (timm, open_clip) that download through huggingface_hub without a `local_files_only` switch.
    """
    try:
        with _hub_cache_only():
            return load()
    except (OSError, RuntimeError):
        if _offline():
            raise
    return load()


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
    """The checkpoint's own image processor as its `Preprocess` (called on every image), and where it came from."""
    from transformers import AutoImageProcessor

    try:
        proc = _from_pretrained(AutoImageProcessor.from_pretrained, ref, revision)
    except (BackboneNotFoundError, OSError, ValueError):
        size = getattr(config, "image_size", 224)
        fix = ("save the processor the weights were trained with next to them: AutoImageProcessor.from_pretrained("
               f'"<the hub id they came from>").save_pretrained("{ref}")' if Path(ref).is_dir() else
               "point backbone.id at a local directory holding the weights and the processor they were trained with "
               "(hf:/path/to/model)")
        warnings.warn(
            f"hf:{ref} has no image-processor config (preprocessor_config.json), so headprobe resizes images to "
            f"{size} px and normalises them with ImageNet mean/std, which is wrong for a model trained otherwise "
            f"(CLIP, SigLIP); {fix}.",
            stacklevel=2,
        )
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
    source = f"{type(proc).__name__} of the checkpoint, called on each image"
    return processor_preprocess(pre, "transformers", transformers_settings(proc)), source


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


def _final_norm(model: nn.Module) -> nn.Module | None:
    """The norm that follows the last block (DINOv2/ViT `layernorm`, CLIP/SigLIP `post_layernorm`)."""
    for name in ("layernorm", "post_layernorm", "norm"):
        norm = getattr(model, name, None)
        if isinstance(norm, nn.Module):
            return norm
    return None


def _has_pooler(model: nn.Module) -> bool:
    """Whether the model computes a `pooler_output` of its own (a head, or CLIP's post-normed class token)."""
    if model.config.model_type in ("siglip_vision_model", "siglip2_vision_model"):
        return getattr(model, "head", None) is not None
    if model.config.model_type.startswith(("dinov2", "clip_vision")):
        return True
    return getattr(model, "pooler", None) is not None


def encode_hidden(
    model: nn.Module, pixels: torch.Tensor, *, pool, picks: list[int], n_prefix: int, interpolate: bool
) -> torch.Tensor:
    """pixels: (B, 3, H, W) → (B, D'): each picked block's output through the final norm, pooled, concatenated.

    The outputs are `hidden_states[i + 1]` of block i, kept by forward hooks so that no other layer is held
    in memory. The final norm is applied to every layer (DINOv2's intermediate-layer convention), so layer -1
    equals `last_hidden_state` of models that normalise it (DINOv2, ViT, SigLIP) and CLIP's post-layernormed
    tokens.
    """
    kwargs = {"interpolate_pos_encoding": True} if interpolate else {}
    if pool is pooled_output:
        return pool(model(pixel_values=pixels, **kwargs))
    blocks = _blocks(model)
    if not blocks:  # a model whose blocks are unknown: only its final features (layer -1) are allowed
        return pool(model(pixel_values=pixels, **kwargs).last_hidden_state, n_prefix)
    wanted = [len(blocks) - 1 if p == FINAL else p for p in picks]
    with block_outputs(blocks, wanted) as outs:
        model(pixel_values=pixels, **kwargs)
    norm = _final_norm(model)
    return torch.cat([pool(norm(outs[i]) if norm is not None else outs[i], n_prefix) for i in wanted], dim=-1)


def wrap_vit(
    model: nn.Module,
    *,
    id: str,
    pooling: str,
    preprocess: Preprocess,
    resolution: int | None,
    description: str,
    options: dict,
    layer: int = FINAL,
    layers: list[int] | None = None,
    has_pooler: bool | None = None,
) -> Backbone:
    """Wrap a transformers ViT-family model (DINOv2, ViT, CLIP/SigLIP vision) as a `Backbone`.

    `has_pooler`: whether `pooling: pooler` may be used (default: the model has a pooled output of its own).
    """
    config = model.config
    n_prefix = 0 if config.model_type in _NO_CLS_TOKEN else 1 + int(getattr(config, "num_register_tokens", 0) or 0)
    blocks = _blocks(model)
    picks = resolve_layers(id, layer, layers, len(blocks))
    has_pooler = _has_pooler(model) if has_pooler is None else has_pooler
    check_pooling(id, pooling, tokens=True, has_cls=n_prefix > 0, has_pooler=has_pooler,
                  final_only=picks == [FINAL])
    if resolution is not None:
        preprocess = preprocess.with_resolution(resolution)
    native = getattr(config, "image_size", preprocess.crop)
    patch = getattr(config, "patch_size", 1)
    if preprocess.crop % patch:
        raise ValueError(f"{id}: image size {preprocess.crop} is not a multiple of the patch size {patch}.")
    accepts = "interpolate_pos_encoding" in inspect.signature(model.forward).parameters
    interpolate = accepts and preprocess.crop != native and config.model_type != "dinov2"
    encode = partial(encode_hidden, pool=POOLINGS.get(pooling), picks=picks, n_prefix=n_prefix, interpolate=interpolate)
    model.eval()
    return Backbone(
        model,
        encode,
        id=id,
        dim=config.hidden_size * POOL_WIDTH[pooling] * len(picks),
        preprocess=preprocess,
        blocks=blocks,
        description=description,
        options={**options, "layer": layer, "layers": layers},
        norm=[_final_norm(model)],
    )


def load_hf(
    ref: str,
    *,
    pooling: str = "cls",
    resolution: int | None = None,
    revision: str | None = None,
    layer: int = FINAL,
    layers: list[int] | None = None,
) -> Backbone:
    """Load `hf:<ref>`; `ref` is a hub id or a local directory saved with `save_pretrained`."""
    from transformers import AutoModel

    loaded, info = _from_pretrained(partial(AutoModel.from_pretrained, output_loading_info=True), ref, revision)
    missing = sorted(info.get("missing_keys") or [])
    # A pooling head absent from the checkpoint is built randomly by transformers: never use it as features.
    random_head = [k for k in missing if k.startswith(("pooler.", "head.")) or ".pooler." in k or ".head." in k]
    if len(random_head) < len(missing):
        others = [k for k in missing if k not in random_head]
        raise ValueError(f"hf:{ref}: the checkpoint has no weights for {', '.join(others[:5])}"
                         f"{' ...' if len(others) > 5 else ''} ({len(others)} tensors), which transformers would "
                         "initialise randomly; check that the directory or hub id holds the full image encoder.")
    model = _vision_tower(loaded)
    preprocess, source = _preprocess_from_processor(ref, revision, model.config)
    return wrap_vit(
        model,
        id=f"hf:{ref}",
        pooling=pooling,
        preprocess=preprocess,
        resolution=resolution,
        description=f"{type(model).__name__} via transformers; preprocessing: {source}",
        options={"pooling": pooling, "resolution": resolution, "revision": revision},
        layer=layer,
        layers=layers,
        has_pooler=_has_pooler(model) and not random_head,
    )


# The transformers families whose checkpoints hold an image projection (`visual_projection`) after the vision tower.
PROJECTION_MODEL_TYPES = ("clip", "clip_vision_model")


def load_hf_image_projection(ref: str, revision: str | None = None) -> nn.Linear:
    """CLIP's image projection of `hf:<ref>`: `visual_projection` of transformers' `CLIPVisionModelWithProjection`,
    read by transformers itself from a full CLIP checkpoint (`CLIPModel.save_pretrained`) or a
    `CLIPVisionModelWithProjection` one. Its input is the post-layernormed class token (`pooler_output`), which
    `pooling: cls` (or `pooler`) gives on the final layer. A checkpoint without the projection's weights (a bare
    `CLIPVisionModel`, or another family) is refused rather than given a random projection."""
    from transformers import AutoConfig, CLIPVisionModelWithProjection

    config = _from_pretrained(AutoConfig.from_pretrained, ref, revision)
    if config.model_type not in PROJECTION_MODEL_TYPES:
        raise ValueError(f"hf:{ref} is a {config.model_type!r} model, which has no image projection; a `type: "
                         "pretrained` head on an hf: backbone is CLIP's visual_projection (model types "
                         f"{', '.join(PROJECTION_MODEL_TYPES)}), so use another head type here.")
    vision = config
    if config.model_type == "clip":  # a full CLIP checkpoint: the projection's width is the joint space's
        vision = config.vision_config
        vision.projection_dim = config.projection_dim
    model, info = _from_pretrained(partial(CLIPVisionModelWithProjection.from_pretrained, config=vision,
                                           output_loading_info=True), ref, revision)
    unread = list(info.get("missing_keys") or []) + [k[0] if isinstance(k, tuple) else k
                                                      for k in info.get("mismatched_keys") or []]
    if any(str(k).startswith("visual_projection") for k in unread):
        raise ValueError(f"hf:{ref} holds no visual_projection weights (saved as a bare CLIPVisionModel?), so it has "
                         "no image projection to probe; save the full model (CLIPModel or "
                         "CLIPVisionModelWithProjection .save_pretrained) or use another head type.")
    return model.visual_projection
