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

import errno
import json
import os
import re
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
    record = {"format": EXPORT_FORMAT, "heads": heads, "in_dim": dim,
              "seeds": recipe.get("seeds") or [recipe.get("seed", 0)],
              "backbone": {k: (results.get("backbone") or {}).get(k) for k in ("id", "fingerprint", "options")},
              "tuned": recipe.get("backbone", {}).get("tune", "frozen") != "frozen"}
    if (problem := _record_problem(record)) is not None:
        raise SavedHeadsError(f"{run_dir}/results.json {problem.replace('a metadata record', 'a record')}; it was "
                              "changed after the run wrote it: run the recipe again.")
    return record


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


# An exported tensor's key: ``seed-S/HEAD/<state-dict key>`` (a head's name may hold '/', a state-dict key not).
_TENSOR_KEY = re.compile(r"seed-(\d+)/(.+)/([^/]+)")

# What to do about an exported file that fails a check: it was not written by export-heads as it stands.
_EXPORT_ADVICE = ("it was changed after `headprobe export-heads` wrote it, or written by another program; export "
                  "the heads again from their run (`headprobe export-heads RUN_DIR`)")


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _record_problem(record: Any) -> str | None:
    """What is wrong with a heads record (an exported file's metadata, or one made from results.json), or None."""
    if not isinstance(record, dict):
        return f"has a metadata record that is a {type(record).__name__}, not a mapping"
    missing = [key for key in ("heads", "in_dim", "seeds") if key not in record]
    if missing:
        return f"has a metadata record without {' or '.join(repr(k) for k in missing)}"
    if record.get("format", EXPORT_FORMAT) != EXPORT_FORMAT:
        return (f"is in format {record.get('format')!r}, which this headprobe does not read (it reads format "
                f"{EXPORT_FORMAT})")
    if not _integer(record["in_dim"]) or record["in_dim"] < 1:
        return f"records in_dim = {record['in_dim']!r}, not a positive integer (the heads' input width)"
    seeds = record["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(_integer(s) for s in seeds) or len(set(seeds)) < len(seeds):
        return f"records seeds = {seeds!r}, not a non-empty list of distinct integers"
    heads = record["heads"]
    if not isinstance(heads, dict) or not heads or not all(isinstance(c, dict) for c in heads.values()):
        return f"records heads = {str(heads)[:80]}, not a mapping of head names to their configs"
    from headprobe.recipe import HeadSpec, RecipeError
    from headprobe.recipe.loading import load_section

    for name, config in heads.items():
        try:
            load_section(HeadSpec, config, f"heads.{name}")
        except RecipeError as err:
            return f"records a config that builds no head ({str(err).rstrip('.')})"
    return None


def _state_problem(head: torch.nn.Module, state: dict[str, torch.Tensor]) -> str | None:
    """How `state`'s tensors differ from those of `head` (built from the record's config), or None."""
    expected = {key: tuple(value.shape) for key, value in head.state_dict().items()}
    got = {key: tuple(value.shape) for key, value in state.items()}
    if missing := sorted(set(expected) - set(got)):
        return f"no tensor {missing[0]!r}, which its recorded config needs"
    if extra := sorted(set(got) - set(expected)):
        return f"the tensor {extra[0]!r}, which its recorded config has no place for"
    wrong = next((key for key in expected if expected[key] != got[key]), None)
    if wrong is not None:
        return (f"the tensor {wrong!r} of shape {list(got[wrong])}, where its recorded config (in_dim, width, "
                f"out_dim) declares {list(expected[wrong])}")
    return None


def _read_export(path: Path) -> tuple[dict, dict[int, dict[str, dict[str, torch.Tensor]]]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except Exception as err:
        raise SavedHeadsError(f"{path} is not a readable safetensors file ({str(err).strip() or type(err).__name__}); "
                              "it is damaged or cut short: export the heads again from their run.") from None
    if "headprobe" not in metadata:
        raise SavedHeadsError(f"{path} has no 'headprobe' metadata record; it was not written by "
                              "`headprobe export-heads`.")
    try:
        record = json.loads(metadata["headprobe"])
    except json.JSONDecodeError as err:
        raise SavedHeadsError(f"{path} has a 'headprobe' metadata record that is not JSON ({err}); "
                              f"{_EXPORT_ADVICE}.") from None
    if (problem := _record_problem(record)) is not None:
        raise SavedHeadsError(f"{path} {problem}; {_EXPORT_ADVICE}.")
    states: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    for key, tensor in tensors.items():
        match = _TENSOR_KEY.fullmatch(key)
        if match is None or int(match[1]) not in record["seeds"] or match[2] not in record["heads"]:
            raise SavedHeadsError(f"{path} holds the tensor {key!r}, which is not seed-S/HEAD/<parameter> of a seed "
                                  f"and head its record names (seeds {record['seeds']}, heads "
                                  f"{sorted(record['heads'])}); {_EXPORT_ADVICE}.")
        states.setdefault(int(match[1]), {}).setdefault(match[2], {})[match[3]] = tensor
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
    exported = not Path(source).is_dir()
    out = {}
    for seed in record["seeds"]:
        heads, out[seed] = states.get(seed, {}), {}
        for name, config in record["heads"].items():
            head = _build(config, record["in_dim"])
            # A file's tensors against the sizes its record declares ("resume the run" is no advice for a file).
            if exported and (problem := _state_problem(head, heads.get(name) or {})) is not None:
                raise SavedHeadsError(f"{source} holds head {name!r} of seed {seed} with {problem}; "
                                      f"{_EXPORT_ADVICE}.")
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
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise SavedHeadsError(f"{run_dir} is not a run directory; pass a folder written by `headprobe run`.")
    record = _record(run_dir)
    tensors = {f"seed-{seed}/{name}/{key}": tensor.contiguous()
               for seed, heads in _from_checkpoints(run_dir, record).items()
               for name, state in heads.items() for key, tensor in state.items()}
    target = Path(path) if path is not None else run_dir / EXPORT_NAME

    def write(tmp: Path) -> None:
        try:
            save_file(tensors, str(tmp), metadata={"headprobe": json.dumps(record)})
        except SafetensorError as err:  # its I/O failures (a read-only folder, a full disk) as the OSError they are
            code = re.search(r"os error (\d+)", str(err))
            number = int(code[1]) if code else errno.EIO
            raise OSError(number, os.strerror(number), str(target)) from None

    replace_atomically(target, write)
    return target
