"""Backbones and heads read from self-supervised training checkpoints: ``ssl:<format>:<path>``.

The paper's foundation-model evidence measures official checkpoints before and after the head they were
pretrained with. ``load_backbone("ssl:dino:/ckpt/dino_deitsmall16_pretrain_full_checkpoint.pth", part="teacher")``
rebuilds the backbone; ``load_pretrained_head(same id, part="teacher")`` rebuilds its head with headprobe's tap
interface. Files are read with torch's weights-only unpickler (never a full unpickle) and loaded strictly; the
record of what was read (sha256, format, part, tensors matched) is in ``backbone.describe()["checkpoint"]`` and
``head.record``. Objects other than tensors, numbers, strings and plain containers (VICReg's LARS keeps its
``exclude_bias_and_norm`` function in the optimiser state) are read as inert placeholders, never imported or called
(`headprobe.ssl.inert`), and listed in the record's ``skipped_objects``.

Formats (each module's docstring quotes the code that writes its files): ``dino`` (main_dino.py full checkpoints
and the released backbone-only files), ``vicreg`` and ``barlow`` / ``barlowtwins`` (the official full checkpoints),
``solo-learn`` (Lightning checkpoints with args.json beside them: vicreg, barlow_twins, simclr, byol on
resnet18/50) and ``lightly`` (Lightning checkpoints of lightly's example modules: ``backbone`` +
``projection_head``: lightly's ProjectionHead classes, the activation read from the layout, the checkpoint's
hyper_parameters or the caller's ``act``, never guessed). `inspect_checkpoint` checks a file's keys and shapes
without loading a model (``headprobe validate``).

>>> bb = load_backbone("ssl:dino:dino_deitsmall16_pretrain_full_checkpoint.pth")  # doctest: +SKIP
>>> head = load_pretrained_head("ssl:dino:dino_deitsmall16_pretrain_full_checkpoint.pth")  # doctest: +SKIP
>>> [t.shape[-1] for t in head.taps(bb(pixels))]  # doctest: +SKIP
[2048, 2048, 256, 65536]
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from torch import nn

from ..backbones.base import Backbone
from ..backbones.blocks import wrap_blocks
from ..backbones.pooling import FINAL
from ..registry import unknown_name_message
from . import dino, lightly, solo_learn, vicreg
from .checkpoint import CheckpointBackbone, Selected, SSLCheckpointError, SSLRecord, read_checkpoint
from .heads import BNReLUProjector, DINOProjectionHead, SequentialProjector, WeightNormLinear
from .inert import skipped_objects

# "barlowtwins" is the (and the repository's) name for "barlow"; both read the same files.
FORMATS: dict[str, ModuleType | vicreg.Format] = {"dino": dino, "vicreg": vicreg.VICREG, "barlow": vicreg.BARLOW,
                                                  "barlowtwins": vicreg.BARLOW, "solo-learn": solo_learn,
                                                  "lightly": lightly}


def parse_id(id: str) -> tuple[str, str]:
    """``ssl:<format>:<path>`` or ``<format>:<path>`` → (format, path); an unknown format lists the supported."""
    ref = id.removeprefix("ssl:")
    format, sep, path = ref.partition(":")
    if format not in FORMATS:
        raise SSLCheckpointError(f"backbone id {id!r}: " + unknown_name_message("checkpoint format", format,
                                                                               list(FORMATS))
                                 + " Write it as ssl:<format>:<path>.")
    if not sep or not path:
        raise SSLCheckpointError(f"backbone id {id!r} names no file; write it as ssl:{format}:<path>.")
    return format, path


def read_part(id: str, part: str | None = None, *, digest: bool = True) -> tuple[ModuleType, Selected, SSLRecord]:
    """Read the checkpoint of `id` safely and pick `part`: (format module, selected state dicts, record).
    `digest`: compute the file's sha256 (validation's inspection skips it)."""
    format, path = parse_id(id)
    fmt = FORMATS[format]
    content, digest = read_checkpoint(path, format=format, allowed=fmt.ALLOWED_GLOBALS,
                                      where=fmt.where(Path(path).name), digest=digest)
    sel = fmt.select(content, part, path)
    record = SSLRecord(path=str(Path(path).expanduser()), sha256=digest, format=format, part=sel.part,
                       layout=sel.layout, ignored=sel.ignored, args=sel.args, skipped=skipped_objects(content))
    return fmt, sel, record


def load_ssl(
    ref: str,
    *,
    part: str | None = None,
    pooling: str | None = None,
    layer: int = FINAL,
    layers: list[int] | None = None,
    resolution: int | None = None,
    num_heads: int | None = None,
    seed: int | None = None,
) -> Backbone:
    """The backbone of a training checkpoint, ``ssl:<format>:<path>`` (the `BACKBONES` entry ``ssl``).

    `part`: teacher or student where the format has both (DINO: default teacher). `num_heads`: attention heads of
    a ViT whose arch the checkpoint does not name. Pooling, layer(s) and resolution as for other ViT sources.
    """
    id = f"ssl:{ref}"
    fmt, sel, record = read_part(id, part)
    what = f"{record.path}, {sel.part} backbone"
    model = fmt.build_backbone(sel, what, num_heads=num_heads)
    record.matched["backbone"] = len(sel.backbone)
    pooling = pooling or sel.pooling or fmt.DEFAULT_POOLING
    preprocess = sel.preprocess or fmt.PREPROCESS
    preprocess = preprocess if resolution is None else preprocess.with_resolution(resolution)
    backbone = wrap_blocks(
        model.eval(), id=id, **fmt.wrap_options(model), pooling=pooling, layer=layer, layers=layers,
        preprocess=preprocess,
        description=f"{record.format} {sel.part} backbone from {record.path} (sha256 {record.sha256[:12]}…, "
                    f"{len(sel.backbone)} tensors); preprocessing: {record.format}'s evaluation transform",
        options={"part": sel.part, "pooling": pooling, "resolution": resolution, "layer": layer, "layers": layers},
    )
    return CheckpointBackbone.wrap(backbone, record)


def build_head(fmt: ModuleType | vicreg.Format, sel: Selected, what: str, act: str | None) -> nn.Module:
    """The head of `sel`. lightly's is the one whose activation the file may not hold: `act` says it there; for the
    other formats, whose head is fixed, an `act` that differs from it is refused."""
    if fmt is lightly:
        return lightly.build_head(sel, what, act=act)
    head = fmt.build_head(sel, what)
    if act is not None and act != head.activation:
        raise SSLCheckpointError(f"{what}: act {act!r} was given, but this head computes {head.activation} (read from "
                                 f"its {sel.layout}); remove act, which only lightly's heads need.")
    return head


def load_pretrained_head(id: str, *, part: str | None = None, act: str | None = None) -> nn.Module:
    """The head a checkpoint was pretrained with, frozen, in eval mode, with ``taps``/``depth``/``tap_labels``.

    `id` is the backbone's id (``ssl:<format>:<path>``, the ``ssl:`` optional) and `part` the same part as the
    backbone's. `act`: the activation of a lightly head whose layout does not say it (the recipe's
    ``heads[i].act``). `head.record` is the `SSLRecord` (sha256, part, tensors matched, skipped objects, how the head
    was rebuilt); `head.expects` the backbone features it was trained on (pooling cls, layer -1 for DINO).
    """
    fmt, sel, record = read_part(id, part)
    head = build_head(fmt, sel, f"{record.path}, {sel.part} head", act)
    record.matched["head"] = len(sel.head or {})
    record.head_rebuilt = dict(getattr(head, "rebuilt", {}))
    head.record = record
    head.eval()
    for p in head.parameters():
        p.requires_grad_(False)
    return head


def inspect_checkpoint(id: str, *, part: str | None = None, num_heads: int | None = None,
                       head: bool = False, act: str | None = None) -> dict:
    """Check, without loading a model, that the file of `id` exists and holds what its format needs: the part's
    keys and shapes against the backbone (and, with `head`, the pretrained head) rebuilt on the meta device, where
    modules hold no memory and nothing is loaded. Raises what loading would (`SSLCheckpointError`,
    `BackboneNotFoundError`); `headprobe validate` reports it with exit code 2. `act` as for `load_pretrained_head`.
    Returns the head's `expects` (the features it was trained on: pooling, layer), {} without `head`."""
    import torch

    fmt, sel, record = read_part(id, part, digest=False)
    with torch.device("meta"):
        fmt.build_backbone(sel, f"{record.path}, {sel.part} backbone", num_heads=num_heads)
        if not head:
            return {}
        return dict(getattr(build_head(fmt, sel, f"{record.path}, {sel.part} head", act), "expects", {}) or {})


__all__ = [
    "FORMATS",
    "BNReLUProjector",
    "CheckpointBackbone",
    "DINOProjectionHead",
    "SSLCheckpointError",
    "SSLRecord",
    "SequentialProjector",
    "WeightNormLinear",
    "inspect_checkpoint",
    "load_pretrained_head",
    "load_ssl",
    "parse_id",
    "read_part",
]
