"""The solo-learn checkpoint format (vturrisi/solo-learn): ``ssl:solo-learn:<path>``.

Read from the code that writes it. ``solo/utils/checkpointer.py`` (`Checkpointer`) saves each epoch with
Lightning's ``trainer.save_checkpoint`` to ``<dir>/<version>/<name>-<version>-ep=<epoch>.ckpt`` and writes the
run's configuration beside it, once, as ``args.json`` (``OmegaConf.to_container(cfg)``: ``method``,
``backbone.name``, ``method_kwargs.proj_hidden_dim`` / ``proj_output_dim``, ``data.dataset``, …). The checkpoint is
Lightning's dict (``epoch``, ``global_step``, ``pytorch-lightning_version``, ``state_dict``, ``loops``,
``callbacks``, ``optimizer_states``, ``lr_schedulers``); ``state_dict`` is the method's: ``backbone.*`` (a
torchvision ResNet, ``fc = nn.Identity()``; for cifar10/100 the stem is ``Conv2d(3, 64, 3, stride 1, padding 2)``
and ``maxpool = nn.Identity()``, ``solo/methods/base.py``), ``classifier.*`` (the online linear classifier) and
``projector.*``. Momentum methods add ``momentum_backbone.*``, ``momentum_projector.*`` (and BYOL ``predictor.*``,
``momentum_classifier.*``).

Projectors, each an ``nn.Sequential`` in ``solo/methods/<method>.py`` (all Linears with bias):
``vicreg``, ``barlow_twins``: Linear → BN → ReLU → Linear → BN → ReLU → Linear; ``simclr``: Linear → ReLU →
Linear; ``byol``: Linear → BN → ReLU → Linear. BYOL's parts: ``student`` is the online network (``backbone``,
``projector``; solo-learn's ``main_linear.py`` evaluates it, so it is the default), ``teacher`` the momentum one.
Backbones: ``resnet18`` and ``resnet50`` (pooling mean: torchvision's average pool), and ``vit_tiny``,
``vit_small``, ``vit_base``, ``vit_large`` (``solo/backbones/vit/vit.py``: timm's ``VisionTransformer`` with
``num_classes=0``, whose keys are DINO's ViT's; its features are the class token after the final norm, pooling
cls); Swin, ConvNeXt, PoolFormer and wide ResNets are refused with that list. A ViT evaluated at another size
than it was trained at interpolates its positions as DINO does (timm would refuse the size).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from torch import nn

from ..backbones.base import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from . import dino
from .checkpoint import Selected, SSLCheckpointError, load_strict, split_by_prefix
from .heads import SequentialProjector
from .resnet import resnet_from_keys, resnet_wrap_options
from .vit import DinoViT, vit_from_keys

ALLOWED_GLOBALS = ()
DEFAULT_POOLING = "mean"
# solo/data/classification_dataloader.py, T_val: imagenet/imagenet100/custom Resize(256) + CenterCrop(224);
# cifar10/100 ToTensor + Normalize with CIFAR's statistics at 32×32 (the images' own size).
PREPROCESS = Preprocess(resize=256, crop=224, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation="bilinear")
CIFAR_PREPROCESS = Preprocess(resize=32, crop=32, mean=(0.4914, 0.4822, 0.4465), std=(0.247, 0.243, 0.261),
                              interpolation="bilinear")
# stl10: Resize((96, 96)) (square), STL's statistics.
STL_PREPROCESS = Preprocess(resize=96, crop=96, mean=(0.4914, 0.4823, 0.4466), std=(0.247, 0.243, 0.261),
                            interpolation="bilinear", resize_mode="square")
CIFAR = ("cifar10", "cifar100")

# method → the projector's blocks: (batch norm after the hidden Linear?, hidden layers).
PROJECTORS = {"vicreg": (True, 2), "barlow_twins": (True, 2), "simclr": (False, 1), "byol": (True, 1)}
# method → {part: (backbone prefix, projector prefix)}; the first part is the default.
PARTS = {"byol": {"student": ("backbone", "projector"), "teacher": ("momentum_backbone", "momentum_projector")}}
# state_dict prefixes each method has besides its parts' (read from the methods' __init__).
OTHERS = {"byol": ("classifier", "predictor", "momentum_classifier")}
# solo/backbones/vit/vit.py: num_heads of each named ViT (head width 64).
VIT_HEADS = {"vit_tiny": 3, "vit_small": 6, "vit_base": 12, "vit_large": 16}
BACKBONES = ("resnet18", "resnet50", *VIT_HEADS)

WHERE_TO_GET = ("solo-learn writes it under checkpoint.dir (trained_models/<version>/<name>-<version>-ep=<epoch>"
                ".ckpt) with args.json beside it; its README says the model-zoo checkpoints are no longer available, "
                "so train one with its scripts (e.g. scripts/pretrain/cifar/vicreg.yaml) and give that .ckpt.")
LAYOUT = ("a solo-learn checkpoint: Lightning's dict with 'state_dict' (plus 'epoch', 'global_step', "
          "'optimizer_states', …) whose keys are 'backbone.<torchvision ResNet key>' (no fc) or 'backbone.<timm ViT "
          "key>' (cls_token, pos_embed, patch_embed.proj.*, blocks.<i>.*, norm.*), 'projector.<i>.*', "
          "'classifier.{weight,bias}' (BYOL also 'momentum_backbone.*', 'momentum_projector.*', 'predictor.*'), and "
          f"the run's args.json in the same folder; methods {', '.join(PROJECTORS)}; backbones "
          f"{', '.join(BACKBONES)}.")


def read_args(path: str) -> dict:
    """The run's ``args.json`` beside the checkpoint, as solo-learn's `Checkpointer.save_args` writes it."""
    file = Path(path).expanduser().parent / "args.json"
    if not file.is_file():
        raise SSLCheckpointError(f"{path}: solo-learn writes the run's configuration as args.json beside its "
                                 f"checkpoints, and {file} does not exist; copy the run's args.json there (it "
                                 "names the method, backbone and projector widths the checkpoint was trained with).")
    try:
        args = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SSLCheckpointError(f"{file} is not valid JSON ({err}); solo-learn writes it with json.dump.") from None
    if not isinstance(args, dict):
        raise SSLCheckpointError(f"{file} holds a {type(args).__name__}, not the run's configuration (a mapping).")
    return args


def _setting(args: dict, dotted: str, file: str):
    node = args
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            raise SSLCheckpointError(f"{file}: args.json has no {dotted!r}, which solo-learn's run configuration "
                                     "always holds; is it the args.json of this run?")
        node = node[key]
    return node


def select(content, part: str | None, path: str) -> Selected:
    """The state dicts of `part` (BYOL: student = online, default; teacher = momentum) and the run's settings."""
    args = read_args(path)
    method, backbone = _setting(args, "method", path), _setting(args, "backbone.name", path)
    if method not in PROJECTORS:
        raise SSLCheckpointError(f"{path}: solo-learn method {method!r} (args.json) is not supported; supported: "
                                 f"{', '.join(PROJECTORS)}.")
    if backbone not in BACKBONES:
        raise SSLCheckpointError(f"{path}: solo-learn backbone {backbone!r} (args.json) is not supported; "
                                 f"supported: {', '.join(BACKBONES)}.")
    parts = PARTS.get(method, {"model": ("backbone", "projector")})
    if part is None:
        part = next(iter(parts))
    elif part not in parts:
        raise SSLCheckpointError(
            f"{path}: part {part!r} is not one of solo-learn {method}'s networks"
            + (f" ({', '.join(parts)})." if len(parts) > 1 else "; it has one, so drop the part option."))
    if not isinstance(content, dict) or not isinstance(content.get("state_dict"), dict):
        what = sorted(content)[:10] if isinstance(content, dict) else type(content).__name__
        raise SSLCheckpointError(f"{path} is not a Lightning checkpoint with a 'state_dict' (it holds {what}). "
                                 f"Expected {LAYOUT}")
    prefixes = tuple(p for pair in parts.values() for p in pair) + OTHERS.get(method, ("classifier",))
    split, other = split_by_prefix(content["state_dict"], prefixes)
    bb_prefix, head_prefix = parts[part]
    if other or not split[bb_prefix] or not split[head_prefix]:
        missing = [p + ".*" for p in (bb_prefix, head_prefix) if not split[p]]
        raise SSLCheckpointError(f"{path}: 'state_dict' does not match solo-learn {method}'s layout: missing "
                                 f"{missing}, unexpected {len(other)} key(s) {other[:10]}. Expected {LAYOUT}")
    dataset = str(_setting(args, "data.dataset", path))
    kwargs = args.get("method_kwargs") or {}
    record = {"method": method, "backbone": backbone, "dataset": dataset,
              **{k: kwargs[k] for k in ("proj_hidden_dim", "proj_output_dim") if k in kwargs}}
    ignored = sorted(k for k in content if k != "state_dict") + [f"{p}.*" for p in prefixes
                                                                 if p not in (bb_prefix, head_prefix) and split[p]]
    return Selected(split[bb_prefix], split[head_prefix], part, f"solo-learn {method} checkpoint", ignored, record,
                    backbone_prefix=f"{bb_prefix}.", head_prefix=f"{head_prefix}.",
                    preprocess=CIFAR_PREPROCESS if dataset in CIFAR else STL_PREPROCESS if dataset == "stl10"
                    else PREPROCESS,
                    pooling="cls" if backbone in VIT_HEADS else "mean")


def build_backbone(sel: Selected, what: str, *, num_heads: int | None) -> nn.Module:
    """solo-learn's torchvision ResNet (CIFAR stem for cifar10/100 runs, fc removed) or timm ViT, loaded strictly."""
    name = sel.args["backbone"]
    if name in VIT_HEADS:
        model = vit_from_keys(sel.backbone, num_heads=num_heads or VIT_HEADS[name], what=what, layout=LAYOUT)
    elif num_heads is not None:
        raise SSLCheckpointError(f"{what}: num_heads applies to ViT backbones only; this one is a ResNet.")
    else:
        model = resnet_from_keys(sel.backbone, what, LAYOUT, sel.backbone_prefix,
                                 cifar_stem=sel.args["dataset"] in CIFAR)
    load_strict(model, sel.backbone, what=what, layout=LAYOUT, prefix=sel.backbone_prefix)
    return model


def wrap_options(model: nn.Module) -> dict:
    return dino.wrap_options(model) if isinstance(model, DinoViT) else resnet_wrap_options(model)


def feature_width(state: dict, what: str) -> int:
    """The width of the backbone's features (solo-learn's ``features_dim``): a ViT's token width, or the channels
    of a ResNet's last block (its last batch norm)."""
    if "cls_token" in state:
        return int(state["cls_token"].shape[-1])
    last = max((int(m.group(1)) for k in state if (m := re.match(r"layer4\.(\d+)\.", k))), default=None)
    norm = next((f"layer4.{last}.{bn}.weight" for bn in ("bn3", "bn2") if f"layer4.{last}.{bn}.weight" in state),
                None)
    if norm is None:
        raise SSLCheckpointError(f"{what}: the backbone has no last ResNet block ('backbone.layer4.<j>.bn2/bn3') "
                                 f"to read the feature width from. Expected {LAYOUT}")
    return int(state[norm].shape[0])


def projector_layers(method: str, features: int, hidden: int, output: int) -> list[nn.Module]:
    """The method's ``self.projector`` modules, in solo-learn's order."""
    batch_norm, n_hidden = PROJECTORS[method]
    layers: list[nn.Module] = []
    width = features
    for _ in range(n_hidden):
        layers += [nn.Linear(width, hidden), *([nn.BatchNorm1d(hidden)] if batch_norm else []), nn.ReLU()]
        width = hidden
    return [*layers, nn.Linear(width, output)]


def build_head(sel: Selected, what: str) -> SequentialProjector:
    """The method's projector, widths from args.json (proj_hidden_dim, proj_output_dim), loaded strictly."""
    args = sel.args
    missing = [k for k in ("proj_hidden_dim", "proj_output_dim") if k not in args]
    if missing:
        raise SSLCheckpointError(f"{what}: args.json has no method_kwargs.{missing[0]}, which solo-learn's "
                                 f"{args['method']} projector is built from.")
    head = SequentialProjector(projector_layers(args["method"], feature_width(sel.backbone, what),
                                                int(args["proj_hidden_dim"]), int(args["proj_output_dim"])))
    head.expects = {"pooling": sel.pooling, "layer": -1}
    load_strict(head, sel.head, what=what, layout=LAYOUT, prefix=sel.head_prefix)
    return head


def where(name: str) -> str:
    """Where to get a checkpoint file called `name` (the sentence the missing-file error ends with)."""
    return WHERE_TO_GET
