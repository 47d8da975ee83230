"""The VICReg and Barlow Twins checkpoint formats: ``ssl:vicreg:<path>``, ``ssl:barlow:<path>``.

Read from the code that writes them. facebookresearch/vicreg ``main_vicreg.py`` saves
``{"epoch", "model": DDP(VICReg).state_dict(), "optimizer"}`` (keys ``module.backbone.*``, ``module.projector.*``)
and, at the end, ``resnet50.pth`` = the backbone's state dict alone. Its ``resnet.py`` has torchvision's key names
(``conv1, bn1, layer<k>.<j>.{conv1,bn1,conv2,bn2,conv3,bn3,downsample.0,downsample.1}``, no ``fc``); its extra
``padding = ConstantPad2d(1)`` before a ``padding=2`` stem convolution equals torchvision's ``padding=3``. The
projector is ``Linear → BatchNorm1d → ReLU`` per hidden layer and a bias-free last ``Linear`` (``--mlp
8192-8192-8192``). facebookresearch/barlowtwins ``main.py`` saves the same dict, with a torchvision ResNet-50
(``fc = Identity``), bias-free projector Linears, and the loss's ``bn`` (``BatchNorm1d(affine=False)``: part of the
loss, not of the head, so its ``bn.*`` statistics are recorded as ignored). VICReg's widened ResNets
(``resnet50x2`` …, ``ResNet(widen=k)``: stem and stages k times wider) are read with the widths their tensors show.
The optimiser state is not read; VICReg's LARS keeps its ``exclude_bias_and_norm`` function there, which is read as
an inert placeholder (`headprobe.ssl.inert`) and listed in the record's ``skipped_objects``.
"""

from __future__ import annotations

import re

from torch import nn

from ..backbones.base import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from .checkpoint import Selected, SSLCheckpointError, load_strict, split_by_prefix, strip_prefix
from .heads import BNReLUProjector
from .resnet import resnet_from_keys, resnet_wrap_options

PARTS = ("model",)
ALLOWED_GLOBALS = ()
DEFAULT_POOLING = "mean"
# vicreg evaluate.py and barlowtwins evaluate.py: Resize(256) (bilinear), CenterCrop(224), ImageNet mean/std.
PREPROCESS = Preprocess(resize=256, crop=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bilinear")

RESNET_KEYS = ("conv1.weight, bn1.*, layer<k>.<j>.{conv1,bn1,conv2,bn2[,conv3,bn3][,downsample.0,downsample.1]}.* "
               "(torchvision names, no fc)")


def layout(name: str, hidden_bias: bool, extra: tuple[str, ...]) -> str:
    return (f"a {name} checkpoint: a dict with 'model' (plus 'epoch', 'optimizer'), the state dict of the "
            f"DistributedDataParallel model with keys 'module.backbone.<ResNet key>', 'module.projector.<i>.*'"
            + "".join(f", 'module.{e}.*'" for e in extra) + f"; ResNet keys: {RESNET_KEYS}; projector: Linear"
            f"{'' if hidden_bias else ' (no bias)'} at 0, 3, …, BatchNorm1d at 1, 4, …, a bias-free last Linear. "
            "Or a backbone-only file (resnet50.pth): the ResNet keys alone.")


class Format:
    """One of the two formats; they differ in the projector's hidden biases and the loss's extra entries."""

    PARTS, ALLOWED_GLOBALS, DEFAULT_POOLING, PREPROCESS = PARTS, ALLOWED_GLOBALS, DEFAULT_POOLING, PREPROCESS

    def __init__(self, name: str, *, hidden_bias: bool, extra: tuple[str, ...]) -> None:
        self.name, self.hidden_bias, self.extra = name, hidden_bias, extra
        self.LAYOUT = layout(name, hidden_bias, extra)

    def select(self, content, part: str | None, path: str) -> Selected:
        if part not in (None, "model"):
            raise SSLCheckpointError(f"{path}: a {self.name} checkpoint has one network, so part {part!r} cannot be "
                                     "chosen; drop the part option.")
        if not isinstance(content, dict):
            raise SSLCheckpointError(f"{path} holds a {type(content).__name__}, not {self.LAYOUT}")
        if "model" in content:
            state = content["model"]
            prefix = "module." if state and all(k.startswith("module.") for k in state) else ""
            parts, other = split_by_prefix(strip_prefix(state, prefix), ("backbone", "projector", *self.extra))
            if other or not parts["backbone"] or not parts["projector"]:
                missing = [p + ".*" for p in ("backbone", "projector") if not parts[p]]
                raise SSLCheckpointError(
                    f"{path}: 'model' does not match the expected layout: missing {missing}, unexpected "
                    f"{len(other)} key(s) {[prefix + k for k in other[:10]]}. Expected {self.LAYOUT}")
            ignored = sorted(k for k in content if k != "model") + [f"{prefix}{e}.*" for e in self.extra]
            return Selected(parts["backbone"], parts["projector"], "model", f"{self.name} full checkpoint", ignored,
                            {}, backbone_prefix=f"{prefix}backbone.", head_prefix=f"{prefix}projector.")
        if "conv1.weight" in content:
            return Selected(dict(content), None, "model", f"{self.name} backbone-only", [], {})
        raise SSLCheckpointError(f"{path} is not a {self.name} checkpoint: it holds {sorted(content)[:10]}. "
                                 f"Expected {self.LAYOUT}")

    def build_backbone(self, sel: Selected, what: str, *, num_heads: int | None) -> nn.Module:
        """The ResNet of `sel` (block type and depths read from the keys), fc removed, loaded strictly."""
        if num_heads is not None:
            raise SSLCheckpointError(f"{what}: num_heads applies to ViT backbones only; this one is a ResNet.")
        model = resnet_from_keys(sel.backbone, what, self.LAYOUT, sel.backbone_prefix)
        load_strict(model, sel.backbone, what=what, layout=self.LAYOUT, prefix=sel.backbone_prefix)
        return model

    def wrap_options(self, model: nn.Module) -> dict:
        return resnet_wrap_options(model)

    def where(self, name: str) -> str:
        """Where to get a checkpoint file called `name` (VICReg's released names have official URLs)."""
        if self.name == "vicreg" and re.fullmatch(r"resnet\w+?(_fullckpt)?\.pth", name):
            return (f"Download it from https://dl.fbaipublicfiles.com/vicreg/{name} (the URL facebookresearch/"
                    "vicreg's README links; the *_fullckpt.pth files hold the projector too).")
        if self.name == "vicreg":
            return ("facebookresearch/vicreg's README links the released checkpoints, e.g. "
                    "https://dl.fbaipublicfiles.com/vicreg/resnet50_fullckpt.pth (backbone and projector).")
        return ("facebookresearch/barlowtwins' README links the released ResNet-50; main.py writes the full "
                "checkpoint (backbone and projector) to <checkpoint-dir>/checkpoint.pth.")

    def build_head(self, sel: Selected, what: str) -> BNReLUProjector:
        state = sel.head
        if state is None:
            raise SSLCheckpointError(f"{what}: this file holds a backbone only (resnet50.pth), without the projector "
                                     "it was trained with; use the full checkpoint, which holds 'model'.")
        linears = sorted(int(m.group(1)) for k in state if (m := re.fullmatch(r"(\d+)\.weight", k))
                         and state[k].ndim == 2)
        if not linears:
            raise SSLCheckpointError(f"{what}: no projector Linear layers found. Expected {self.LAYOUT}")
        dims = [int(state[f"{linears[0]}.weight"].shape[1])] + [int(state[f"{i}.weight"].shape[0]) for i in linears]
        head = BNReLUProjector(dims, hidden_bias=self.hidden_bias)
        load_strict(head, state, what=what, layout=self.LAYOUT, prefix=sel.head_prefix)
        return head


VICREG = Format("vicreg", hidden_bias=True, extra=())
BARLOW = Format("barlow", hidden_bias=False, extra=("bn",))
