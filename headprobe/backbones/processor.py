"""A backbone's own image processor as its `Preprocess`: the pixels the library itself gives.

- ``transformers``: the class `AutoImageProcessor.from_pretrained(DIR)` returns, rebuilt from its configuration
  (`from_dict`, as `from_pretrained` does), called as `processor(image, return_tensors="pt").pixel_values`;
- ``open_clip``: the validation transform `open_clip.create_model_and_transforms` returns
  (`image_transform_v2(PreprocessCfg(**visual.preprocess_cfg), is_train=False)`);
- ``timm``: `timm.data.create_transform(**timm.data.resolve_data_config(model=model))`, after the RGB conversion
  timm's datasets do when they read an image.

Each library is declared once, as a `LibraryProcessor` in `PROCESSORS` (how its object is built from the saved
settings, called, cut before normalisation and moved to another crop size); nothing else branches on the library.

The clean features of `hf:`, `open_clip:` and `timm:` backbones are computed from exactly these pixels, so they
equal the features a user's own pipeline computes (re-implementing the processors with torchvision was off by a
crop column and by resampling rounding: benchmarks/results/preprocess.json). The processor's configuration is
recorded as sorted JSON (`settings`): the processor is rebuilt from it alone, `to_dict` reports it, and so the
feature-cache key (which reads `to_dict`) changes whenever the processor does. The fields inherited from
`Preprocess` describe the same processor for the path that cannot call it: augmented views are made at `crop`
by the augmentation itself and then only normalised with `mean`/`std` (docs/DESIGN.md, "Preprocessing"). Orbit
frames are the processor's own pixels before scaling and normalisation (`frame`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .base import Preprocess


@dataclass(frozen=True)
class ProcessorPreprocess(Preprocess):
    """`Preprocess` whose pixels come from `library`'s own processor, rebuilt from `settings` (JSON).

    >>> pre = processor_preprocess(Preprocess(resize=256, crop=224, mean=(0.5,) * 3, std=(0.5,) * 3),
    ...                            "timm", {"input_size": [3, 224, 224], "crop_pct": 0.875})  # doctest: +SKIP
    >>> pre(image).shape  # doctest: +SKIP
    torch.Size([3, 224, 224])
    """

    library: str = "transformers"
    settings: str = "{}"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.library not in LIBRARIES:
            raise ValueError(f"image processor library {self.library!r} is not supported; use one of "
                             f"{', '.join(LIBRARIES)}.")

    def transform(self) -> Callable:
        return _processor(self.library, self.settings)

    def __call__(self, image) -> torch.Tensor:
        """image: PIL image of any mode → (3, crop, crop) float tensor, the library's own pixels."""
        return self.transform()(image)

    def frame(self, image):
        """image: PIL → the processor's pixels before scaling and normalisation, as a PIL RGB image (crop × crop):
        normalising it again (`features.normalise_only`) gives `self(image)` to float rounding."""
        return _frames(self.library, self.settings)(image)

    def with_resolution(self, crop: int) -> ProcessorPreprocess:
        """The same processor at another crop size: resize scaled by the same ratio (timm: crop / crop_pct, as
        timm computes it)."""
        settings = json.loads(self.settings)
        scaled = PROCESSORS[self.library].rescale(settings, super().with_resolution(crop), crop)
        return dataclasses.replace(scaled, settings=json.dumps(settings, sort_keys=True))

    def to_dict(self) -> dict:
        d = super().to_dict()
        del d["library"], d["settings"]
        return {**d, "processor": {"library": self.library, "settings": json.loads(self.settings)}}


def processor_preprocess(described: Preprocess, library: str, settings: dict[str, Any]) -> ProcessorPreprocess:
    """`described` (the processor's resize, crop, mean, std, as headprobe reads them) with the processor itself."""
    fields = {f.name: getattr(described, f.name) for f in dataclasses.fields(Preprocess)}
    return ProcessorPreprocess(**fields, library=library, settings=json.dumps(settings, sort_keys=True))


def transformers_settings(processor) -> dict[str, Any]:
    """The configuration `from_dict` rebuilds `processor` from: what `save_pretrained` writes, with its class
    (one transformers exports: `AutoImageProcessor` resolves no other without remote code, which headprobe
    never runs)."""
    return {**json.loads(processor.to_json_string()), "image_processor_type": type(processor).__name__}


class LibraryProcessor:
    """What headprobe needs of one library's image processor: `build` its own object from the saved settings,
    `call` it on an image, take its `frames` (pixels before scaling and normalisation), and `rescale` its settings
    to another crop size. One subclass per library, declared once in `PROCESSORS`."""

    name: str

    def build(self, config: dict[str, Any]) -> Any:
        raise NotImplementedError

    def call(self, own) -> Callable:
        return own

    def frames(self, own) -> Callable:
        return _before_normalisation(self.name, own)

    def rescale(self, settings: dict[str, Any], scaled: Preprocess, crop: int) -> Preprocess:
        """Change `settings` (in place) for `crop`; returns `scaled` (`Preprocess.with_resolution`) as adjusted."""
        raise NotImplementedError


class TransformersProcessor(LibraryProcessor):
    name = "transformers"

    def build(self, config):
        import transformers

        return getattr(transformers, config["image_processor_type"]).from_dict(config)

    def call(self, own):
        return functools.partial(_call_transformers, own)

    def frames(self, own):
        return functools.partial(_transformers_frame, own)

    def rescale(self, settings, scaled, crop):
        size = settings.get("size") or {}
        settings["size"] = ({"shortest_edge": scaled.resize} if "shortest_edge" in size
                            else {"height": scaled.resize, "width": scaled.resize})
        if settings.get("crop_size"):
            settings["crop_size"] = {"height": crop, "width": crop}
        return scaled


class OpenClipProcessor(LibraryProcessor):
    name = "open_clip"

    def build(self, config):
        from open_clip.transform import PreprocessCfg, image_transform_v2

        return image_transform_v2(PreprocessCfg(**config), is_train=False)

    def rescale(self, settings, scaled, crop):
        settings["size"] = [crop, crop] if isinstance(settings.get("size"), list) else crop
        return dataclasses.replace(scaled, resize=crop)


class TimmProcessor(LibraryProcessor):
    name = "timm"

    def build(self, config):
        import timm.data

        return timm.data.create_transform(**config)

    def call(self, own):
        return functools.partial(_call_timm, own)

    def frames(self, own):
        return functools.partial(_call_timm, _before_normalisation(self.name, own))

    def rescale(self, settings, scaled, crop):
        settings["input_size"] = [3, crop, crop]
        return dataclasses.replace(scaled, resize=math.floor(crop / (settings.get("crop_pct") or 1.0)))


# The libraries whose own processors headprobe calls, each declared once.
PROCESSORS: dict[str, LibraryProcessor] = {p.name: p for p in (TransformersProcessor(), OpenClipProcessor(),
                                                               TimmProcessor())}
LIBRARIES = tuple(PROCESSORS)


@functools.lru_cache(maxsize=16)
def _library_processor(library: str, settings: str):
    """The library's own object: a transformers image processor, or open_clip's / timm's torchvision `Compose`."""
    return PROCESSORS[library].build(json.loads(settings))


@functools.lru_cache(maxsize=16)
def _processor(library: str, settings: str) -> Callable:
    return PROCESSORS[library].call(_library_processor(library, settings))


@functools.lru_cache(maxsize=16)
def _frames(library: str, settings: str) -> Callable:
    return PROCESSORS[library].frames(_library_processor(library, settings))


def _before_normalisation(library: str, own):
    """A torchvision `Compose` without its last two steps (to tensor, normalise)."""
    steps = own.transforms
    if [type(t).__name__ for t in steps[-2:]] not in (["MaybeToTensor", "Normalize"], ["ToTensor", "Normalize"]):
        raise ValueError(f"the {library} transform {own} does not end in ToTensor and Normalize, so headprobe "
                         "cannot take its pixels before normalisation, which orbit probes sweep.")
    return type(own)(steps[:-2])


def _given_to(processor, image):
    # Processors that convert to RGB themselves (compositing transparency onto white) get the image as it is;
    # the others would return as many channels as the image has.
    return image if image.mode == "RGB" or getattr(processor, "do_convert_rgb", False) else image.convert("RGB")


def _call_transformers(processor, image) -> torch.Tensor:
    return processor(_given_to(processor, image), return_tensors="pt").pixel_values[0]


def _transformers_frame(processor, image):
    from torchvision.transforms.v2.functional import to_pil_image

    pixels = processor(_given_to(processor, image), do_rescale=False, do_normalize=False,
                       return_tensors="pt").pixel_values[0]
    return to_pil_image(pixels.round().clamp(0, 255).to(torch.uint8))


def _call_timm(transform: Callable, image) -> torch.Tensor:
    # timm's datasets convert every image to RGB when they read it (`input_img_mode="RGB"`); the transform expects it.
    return transform(image if image.mode == "RGB" else image.convert("RGB"))
