"""Augmented views of every image, extracted once and cached (`extract_views`): the inputs head training reads.

Each view is a pure function of (seed, image, view) (`data.augment`), its augmentation parameters recorded beside
its features; the views go through the same cache, store dtype and multi-process writing as the clean features
(`features.extract`, whose module docstring says how), under ``$HEADPROBE_CACHE/views/``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headprobe.data.cache_dir import cache_root
from headprobe.data.loader import loader_options
from headprobe.features.cache import (
    as_stored,
    checksum_algorithm,
    file_metadata,
    load_cached,
    save_cached,
    store_dtype_of,
)
from headprobe.features.extract import (
    effective_precision,
    every_process,
    feature_key,
    gather_shards,
    load_image,
    output_buffer,
    precision_autocast,
)
from headprobe.features.parallel_file import ParallelCacheFile


@dataclass
class ViewFeatures:
    """features: (N, K, D) backbone features of K augmented views per image; params: (N, K, P) their
    sampled augmentation parameters (`headprobe.data.augment.PARAM_NAMES` order)."""

    features: torch.Tensor
    params: torch.Tensor
    key: str
    cached: bool


class AugmentedViews(torch.utils.data.Dataset):
    """Flat index j → view j % K of image j // K, normalised with the backbone's statistics."""

    def __init__(self, dataset, items: Sequence[int], views: int, spec, seed: int, normalise) -> None:
        self.dataset, self.items, self.views, self.spec, self.seed = dataset, items, views, spec, seed
        self.normalise = normalise

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, j: int) -> torch.Tensor:
        from headprobe.data.augment import make_view

        index, view = divmod(self.items[j], self.views)
        image = load_image(self.dataset, index)
        if image.mode != "RGB":
            image = image.convert("RGB")
        pixels, params = make_view(image, self.spec, self.seed, index, view)
        return torch.cat([self.normalise(pixels).flatten(), params])


def view_transforms(preprocess, augment):
    """(augmentation at the backbone's crop size, normalisation applied to its output view without a second
    resize) — how the cached path and the tuned path (`headprobe.train.tuned`) both turn an image into a view."""
    import dataclasses

    return dataclasses.replace(augment, size=preprocess.crop), normalise_only(preprocess)


def normalise_only(preprocess):
    """The backbone's normalisation for an image already at its crop size (the resize is then the identity)."""
    from headprobe.backbones.base import Preprocess

    crop = preprocess.crop
    return Preprocess(resize=crop, crop=crop, mean=preprocess.mean, std=preprocess.std,
                      interpolation=preprocess.interpolation)


def extract_views(
    backbone,
    dataset,
    *,
    data_info: dict,
    augment,
    views: int,
    seed: int,
    batch_size: int = 64,
    precision: str = "fp32",
    cache: bool = True,
    num_workers: int | None = 0,
    mapped: bool = False,
    store_dtype: str = "float32",
    state=None,
    progress=None,
) -> ViewFeatures:
    """Backbone features of `views` augmented views of every image, extracted once and cached.

    View k of image i depends only on (seed, i, k), so the cache is valid for any batch size or
    number of processes. `augment` is an `AugmentSpec`; its output size is set to the backbone's
    crop size and the view is then only normalised (no second resize). `mapped`: a cache hit is memory-mapped.
    """
    import dataclasses

    from headprobe.parallel.distributed import process_state

    state = state or process_state()
    device = state.device
    precision = effective_precision(precision, device)
    spec, normalise = view_transforms(backbone.preprocess, augment)
    key, description = feature_key(backbone, data_info, "train-views", precision, store_dtype)
    description |= {"augment": dataclasses.asdict(spec), "views": views, "seed": seed}
    key = hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()[:24]
    path = cache_root() / "views" / f"{key}.safetensors"
    n = len(dataset)
    if cache:
        hit = load_cached(path, key, n, mapped=mapped, store_dtype=store_dtype)
        if every_process(hit is not None, state):
            return ViewFeatures(hit[0], hit[1], key, True)

    from headprobe.data.augment import PARAM_NAMES

    total = n * views
    world = state.num_processes
    shared = None
    if cache and world > 1:
        shared = ParallelCacheFile.open(
            path, {"features": (store_dtype_of(store_dtype), (n, views, backbone.dim)),
                   "params": (torch.float32, (n, views, len(PARAM_NAMES)))},
            file_metadata(key, description, "params"), state, checksum_algorithm())
    if shared is not None:
        _forward_views(backbone, dataset, state, spec, normalise, views, seed, batch_size, precision, num_workers,
                       progress, into=shared, store_dtype=store_dtype)
        if shared.commit():
            hit = load_cached(path, key, n, mapped=mapped, store_dtype=store_dtype)
            if every_process(hit is not None, state):
                return ViewFeatures(hit[0], hit[1], key, False)
    # One process, no cache, or a cache folder the processes cannot write together: gathered (`gather_shards`).
    feats, params = _forward_views(backbone, dataset, state, spec, normalise, views, seed, batch_size, precision,
                                   num_workers, progress)
    feats = gather_shards(feats, total, state).cpu().view(n, views, feats.shape[-1])
    params = gather_shards(params, total, state).cpu().view(n, views, params.shape[-1])
    stored = as_stored(feats, store_dtype)
    if cache and state.is_main_process:
        save_cached(path, key, description, stored, params, second="params", store_dtype=store_dtype)
    feats.copy_(stored)  # the numbers a cache hit returns
    return ViewFeatures(feats, params, key, False)


def _forward_views(backbone, dataset, state, spec, normalise, views: int, seed: int, batch_size: int,
                   precision: str, num_workers, progress, into: ParallelCacheFile | None = None,
                   store_dtype: str = "float32") -> tuple[torch.Tensor, torch.Tensor] | None:
    """This process's interleaved share of the N·K views (flat row j = view j % K of image j // K; rank r: rows
    r, r + W, ...) → (features, params), each (ceil(N·K / W), ·) float32 on the device; with `into`, each batch is
    written into its rows of that shared cache file instead (features rounded to `store_dtype`), and None."""
    device = state.device
    crop = backbone.preprocess.crop
    n = len(dataset)
    total = n * views
    world = state.num_processes
    items = range(state.process_index, total, world)
    loader = torch.utils.data.DataLoader(
        AugmentedViews(dataset, items, views, spec, seed, normalise), batch_size=batch_size,
        **loader_options(num_workers, device))
    n_pixels = 3 * crop * crop
    task = progress.add_task(f"extract {views} views × {n} images", total=total) if progress is not None else None
    # Flat row j = view j % K of image j // K. One process: the (N·K, ·) buffers are the (N, K, ·) results, viewed;
    # several: this rank's rows j = r, r + W, ..., padded to ceil(N·K / W) rows for `gather_shards`.
    rows = -(-total // world)
    feats = params = None
    start = 0
    backbone.to(device)
    with torch.inference_mode():
        for batch in loader:
            batch = batch.to(device, non_blocking=True)  # the whole (pinned) batch in one copy
            pixels = batch[:, :n_pixels].reshape(-1, 3, crop, crop)
            with precision_autocast(device, precision):
                out = backbone(pixels)
            if into is not None:
                first = state.process_index + start * world
                into.write("features", as_stored(out.float(), store_dtype).cpu(), first, world)
                into.write("params", batch[:, n_pixels:].float().cpu(), first, world)
            else:
                if feats is None:
                    feats = output_buffer((rows, *out.shape[1:]), device)
                    params = output_buffer((rows, batch.shape[1] - n_pixels), device)
                feats[start : start + len(batch)].copy_(out)
                params[start : start + len(batch)].copy_(batch[:, n_pixels:])
            start += len(batch)
            if task is not None:
                progress.advance(task, len(batch) * state.num_processes)
    if into is not None:
        return None
    if feats is None:
        from headprobe.data.augment import PARAM_NAMES

        feats, params = output_buffer((rows, backbone.dim), device), output_buffer((rows, len(PARAM_NAMES)), device)
    feats[start:], params[start:] = 0, 0
    return feats, params
