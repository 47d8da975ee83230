"""Your own network as a backbone: the contract a bare `nn.Module` is held to, and how it becomes a `Backbone`.

A bare module (given to ``headprobe.run(recipe, backbone=net)`` or returned by a plug-in backbone loader) maps
pixels ``(B, 3, H, W)`` float32, centre-cropped to ``backbone.resolution`` (default 224) px after resizing the
shorter side to 256/224 of that and normalised with the ImageNet mean and std, to one feature vector per image,
``(B, D)``; D is read from one forward pass on two black images. Anything else (another normalisation, size or
interpolation) is said with ``headprobe.load_backbone(module=net, preprocess=Preprocess(...), dim=D)``, whose
`Backbone` is then used as given.

>>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
>>> as_backbone(net, resolution=32).dim
8
"""

from __future__ import annotations

import torch
from torch import nn

from .base import IMAGENET_MEAN, IMAGENET_STD, Backbone, Preprocess

DEFAULT_RESOLUTION = 224


def default_preprocess(resolution: int | None = None) -> Preprocess:
    """What a bare module gets: ImageNet's mean and std, bicubic resize to 256/224 of the crop, centre crop."""
    crop = resolution or DEFAULT_RESOLUTION
    return Preprocess(resize=round(crop * 256 / 224), crop=crop, mean=IMAGENET_MEAN, std=IMAGENET_STD)


def module_id(module: nn.Module) -> str:
    """``module:<its class, qualified>``: how results.json and the run's recipe name a module passed in."""
    cls = type(module)
    return f"module:{cls.__module__}.{cls.__qualname__}"


def as_backbone(obj: nn.Module, resolution: int | None = None) -> Backbone:
    """A `Backbone` as it is (frozen), or a bare module wrapped under the contract above (frozen)."""
    if isinstance(obj, Backbone):
        return obj.freeze()
    if not isinstance(obj, nn.Module):
        raise TypeError(f"backbone must be a torch.nn.Module or a headprobe Backbone, got {type(obj).__name__}; "
                        "for a registered backbone set backbone.id in the recipe instead.")
    preprocess = default_preprocess(resolution)
    was_training = obj.training
    obj.eval()
    try:
        with torch.no_grad():
            out = obj(torch.zeros(2, 3, preprocess.crop, preprocess.crop))
    except Exception as err:
        raise ValueError(f"the backbone module {module_id(obj)} failed on a (2, 3, {preprocess.crop}, "
                         f"{preprocess.crop}) batch of normalised pixels ({type(err).__name__}: {err}); a bare module "
                         "must take that input (set backbone.resolution for another size), or wrap it with "
                         "headprobe.load_backbone(module=..., preprocess=..., dim=...).") from None
    finally:
        obj.train(was_training)
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != 2:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"the backbone module {module_id(obj)} returned {shape} for 2 images; it must return one "
                         "feature vector per image, (B, D): pool its tokens or feature maps inside forward.")
    return Backbone(obj, lambda m, x: m(x), id=module_id(obj), dim=int(out.shape[1]), preprocess=preprocess,
                    description="user module (ImageNet mean/std, centre crop)").freeze()
