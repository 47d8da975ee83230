"""A finished run's trained heads, for use outside headprobe: `load_heads` as torch modules, `export_heads` as one
safetensors file.

The heads come from the run's last checkpoint (``checkpoints/step-S.pt``; with several seeds
``checkpoints/seed-S/step-S.pt``), read with ``weights_only=True`` (`checkpoint.load_checkpoint`) and loaded
strictly into heads built from the configs results.json records. A head maps the run's backbone features
(results.json ``backbone.dim``; pooled as ``recipe.backbone`` says) to its output, in eval mode (BatchNorm with its
running statistics), exactly as the run's head taps were computed. Heads without weights (``type: identity``) and
a checkpoint's own heads (``type: pretrained``, which never train) are not included. A tuned run's heads
(``backbone.tune``) belong to its tuned backbone (results.json ``backbone_tuned.saved``), not the original one.

The exported file holds every seed's head tensors under ``seed-S/HEAD/<state-dict key>`` and, in its metadata
``headprobe``, a JSON record of the heads' configs, the input dimension, the seeds and the backbone, so that
`load_heads` (or any safetensors reader) rebuilds them:

>>> heads = load_heads("runs/quickstart")  # doctest: +SKIP
>>> z = heads["mlp_swish"](backbone_features)  # (N, 384) -> (N, 512)  # doctest: +SKIP
>>> export_heads("runs/quickstart")  # doctest: +SKIP
PosixPath('runs/quickstart/heads.safetensors')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from headprobe.parallel.atomic import replace_atomically
from headprobe.train.checkpoint import latest_checkpoint, load_checkpoint, load_module

EXPORT_NAME = "heads.safetensors"
EXPORT_FORMAT = 1


class SavedHeadsError(ValueError):
    """A run (or exported file) whose trained heads cannot be read; the message says why and what to do."""


def _record(run_dir: Path) -> dict[str, Any]:
    """What rebuilding the heads needs, from results.json: their configs, input dimension, seeds, backbone."""
    from headprobe.record.directory import read_results

    try:
        results = read_results(run_dir)
    except FileNotFoundError as err:
        raise SavedHeadsError(str(err)) from None
    recipe = results.get("recipe") or {}
    heads = {name: entry["config"] for name, entry in (results.get("heads") or {}).items()
             if entry.get("config", {}).get("type") not in (None, "identity", "pretrained")}
    if not heads:
        raise SavedHeadsError(f"{run_dir} has no trained heads (its recipe trains none, or the run stopped before "
                              "training them); run a recipe with `heads:`, or resume this run with --resume.")
    dim = (results.get("backbone") or {}).get("dim")
    if not isinstance(dim, int):
        raise SavedHeadsError(f"{run_dir}/results.json records no backbone dimension (backbone.dim); the run stopped "
                              "before loading its backbone.")
    seeds = recipe.get("seeds") or [recipe.get("seed", 0)]
    return {"format": EXPORT_FORMAT, "heads": heads, "in_dim": dim, "seeds": [int(s) for s in seeds],
            "backbone": {k: (results.get("backbone") or {}).get(k) for k in ("id", "fingerprint", "options")},
            "tuned": recipe.get("backbone", {}).get("tune", "frozen") != "frozen"}


def _build(config: dict, in_dim: int) -> torch.nn.Module:
    """The head a config of results.json describes (a plug-in head type by its factory), weights not yet loaded."""
    from headprobe.recipe import HeadSpec
    from headprobe.train.engine import build_head

    return build_head(HeadSpec(**config), in_dim, seed=0)[0]


def _from_checkpoints(run_dir: Path, record: dict) -> dict[int, dict[str, dict[str, torch.Tensor]]]:
    """{seed: {head: state dict}} from each seed's last checkpoint."""
    several = len(record["seeds"]) > 1
    out = {}
    for seed in record["seeds"]:
        folder = run_dir / "checkpoints" / (f"seed-{seed}" if several else "")
        path = latest_checkpoint(folder)
        if path is None:
            raise SavedHeadsError(f"{folder} holds no checkpoint (step-S.pt), so the heads of seed {seed} cannot be "
                                  "loaded; the run stopped before training finished (`headprobe run RECIPE --resume "
                                  f"--out {run_dir}` finishes it), or it ran on a process that could not write there.")
        saved = load_checkpoint(path)
        missing = sorted(set(record["heads"]) - set(saved["heads"]))
        if missing:
            raise SavedHeadsError(f"{path} holds no weights for the head(s) {missing} that {run_dir}/results.json "
                                  "records; the checkpoint belongs to another run.")
        out[seed] = {name: saved["heads"][name]["head"] for name in record["heads"]}
    return out


def _read_export(path: Path) -> tuple[dict, dict[int, dict[str, dict[str, torch.Tensor]]]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except Exception as err:
        raise SavedHeadsError(f"{path} is not a readable safetensors file ({err}).") from None
    try:
        record = json.loads(metadata["headprobe"])
    except (KeyError, json.JSONDecodeError):
        raise SavedHeadsError(f"{path} has no 'headprobe' metadata record; it was not written by "
                              "`headprobe export-heads`.") from None
    states: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    for key, tensor in tensors.items():
        seed, rest = key.split("/", 1)
        name, _, param = rest.rpartition("/")  # a state-dict key has no '/'; a head's name might
        states.setdefault(int(seed.removeprefix("seed-")), {}).setdefault(name, {})[param] = tensor
    return record, states


def _source(path: str | Path) -> tuple[dict, dict[int, dict[str, dict[str, torch.Tensor]]]]:
    path = Path(path)
    if path.is_file() and path.suffix == ".safetensors":
        return _read_export(path)
    if not path.is_dir():
        raise SavedHeadsError(f"{path} is neither a run directory nor a .safetensors file written by "
                              "`headprobe export-heads`.")
    record = _record(path)
    return record, _from_checkpoints(path, record)


def load_heads_by_seed(source: str | Path) -> dict[int, dict[str, torch.nn.Module]]:
    """{seed: {head name: head}} of a run directory (or an exported .safetensors file): every seed's trained heads,
    in eval mode, loaded strictly."""
    record, states = _source(source)
    out = {}
    for seed in record["seeds"]:
        heads, out[seed] = states.get(seed, {}), {}
        for name, config in record["heads"].items():
            head = _build(config, record["in_dim"])
            load_module(head, heads.get(name), f"head {name!r}", f"{source} (seed {seed})")
            out[seed][name] = head.eval()
    return out


def load_heads(source: str | Path, seed: int | None = None) -> dict[str, torch.nn.Module]:
    """{head name: head} of a run directory (or an exported .safetensors file): the heads trained with `seed`
    (default: the run's first seed, the one its geometry analyses), in eval mode. ``head(x)``: (N, in_dim) →
    (N, out_dim); ``head.taps(x)`` every layer's output (taps ``HEAD@i`` and ``HEAD``)."""
    by_seed = load_heads_by_seed(source)
    if seed is None:
        seed = next(iter(by_seed))
    if seed not in by_seed:
        raise SavedHeadsError(f"{source} has no heads trained with seed {seed}; its seeds are {sorted(by_seed)}.")
    return by_seed[seed]


def export_heads(run_dir: str | Path, path: str | Path | None = None) -> Path:
    """Write every seed's trained heads of `run_dir` into one safetensors file (default RUN/heads.safetensors)
    with the record `load_heads` rebuilds them from; returns its path."""
    from safetensors.torch import save_file

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise SavedHeadsError(f"{run_dir} is not a run directory; pass a folder written by `headprobe run`.")
    record = _record(run_dir)
    tensors = {f"seed-{seed}/{name}/{key}": tensor.contiguous()
               for seed, heads in _from_checkpoints(run_dir, record).items()
               for name, state in heads.items() for key, tensor in state.items()}
    target = Path(path) if path is not None else run_dir / EXPORT_NAME
    replace_atomically(target, lambda tmp: save_file(tensors, str(tmp), metadata={"headprobe": json.dumps(record)}))
    return target
