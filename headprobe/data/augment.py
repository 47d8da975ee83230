"""SSL augmentations whose views carry their parameters and are reproducible per (seed, image, view).

View ``k`` of image ``i`` is a pure function of ``(seed, i, k)``: its random numbers come from a
private `torch.Generator` seeded from ``SeedSequence([seed, i, k, tag])``, never from global RNG
state, so the same view comes out whatever the batch size, the sampler order or the number of
processes. Every view records the parameters it was made with as a fixed-length float32 vector
(`PARAM_NAMES`), so K views of N images stack into an ``(N, K, P)`` tensor that regression probes
can read, and `apply_view` reproduces the view's pixels exactly from that vector.

Order, as in SimCLR and torchvision: random resized crop → horizontal flip → colour jitter
(its four ops in a random order, recorded) → grayscale → Gaussian blur → solarize → rotation.
The paper "adds RandomRotation(45°)" to SimCLR's augmentations without saying where; here it
comes last, on the output-sized view, with torchvision's defaults (nearest, black corners).
An operation whose probability is not hit is recorded at its identity value (flip 0, factors 1,
hue 0, sigma 0, angle 0).

>>> from PIL import Image
>>> spec = augment_spec("simclr", size=32)
>>> view, params = make_view(Image.new("RGB", (48, 40), "red"), spec, seed=0, index=7, view=1)
>>> view.size, tuple(params.shape) == (len(PARAM_NAMES),)
((32, 32), True)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..registry import AUGMENT_PRESETS, unknown_name_message

if TYPE_CHECKING:  # torch, numpy and PIL load when views are made, not when a recipe's augment section is checked
    import torch
    from PIL import Image

PARAM_NAMES: tuple[str, ...] = (
    "crop_x",  # left edge / image width
    "crop_y",  # top edge / image height
    "crop_w",  # crop width / image width
    "crop_h",  # crop height / image height
    "crop_scale",  # crop area / image area
    "crop_aspect",  # crop width / crop height, in pixels
    "flip",  # 1 if mirrored left-right
    "brightness",  # factor, 1 = unchanged
    "contrast",  # factor, 1 = unchanged
    "saturation",  # factor, 1 = unchanged
    "hue",  # shift in [-0.5, 0.5], 0 = unchanged
    "jitter_order",  # index into JITTER_ORDERS
    "grayscale",  # 1 if made grey
    "blur_sigma",  # Gaussian sigma in output pixels, 0 = not blurred
    "solarize",  # 1 if solarized at threshold 128
    "rotation",  # degrees counter-clockwise, 0 = not rotated
)
_I = {name: i for i, name in enumerate(PARAM_NAMES)}

# Colour-jitter ops 0..3 = brightness, contrast, saturation, hue (torchvision's numbering); the
# recorded ``jitter_order`` is the index of the permutation applied, 0 = that fixed order.
JITTER_ORDERS: tuple[tuple[int, ...], ...] = tuple(itertools.permutations(range(4)))
_JITTER_NAMES = ("brightness", "contrast", "saturation", "hue")
_JITTER_IDENTITY = (1.0, 1.0, 1.0, 0.0)

_INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
_CROP_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries 10 boxes before its central fallback
# Every view draws this many uniforms in a fixed layout, so changing one knob (say flip_p) leaves
# the crops and the other draws of the same (seed, index, view) unchanged across specs.
_N_UNIFORMS = 2 * _CROP_ATTEMPTS + 2 + 16
_STREAM_TAG = 0x61756776  # "augv": keeps these streams apart from other SeedSequence([seed, i, k]) users
_SOLARIZE_THRESHOLD = 128


def _pair(name: str, value, lo: float, hi: float) -> tuple[float, float]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise ValueError(f"AugmentSpec.{name} must be a pair [low, high]; got {value!r}.")
    a, b = float(value[0]), float(value[1])
    if not (lo <= a <= b <= hi):
        raise ValueError(f"AugmentSpec.{name} = [{a}, {b}] must satisfy {lo} <= low <= high <= {hi}.")
    return a, b


@dataclass(frozen=True)
class AugmentSpec:
    """The knobs of one SSL view distribution; the defaults change nothing (preset ``"none"``).

    crop_scale, crop_ratio: RandomResizedCrop's area fraction and width/height ranges; ``(1, 1)``
        scale means no crop at all (the whole image, whatever its aspect ratio).
    size: side of the square output; None keeps the input image's size. Callers usually set it to
        the backbone's preprocess crop size and normalise the view afterwards.
    interpolation: for the resize after cropping: "bilinear", "bicubic" or "nearest".
    flip_p: probability of a left-right mirror.
    jitter_p: probability of colour jitter; brightness/contrast/saturation factors are uniform in
        [max(0, 1 - x), 1 + x], the hue shift uniform in [-hue, hue]; jitter_random_order shuffles the
        four ops as torchvision's ColorJitter does.
    grayscale_p, solarize_p: probabilities of a 3-channel grey conversion and of solarizing at 128.
    blur_p, blur_sigma: probability of a Gaussian blur and its sigma range, in output pixels; the
        kernel spans ±3 sigma.
    rotation_degrees, rotation_p: a rotation uniform in [-degrees, degrees] with probability
        rotation_p (torchvision's RandomRotation is rotation_p = 1); degrees 0 turns it off.
    """

    crop_scale: tuple[float, float] = (1.0, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    size: int | None = None
    interpolation: str = "bilinear"
    flip_p: float = 0.0
    jitter_p: float = 0.0
    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0
    hue: float = 0.0
    jitter_random_order: bool = True
    grayscale_p: float = 0.0
    blur_p: float = 0.0
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    solarize_p: float = 0.0
    rotation_degrees: float = 0.0
    rotation_p: float = 1.0

    def __post_init__(self) -> None:
        fix = object.__setattr__  # recipes hand over lists; store hashable tuples of floats
        fix(self, "crop_scale", _pair("crop_scale", self.crop_scale, 1e-6, 1.0))
        fix(self, "crop_ratio", _pair("crop_ratio", self.crop_ratio, 1e-6, math.inf))
        fix(self, "blur_sigma", _pair("blur_sigma", self.blur_sigma, 1e-6, math.inf))
        if self.size is not None and (isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1):
            raise ValueError(f"AugmentSpec.size must be a positive int or None; got {self.size!r}.")
        if self.interpolation not in _INTERPOLATIONS:
            raise ValueError(
                f"AugmentSpec.interpolation {self.interpolation!r} is not supported; use one of {_INTERPOLATIONS}."
            )
        for name in ("flip_p", "jitter_p", "grayscale_p", "blur_p", "solarize_p", "rotation_p"):
            if not 0.0 <= float(getattr(self, name)) <= 1.0:
                raise ValueError(
                    f"AugmentSpec.{name} is a probability and must lie in [0, 1]; got {getattr(self, name)}."
                )
        for name in ("brightness", "contrast", "saturation"):
            if float(getattr(self, name)) < 0.0:
                raise ValueError(
                    f"AugmentSpec.{name} is a jitter strength and must be >= 0; got {getattr(self, name)}."
                )
        if not 0.0 <= float(self.hue) <= 0.5:
            raise ValueError(f"AugmentSpec.hue must lie in [0, 0.5] (a fraction of the colour wheel); got {self.hue}.")
        if not 0.0 <= float(self.rotation_degrees) <= 180.0:
            raise ValueError(f"AugmentSpec.rotation_degrees must lie in [0, 180]; got {self.rotation_degrees}.")
        if not isinstance(self.jitter_random_order, bool):
            raise ValueError(
                f"AugmentSpec.jitter_random_order must be true or false; got {self.jitter_random_order!r}."
            )

    def to_dict(self) -> dict:
        """Plain types only (pairs as lists), ready for a recipe or a results file."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


SIMCLR = AugmentSpec(
    # SimCLR (Chen et al. 2020, App. A) with colour strength s = 0.5, its CIFAR setting:
    # ColorJitter(0.8s, 0.8s, 0.8s, 0.2s) with p = 0.8. Blur p = 0.5 is its ImageNet setting.
    crop_scale=(0.08, 1.0),
    flip_p=0.5,
    jitter_p=0.8,
    brightness=0.4,
    contrast=0.4,
    saturation=0.4,
    hue=0.1,
    grayscale_p=0.2,
    blur_p=0.5,
)

# DINO's first global view (facebookresearch/dino main_dino.py, DataAugmentationDINO with the default
# global_crops_scale (0.4, 1.0)); its second global view is augment_spec("dino", blur_p=0.1, solarize_p=0.2).
DINO = AugmentSpec(
    crop_scale=(0.4, 1.0),
    interpolation="bicubic",
    flip_p=0.5,
    jitter_p=0.8,
    brightness=0.4,
    contrast=0.4,
    saturation=0.2,
    hue=0.1,
    grayscale_p=0.2,
    blur_p=1.0,
)
# The paper's collapse experiments (SimSiam): crop(0.2-1) + flip only.
CROP_FLIP = AugmentSpec(crop_scale=(0.2, 1.0), flip_p=0.5)
# The paper's information experiment: SimCLR's augmentations plus RandomRotation(45°).
ROTATION = dataclasses.replace(SIMCLR, rotation_degrees=45.0)
NO_AUGMENTATION = AugmentSpec()
# The built-in presets by name. A recipe's `augment.preset` is looked up in the AUGMENT_PRESETS registry, whose
# entries point at these (and where a plug-in adds its own).
PRESETS: Mapping[str, AugmentSpec] = types.MappingProxyType(
    {"simclr": SIMCLR, "dino": DINO, "crop-flip": CROP_FLIP, "rotation": ROTATION, "none": NO_AUGMENTATION}
)
_KNOBS = [f.name for f in dataclasses.fields(AugmentSpec)]


def augment_spec(preset: str, **overrides) -> AugmentSpec:
    """A preset with some knobs replaced, e.g. ``augment_spec("simclr", size=224, blur_p=0.0)``."""
    base = AUGMENT_PRESETS.definition(preset, AugmentSpec)
    for knob in overrides:
        if knob not in _KNOBS:
            raise ValueError(unknown_name_message(f"augmentation knob (preset {preset!r})", knob, _KNOBS))
    return dataclasses.replace(base, **overrides)


def _check_size(image_size: tuple[int, int]) -> tuple[int, int]:
    width, height = (int(s) for s in image_size)
    if width < 1 or height < 1:
        raise ValueError(f"image_size must be (width, height) with both >= 1; got {tuple(image_size)}.")
    return width, height


def identity_params(image_size: tuple[int, int]) -> torch.Tensor:
    """The (P,) float32 parameters of a view that changes nothing (whole image, identity values)."""
    import torch

    width, height = _check_size(image_size)
    params = torch.zeros(len(PARAM_NAMES), dtype=torch.float32)
    for name in ("crop_w", "crop_h", "crop_scale", "brightness", "contrast", "saturation"):
        params[_I[name]] = 1.0
    params[_I["crop_aspect"]] = width / height
    return params


def params_dict(params: torch.Tensor) -> dict[str, float]:
    """A (P,) parameter vector as ``{name: value}``, for reading and logging."""
    if tuple(params.shape) != (len(PARAM_NAMES),):
        raise ValueError(
            f"params must have shape ({len(PARAM_NAMES)},) in PARAM_NAMES order; got {tuple(params.shape)}."
        )
    return dict(zip(PARAM_NAMES, params.tolist(), strict=True))


def _generator(seed: int, index: int, view: int) -> torch.Generator:
    import numpy as np
    import torch

    for name, value in (("seed", seed), ("index", index), ("view", view)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be a non-negative int; got {value!r}.")
    state = np.random.SeedSequence([int(seed), int(index), int(view), _STREAM_TAG]).generate_state(1, np.uint64)
    return torch.Generator().manual_seed(int(state[0]))


def _crop_box(u: list[float], width: int, height: int, spec: AugmentSpec) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params on given uniforms → (left, top, w, h) in pixels."""
    if spec.crop_scale == (1.0, 1.0):
        return 0, 0, width, height
    area = width * height
    log_lo, log_hi = math.log(spec.crop_ratio[0]), math.log(spec.crop_ratio[1])
    lo, hi = spec.crop_scale
    for t in range(_CROP_ATTEMPTS):
        target = area * (lo + (hi - lo) * u[2 * t])
        aspect = math.exp(log_lo + (log_hi - log_lo) * u[2 * t + 1])
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(u[2 * _CROP_ATTEMPTS] * (height - h + 1))
            left = int(u[2 * _CROP_ATTEMPTS + 1] * (width - w + 1))
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < spec.crop_ratio[0]:
        w, h = width, round(width / spec.crop_ratio[0])
    elif in_ratio > spec.crop_ratio[1]:
        w, h = round(height * spec.crop_ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def sample_params(spec: AugmentSpec, image_size: tuple[int, int], seed: int, index: int, view: int) -> torch.Tensor:
    """The (P,) float32 parameters of view ``view`` of image ``index``; image_size is (W, H).

    Deterministic in (spec, image_size, seed, index, view) and independent of global RNG state.
    """
    import numpy as np
    import torch

    width, height = _check_size(image_size)
    u = torch.rand(_N_UNIFORMS, generator=_generator(seed, index, view), dtype=torch.float64).tolist()
    crop_u, rest = u[: 2 * _CROP_ATTEMPTS + 2], u[2 * _CROP_ATTEMPTS + 2 :]
    flip_u, jitter_u, *factor_u = rest[:6]
    order_u = rest[6:10]
    gray_u, blur_u, sigma_u, solarize_u, rotation_u, angle_u = rest[10:16]

    params = identity_params((width, height))
    left, top, w, h = _crop_box(crop_u, width, height, spec)
    params[_I["crop_x"]], params[_I["crop_y"]] = left / width, top / height
    params[_I["crop_w"]], params[_I["crop_h"]] = w / width, h / height
    params[_I["crop_scale"]], params[_I["crop_aspect"]] = (w * h) / (width * height), w / h
    params[_I["flip"]] = float(flip_u < spec.flip_p)
    if jitter_u < spec.jitter_p:
        for name, x in zip(("brightness", "contrast", "saturation"), factor_u[:3], strict=True):
            strength = float(getattr(spec, name))
            if strength > 0:
                low = max(0.0, 1.0 - strength)
                params[_I[name]] = low + (1.0 + strength - low) * x
        if spec.hue > 0:
            params[_I["hue"]] = spec.hue * (2.0 * factor_u[3] - 1.0)
        if spec.jitter_random_order:
            params[_I["jitter_order"]] = JITTER_ORDERS.index(tuple(np.argsort(order_u, kind="stable").tolist()))
    params[_I["grayscale"]] = float(gray_u < spec.grayscale_p)
    if blur_u < spec.blur_p:
        params[_I["blur_sigma"]] = spec.blur_sigma[0] + (spec.blur_sigma[1] - spec.blur_sigma[0]) * sigma_u
    params[_I["solarize"]] = float(solarize_u < spec.solarize_p)
    if spec.rotation_degrees > 0 and rotation_u < spec.rotation_p:
        params[_I["rotation"]] = spec.rotation_degrees * (2.0 * angle_u - 1.0)
    return params


def apply_view(image: Image.Image, spec: AugmentSpec, params: torch.Tensor) -> Image.Image:
    """Apply exactly the recorded params (P,) to a PIL image → RGB PIL image of side ``spec.size``.

    Only ``spec.size`` and ``spec.interpolation`` are read from the spec; everything random is in
    ``params``, so a view is rebuilt from its stored vector alone.
    """
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    p = params_dict(params)
    if image.mode != "RGB":
        image = image.convert("RGB")
    width, height = image.size
    left, top = round(p["crop_x"] * width), round(p["crop_y"] * height)
    w, h = round(p["crop_w"] * width), round(p["crop_h"] * height)
    if not (0 <= left and 0 <= top and 0 < w and 0 < h and left + w <= width and top + h <= height):
        raise ValueError(
            f"params crop box (left {left}, top {top}, {w}x{h}) does not fit the {width}x{height} image; "
            "were these params sampled for another image size?"
        )
    out = [spec.size, spec.size] if spec.size is not None else [height, width]
    mode = InterpolationMode(spec.interpolation)
    view = F.resized_crop(image, top, left, h, w, out, interpolation=mode, antialias=True)
    if p["flip"] >= 0.5:
        view = F.hflip(view)
    adjust = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    for op in JITTER_ORDERS[round(p["jitter_order"])]:
        factor = p[_JITTER_NAMES[op]]
        # skipped at identity: PIL's hue round trip through HSV is not lossless even for a zero shift
        if factor != _JITTER_IDENTITY[op]:
            view = adjust[op](view, factor)
    if p["grayscale"] >= 0.5:
        view = F.rgb_to_grayscale(view, num_output_channels=3)
    sigma = p["blur_sigma"]
    if sigma > 0:
        # ±3 sigma, capped so reflect padding stays smaller than the image
        kernel = min(2 * math.ceil(3 * sigma) + 1, 2 * min(view.size) - 1)
        view = F.gaussian_blur(view, [kernel, kernel], [sigma, sigma])
    if p["solarize"] >= 0.5:
        view = F.solarize(view, _SOLARIZE_THRESHOLD)
    if p["rotation"] != 0:
        view = F.rotate(view, p["rotation"], interpolation=InterpolationMode.NEAREST)
    return view


def make_view(
    image: Image.Image, spec: AugmentSpec, seed: int, index: int, view: int
) -> tuple[Image.Image, torch.Tensor]:
    """View ``view`` of image ``index`` → (RGB PIL image, (P,) float32 params in PARAM_NAMES order)."""
    params = sample_params(spec, image.size, seed, index, view)
    return apply_view(image, spec, params), params
