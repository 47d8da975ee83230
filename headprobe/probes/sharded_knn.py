"""The k-NN probe with its training bank split across processes, as DINOv2's `eval/knn.py` shards it.

Each of W processes holds a contiguous 1/W of the training bank (`shard_rows`) and every test query; it finds each
query's nearest samples within its shard (`local_neighbours`), the processes exchange those partial lists, and
`merge_neighbours` keeps the k nearest of their union. Every sample of the global top-k is among the top-k of its own
shard, so the union holds it. `knn`'s similarities are canonical (`knn_prefilter.canonical_dot`: each (query, sample)
value depends on neither the bank's size nor the search) and its neighbours their exact top-k, ordered by similarity and
then by index, as the merge orders them by the global index; so the neighbours, the weights, the votes and the
predictions are those of the single-process `knn`, bit for bit, with the prefilter or without (each shard runs the same
certified search, `Float32TopK` or `Bf16Prefilter`). faiss's `IndexShards` merges BLAS products, whose last bits depend
on the shapes multiplied (`knn_prefilter`), so it cannot promise that; `benchmarks/results/sharded_probes.json` records
identical results from 2 processes and 1.

>>> import torch
>>> x, y = torch.randn(50, 8), torch.arange(50) % 3
>>> parts = [local_neighbours(x[shard_rows(50, 2, r)], x[:5], 4, shard_rows(50, 2, r).start) for r in (0, 1)]
>>> sims, idx = (torch.stack(t) for t in zip(*parts))
>>> sims, idx, labels = merge_neighbours(sims, idx, y[idx.clamp_min(0)], 4)
>>> idx[:, 0].tolist()  # each query is its own nearest sample
[0, 1, 2, 3, 4]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headprobe.checks import as_tensor, check_labelled_split
from headprobe.parallel.collectives import all_objects, all_rows, max_over_ranks, sum_over_ranks
from headprobe.probes.knn import (
    DEFAULT_KS,
    KnnResult,
    bank_search,
    merge_topk,
    neighbour_counts,
    prefilter_default,
    similarity_name,
)


def shard_rows(n: int, world: int, rank: int) -> slice:
    """The rows of an N-row bank that process `rank` of `world` holds: contiguous, sizes differing by at most one
    (the first N mod W shards are one row longer)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not among the {world} processes (0..{world - 1}).")
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


@torch.no_grad()
def local_neighbours(shard: torch.Tensor, queries: torch.Tensor, k: int, offset: int,
                     chunk_size: int = 256, prefilter: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k nearest samples of one shard for every query, by cosine similarity.

    shard: (n, D) training rows whose first has global index `offset`; queries: (M, D) -> similarities (M, k)
    and global indices (M, k), by similarity (descending) and index (ascending), as `knn` finds them. A shard with
    fewer than k rows pads its list with similarity -inf and index -1, which the merge puts last. `prefilter`:
    as in `knn` (None: `prefilter_default` for this shard's rows); it changes no result, only the time.
    """
    sims, idx, _ = shard_search(shard, queries, k, offset, chunk_size, prefilter)
    return sims, idx


@torch.no_grad()
def shard_search(shard: torch.Tensor, queries: torch.Tensor, k: int, offset: int, chunk_size: int = 256,
                 prefilter: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, dict | None]:
    """`local_neighbours`, and the prefilter's statistics on this shard (None without the prefilter): `knn`'s
    `bank_search` over the shard, `BANK_ROWS` rows at a time."""
    if prefilter is None:
        prefilter = prefilter_default(shard.device, len(shard), shard.shape[1])[0]
    return bank_search(shard, queries, k, chunk_size=chunk_size, prefilter=prefilter, offset=offset)


def merge_neighbours(sims: torch.Tensor, idx: torch.Tensor, labels: torch.Tensor, k: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k nearest of the shards' partial lists: sims, idx, labels (W, M, k_w) -> each (M, k), by similarity
    (descending) and, among equal similarities, by global index (ascending; padding, index -1, goes last)."""
    w, m, width = sims.shape
    merged, merged_idx, position = merge_topk(sims, idx, k)
    return merged, merged_idx, labels.permute(1, 0, 2).reshape(m, w * width).gather(1, position)


def vote(sims: torch.Tensor, neighbour_labels: torch.Tensor, k: int, num_classes: int, temperature: float,
         weighting: str) -> torch.Tensor:
    """sims, neighbour_labels: (M, ≥k), nearest first -> (M,) the class with the largest vote over the first k
    (ties to the smaller class), computed as `knn` computes it so that the two agree bit for bit."""
    if weighting == "exp":
        weights = ((sims - sims[:, :1]) / temperature).exp()
    else:
        weights = torch.ones_like(sims)
    votes = torch.zeros(len(sims), num_classes, device=sims.device)
    votes.scatter_add_(1, neighbour_labels[:, :k], weights[:, :k])
    return votes.argmax(dim=1).cpu()


@torch.no_grad()
def sharded_knn(
    train_shard_features: torch.Tensor,
    train_shard_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    offset: int,
    world: int,
    ks: Sequence[int] = DEFAULT_KS,
    temperature: float = 0.07,
    weighting: str = "exp",
    chunk_size: int = 256,
    num_classes: int | None = None,
    prefilter: bool | None = None,
) -> KnnResult:
    """`knn` with the training bank split across `world` processes; call it on every process at once.

    train_shard_features: (n_r, D), train_shard_labels: (n_r,): this process's rows of the bank, the first of
    which is row `offset` of the whole bank (`shard_rows` gives a split); test_features: (M, D), test_labels: (M,):
    the same on every process. Every process returns the same `KnnResult`: the predictions and metrics of `knn`
    over the whole bank, bit for bit. `prefilter` as in `knn`: None takes `prefilter_default` for the whole bank's
    N on process 0, which every process then follows; the protocol records the choice, the prefilter's statistics
    summed over the shards (each shard's under "per_shard"), and `"shards": world`. Memory per process is
    O(n_r × D + chunk_size × n_r + W × M × k).
    """
    train_shard_features, train_shard_labels, test_features, test_labels = (
        as_tensor(name, value) for name, value in (
            ("train_shard_features", train_shard_features), ("train_shard_labels", train_shard_labels),
            ("test_features", test_features), ("test_labels", test_labels)))
    check_labelled_split("test", test_features, test_labels)
    if len(train_shard_features):
        check_labelled_split("train", train_shard_features, train_shard_labels)
    ks = neighbour_counts(ks)
    if weighting not in ("exp", "uniform"):
        raise ValueError(f"weighting {weighting!r} is not supported; use 'exp' or 'uniform'.")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive but got {temperature}; DINO uses 0.07.")
    device = train_shard_features.device
    n_train = sum_over_ranks(len(train_shard_features), world, device)
    if n_train == 0:
        raise ValueError("the training bank is empty on every process; each shard holds no rows.")
    own = int(train_shard_labels.max()) if len(train_shard_labels) else -1
    largest = max(max_over_ranks(own, world, device), int(test_labels.max()))
    if num_classes is None:
        num_classes = largest + 1
    elif largest >= num_classes:
        raise ValueError(f"a label equals {largest} but num_classes is {num_classes}; labels must lie in "
                         "0..num_classes-1, so raise num_classes or remap the labels.")
    effective = {k: min(k, n_train) for k in ks}
    max_k = max(effective.values())

    if prefilter is None:
        dim = train_shard_features.shape[1] if train_shard_features.ndim == 2 else test_features.shape[1]
        prefilter, choice = all_objects(prefilter_default(device, n_train, dim), world)[0]
    else:
        prefilter, choice = bool(prefilter), f"explicit: prefilter={bool(prefilter)}"

    # A process whose own search fails (out of memory, say) tells the others before the gather they would wait in
    # forever, and every process raises; one small object per call.
    try:
        sims, idx, stats = shard_search(train_shard_features, test_features, max_k, offset, chunk_size, prefilter)
        failure = None
    except Exception as err:  # noqa: BLE001 -- sent to every process and raised below
        failure, caught = f"{type(err).__name__}: {err}", err
    failures = [(rank, message) for rank, message in enumerate(all_objects(failure, world)) if message is not None]
    if failure is not None:
        raise caught
    if failures:
        rank, message = failures[0]
        raise RuntimeError(f"the k-NN search of process {rank} failed ({message}); every process stops.")
    labels = torch.zeros_like(idx)
    real = idx >= 0
    labels[real] = train_shard_labels.to(device, torch.int64)[idx[real] - offset]
    m = len(test_features)
    gathered = [all_rows(t, world).view(world, m, max_k) for t in (sims, idx, labels)]
    merged_sims, _, neighbour_labels = merge_neighbours(*gathered, max_k)

    predictions = {k: vote(merged_sims, neighbour_labels, effective[k], num_classes, temperature, weighting)
                   for k in ks}
    targets = test_labels.cpu().long()
    metrics = {f"knn.k{k}.acc": (predictions[k] == targets).double().mean().item() for k in ks}
    per_shard = all_objects(stats, world) if prefilter else None
    summed = None
    if per_shard is not None:
        summed = {key: sum(part[key] for part in per_shard) for key in ("queries", "widened", "full_float32")}
        summed = {**summed, "candidates": max(part["candidates"] for part in per_shard), "per_shard": per_shard}
    protocol = {"ks": ks, "effective_ks": effective, "temperature": temperature, "weighting": weighting,
                "normalize": True, "chunk_size": chunk_size, "n_train": n_train, "n_test": m,
                "n_classes": num_classes, "similarity": similarity_name(prefilter), "prefilter": summed,
                "prefilter_choice": choice, "shards": world}
    return KnnResult(metrics=metrics, predictions=predictions, protocol=protocol)
