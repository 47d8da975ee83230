"""Backbone features along the orbit sweeps (`data.orbits`) of the first test images, extracted once and cached.

An orbit is deterministic (no randomness at all): its frames depend only on the image, the sweep's definition and
the backbone's preprocessing, so a sweep's features are cached like the clean ones (`features`), in
``$HEADPROBE_CACHE/orbits/<key>.safetensors``, keyed by everything `feature_key` names plus the sweep's definition,
its values and the number of images; a hit's labels must equal the images' own. Why cache them: on a CPU the
orbits are the largest extraction a warm run repeats (offline_orbits.yaml: 3,968 frames, most of the run's time;
the run's `timing` in results.json says how much).

Frames are made at the backbone's input size (after resize and centre crop, before normalisation:
`Preprocess.frame`, the processor's own for hf/open_clip/timm backbones), so rotation corners and blur sigmas are in
input pixels; they are forwarded under the run's precision (bf16 autocast on a GPU,
as the clean features, which the heads were trained on), and in a multi-process run each process forwards an
interleaved share of the images, gathered into the same (N, T, D) result on every process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import torch

from headprobe.data.cache_dir import cache_root
from headprobe.data.orbits import orbit_images, orbit_sweep, sweep_values
from headprobe.features.cache import as_stored, load_cached, save_cached
from headprobe.features.extract import (
    effective_precision,
    feature_key,
    gather_shards,
    output_buffer,
    precision_autocast,
)
from headprobe.features.views import normalise_only

__all__ = ["extract_orbits", "orbit_key"]


def orbit_key(backbone, data_info: dict, sweep: str, n_images: int, precision: str, store_dtype: str = "float32"
              ) -> tuple[str, dict]:
    """(cache key, description) of one sweep's features of the first `n_images` test images."""
    _, description = feature_key(backbone, data_info, "test-orbits", precision, store_dtype)
    description |= {"sweep": sweep, "definition": dataclasses.asdict(orbit_sweep(sweep)),
                    "values": sweep_values(sweep), "n_images": n_images, "frames": "resize and crop, then sweep"}
    blob = json.dumps(description, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24], description


@torch.inference_mode()
def _forward_orbits(backbone, dataset, sweep: str, indices: range, rows: int, batch_size: int, autocast, device,
                    progress, world: int) -> torch.Tensor:
    """Features of the orbits of `indices` (this process's images) → (rows, T, D) float32 on `device`; rows past
    len(indices) are zero (the padding `gather_shards` drops)."""
    normalise = normalise_only(backbone.preprocess)
    steps = len(sweep_values(sweep))
    frames = [normalise(frame) for i in indices
              for frame in orbit_images(backbone.preprocess.frame(dataset[i]["image"]), sweep)]
    task = progress.add_task(f"orbits {sweep}", total=len(frames) * world) if progress is not None else None
    local = output_buffer((rows * steps, backbone.dim), device)
    for start in range(0, len(frames), batch_size):
        with autocast:
            batch = backbone(torch.stack(frames[start : start + batch_size]).to(device, non_blocking=True))
        local[start : start + len(batch)].copy_(batch)
        if task is not None:
            progress.advance(task, len(batch) * world)
    local[len(frames) :] = 0
    return local.view(rows, steps, backbone.dim)


def extract_orbits(backbone, dataset, *, sweeps: list[str], n_images: int, data_info: dict | None = None,
                   batch_size: int = 64, precision: str = "fp32", cache: bool = True, state=None, progress=None,
                   record: dict | None = None, store_dtype: str = "float32") -> dict[str, torch.Tensor]:
    """Backbone features along each sweep's orbit of the first `n_images` images of `dataset` → {sweep: (N, T, D)}
    float32 on the CPU, N = min(n_images, len(dataset)), T the sweep's steps (`sweep_values`).

    `data_info` (the data's `info`: source, fingerprint, split, limits) keys the cache; without it nothing is
    cached. `record`, when given, gets {"orbits-<sweep>": {"key", "hit"}} for each sweep (results.json's
    `protocol.features.cache`). `store_dtype`: the cache's dtype (`features.store_dtype`); the frames' features
    are rounded to it and returned as float32, hit or miss.
    """
    from headprobe.parallel.distributed import process_state

    state = state or process_state()
    device, world = state.device, state.num_processes
    precision = effective_precision(precision, device)
    n = min(n_images, len(dataset))
    labels = torch.as_tensor(dataset[:n]["label"], dtype=torch.int64) if n else torch.zeros(0, dtype=torch.int64)
    cache = cache and data_info is not None
    autocast = precision_autocast(device, precision)
    out = {}
    for sweep in sweeps:
        key = path = None
        if cache:
            key, description = orbit_key(backbone, data_info, sweep, n, precision, store_dtype)
            path = cache_root() / "orbits" / f"{key}.safetensors"
            hit = load_cached(path, key, n, labels, store_dtype=store_dtype)
            if hit is not None:
                out[sweep] = hit[0]
                if record is not None:
                    record[f"orbits-{sweep}"] = {"key": key, "hit": True}
                continue
        backbone.to(device)
        rows = -(-n // world)
        local = _forward_orbits(backbone, dataset, sweep, range(state.process_index, n, world), rows, batch_size,
                                autocast, device, progress, world)
        feats = gather_shards(local.flatten(1), n, state).cpu().view(n, *local.shape[1:])
        stored = as_stored(feats, store_dtype)
        if cache and state.is_main_process:
            save_cached(path, key, description, stored, labels, store_dtype=store_dtype)
        feats.copy_(stored)
        out[sweep] = feats
        if record is not None:
            record[f"orbits-{sweep}"] = {"key": key, "hit": False}
    return out
