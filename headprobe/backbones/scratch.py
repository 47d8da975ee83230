"""`scratch:<name>`: the small backbones of the paper's controlled experiments, randomly initialised.

"Backbones trained from scratch: ResNet-18 with CIFAR stem (512-d), a 'ViT-Tiny' (patch 4, dim 192,
3 layers, 3 heads, MLP 768, CLS token)." The weights come from `seed` alone (the global random state
is left untouched), so the same seed gives the same network. Inputs are 32 px with CIFAR-10 statistics;
`resolution` changes that (a ViT's patch grid follows it).
"""

from __future__ import annotations

import torch
from torch import nn

from ..registry import SCRATCH_MODELS, UnknownNameError
from . import call_with_options
from .base import Backbone, Preprocess, seeded
from .blocks import wrap_blocks
from .from_timm import wrap_timm_model
from .pooling import FINAL

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR_PREPROCESS = Preprocess(resize=32, crop=32, mean=CIFAR10_MEAN, std=CIFAR10_STD, interpolation="bilinear")


def load_scratch(name: str, **options) -> Backbone:

    try:
        factory = SCRATCH_MODELS.get(name)
    except UnknownNameError as err:
        raise ValueError(f"scratch:{name}: {err}") from None
    return call_with_options(factory, f"scratch:{name}", options)


def _preprocess(resolution: int | None) -> Preprocess:
    if resolution is None:
        return CIFAR_PREPROCESS
    return Preprocess(resize=resolution, crop=resolution, mean=CIFAR10_MEAN, std=CIFAR10_STD, interpolation="bilinear")


def resnet18_cifar_model() -> nn.Module:
    """torchvision's ResNet-18 with the CIFAR stem: 3x3 stride-1 first convolution, no max-pool, no classifier."""
    from torchvision.models import resnet18

    model = resnet18(weights=None)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()
    model.fc = nn.Identity()
    return model


def _resnet_trunk(model: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) → (B, 512, H/8, W/8), the output of layer4."""
    x = model.relu(model.bn1(model.conv1(pixels)))
    for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
        x = layer(x)
    return x


def resnet18_cifar(
    *, pooling: str = "mean", resolution: int | None = None, layer: int = FINAL, layers: list[int] | None = None,
    seed: int = 0,
) -> Backbone:
    """ResNet-18, CIFAR stem, 512-d global-average-pooled features; `.blocks` are its 8 basic blocks."""
    with seeded(seed):
        model = resnet18_cifar_model()
    return wrap_blocks(
        model,
        id="scratch:resnet18-cifar",
        run=_resnet_trunk,
        blocks=[b for stage in (model.layer1, model.layer2, model.layer3, model.layer4) for b in stage],
        tokens=False,
        pooling=pooling,
        layer=layer,
        layers=layers,
        preprocess=_preprocess(resolution),
        description=f"ResNet-18 with CIFAR stem (3x3 conv, no max-pool), randomly initialised from seed {seed}",
        options={"pooling": pooling, "resolution": resolution, "layer": layer, "layers": layers, "seed": seed},
    )


def vit_tiny_model(image_size: int = 32) -> nn.Module:
    """timm's VisionTransformer at the paper's ViT-Tiny size, with a class token and no classifier."""
    from timm.models.vision_transformer import VisionTransformer

    if image_size % 4:
        raise ValueError(f"scratch:vit-tiny: image size {image_size} is not a multiple of the patch size 4.")
    return VisionTransformer(img_size=image_size, patch_size=4, embed_dim=192, depth=3, num_heads=3, mlp_ratio=4.0,
                             num_classes=0, class_token=True, global_pool="token")


def vit_tiny(
    *, pooling: str = "cls", resolution: int | None = None, layer: int = FINAL, layers: list[int] | None = None,
    seed: int = 0,
) -> Backbone:
    """ViT-Tiny: patch 4, dim 192, 3 pre-norm blocks, 3 heads, MLP 768, class token; 192-d features."""

    preprocess = _preprocess(resolution)
    with seeded(seed):
        model = vit_tiny_model(preprocess.crop)
    return wrap_timm_model(
        model,
        id="scratch:vit-tiny",
        pooling=pooling,
        layer=layer,
        layers=layers,
        preprocess=preprocess,
        description=f"ViT-Tiny (patch 4, dim 192, 3 layers, 3 heads, MLP 768, CLS), randomly initialised from "
                    f"seed {seed}",
        options={"pooling": pooling, "resolution": resolution, "layer": layer, "layers": layers, "seed": seed},
    )
