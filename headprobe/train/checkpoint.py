"""The one checkpoint format of head training, cached and tuned (`headprobe.train.engine`), loaded strictly.

A checkpoint ``step-S.pt`` holds, after S steps::

    {"step": S, "kind": "frozen" | "tuned",
     "heads": {name: {"head", "predictor", "status", "message", "last_loss"}},
     "optimisers": {name: {"optimizer", "scheduler", "scaler"}},   # one per optimiser: each head, or "joint"
     "backbone": {...}, "tuning": {...}}                            # tuned runs only: `trainable_state`

Everything loads with ``strict=True``: a checkpoint that names other heads, other layers, other tuned weights or
other optimisers than the run resuming from it stops with a sentence saying which, instead of training on with a
partly restored state.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from headprobe.parallel.atomic import replace_atomically


class CheckpointError(RuntimeError):
    """A checkpoint that holds more than tensors, numbers, strings and plain containers, cannot be read, or does
    not match the run that loads it."""


def load_checkpoint(path: Path) -> dict:
    """A checkpoint of `save_checkpoint`, read onto the CPU with ``weights_only=True``.

    Unpickling an arbitrary file can run code it names, and run directories get shared: only what headprobe
    writes (tensors, numbers, strings, plain containers) is accepted; anything else raises `CheckpointError`.
    """
    import pickle

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path} holds Python objects other than tensors, numbers, strings and plain containers, so it was not "
            "loaded (unpickling it could run code); delete it, so that the newest checkpoint headprobe wrote is "
            "read instead, or train the run again."
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        raise CheckpointError(f"{path} is not a readable checkpoint ({err}); delete it, so that the newest "
                              "checkpoint before it is read instead, or train the run again.") from None
    if not isinstance(saved, dict) or not {"step", "heads"} <= set(saved):
        raise CheckpointError(f"{path} is not a headprobe checkpoint (it lacks 'step' and 'heads'); delete it, "
                              "so that the newest checkpoint before it is read instead, or train the run again.")
    return saved


def latest_checkpoint(folder: Path) -> Path | None:
    found = sorted(folder.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    return found[-1] if found else None


def trainable_state(backbone) -> dict[str, torch.Tensor]:
    """The backbone's trainable parameters and the persistent buffers (BatchNorm statistics) of the modules that
    own them, named as in `backbone.model`'s state dict, detached copies on the CPU."""
    persistent = set(backbone.model.state_dict(keep_vars=True))
    out = {}
    for prefix, module in backbone.model.named_modules():
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        dot = f"{prefix}." if prefix else ""
        for name, tensor in [*own, *module.named_buffers(recurse=False)]:
            if dot + name in persistent:
                out[dot + name] = tensor.detach().to("cpu", copy=True).contiguous()
    return out


def load_trainable_state(backbone, state: dict[str, torch.Tensor], origin: str) -> None:
    """Put `trainable_state`'s tensors back into `backbone`, strictly: exactly its trainable weights, or an error
    naming what differs (`origin` says where `state` came from)."""
    expected = set(trainable_state(backbone))
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise CheckpointError(f"{origin} does not hold this backbone's tuned weights (missing {missing[:4]}, "
                              f"unexpected {extra[:4]}); resume with the tune policy that wrote it "
                              f"(this run uses {backbone.tuning['policy']!r}), or train the run again.")
    full = backbone.model.state_dict()
    full.update(state)
    backbone.model.load_state_dict(full, strict=True)


def load_module(module: nn.Module | None, state: dict | None, what: str, origin: str) -> None:
    """``module.load_state_dict(state, strict=True)``, with a sentence instead of torch's key listing on mismatch."""
    if (module is None) != (state is None):
        raise CheckpointError(f"{origin} {'has' if state is not None else 'lacks'} a {what}, but this run's head "
                              f"{'lacks' if module is None else 'has'} one; resume with the recipe that wrote it, or "
                              "train the run again.")
    if module is None:
        return
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as err:
        first = str(err).splitlines()[1:2] or [str(err)]
        raise CheckpointError(f"{origin} holds a {what} of another shape or layout than this run's "
                              f"({first[0].strip()}); resume with the recipe that wrote it, or train the run "
                              "again.") from None


def save_checkpoint(path: Path, step: int, groups, backbone=None) -> None:
    """Write the heads and optimisers of `groups` (`engine.Optimisation`s) and a tuned `backbone`'s weights."""
    path.parent.mkdir(parents=True, exist_ok=True)
    heads = {s.name: {"head": s.head.state_dict(), "predictor": s.predictor.state_dict() if s.predictor else None,
                      "status": s.status, "message": s.message, "last_loss": s.last_loss}
             for group in groups for s in group.heads}
    saved = {"step": step, "kind": "frozen" if backbone is None else "tuned", "heads": heads,
             "optimisers": {g.name: {"optimizer": g.optimizer.state_dict(), "scheduler": g.scheduler.state_dict(),
                                     "scaler": g.scaler.state_dict()} for g in groups}}
    if backbone is not None:
        saved |= {"tuning": dict(backbone.tuning), "backbone": trainable_state(backbone)}
    replace_atomically(path, lambda tmp: torch.save(saved, tmp))


def _same_names(path: Path, what: str, saved: set[str], ours: set[str]) -> None:
    if saved != ours:
        raise CheckpointError(f"{path} holds the {what} {sorted(saved)}, this run has {sorted(ours)}; resume with "
                              "the recipe that wrote it, or train the run again without resuming.")


def restore_checkpoint(path: Path, groups, backbone=None) -> int:
    """Load `path` into `groups` (and a tuned `backbone`), strictly; returns the step it was saved at."""
    saved = load_checkpoint(path)
    kind = "frozen" if backbone is None else "tuned"
    if saved.get("kind") != kind or "optimisers" not in saved:
        written = {"frozen": "frozen-backbone head training", "tuned": "a tuned backbone"}.get(saved.get("kind"))
        raise CheckpointError(f"{path} is a checkpoint of {written or 'an earlier headprobe version'}, not of "
                              f"{'frozen-backbone head training' if backbone is None else 'a tuned backbone'}; "
                              "resume the run that wrote it, or train this one again without resuming.")
    states = {s.name: s for g in groups for s in g.heads}
    _same_names(path, "heads", set(saved["heads"]), set(states))
    _same_names(path, "optimisers", set(saved["optimisers"]), {g.name for g in groups})
    if backbone is not None:
        load_trainable_state(backbone, saved["backbone"], f"{path} (saved with tune policy "
                                                          f"{saved['tuning'].get('policy')!r})")
    for name, state in states.items():
        entry = saved["heads"][name]
        load_module(state.head, entry["head"], f"head {name!r}", str(path))
        load_module(state.predictor, entry["predictor"], f"predictor of head {name!r}", str(path))
        state.status, state.message, state.last_loss = entry["status"], entry["message"], entry["last_loss"]
    for group in groups:
        entry = saved["optimisers"][group.name]
        try:
            group.optimizer.load_state_dict(entry["optimizer"])
        except ValueError as err:
            raise CheckpointError(f"{path} holds an optimiser state for {group.name!r} that does not fit this run's "
                                  f"({err}); resume with the recipe that wrote it, or train the run again.") from None
        group.scheduler.load_state_dict(entry["scheduler"])
        group.scaler.load_state_dict(entry["scaler"])
    return saved["step"]
