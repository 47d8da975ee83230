"""Orbit sweeps: the images of one augmentation swept over a fixed image (rotation, hue, saturation, blur), the
values of each sweep and its anchor (the unchanged image). `headprobe.probes.orbits` measures the representations.

>>> from PIL import Image
>>> images = orbit_images(Image.new("RGB", (32, 32), "red"), "rotation360")
>>> len(images), sweep_values("rotation360")[:3], anchor_index("hue")
(12, [0.0, 30.0, 60.0], 5)
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .. import registry

__all__ = ["ORBIT_SWEEPS", "OrbitSweep", "anchor_index", "orbit_images", "orbit_sweep", "sweep_values"]


@dataclass(frozen=True)
class OrbitSweep:
    """One augmentation swept from `low` to `high` in `steps` values, `identity` being the unchanged image.

    op: "rotate" (degrees counter-clockwise), "hue" (shift as a fraction of the colour wheel), "saturation"
        (factor; 0 is grey) or "blur" (Gaussian sigma in pixels of the image handed to `orbit_images`).
    cyclic: the sweep goes once round a circle and stops one step short of `high` (which equals `low`); its
        trajectory is closed, so curvature wraps around.
    """

    op: str
    low: float
    high: float
    steps: int
    identity: float
    cyclic: bool = False


# the paper's curvature sweep: "10 angles in 0–45°"
ROTATION45 = OrbitSweep("rotate", 0.0, 45.0, 10, identity=0.0)
# the paper's orbits: "rotated in 12 steps", i.e. 0, 30, ..., 330°
ROTATION360 = OrbitSweep("rotate", 0.0, 360.0, 12, identity=0.0, cyclic=True)
# −0.5 and +0.5 are the same half-turn of the colour wheel, reached from both sides of the anchor
HUE = OrbitSweep("hue", -0.5, 0.5, 11, identity=0.0)
SATURATION = OrbitSweep("saturation", 0.0, 2.0, 11, identity=1.0)
BLUR = OrbitSweep("blur", 0.0, 3.0, 7, identity=0.0)
# The built-in sweeps by name. `probes.orbits.sweeps` is looked up in the ORBIT_SWEEPS registry
# (`headprobe.registry`), whose entries point at these (and where a plug-in adds its own): `orbit_sweep`.
ORBIT_SWEEPS: Mapping[str, OrbitSweep] = types.MappingProxyType(
    {"rotation45": ROTATION45, "rotation360": ROTATION360, "hue": HUE, "saturation": SATURATION, "blur": BLUR}
)


def orbit_sweep(sweep: str) -> OrbitSweep:
    """The sweep registered as `sweep` (built in, or added to the ORBIT_SWEEPS registry by a plug-in)."""
    return registry.ORBIT_SWEEPS.definition(sweep, OrbitSweep)


def sweep_values(sweep: str, steps: int | None = None) -> list[float]:
    """The `steps` augmentation values of a sweep, in order (default: the preset's steps).

    Open sweeps include both ends; the cyclic one (rotation360) stops one step before a full turn. The identity
    value is always one of them (exactly), so hue and saturation, centred on it, need an odd number of steps.

    >>> sweep_values("saturation", 5)
    [0.0, 0.5, 1.0, 1.5, 2.0]
    """
    spec = orbit_sweep(sweep)
    steps = spec.steps if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 3:
        raise ValueError(
            f"orbit sweep {sweep!r} needs an int number of steps >= 3 (curvature takes second differences); "
            f"got {steps!r}."
        )
    intervals = steps if spec.cyclic else steps - 1
    values = [round(spec.low + (spec.high - spec.low) * k / intervals, 12) for k in range(steps)]
    anchor = min(range(steps), key=lambda k: abs(values[k] - spec.identity))
    if abs(values[anchor] - spec.identity) > 1e-9 * (spec.high - spec.low):
        raise ValueError(
            f"orbit sweep {sweep!r} with {steps} steps does not pass through its identity value {spec.identity}, "
            "which the orbit's anchor must be; use an odd number of steps."
        )
    values[anchor] = spec.identity
    return values


def anchor_index(sweep: str, steps: int | None = None) -> int:
    """Index of the unchanged image (the anchor) in the sweep: 0 for rotations and blur, the middle for hue and
    saturation."""
    return sweep_values(sweep, steps).index(orbit_sweep(sweep).identity)


def _on_floats(image: Image.Image, op: str, value: float) -> Image.Image:
    # PIL's hue shift works on 8-bit HSV, so it moves in 1/255 turns and ±0.5 land on different colours; the
    # float path rounds once, at the end, which keeps the orbit free of quantisation jitter.
    from torchvision.transforms.v2 import functional as F

    pixels = F.pil_to_tensor(image).double() / 255
    if op == "hue":
        pixels = F.adjust_hue(pixels, value)
    elif op == "saturation":
        pixels = F.adjust_saturation(pixels, value)
    else:
        # ±3 sigma, capped so reflect padding stays smaller than the image (as data.augment.apply_view)
        kernel = min(2 * math.ceil(3 * value) + 1, 2 * min(image.size) - 1)
        pixels = F.gaussian_blur(pixels, [kernel, kernel], [value, value])
    return F.to_pil_image((pixels * 255).round().clamp(0, 255).to(torch.uint8))


def orbit_images(image: Image.Image, sweep: str, steps: int | None = None) -> list[Image.Image]:
    """The orbit of one image under a sweep: `steps` RGB images of the input's size, in `sweep_values` order.

    Deterministic (no randomness at all). The image at the identity value (index `anchor_index`) is the input
    itself, converted to RGB, untouched by any resampling. Rotation turns counter-clockwise about the centre with
    bilinear interpolation and keeps the size; corners that come from outside the original are black (torchvision's
    RandomRotation default, also used by data.augment), so their area varies with the angle — the representation
    sees them, as it did in the paper. Multiples of 90° on a square image are exact pixel permutations with no
    corners. Hue, saturation and blur run in floating point and round to 8 bits once. Apply this to the image at
    the backbone's input size (after resize and centre crop, before normalisation) so that blur sigmas and the
    rotation's corners are in input pixels.

    >>> [im.size for im in orbit_images(Image.new("L", (20, 10)), "blur", 3)]
    [(20, 10), (20, 10), (20, 10)]
    """
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    spec = orbit_sweep(sweep)
    values = sweep_values(sweep, steps)
    if image.mode != "RGB":
        image = image.convert("RGB")
    orbit = []
    for value in values:
        if value == spec.identity:
            orbit.append(image.copy())
        elif spec.op == "rotate":
            orbit.append(F.rotate(image, value, interpolation=InterpolationMode.BILINEAR, expand=False, fill=0))
        else:
            orbit.append(_on_floats(image, spec.op, value))
    return orbit
