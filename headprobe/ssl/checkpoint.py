"""Reading self-supervised training checkpoints safely, and loading their tensors strictly.

A training checkpoint is a pickle. Unpickling an arbitrary file can run any code it names, so the file is read
with torch's weights-only unpickler: tensors, numbers, strings and plain containers, the few classes a format
declares (DINO saves its command line as an ``argparse.Namespace``), and for every other global an inert placeholder
(`headprobe.ssl.inert`: VICReg's LARS keeps a function in its optimiser state). Nothing the file names is imported or
called; where the placeholders are is recorded (``skipped_objects``).

Every tensor of the part that is loaded must be used and every tensor the rebuilt module needs must be present:
`load_strict` names the missing and unexpected keys, or the tensor whose shape differs, instead of leaving
randomly initialised weights behind (solo-learn's ``strict=False`` habit that STYLE.md warns about).
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..backbones.base import Backbone, BackboneNotFoundError, Preprocess
from .inert import is_skipped, read_inert


class SSLCheckpointError(ValueError):
    """A checkpoint that cannot be read safely or does not match the format it was declared to be."""


@dataclass
class Selected:
    """The part of a checkpoint that a format picked: the backbone's and the head's state dicts (keys as the
    rebuilt modules name them), and what the record says about it."""

    backbone: dict
    head: dict | None
    part: str
    layout: str
    ignored: list[str]
    args: dict
    backbone_prefix: str = ""
    head_prefix: str = ""
    # The evaluation transform where it depends on the run (solo-learn: CIFAR or ImageNet); None: the format's.
    preprocess: Preprocess | None = None
    # The pooling the head was trained on where it depends on the run (solo-learn: cls for ViTs); None: the format's.
    pooling: str | None = None
    # What the file says about rebuilding the head beyond its tensors (lightly: the head classes hyper_parameters name).
    hints: dict = field(default_factory=dict)


@dataclass
class SSLRecord:
    """What was read, from where, and how much of it was used (`results.json` → `backbone.checkpoint`)."""

    path: str
    sha256: str
    format: str
    part: str
    layout: str
    matched: dict[str, int] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    args: dict = field(default_factory=dict)
    # {global: {"count", "at"}}: the objects read as inert placeholders (`inert.skipped_objects`), never run.
    skipped: dict[str, dict] = field(default_factory=dict)
    # How the head was rebuilt where its tensors do not say everything (lightly: which activation, from where).
    head_rebuilt: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {"path": self.path, "sha256": self.sha256, "format": self.format, "part": self.part,
               "layout": self.layout, "matched_tensors": dict(self.matched), "ignored_entries": list(self.ignored),
               "args": dict(self.args), "skipped_objects": dict(self.skipped)}
        return out | ({"head_rebuilt": dict(self.head_rebuilt)} if self.head_rebuilt else {})


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_checkpoint(path: str | Path, *, format: str, allowed: tuple[type, ...] = (), where: str = "",
                    digest: bool = True) -> tuple[object, str]:
    """The content of `path` (weights only, the classes in `allowed`, inert placeholders for every other global:
    `inert.read_inert`) and the file's sha256 ("" when `digest` is False: validation inspects the keys and needs no
    checksum). `where` says where to get the file."""
    path = Path(path).expanduser()
    if not path.is_file():
        relative = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
        raise BackboneNotFoundError(f"{path}: no such file{relative}; give the path of a {format} training "
                                    f"checkpoint{'. ' + where if where else ' (.pth).'}")
    checksum = sha256_file(path) if digest else ""
    try:
        content = read_inert(path, allowed=allowed)
    except pickle.UnpicklingError as err:
        lines = str(err).splitlines()
        named = next((line.strip() for line in lines if "global" in line.lower()), lines[0] if lines else "")
        raise SSLCheckpointError(
            f"{path} was not loaded: it holds Python objects that cannot be read without running code "
            f"({named or 'an unsupported object'}); headprobe reads tensors, "
            "numbers, strings, plain containers"
            f"{', ' + ', '.join(c.__qualname__ for c in allowed) if allowed else ''} and keeps other objects as "
            "inert placeholders, but torch's unpickler refuses these, and unpickling them fully could run code. "
            "Re-save the state dicts alone (torch.save(ckpt['model'], ...)) from a trusted copy."
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        first = str(err).splitlines()[0] if str(err) else ""
        raise SSLCheckpointError(f"{path} is not a readable torch checkpoint ({type(err).__name__}: {first}).") \
            from None
    return content, checksum


def strip_prefix(state: dict, prefix: str) -> dict:
    """Keys with a leading `prefix` removed (DistributedDataParallel's ``module.``); other keys unchanged."""
    return {k.removeprefix(prefix): v for k, v in state.items()}


def split_by_prefix(state: dict, prefixes: tuple[str, ...]) -> tuple[dict[str, dict], list[str]]:
    """{prefix: {rest of key: tensor}} for each of `prefixes` (written without the dot), and the keys under none."""
    parts: dict[str, dict] = {p: {} for p in prefixes}
    other = []
    for key, value in state.items():
        head, dot, rest = key.partition(".")
        if dot and head in parts:
            parts[head][rest] = value
        else:
            other.append(key)
    return parts, other


def load_strict(module: nn.Module, state: dict, *, what: str, layout: str, prefix: str = "") -> int:
    """Load `state` into `module`, every tensor used and every tensor present; returns the number loaded.

    `what` says which file and part it is ("…/checkpoint.pth, teacher backbone"); `layout` is a sentence describing
    the expected key layout, quoted in the error; `prefix` is put back in front of the keys the error names, so
    they read as in the file. A `module` built on the meta device (validation's inspection) is checked, not loaded.
    """
    expected = module.state_dict()
    missing = [prefix + k for k in expected if k not in state]
    unexpected = [prefix + k for k in state if k not in expected]
    if missing or unexpected:
        raise SSLCheckpointError(
            f"{what} does not match the expected layout: missing {len(missing)} tensor(s) {missing[:10]}, "
            f"unexpected {len(unexpected)} {unexpected[:10]}. Expected: {layout}"
        )
    for key, tensor in state.items():
        if is_skipped(tensor):
            raise SSLCheckpointError(f"{what}: entry {prefix + key!r} is an object built by {tensor.name}, which "
                                     "headprobe does not run, not a tensor.")
        if not isinstance(tensor, torch.Tensor):
            raise SSLCheckpointError(f"{what}: entry {prefix + key!r} is a {type(tensor).__name__}, not a tensor.")
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise SSLCheckpointError(
                f"{what}: tensor {prefix + key!r} has shape {tuple(tensor.shape)} in the checkpoint but the rebuilt "
                f"model needs {tuple(expected[key].shape)}. Expected: {layout}"
            )
    if not any(t.is_meta for t in expected.values()):
        module.load_state_dict(state, strict=True)
    return len(state)


class CheckpointBackbone(Backbone):
    """A `Backbone` read from a training checkpoint; `describe()` adds the checkpoint record."""

    record: SSLRecord

    @classmethod
    def wrap(cls, backbone: Backbone, record: SSLRecord) -> CheckpointBackbone:
        wrapped = cls(backbone.model, backbone._encode, id=backbone.id, dim=backbone.dim,
                      preprocess=backbone.preprocess, blocks=backbone.blocks, description=backbone.description,
                      options=backbone.options, norm=backbone.norm)
        wrapped.record = record
        return wrapped

    def describe(self) -> dict:
        return {**super().describe(), "checkpoint": self.record.to_dict()}
