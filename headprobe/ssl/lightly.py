"""The lightly checkpoint format (lightly-ai/lightly): ``ssl:lightly:<path>``, a Lightning checkpoint of a model
written as lightly's examples write them.

lightly saves nothing itself: its examples (``examples/pytorch_lightning/<method>.py``) are LightningModules with
``self.backbone = nn.Sequential(*list(torchvision.models.resnet18().children())[:-1])`` and
``self.projection_head = <Method>ProjectionHead(...)``; momentum methods (BYOL, MoCo) add
``self.backbone_momentum`` and ``self.projection_head_momentum`` (deep copies), some a ``prediction_head``, and the
loss is ``self.criterion``. Lightning's ``trainer.save_checkpoint`` writes ``{"state_dict": …, "epoch", …}``.

Supported module names: ``backbone.*`` and ``projection_head.layers.*`` (part ``student``, the default: the
online network the examples evaluate), ``backbone_momentum.*`` and ``projection_head_momentum.layers.*`` (part
``teacher``); ``prediction_head.*`` and ``criterion.*`` are recorded as ignored. The backbone is a torchvision
ResNet with the ImageNet stem, either as lightly's ``nn.Sequential`` of its children (``backbone.0.weight`` = conv1,
``backbone.4.*`` = layer1, …) or with torchvision's names (``backbone.conv1.weight``, ``fc = Identity``).

The head is lightly's ``ProjectionHead``: ``layers = nn.Sequential`` of, per block, ``Linear`` (bias only where
no batch norm follows: ``use_bias = not bool(batch_norm)``), the block's norm, its activation
(``lightly/models/modules/heads.py``). Linears and norms are read from the tensors; an activation has none, so its
place is the index the keys skip but not which it is. The layout names the classes it can be
(`lightly_heads.candidates`); where they all compute the same activation (SimSiam's, NNCLR's, MoCo's layouts: ReLU)
it is rebuilt with it, else the activation must be said: by the Lightning checkpoint's ``hyper_parameters``
naming the class (``self.save_hyperparameters()`` with the head's class name as an argument, or the head itself), or
by the caller (``act``; the recipe's ``heads[i].act`` of the ``type: pretrained`` head). Barlow Twins', VICReg's and
LeJEPA's layout is MSN's (GELU), BYOL's, TiCo's, SwaV's and SMoG's is LeWM's (GELU): those are refused without it,
with the candidates named. DINO's and DINOv2's heads (``last_layer``), CAPI's and the prototype modules are refused
by name; ``prototypes.*`` and ``smog.*`` (SwaV's and SMoG's prototypes beside the head) are ignored.
"""

from __future__ import annotations

import re

from torch import nn

from ..backbones.base import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from .checkpoint import Selected, SSLCheckpointError, load_strict, split_by_prefix
from .heads import SequentialProjector
from .inert import skipped_objects
from .lightly_heads import ACTIVATION, NOT_PROJECTION_HEADS, candidates
from .resnet import as_children, children_to_names, children_wrap_options, resnet_from_keys, resnet_wrap_options

ALLOWED_GLOBALS = ()
DEFAULT_POOLING = "mean"
# lightly's transforms normalise with IMAGENET_NORMALIZE; it fixes no evaluation resize, so ImageNet's is used.
PREPROCESS = Preprocess(resize=256, crop=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bilinear")
PARTS = {"student": ("backbone", "projection_head"), "teacher": ("backbone_momentum", "projection_head_momentum")}
IGNORED = ("prediction_head", "criterion", "prototypes", "smog")
HEADS = tuple(ACTIVATION)
# The activations a rebuilt head may be given (`act`), as `headprobe.train.heads.ACTIVATIONS` names them.
ACT_MODULES = {"relu": nn.ReLU, "gelu": nn.GELU, "swish": nn.SiLU, "silu": nn.SiLU, "tanh": nn.Tanh}

WHERE_TO_GET = ("lightly writes no checkpoints itself: save your LightningModule with trainer.save_checkpoint (or "
         "Lightning's ModelCheckpoint) and give that .ckpt.")
LAYOUT = ("a Lightning checkpoint of a lightly model: a dict with 'state_dict' whose keys are 'backbone.<i>.*' "
          "(nn.Sequential of a torchvision ResNet's children: 0 conv1, 1 bn1, 4-7 layer1-4) or 'backbone.<torchvision "
          "ResNet key>', and 'projection_head.layers.<i>.*' (lightly's ProjectionHead: Linear, BatchNorm1d or "
          "LayerNorm, an activation per block); teacher: 'backbone_momentum.*', 'projection_head_momentum.layers.*'; "
          f"'prediction_head.*', 'criterion.*', 'prototypes.*', 'smog.*' ignored. Supported heads: {', '.join(HEADS)}.")


def select(content, part: str | None, path: str) -> Selected:
    """The backbone and projection head of `part` (student: the online network, default; teacher: momentum)."""
    part = part or "student"
    if part not in PARTS:
        raise SSLCheckpointError(f"{path}: part {part!r} is not one of {', '.join(PARTS)} (lightly's momentum "
                                 "copies, backbone_momentum and projection_head_momentum, are the teacher).")
    if not isinstance(content, dict) or not isinstance(content.get("state_dict"), dict):
        what = sorted(content)[:10] if isinstance(content, dict) else type(content).__name__
        raise SSLCheckpointError(f"{path} is not a Lightning checkpoint with a 'state_dict' (it holds {what}). "
                                 f"Expected {LAYOUT}")
    prefixes = tuple(p for pair in PARTS.values() for p in pair) + IGNORED
    split, other = split_by_prefix(content["state_dict"], prefixes)
    bb_prefix, head_prefix = PARTS[part]
    if other or not split[bb_prefix] or not split[head_prefix]:
        missing = [p + ".*" for p in (bb_prefix, head_prefix) if not split[p]]
        raise SSLCheckpointError(f"{path}: 'state_dict' does not match the lightly layout ({part}): missing "
                                 f"{missing}, unexpected {len(other)} key(s) {other[:10]}. Expected {LAYOUT}")
    head = split[head_prefix]
    outside = [k for k in head if not k.startswith("layers.")]
    if outside:
        refused = "; ".join(f"{name}: {why}" for name, why in NOT_PROJECTION_HEADS.items())
        raise SSLCheckpointError(
            f"{path}: the projection head has tensors outside a lightly ProjectionHead's layers "
            f"{[f'{head_prefix}.{k}' for k in outside[:10]]}, so it is none of the heads read here. Not supported "
            f"({refused}). Supported heads: {', '.join(HEADS)}.")
    ignored = sorted(k for k in content if k != "state_dict") + [f"{p}.*" for p in prefixes
                                                                 if p not in (bb_prefix, head_prefix) and split[p]]
    hparams = content.get("hyper_parameters")
    return Selected(split[bb_prefix], {k.removeprefix("layers."): v for k, v in head.items()}, part,
                    "lightly Lightning checkpoint", ignored, plain_values(hparams), backbone_prefix=f"{bb_prefix}.",
                    head_prefix=f"{head_prefix}.layers.", hints={"head_classes": named_heads(hparams)})


def plain_values(hparams) -> dict:
    """The Lightning checkpoint's ``hyper_parameters`` that are numbers, strings or booleans (the record's args)."""
    if not isinstance(hparams, dict):
        return {}
    return {str(k): v for k, v in hparams.items() if isinstance(v, (str, int, float, bool, type(None)))}


def named_heads(hparams) -> list[str]:
    """lightly head classes the ``hyper_parameters`` name: a string value that is a class name, or a head module
    saved in them (read as an inert placeholder of ``lightly.models.modules.heads.<Class>``, never rebuilt)."""
    if not isinstance(hparams, dict):
        return []
    known = {*ACTIVATION, *NOT_PROJECTION_HEADS}
    strings = [v for v in hparams.values() if isinstance(v, str) and v in known]
    modules = [name.rpartition(".")[2] for name in skipped_objects(hparams)
               if name.rpartition(".")[0] == "lightly.models.modules.heads"]
    return sorted({*strings, *modules})


def build_backbone(sel: Selected, what: str, *, num_heads: int | None) -> nn.Module:
    """The torchvision ResNet of `sel` (lightly's nn.Sequential of its children, or torchvision's names)."""
    if num_heads is not None:
        raise SSLCheckpointError(f"{what}: num_heads applies to ViT backbones only; this one is a ResNet.")
    state = sel.backbone
    if "conv1.weight" in state:
        model = resnet_from_keys(state, what, LAYOUT, sel.backbone_prefix)
    else:
        model = as_children(resnet_from_keys(children_to_names(state), what, LAYOUT, sel.backbone_prefix))
    load_strict(model, state, what=what, layout=LAYOUT, prefix=sel.backbone_prefix)
    return model


def wrap_options(model: nn.Module) -> dict:
    return children_wrap_options(model) if isinstance(model, nn.Sequential) else resnet_wrap_options(model)


def layer_of(index: int, keys: dict, what: str, prefix: str) -> nn.Module:
    """The module at `index` of ProjectionHead.layers, from its tensors (name → tensor)."""
    weight = keys.get("weight")
    if weight is not None and weight.ndim == 2:
        return nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in keys)
    if "running_mean" in keys:
        return nn.BatchNorm1d(keys["running_mean"].shape[0], affine="weight" in keys)
    if weight is not None and weight.ndim == 1:
        return nn.LayerNorm(weight.shape[0], elementwise_affine=True, bias="bias" in keys)
    raise SSLCheckpointError(f"{what}: layer {prefix}{index} holds {sorted(keys)}, which is none of Linear, "
                             f"BatchNorm1d, LayerNorm. Expected {LAYOUT}")


def check_widths(layers: list[nn.Module | None], prefix: str, what: str) -> None:
    """Each layer's input width is the previous one's output (the state dict alone shows a mismatch); None is an
    activation's place."""
    width = None
    for index, layer in enumerate(layers):
        if isinstance(layer, nn.Linear):
            needs, key, shape = layer.in_features, f"{index}.weight", (layer.out_features, layer.in_features)
        elif isinstance(layer, nn.BatchNorm1d):
            needs, key, shape = layer.num_features, f"{index}.running_mean", (layer.num_features,)
        elif isinstance(layer, nn.LayerNorm):
            needs, key, shape = layer.normalized_shape[0], f"{index}.weight", tuple(layer.normalized_shape)
        else:
            continue
        if width is not None and needs != width:
            raise SSLCheckpointError(f"{what}: tensor {prefix + key!r} has shape {shape}, but it follows a layer of "
                                     f"width {width}. Expected {LAYOUT}")
        width = layer.out_features if isinstance(layer, nn.Linear) else needs


def block_layout(layers: list[nn.Module | None]) -> str:
    """The block tokens of `layers` (None = an activation's place): ``"L+BN+A Lb"`` (`lightly_heads`)."""
    blocks: list[str] = []
    for layer in layers:
        if isinstance(layer, nn.Linear):
            blocks.append("Lb" if layer.bias is not None else "L")
        elif isinstance(layer, nn.BatchNorm1d):
            blocks[-1] += "+BN" if layer.affine else "+BNp"
        elif isinstance(layer, nn.LayerNorm):
            blocks[-1] += "+LN"
        else:
            blocks[-1] += "+A"
    return " ".join(blocks)


def choose_activation(layout: str, sel: Selected, act: str | None, what: str) -> dict:
    """The activation of a head with `layout`, and where it was read: the caller's `act`, the classes the
    ``hyper_parameters`` name, or the layout where every class with it computes the same; else an error naming the
    candidates and the hint to give."""
    classes = candidates(layout)
    if "+A" not in layout:  # no activation to choose (one Linear, or Linears and norms only)
        return {"activation": "none", "from": "the layout: it has no activation", "class_candidates": classes}
    if act is not None:
        if act not in ACT_MODULES:
            raise SSLCheckpointError(f"{what}: act {act!r} is not an activation a lightly head is rebuilt with; use "
                                     f"one of {', '.join(ACT_MODULES)}.")
        return {"activation": act, "from": "the act given (recipe heads[i].act)", "class_candidates": classes}
    named = [c for c in sel.hints.get("head_classes", []) if c in classes]
    if len({ACTIVATION[c] for c in named}) == 1:
        return {"activation": ACTIVATION[named[0]], "from": f"hyper_parameters name {', '.join(named)}",
                "class_candidates": classes}
    if len({ACTIVATION[c] for c in classes}) == 1:
        return {"activation": ACTIVATION[classes[0]], "from": "the layout: every lightly head class with it computes "
                f"{ACTIVATION[classes[0]]}", "class_candidates": classes}
    by_act: dict[str, list[str]] = {}
    for c in classes:
        by_act.setdefault(ACTIVATION[c], []).append(c)
    which = " or ".join(f"{', '.join(cs)} ({a})" for a, cs in sorted(by_act.items(), key=lambda i: i[0] != "relu"))
    hint = " or ".join(f"act: {a}" for a in sorted(by_act, key=lambda a: a != "relu")) or "act: relu"
    shape = (f"its layout ({layout}) is that of {which}" if classes else
             f"its layout ({layout}) is none of lightly's head classes ({', '.join(HEADS)})")
    raise SSLCheckpointError(
        f"{what}: {shape}, and an activation leaves no tensors, so which one it computes is not in the "
        "checkpoint (nor do its hyper_parameters name the class). Say it: in the recipe, on the `type: pretrained` "
        f"head, {hint} (load_pretrained_head(..., act=...) in Python); headprobe does not guess it.")


def build_head(sel: Selected, what: str, act: str | None = None) -> SequentialProjector:
    """lightly's ProjectionHead rebuilt from its tensors, a tensor-free index between two layers being the
    activation `choose_activation` reads (never guessed); `head.rebuilt` records which and from where."""
    by_index: dict[int, dict] = {}
    for key, value in sel.head.items():
        m = re.fullmatch(r"(\d+)\.(\w+)", key)
        if m is None:
            raise SSLCheckpointError(f"{what}: key {sel.head_prefix + key!r} is not '<index>.<tensor>'. "
                                     f"Expected {LAYOUT}")
        by_index.setdefault(int(m.group(1)), {})[m.group(2)] = value
    layers: list[nn.Module | None] = []
    for index in range(max(by_index) + 1):
        if index in by_index:
            layers.append(layer_of(index, by_index[index], what, sel.head_prefix))
        elif index == 0 or index - 1 not in by_index:
            raise SSLCheckpointError(f"{what}: layers {sel.head_prefix}{index - 1} and {index} both hold no tensors; "
                                     "a lightly ProjectionHead has at most one activation between layers.")
        else:
            layers.append(None)
    check_widths(layers, sel.head_prefix, what)
    rebuilt = choose_activation(block_layout(layers), sel, act, what)
    head = SequentialProjector([m if m is not None else ACT_MODULES[rebuilt["activation"]]() for m in layers])
    load_strict(head, sel.head, what=what, layout=LAYOUT, prefix=sel.head_prefix)
    head.rebuilt = rebuilt
    return head


def where(name: str) -> str:
    """Where to get a checkpoint file called `name` (the sentence the missing-file error ends with)."""
    return WHERE_TO_GET
