"""The DINO checkpoint format (facebookresearch/dino): ``ssl:dino:<path>``.

Read from the code that writes it. ``main_dino.py`` saves every epoch::

    {"student": student.state_dict(),      # DistributedDataParallel(MultiCropWrapper) → keys "module.backbone.…",
                                           #   "module.head.…"
     "teacher": teacher.state_dict(),      # MultiCropWrapper → "backbone.…", "head.…" ("module." too when the
                                           #   student has batch norms, as the teacher is then DDP-wrapped)
     "optimizer": …, "epoch": int, "args": argparse.Namespace, "dino_loss": {"center": …}[, "fp16_scaler": …]}

``utils.MultiCropWrapper`` holds ``backbone`` (classifier replaced by ``nn.Identity``) and ``head``
(``vision_transformer.DINOHead``). The released ``dino_*_pretrain.pth`` files hold the teacher backbone's
state dict alone (``eval_linear`` / ``load_pretrained_weights`` strip ``module.`` and ``backbone.``); they load as a
backbone without a head. Only ViT backbones (``vit_tiny``, ``vit_small``, ``vit_base`` or any ViT with
``num_heads`` given) are supported; DINO's XCiT and ResNet checkpoints are refused with a sentence.
"""

from __future__ import annotations

import argparse
import re

import torch

from ..backbones.base import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from .checkpoint import Selected, SSLCheckpointError, load_strict, split_by_prefix, strip_prefix
from .heads import DINOProjectionHead
from .inert import is_skipped
from .vit import DINO_VIT_HEADS, DinoViT, vit_from_keys

PARTS = ("teacher", "student")
DEFAULT_POOLING = "cls"
ALLOWED_GLOBALS = (argparse.Namespace,)
# eval_linear.py / eval_knn.py: Resize(256, interpolation=3 (bicubic)), CenterCrop(224), ImageNet mean/std.
PREPROCESS = Preprocess(resize=256, crop=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bicubic")

VIT_KEYS = ("cls_token, pos_embed, patch_embed.proj.{weight,bias}, blocks.<i>.{norm1,attn.qkv,attn.proj,norm2,"
            "mlp.fc1,mlp.fc2}.{weight,bias}, norm.{weight,bias}")
HEAD_KEYS = ("mlp.<i>.{weight,bias} (Linear at 0, 2, 4 with GELU between; with use_bn_in_head BatchNorm1d after "
             "each hidden Linear; 'mlp.weight' for one layer), last_layer.weight_g (K, 1), last_layer.weight_v "
             "(K, bottleneck)")
LAYOUT = ("a DINO checkpoint as main_dino.py saves it: a dict with 'teacher' and 'student' (plus 'optimizer', "
          "'epoch', 'args', 'dino_loss'), each a MultiCropWrapper state dict with keys 'backbone.<ViT key>' and "
          "'head.<DINOHead key>', optionally under 'module.'; ViT keys: " + VIT_KEYS + "; head keys: " + HEAD_KEYS +
          ". Or a backbone-only file (dino_*_pretrain.pth): the ViT keys alone.")


def _args_dict(args) -> dict:
    if args is None:
        return {}
    if is_skipped(args):
        raise SSLCheckpointError(f"the checkpoint's 'args' is an object built by {args.name}, which headprobe does not "
                                 "run, not the argparse.Namespace main_dino.py saves; re-save the checkpoint without "
                                 "it (its 'args' is not needed with the backbone option num_heads).")
    if not isinstance(args, argparse.Namespace):
        raise SSLCheckpointError(f"the checkpoint's 'args' is a {type(args).__name__}, not the argparse.Namespace "
                                 "main_dino.py saves.")
    return {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, type(None)))}


def select(content, part: str | None, path: str) -> Selected:
    """Pick `part` (default teacher) of a DINO checkpoint and split it into backbone and head state dicts."""
    if not isinstance(content, dict):
        raise SSLCheckpointError(f"{path} holds a {type(content).__name__}, not {LAYOUT}")
    if "teacher" in content or "student" in content:
        part = part or "teacher"
        if part not in PARTS:
            raise SSLCheckpointError(f"{path}: part {part!r} is not one of {', '.join(PARTS)} (a DINO checkpoint "
                                     "holds both).")
        if part not in content:
            raise SSLCheckpointError(f"{path} has no {part!r} entry; it holds {sorted(content)}. Expected {LAYOUT}")
        state = content[part]
        if not isinstance(state, dict):
            raise SSLCheckpointError(f"{path}: {part!r} is a {type(state).__name__}, not a state dict.")
        prefix = "module." if state and all(k.startswith("module.") for k in state) else ""
        parts, other = split_by_prefix(strip_prefix(state, prefix), ("backbone", "head"))
        if other or not parts["backbone"] or not parts["head"]:
            missing = [p + ".*" for p in ("backbone", "head") if not parts[p]]
            raise SSLCheckpointError(
                f"{path}, {part}: the state dict does not match the expected layout: missing {missing}, "
                f"unexpected {len(other)} key(s) {[prefix + k for k in other[:10]]}. Expected {LAYOUT}"
            )
        return Selected(parts["backbone"], parts["head"], part, "dino full checkpoint",
                        sorted(k for k in content if k != part), _args_dict(content.get("args")),
                        backbone_prefix=f"{prefix}backbone.", head_prefix=f"{prefix}head.")
    if "cls_token" in strip_prefix(strip_prefix(content, "module."), "backbone."):
        if part not in (None, "teacher"):
            raise SSLCheckpointError(f"{path} holds one backbone only (DINO's released *_pretrain.pth files are the "
                                     f"teacher's), so part {part!r} cannot be chosen; use the full checkpoint "
                                     "(*_full_checkpoint.pth) for the student.")
        state = strip_prefix(strip_prefix(content, "module."), "backbone.")
        return Selected(state, None, "teacher", "dino backbone-only", [], {})
    raise SSLCheckpointError(f"{path} is not a DINO checkpoint: it holds {sorted(content)[:10]}. Expected {LAYOUT}")


def _shape(state: dict, key: str, what: str) -> tuple[int, ...]:
    if key not in state or not isinstance(state[key], torch.Tensor):
        raise SSLCheckpointError(f"{what}: tensor {key!r} is missing, so the model cannot be rebuilt. "
                                 f"Expected {LAYOUT}")
    return tuple(state[key].shape)


def build_backbone(sel: Selected, what: str, *, num_heads: int | None) -> DinoViT:
    """The ViT of `sel`, its size read from the tensors (and `args`), every tensor loaded strictly."""
    state, args, p = sel.backbone, sel.args, sel.backbone_prefix
    arch = str(args.get("arch", "")).replace("deit", "vit")
    if arch and not arch.startswith("vit_"):
        raise SSLCheckpointError(f"{what}: DINO architecture {arch!r} is not supported; supported: ViTs "
                                 f"({', '.join(DINO_VIT_HEADS)}, or another ViT with the num_heads option).")
    dim = _shape(state, "cls_token", what)[-1]
    if num_heads is None:
        if arch not in DINO_VIT_HEADS:
            raise SSLCheckpointError(
                f"{what}: the number of attention heads cannot be read from the tensors and the checkpoint's arch "
                f"({arch or 'not recorded'}) is not one of {', '.join(DINO_VIT_HEADS)}; give the backbone option "
                f"num_heads (DINO's ViTs use {dim // 64 or 1} for width {dim}: 64 per head)."
            )
        num_heads = DINO_VIT_HEADS[arch]
    model = vit_from_keys(state, num_heads=num_heads, what=what, layout=LAYOUT, patch_size=args.get("patch_size"))
    load_strict(model, state, what=what, layout=LAYOUT, prefix=p)
    return model


def run_tokens(model: DinoViT, pixels: torch.Tensor) -> torch.Tensor:
    return model(pixels)


def wrap_options(model: DinoViT) -> dict:
    """How `wrap_blocks` reads the ViT: tokens of each block, DINO's final norm, one class token."""
    return {"run": run_tokens, "blocks": list(model.blocks), "tokens": True, "norm": model.norm, "n_prefix": 1,
            "has_cls": True}


def build_head(sel: Selected, what: str) -> DINOProjectionHead:
    """The DINOHead of `sel`: layers, widths and batch norms read from the tensors, loaded strictly."""
    state, p = sel.head, sel.head_prefix
    if state is None:
        raise SSLCheckpointError(f"{what}: this file holds a backbone only (DINO's released *_pretrain.pth), "
                                 "without the head it was trained with; use the full checkpoint "
                                 "(dino_*_pretrain_full_checkpoint.pth), which holds 'teacher' and 'student'.")
    if "mlp.weight" in state:
        nlayers, use_bn = 1, False
        in_dim, hidden, bottleneck = _shape(state, "mlp.weight", what)[1], 0, _shape(state, "mlp.weight", what)[0]
    else:
        linears = sorted(int(m.group(1)) for k, v in state.items()
                         if (m := re.fullmatch(r"mlp\.(\d+)\.weight", k)) and v.ndim == 2)
        if not linears:
            raise SSLCheckpointError(f"{what}: no MLP layers ('{p}mlp.<i>.weight') were found. Expected {LAYOUT}")
        # main_dino.py always builds DINOHead with its default nlayers=3 and records use_bn_in_head in args; a
        # checkpoint without args (written by other code) has its layers counted instead.
        nlayers = 3 if sel.args else len(linears)
        use_bn = bool(sel.args.get("use_bn_in_head")) if sel.args else any(k.endswith("running_mean") for k in state)
        linears = linears[:nlayers]
        in_dim, hidden = _shape(state, f"mlp.{linears[0]}.weight", what)[1], state[f"mlp.{linears[0]}.weight"].shape[0]
        bottleneck = state[f"mlp.{linears[-1]}.weight"].shape[0]
    out_dim = int(sel.args.get("out_dim") or _shape(state, "last_layer.weight_v", what)[0])
    head = DINOProjectionHead(in_dim, hidden_dim=hidden or bottleneck, bottleneck_dim=bottleneck, out_dim=out_dim,
                              nlayers=nlayers, use_bn=use_bn)
    load_strict(head, state, what=what, layout=LAYOUT, prefix=p)
    return head


def where(name: str) -> str:
    """Where to get a DINO checkpoint called `name`: its official URL for the released names (README.md)."""
    released = re.fullmatch(r"(dino_\w+?_pretrain)(_full_checkpoint)?\.pth", name)
    if released:
        return (f"Download it from https://dl.fbaipublicfiles.com/dino/{released.group(1)}/{name} (the URL "
                "facebookresearch/dino's README links)" + ("" if released.group(2) else
                                                           "; for the head too, use the *_full_checkpoint.pth") + ".")
    return ("facebookresearch/dino's README links the released checkpoints, e.g. "
            "https://dl.fbaipublicfiles.com/dino/dino_deitsmall16_pretrain/dino_deitsmall16_pretrain_full_checkpoint.pth"
            " (the full checkpoint holds the heads).")
