"""torchvision ResNets rebuilt from a training checkpoint's tensors: block type, stage depths and widths read from
the keys, ``fc`` removed, loaded strictly.

The self-supervised codebases read here all use torchvision's ResNet (VICReg's own ``resnet.py`` keeps its names;
Barlow Twins, solo-learn and lightly's examples call ``torchvision.models.resnet18/50``). Two stems exist:
ImageNet's (7×7 stride-2 convolution, max-pool) and solo-learn's CIFAR stem (``Conv2d(3, 64, kernel_size=3,
stride=1, padding=2, bias=False)`` and ``maxpool = nn.Identity()``, set in ``solo/methods/base.py`` when
``data.dataset`` is cifar10/100). Widths other than torchvision's (VICReg's ``resnet50x2`` … scale the stem and every
stage: ``ResNet(widen=k)``; narrowed test models) are rebuilt from torchvision's own blocks with the widths the
tensors show.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from .checkpoint import SSLCheckpointError

# torchvision.models.resnet.ResNet's children, in order; nn.Sequential(*list(resnet.children())[:-1]) (lightly's
# examples) names them by these indices.
CHILDREN = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool", "fc")


def resnet_from_keys(state: dict, what: str, layout: str, prefix: str = "", *, cifar_stem: bool = False) -> nn.Module:
    """An unloaded torchvision ResNet shaped like `state` (torchvision key names), ``fc = Identity``.

    `cifar_stem`: solo-learn's 3×3 stride-1 padding-2 stem without max-pool. The stem's and each stage's widths are
    read from the tensors; torchvision's widths give torchvision's ``ResNet`` itself, others (VICReg's widened
    ResNets) the same modules built stage by stage (`widths_from_keys`).
    """
    from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

    if "conv1.weight" not in state or "layer1.0.conv1.weight" not in state:
        raise SSLCheckpointError(f"{what}: no ResNet stem ('{prefix}conv1.weight', '{prefix}layer1.0.conv1.weight')."
                                 f" Expected {layout}")
    stem = state["conv1.weight"]
    kernel = 3 if cifar_stem else 7
    if tuple(stem.shape[1:]) != (3, kernel, kernel):
        raise SSLCheckpointError(
            f"{what}: tensor '{prefix}conv1.weight' has shape {tuple(stem.shape)}, but the "
            f"{'CIFAR' if cifar_stem else 'ImageNet'} stem needs (C, 3, {kernel}, {kernel}). Expected {layout}")
    block = Bottleneck if "layer1.0.conv3.weight" in state else BasicBlock
    depths = [len({int(m.group(1)) for k in state if (m := re.match(rf"layer{i}\.(\d+)\.", k))}) for i in range(1, 5)]
    if not all(depths):
        raise SSLCheckpointError(f"{what}: ResNet stages {[f'layer{i + 1}' for i, d in enumerate(depths) if not d]} "
                                 f"have no tensors. Expected {layout}")
    planes, inner = widths_from_keys(state, block)
    groups = {64 * w // p for w, p in zip(inner, planes, strict=True)}
    if stem.shape[0] == 64 and planes == [64, 128, 256, 512] and len(groups) == 1:
        model = ResNet(block, depths, width_per_group=groups.pop())
    else:
        model = ResNet(block, [1, 1, 1, 1])
        model.conv1 = nn.Conv2d(3, int(stem.shape[0]), kernel_size=7, stride=2, padding=3, bias=False)
        model.bn1 = nn.BatchNorm2d(int(stem.shape[0]))
        width = int(stem.shape[0])
        for i, (depth, p, w) in enumerate(zip(depths, planes, inner, strict=True)):
            setattr(model, f"layer{i + 1}", stage(block, width, p, w, depth, stride=1 if i == 0 else 2))
            width = p * block.expansion
    model.fc = nn.Identity()
    if cifar_stem:
        model.conv1 = nn.Conv2d(3, int(stem.shape[0]), kernel_size=3, stride=1, padding=2, bias=False)
        model.maxpool = nn.Identity()
    return model


def widths_from_keys(state: dict, block: type) -> tuple[list[int], list[int]]:
    """Each stage's planes (its output is planes × expansion) and its blocks' inner width, from its first block."""
    if block.expansion == 1:
        planes = [int(state[f"layer{i}.0.conv1.weight"].shape[0]) for i in range(1, 5)]
        return planes, planes
    planes = [int(state[f"layer{i}.0.conv3.weight"].shape[0]) // block.expansion for i in range(1, 5)]
    return planes, [int(state[f"layer{i}.0.conv1.weight"].shape[0]) for i in range(1, 5)]


def stage(block: type, inplanes: int, planes: int, inner: int, depth: int, stride: int) -> nn.Sequential:
    """torchvision's ``ResNet._make_layer`` for one stage: `depth` blocks of `planes`, inner width `inner`
    (Bottleneck's ``base_width`` = 64 · inner / planes), a 1×1 downsample where the shape changes."""
    from torchvision.models.resnet import conv1x1

    out = planes * block.expansion
    extra = {} if block.expansion == 1 else {"base_width": 64 * inner / planes}
    downsample = (nn.Sequential(conv1x1(inplanes, out, stride), nn.BatchNorm2d(out))
                  if stride != 1 or inplanes != out else None)
    blocks = [block(inplanes, planes, stride, downsample, **extra)]
    blocks += [block(out, planes, **extra) for _ in range(depth - 1)]
    return nn.Sequential(*blocks)


def resnet_feature_map(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x: (B, 3, H, W) → the (B, C, h, w) map of layer4 (torchvision's forward before avgpool)."""
    x = model.maxpool(model.relu(model.bn1(model.conv1(x))))
    return model.layer4(model.layer3(model.layer2(model.layer1(x))))


def resnet_wrap_options(model: nn.Module) -> dict:
    """How `wrap_blocks` reads a torchvision ResNet: the map after each residual block, global average pooling."""
    blocks = [b for i in range(1, 5) for b in getattr(model, f"layer{i}").children()]
    return {"run": resnet_feature_map, "blocks": blocks, "tokens": False}


def children_to_names(state: dict) -> dict:
    """Keys of ``nn.Sequential(*list(resnet.children())[:-1])`` ("4.0.conv1.weight") → torchvision's
    ("layer1.0.conv1.weight"); keys whose first index is not a child with tensors are kept as they are."""
    out = {}
    for key, value in state.items():
        index, dot, rest = key.partition(".")
        named = CHILDREN[int(index)] if dot and index.isdigit() and int(index) < len(CHILDREN) else None
        out[f"{named}.{rest}" if named else key] = value
    return out


def as_children(model: nn.Module) -> nn.Sequential:
    """`model`'s children without ``fc``, as ``nn.Sequential`` (lightly's examples' backbone; same modules)."""
    return nn.Sequential(*[getattr(model, name) for name in CHILDREN[:-1]])


def children_feature_map(model: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """x: (B, 3, H, W) → the (B, C, h, w) map of the last stage (every child but the average pool)."""
    for child in list(model)[:-1]:
        x = child(x)
    return x


def children_wrap_options(model: nn.Sequential) -> dict:
    blocks = [b for i in range(4, 8) for b in model[i].children()]
    return {"run": children_feature_map, "blocks": blocks, "tokens": False}
