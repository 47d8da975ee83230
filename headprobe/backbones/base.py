"""The `Backbone` wrapper every backbone source returns, and its preprocessing."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch
from torch import nn

_INTERPOLATIONS = ("bicubic", "bilinear", "nearest")


@dataclass(frozen=True)
class Preprocess:
    """Image → tensor transform that travels with a backbone's weights.

    Resize (`resize_mode="shortest"`: the shorter side to `resize`, keeping the
    aspect ratio; `"square"`: to `resize`×`resize`), centre-crop `crop`×`crop`,
    scale to [0, 1], normalise with `mean`/`std`. Grey or RGBA images become RGB.
    """

    resize: int
    crop: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str = "bicubic"
    resize_mode: str = "shortest"

    def __post_init__(self) -> None:
        if self.interpolation not in _INTERPOLATIONS:
            raise ValueError(
                f"interpolation {self.interpolation!r} is not supported; use one of {_INTERPOLATIONS}."
            )
        if self.resize_mode not in ("shortest", "square"):
            raise ValueError(f"resize_mode {self.resize_mode!r} must be 'shortest' or 'square'.")
        if self.crop > self.resize:
            raise ValueError(f"crop ({self.crop}) must not exceed resize ({self.resize}).")

    def with_resolution(self, crop: int) -> Preprocess:
        """The same transform at another crop size, resize scaled by the same ratio."""
        resize = max(crop, round(crop * self.resize / self.crop))
        return dataclasses.replace(self, resize=resize, crop=crop)

    def transform(self) -> Callable:
        return _build_transform(self)

    def __call__(self, image) -> torch.Tensor:
        """image: PIL image → (3, crop, crop) float tensor."""
        if getattr(image, "mode", "RGB") != "RGB":
            image = image.convert("RGB")
        return self.transform()(image)

    def frame(self, image):
        """image: PIL → the PIL RGB image at crop × crop, resized and centre-cropped but not yet scaled or
        normalised: where orbit sweeps act (`orbit_features`); PIL resampling (torchvision's PIL path)."""
        from torchvision.transforms import v2

        mode = getattr(v2.InterpolationMode, self.interpolation.upper())
        size = self.resize if self.resize_mode == "shortest" else [self.resize, self.resize]
        return v2.CenterCrop(self.crop)(v2.Resize(size, interpolation=mode, antialias=True)(image.convert("RGB")))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d


@functools.lru_cache(maxsize=64)
def _build_transform(pre: Preprocess) -> Callable:
    from torchvision.transforms import v2

    mode = getattr(v2.InterpolationMode, pre.interpolation.upper())
    return v2.Compose(
        [
            v2.ToImage(),
            v2.Resize(
                pre.resize if pre.resize_mode == "shortest" else [pre.resize, pre.resize],
                interpolation=mode,
                antialias=True,
            ),
            v2.CenterCrop(pre.crop),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(list(pre.mean), list(pre.std)),
        ]
    )


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def weights_fingerprint(module: nn.Module) -> str:
    """Short sha256 over parameter names, shapes and values (buffers included)."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(tensor.shape)).encode())
        h.update(tensor.detach().to("cpu").contiguous().numpy().tobytes() if tensor.dtype != torch.bfloat16
                 else tensor.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Random initialisation inside the block depends on `seed` only; the global CPU random state is restored."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        yield


class BackboneNotFoundError(FileNotFoundError):
    """A backbone whose weights cannot be found; the message says where we looked and what to run."""


class Backbone(nn.Module):
    """A feature extractor: `Backbone(pixels: (B, 3, H, W)) -> (B, dim)`.

    `encode` maps pixels to pooled features; `preprocess` maps one PIL image to
    the pixel tensor the weights expect; `blocks` lists the model's blocks in order.
    """

    def __init__(
        self,
        model: nn.Module,
        encode: Callable[[nn.Module, torch.Tensor], torch.Tensor],
        *,
        id: str,
        dim: int,
        preprocess: Preprocess,
        blocks: list[nn.Module] | None = None,
        description: str = "",
        options: dict | None = None,
        norm: list[nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self._encode = encode
        self.id = id
        self.dim = dim
        self.preprocess = preprocess
        self.blocks = list(blocks or [])
        # What follows the last block before the features (final norm, a CNN's head conv): `last:N` tunes it too.
        self.norm = [m for m in (norm or []) if m is not None]
        self.description = description
        self.options = dict(options or {})
        self.tuning: dict = {"policy": "frozen"}
        self._fingerprint: str | None = None

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        features = self._encode(self.model, pixels)
        # Checked on every batch (it costs nothing): a declared dim that is wrong would otherwise surface later as
        # a shape error in a head, or not at all in the probes, with `dim` recorded wrongly in results.json.
        if features.ndim != 2 or features.shape[1] != self.dim:
            raise ValueError(
                f"backbone {self.id} returned features of shape {tuple(features.shape)} for {pixels.shape[0]} "
                f"images, but declares (B, {self.dim}); a wrapped module must return one vector per image and "
                f"be given its true size, e.g. load_backbone(module=..., dim={features.shape[-1]})."
            )
        return features

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def trainable(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    @property
    def fingerprint(self) -> str:
        """Cached while nothing is trainable; a tuned backbone is hashed afresh, as its weights move."""
        if self._fingerprint is None or self.trainable:
            self._fingerprint = weights_fingerprint(self.model)
        return self._fingerprint

    def forget_fingerprint(self) -> None:
        """Drop the cached fingerprint, so that the next read hashes the weights (after they were changed)."""
        self._fingerprint = None

    def freeze(self) -> Backbone:
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        return self

    def train(self, mode: bool = True) -> Backbone:
        """Train mode for what is tuned only: any sub-module holding weights, none of them trainable, stays in
        eval mode, so frozen batch-norm statistics and frozen blocks' dropout do not change."""
        super().train(mode)
        if mode:
            _freeze_modes(self.model)
        return self

    def describe(self) -> dict:
        """What `results.json` records under `backbone`."""
        return {
            "id": self.id,
            "dim": self.dim,
            "params": self.params,
            "trainable": self.trainable,
            "fingerprint": self.fingerprint,
            "description": self.description,
            "options": self.options,
            "tuning": dict(self.tuning),
            "preprocess": self.preprocess.to_dict(),
        }


def _freeze_modes(module: nn.Module) -> None:
    """Put every sub-tree that holds weights or buffers but no trainable parameter in eval mode."""
    for child in module.children():
        tensors = [*child.parameters(), *child.buffers()]
        if tensors and not any(p.requires_grad for p in child.parameters()):
            child.eval()
        else:
            _freeze_modes(child)
