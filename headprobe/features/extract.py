"""Batched feature extraction with an on-disk cache.

A frozen backbone runs once per image: features are written to
``$HEADPROBE_CACHE/features/<key>.safetensors`` (default ``~/.cache/headprobe``),
keyed by everything that determines their content (backbone id, weights
fingerprint, pooling, preprocessing, precision, data fingerprint, split, limits).
Files are written to a temporary name and renamed, so a partial file never
counts as a hit. Each file's metadata holds a checksum of every tensor's bytes, verified on every load, and a
hit's labels are compared with the dataset's own: a file that fails to load, does not match its key, its
checksums or the labels is reported, deleted and recomputed. The cache is an optimisation: one that cannot be
written (read-only, full) is reported once and the run carries on uncached. What it saves against re-forwarding
the backbone at every step, as solo-learn and lightly train: 322x per epoch of head training, and a first run
within 1.09x of the bare backbone forwards (`benchmarks/bench_cache.py`, `benchmarks/results/cache.json`).

In a multi-process run each process extracts an interleaved shard of the images (rank r: r, r + W, ...). With the
cache on, every process writes its rows straight into the one cache file (`parallel_file.ParallelCacheFile`:
created at its final size under a temporary name, sealed with its checksums and renamed by process 0), and then
every process reads that file as a cache hit (memory-mapped with `mapped=True`): nothing is gathered, and no process
holds more of the features than the batch it writes. The file is the one a single process writes, so the result is
the same for any number of processes, and a later run with any number hits it. Processes decide together: a hit
only where every process hits. The fallback, where the processes cannot all write the file (`cache=False`, a
read-only cache folder, one not shared between nodes) or completing it failed: the shards are gathered into one
(N, D) buffer on every process (`gather_shards`), and process 0 writes the cache file if it can.

Memory: each extraction allocates its output once, when the first batch gives the feature width, and
writes every batch into its rows; batch outputs are never collected and concatenated. In one process on
the CPU the returned tensor is that buffer, so extraction holds one (N, D) copy of the features (one on
the device and one on the CPU when extracting on a GPU). A cache hit is loaded whole, or with `mapped=True`
memory-mapped from its file (`tensor_file`), read only where it is indexed. Several processes writing the cache
hold one batch each (`benchmarks/results/parallel_extract.json`).

Store dtype (`store_dtype`, `features.store_dtype`): the cache holds the features as float32, float16 or bfloat16
(`features.cache`), and the dtype is part of the key. Freshly extracted features are rounded to it in place before
they are returned, so a run computes on the same numbers whether its features came from the cache or not (and
with the cache off); they are returned as float32, except a mapped hit, which stays in the stored dtype
(`cache.as_float32` is how its readers upcast).

Input pipeline: `num_workers` (None: chosen from the machine), pinned memory and prefetching on CUDA are
`data.loader.loader_options`; every item is a pure function of its index, so the results are the same for any
worker count.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from headprobe.data.cache_dir import cache_root
from headprobe.data.loader import ImageDecodeError, loader_options
from headprobe.features.cache import (
    FORMAT_VERSION,
    as_stored,
    checksum_algorithm,
    file_metadata,
    load_cached,
    save_cached,
    store_dtype_of,
)
from headprobe.features.parallel_file import ParallelCacheFile


@dataclass
class Features:
    """features: (N, D) on CPU, float32 (mapped from the cache file, a hit or what several processes wrote
    together: the store dtype); labels: (N,) int64; `cached` says whether it was on disk before this call."""

    features: torch.Tensor
    labels: torch.Tensor
    key: str
    cached: bool
    path: Path | None


def feature_key(backbone, data_info: dict, split: str, precision: str, store_dtype: str = "float32"
                ) -> tuple[str, dict]:
    """(cache key, description): the key is a hash of everything that determines the cached bytes. The store dtype
    enters only when it is not float32, so float32 caches keep the keys they had before the field existed."""
    description = {
        "format": FORMAT_VERSION,
        "backbone": backbone.id,
        "weights": backbone.fingerprint,
        "options": backbone.options,
        "preprocess": backbone.preprocess.to_dict(),
        "precision": precision,
        "data": {k: data_info[k] for k in ("source", "fingerprint", "test_split", "limit", "split_seed")},
        "split": split,
    }
    if store_dtype != "float32":
        description["store_dtype"] = store_dtype
    blob = json.dumps(description, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24], description


def effective_precision(requested: str, device: torch.device) -> str:
    # Autocast is used only on GPUs: on a CPU without AMX, bf16 products are slower than fp32 ones (1.87x the time
    # on the benchmarks' Intel machine, `benchmarks/results/knn.json`, prefilter_choice) and bf16 changes numbers.
    return requested if device.type == "cuda" else "fp32"


def precision_autocast(device: torch.device, precision: str):
    """Autocast to bf16/fp16 for an effective precision from `effective_precision`; a no-op for fp32."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()


def load_image(dataset, index: int):
    """Image `index` of a Hugging Face `dataset`, decoded in full here, so that a file that cannot be decoded (a
    truncated PNG, say) is named in the error instead of failing deep inside a transform."""
    try:
        image = dataset[index]["image"]
        image.load()
        return image
    except (OSError, ValueError, SyntaxError) as err:
        raise ImageDecodeError(f"image {index} of the data ({_image_path(dataset, index)}) cannot be decoded "
                               f"({type(err).__name__}: {err}); replace or remove that file.") from None


def _image_path(dataset, index: int) -> str:
    import datasets

    try:
        raw = dataset.cast_column("image", datasets.Image(decode=False))[index]["image"]
        return raw.get("path") or "an image stored in the dataset itself, with no file name"
    except Exception:  # the path is only for the message: never let finding it hide the decode error
        return "file name unknown"


class _Images(torch.utils.data.Dataset):
    def __init__(self, dataset, indices: Sequence[int], preprocess, rotation: int = 0) -> None:
        self.dataset, self.indices, self.preprocess, self.rotation = dataset, indices, preprocess, rotation % 360

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> torch.Tensor:
        image = load_image(self.dataset, self.indices[i])
        if self.rotation:
            image = image.rotate(self.rotation, expand=True)  # exact for multiples of 90°
        return self.preprocess(image)


def output_buffer(shape: tuple[int, ...], device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised output buffer, allocated outside inference mode even when called inside it: an ordinary
    tensor, which autograd accepts later (tuning), so the result needs no clone."""
    with torch.inference_mode(False):
        return torch.empty(shape, dtype=dtype, device=device)


def gather_shards(local: torch.Tensor, n: int, state) -> torch.Tensor:
    """Interleaved shards (rank r holds rows r, r+W, ...) → the full (N, D) buffer on every process.

    `local` holds this rank's rows, optionally already padded to ceil(N / W) rows (as `_forward_shard` and
    `extract_views` make it), which is then sent as it is; with one process it is returned as it is.
    """
    world = state.num_processes
    if world == 1:
        return local
    import torch.distributed as dist

    per = -(-n // world)
    if local.shape[0] == per:
        padded = local
    else:
        padded = torch.zeros(per, *local.shape[1:], dtype=local.dtype, device=local.device)
        padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    out = torch.empty(n, *local.shape[1:], dtype=local.dtype, device=local.device)
    for rank, part in enumerate(parts):
        count = len(range(rank, n, world))
        out[rank::world] = part[:count]
    return out


def extract(
    backbone,
    dataset,
    *,
    data_info: dict,
    split: str,
    batch_size: int = 64,
    precision: str = "fp32",
    cache: bool = True,
    num_workers: int | None = 0,
    rotation: int = 0,
    mapped: bool = False,
    store_dtype: str = "float32",
    state=None,
    progress=None,
) -> Features:
    """Features of every image of `dataset` (a `datasets.Dataset` with ``image``/``label``) → `Features`.

    `rotation` (degrees, a multiple of 90) rotates each image before preprocessing (rotation probes). `mapped`: a
    cache hit is memory-mapped from its file instead of loaded whole. Several processes with the cache on write the
    cache file together and each returns it as a hit would be read (`cached` False); see the module's docstring.
    """
    if rotation % 90:
        raise ValueError(f"rotation must be a multiple of 90 degrees, got {rotation}.")
    from headprobe.parallel.distributed import process_state

    state = state or process_state()
    device = state.device
    precision = effective_precision(precision, device)
    key, description = feature_key(backbone, data_info, split + (f"-rot{rotation % 360}" if rotation % 360 else ""),
                                   precision, store_dtype)
    path = cache_root() / "features" / f"{key}.safetensors"
    n = len(dataset)
    labels = torch.as_tensor(dataset["label"], dtype=torch.int64)
    if cache:
        hit = load_cached(path, key, n, labels, mapped=mapped, store_dtype=store_dtype)
        if every_process(hit is not None, state):
            return Features(hit[0], hit[1], key, True, path)

    # Moved outside inference mode: parameters created inside it could never require grad again (tuning).
    backbone.to(state.device)
    shared = None
    if cache and state.num_processes > 1:
        shared = ParallelCacheFile.open(
            path, {"features": (store_dtype_of(store_dtype), (n, backbone.dim)), "labels": (torch.int64, (n,))},
            file_metadata(key, description), state, checksum_algorithm())
    if shared is not None:
        if state.is_main_process:
            shared.write("labels", labels)
        _forward_shard(backbone, dataset, state, batch_size, precision, num_workers, progress, split, rotation,
                       into=shared, store_dtype=store_dtype)
        if shared.commit():
            hit = load_cached(path, key, n, labels, mapped=mapped, store_dtype=store_dtype)
            if every_process(hit is not None, state):
                return Features(hit[0], hit[1], key, False, path)
    # One process, no cache, or a cache folder the processes cannot write together: gathered (`gather_shards`).
    local = _forward_shard(backbone, dataset, state, batch_size, precision, num_workers, progress, split, rotation)
    # One process on the CPU: `local` is already the (N, D) result, and .cpu() returns it without a copy.
    feats = gather_shards(local, n, state).cpu()
    stored = as_stored(feats, store_dtype)
    if cache and state.is_main_process and not save_cached(path, key, description, stored, labels,
                                                              store_dtype=store_dtype):
        cache = False  # not written: there is no file to point at
    feats.copy_(stored)  # what a cache hit will return: the same numbers, hit or miss
    return Features(feats, labels, key, False, path if cache else None)


def every_process(flag: bool, state) -> bool:
    """Whether `flag` holds on every process (collective; one process: `flag`). Each process decides a cache hit for
    itself: they extract together unless every one of them hits."""
    from headprobe.parallel.collectives import sum_over_ranks

    world = state.num_processes
    return bool(flag) if world == 1 else sum_over_ranks(int(bool(flag)), world, state.device) == world


@torch.inference_mode()
def _forward_shard(
    backbone, dataset, state, batch_size, precision, num_workers, progress, split, rotation=0,
    into: ParallelCacheFile | None = None, store_dtype: str = "float32",
) -> torch.Tensor | None:
    """This process's interleaved shard of the images (rank r: images r, r + W, ...) → (ceil(N / W), D) float32
    features on the device; with `into`, each batch is written into its rows of that shared cache file instead
    (rounded to `store_dtype`), nothing is kept and None is returned.

    Batch outputs go straight into their rows of one buffer, allocated at the first batch (which gives D); a
    shard one image short of ceil(N / W) ends in a zero row that `gather_shards` drops. With W = 1: (N, D).
    """
    device, n, world = state.device, len(dataset), state.num_processes
    indices = range(state.process_index, n, world)  # a range, not a list of N Python ints
    loader = torch.utils.data.DataLoader(
        _Images(dataset, indices, backbone.preprocess, rotation), batch_size=batch_size,
        **loader_options(num_workers, device))
    autocast = precision_autocast(device, precision)
    rows = -(-n // world)
    local, start = None, 0
    label = f"extract {split}" + (f" rotated {rotation}°" if rotation else "")
    task = progress.add_task(label, total=n) if progress is not None else None
    for pixels in loader:
        with autocast:
            out = backbone(pixels.to(device, non_blocking=True))
        if into is not None:
            into.write("features", as_stored(out.float(), store_dtype).cpu(), state.process_index + start * world,
                       world)
        else:
            if local is None:
                local = output_buffer((rows, *out.shape[1:]), device)
            local[start : start + len(out)].copy_(out)  # the cast to float32 of out.float(), without its temporary
        start += len(out)
        if task is not None:
            progress.advance(task, len(pixels) * state.num_processes)
    if start != len(indices):
        raise RuntimeError(f"the backbone returned {start} feature rows for {len(indices)} images.")
    if into is not None:
        return None
    if local is None:
        local = output_buffer((rows, backbone.dim), device)
    local[start:] = 0
    return local
