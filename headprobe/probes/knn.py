"""Weighted k-nearest-neighbour probe on frozen features, following the DINO / DINOv2 protocol.

Written here rather than calling scikit-learn's `KNeighborsClassifier` or faiss: the vote is DINO's (similarities
weighted by exp(s/T)), memory is bounded by the query chunk, and every similarity is one canonical float32 value
(`knn_prefilter`), so the chunk size, the prefilter and a bank split across processes (`sharded_knn`) change no bit.
Measured (`benchmarks/results/knn.json`, N = 50,000, D = 384, 10,000 queries, k = 20): 3.15x scikit-learn's brute-force
cosine search with the same predictions and 152 MiB against its 1,545 MiB of peak memory (2.29x on an AMD EPYC without
AVX-512: `benchmarks/results/no-avx512/knn.json`); 0.80x faiss's `IndexFlatIP` (faiss is faster, and not a dependency;
its products are not canonical, so it cannot give the same neighbours whatever the split).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headprobe.checks import as_tensor, check_labelled_split
from headprobe.features.rows import BLOCK_ROWS
from headprobe.probes.knn_counts import DEFAULT_KS, neighbour_counts
from headprobe.probes.knn_prefilter import (
    Bf16Prefilter,
    Float32TopK,
    blocked_topk,
    by_similarity_then_index,
    canonical_normalize,
    ieee_float32_matmul,
)

__all__ = [
    "BANK_ROWS", "DEFAULT_KS", "PREFILTER_MIN_TRAIN", "PREFILTER_SPEEDUP", "KnnResult", "bank_search", "blocked_topk",
    "by_similarity_then_index", "fast_bfloat16", "knn", "merge_topk", "neighbour_counts", "normalised_rows",
    "ordered_topk", "prefer_bfloat16", "prefilter_default", "product_seconds", "similarity_name",
]

_WEIGHTINGS = ("exp", "uniform")
# Training rows converted, normalised and searched at once (`bank_search`, in `knn` and in each shard of
# `sharded_knn`): a bank of at most this many rows is searched whole, as before; a longer one block by block, each
# block's top-k lists merged into the running ones (`merge_topk`). The similarities are canonical, so the blocks
# change no bit; memory is O(BANK_ROWS × (D + chunk_size)) beside the bank, whatever N (256 MiB at D = 768 in float32
# for the block, 64 MiB for a 256-query chunk's scores).
BANK_ROWS = 65_536
# Below this many training samples the float32 product is cheap, and the prefilter is not worth its set-up.
PREFILTER_MIN_TRAIN = 2048
# On the CPU the prefilter is the default only where its bfloat16 product measures under this fraction of the
# float32 one's time: with AVX512-BF16 but no AMX, bfloat16 products can be slower than float32 ones.
PREFILTER_SPEEDUP = 0.8
# The calibration product: (rows × D) @ (D × columns), D capped (the ratio barely moves with D, the cost does).
_CALIBRATION_ROWS, _CALIBRATION_COLUMNS, _CALIBRATION_MAX_DIM = 256, 4096, 1024


@dataclass
class KnnResult:
    """What `knn` returns.

    metrics: {"knn.k{k}.acc": test accuracy in [0, 1]} for each requested k.
    predictions: requested k -> (M,) int64 predicted test labels, on the CPU.
    protocol: every knob that shaped the numbers, so a result can be reproduced from it alone.
    """

    metrics: dict[str, float]
    predictions: dict[int, torch.Tensor]
    protocol: dict


@torch.no_grad()
def knn(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    ks: Sequence[int] = DEFAULT_KS,
    temperature: float = 0.07,
    weighting: str = "exp",
    chunk_size: int = 256,
    num_classes: int | None = None,
    device: torch.device | str | None = None,
    prefilter: bool | None = None,
    bank_rows: int | None = None,
) -> KnnResult:
    """Classify each test sample by a weighted vote of its nearest training samples.

    train_features: (N, D), train_labels: (N,), test_features: (M, D), test_labels: (M,).

    Protocol (DINO `eval_knn.py`, DINOv2 `eval/knn.py`): features are L2-normalised and compared by
    cosine similarity s; each query takes its top-k training neighbours, each neighbour votes for its own
    label with weight exp(s / temperature) ("exp") or 1 ("uniform"), and the class with the largest
    summed vote over the first k neighbours is the prediction (ties go to the smaller class index). Among
    equally similar training samples the one with the smaller index is the nearer, so the neighbours do not
    depend on the top-k kernel.

    s is float32 and canonical (`knn_prefilter.canonical_dot`: products summed by a fixed pairwise tree), and the
    neighbours are its exact top-k: a matrix product only proposes candidates, and a rigorous bound on its error
    certifies them (`Float32TopK`). Each (query, sample) similarity thus depends on neither the bank's size nor
    the device nor the search, and `sharded_knn` over a bank split across processes reproduces the neighbours,
    the weights and the predictions bit for bit.

    A k larger than N is clamped to N; the clamp is recorded in `protocol["effective_ks"]`. Queries are
    processed `chunk_size` at a time, so memory is O(chunk_size × N), on `device` (default: the device of
    `train_features`), and the bank `bank_rows` rows at a time (default `BANK_ROWS`; `bank_search`), so the
    extra memory is O(bank_rows × (D + chunk_size) + M × k) whatever N; neither changes a bit of the result.

    `prefilter` finds the candidates with a bfloat16 product instead of a float32 one (`Bf16Prefilter`). It
    changes no result, only the time: a query is accepted only when a rigorous bound on the bfloat16 error proves
    that no training sample outside its candidates can be among its top-k; otherwise its candidates are widened,
    and failing that it goes to the float32 search. How many queries needed either is recorded in
    `protocol["prefilter"]`. Default (`prefilter_default`): off for N < 2048; on CUDA where bfloat16 is
    supported; on a CPU with AVX512-BF16/AMX, on only if a one-time timing (`product_seconds`) finds its
    bfloat16 product under 0.8x the float32 one's time. Why it was on or off is `protocol["prefilter_choice"]`.
    NumPy arrays are accepted too.
    """
    train_features, train_labels, test_features, test_labels = (
        as_tensor(name, value) for name, value in (("train_features", train_features), ("train_labels", train_labels),
                                                    ("test_features", test_features), ("test_labels", test_labels))
    )
    check_labelled_split("train", train_features, train_labels)
    check_labelled_split("test", test_features, test_labels)
    if train_features.shape[1] != test_features.shape[1]:
        raise ValueError(
            f"train_features has dimension {train_features.shape[1]} but test_features has "
            f"{test_features.shape[1]}; both must come from the same backbone and pooling."
        )
    ks = neighbour_counts(ks)
    if weighting not in _WEIGHTINGS:
        raise ValueError(f"weighting {weighting!r} is not supported; use one of {_WEIGHTINGS}.")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive but got {temperature}; DINO uses 0.07.")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive but got {chunk_size}.")
    if bank_rows is not None and bank_rows <= 0:
        raise ValueError(f"bank_rows must be positive but got {bank_rows}.")
    largest = int(max(train_labels.max(), test_labels.max()))
    if num_classes is None:
        num_classes = largest + 1
    elif largest >= num_classes:
        raise ValueError(
            f"a label equals {largest} but num_classes is {num_classes}; labels must lie in "
            "0..num_classes-1, so raise num_classes or remap the labels."
        )

    device = torch.device(device) if device is not None else train_features.device
    n_train, n_test = train_features.shape[0], test_features.shape[0]
    effective = {k: min(k, n_train) for k in ks}
    max_k = max(effective.values())

    bank_labels = train_labels.to(device, torch.int64)
    if prefilter is None:
        prefilter, choice = prefilter_default(device, n_train, train_features.shape[1])
    else:
        prefilter, choice = bool(prefilter), f"explicit: prefilter={bool(prefilter)}"
    bank_rows = BANK_ROWS if bank_rows is None else bank_rows
    all_sims, all_idx, stats = bank_search(train_features, test_features, max_k, chunk_size=chunk_size,
                                           prefilter=prefilter, bank_rows=bank_rows, device=device)
    predictions = {k: torch.empty(n_test, dtype=torch.int64) for k in ks}
    for start in range(0, n_test, chunk_size):
        sims, idx = all_sims[start : start + chunk_size], all_idx[start : start + chunk_size]
        neighbour_labels = bank_labels[idx]
        if weighting == "exp":
            # Subtracting each row's top similarity rescales that query's votes by a constant, which leaves
            # the argmax unchanged but keeps exp() finite for small temperatures.
            weights = ((sims - sims[:, :1]) / temperature).exp()
        else:
            weights = torch.ones_like(sims)
        for k in ks:
            votes = torch.zeros(len(sims), num_classes, device=device)
            votes.scatter_add_(1, neighbour_labels[:, : effective[k]], weights[:, : effective[k]])
            predictions[k][start : start + len(sims)] = votes.argmax(dim=1).cpu()

    targets = test_labels.cpu().long()
    metrics = {f"knn.k{k}.acc": (predictions[k] == targets).double().mean().item() for k in ks}
    protocol = {
        "ks": ks,
        "effective_ks": {k: effective[k] for k in ks},
        "temperature": temperature,
        "weighting": weighting,
        "normalize": True,
        "chunk_size": chunk_size,
        "bank_rows": bank_rows,
        "n_train": n_train,
        "n_test": n_test,
        "n_classes": num_classes,
        "similarity": similarity_name(prefilter),
        "prefilter": stats,
        "prefilter_choice": choice,
    }
    return KnnResult(metrics=metrics, predictions=predictions, protocol=protocol)


@torch.no_grad()
def bank_search(bank: torch.Tensor, queries: torch.Tensor, k: int, *, chunk_size: int = 256, prefilter: bool = False,
                bank_rows: int | None = None, offset: int = 0, device: torch.device | str | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, dict | None]:
    """The k nearest rows of `bank` for every query by canonical cosine similarity, as `knn` finds them.

    bank: (N, D) rows whose first has global index `offset`; queries: (M, D) -> similarities (M, k) and global
    indices (M, k), by similarity (descending) and index (ascending), and the prefilter's statistics (None without
    it; over several blocks their sums, `candidates` the largest). The bank is read `bank_rows` rows at a time
    (default `BANK_ROWS`), the queries `chunk_size` at a time; each block's lists are merged into the running
    ones a query chunk at a time (`merge_topk`), which keeps every row of the global top-k (it is in its own
    block's top-k) and changes no bit. A bank with fewer than k rows pads its lists with similarity -inf and index
    -1, which a merge puts last.
    Memory beyond the (M, k) lists is O(bank_rows × (D + chunk_size) + chunk_size × k), on `device` (default:
    the bank's).
    """
    bank_rows = BANK_ROWS if bank_rows is None else bank_rows
    device = bank.device if device is None else torch.device(device)
    sims = torch.full((len(queries), k), float("-inf"), device=device)
    idx = torch.full((len(queries), k), -1, dtype=torch.int64, device=device)
    parts = []
    for first in range(0, len(bank), bank_rows):
        block = normalised_rows(bank, first, min(first + bank_rows, len(bank)), device)
        width = min(k, len(block))
        search = Bf16Prefilter(block, width) if prefilter else Float32TopK(block, width)
        for start in range(0, len(queries), chunk_size):
            q = canonical_normalize(queries[start : start + chunk_size].to(device, torch.float32))
            s, i = search.topk(q)
            rows = slice(start, start + len(q))
            if not first:
                sims[rows, :width], idx[rows, :width] = s, i + offset
                continue
            # Merged a query chunk at a time: the merge's sort keys and orders are (chunk, 2k), not (M, 2k)
            # (at M = 100k queries and k = 200 those were 3 GiB); rows merge independently, so no bit changes.
            block_sims = torch.full((len(q), k), float("-inf"), device=device)
            block_idx = torch.full((len(q), k), -1, dtype=torch.int64, device=device)
            block_sims[:, :width], block_idx[:, :width] = s, i + offset + first
            sims[rows], idx[rows], _ = merge_topk(torch.stack([sims[rows], block_sims]),
                                                  torch.stack([idx[rows], block_idx]), k)
        parts.append(search.stats)
    if not prefilter:
        return sims, idx, None
    if len(parts) <= 1:
        return sims, idx, (dict(parts[0]) if parts else {"queries": 0, "candidates": 0, "widened": 0,
                                                         "full_float32": 0})
    return sims, idx, {key: (max if key == "candidates" else sum)(part[key] for part in parts) for key in parts[0]}


def normalised_rows(bank: torch.Tensor, start: int, stop: int, device: torch.device) -> torch.Tensor:
    """Rows start .. stop of `bank` L2-normalised (`canonical_normalize`, row by row, so the same bits however the
    rows are split) into one float32 (stop - start, D) tensor on `device`, read `features.rows.BLOCK_ROWS` rows at a
    time: a tap read by rows (a head's, `TapRows`) is then never held as a second copy of the block beside it."""
    out = torch.empty((stop - start, bank.shape[1]), dtype=torch.float32, device=device)
    for first in range(start, stop, BLOCK_ROWS):
        last = min(first + BLOCK_ROWS, stop)
        out[first - start : last - start] = canonical_normalize(bank[first:last].to(device, torch.float32))
    return out


def merge_topk(sims: torch.Tensor, idx: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k nearest of several partial top-k lists: sims, idx (W, M, k_w) -> similarities, global indices (M, k),
    by similarity (descending) and, among equal similarities, by index (ascending; padding, index -1, goes last),
    and each kept entry's position (M, k) in the lists laid side by side, (M, W·k_w), for carrying other values
    along (`sharded_knn.merge_neighbours`: the labels)."""
    w, m, width = sims.shape
    flat_sims, flat_idx = (t.permute(1, 0, 2).reshape(m, w * width) for t in (sims, idx))
    # Each entry's global index and its position in the flat list in one integer, so that ordering by it orders by
    # the index and still says where each entry came from; padding gets an index past every real one.
    past = int(flat_idx.max()) + 1
    key = torch.where(flat_idx < 0, past, flat_idx) * (w * width) + torch.arange(w * width, device=idx.device)
    merged, key = by_similarity_then_index(flat_sims, key)
    position = key[:, :k] % (w * width)
    return merged[:, :k], flat_idx.gather(1, position), position


def similarity_name(prefilter: bool) -> str:
    """What `protocol["similarity"]` says for a search with or without the prefilter."""
    return "float32, candidates from a certified bfloat16 prefilter" if prefilter else "float32"


def ordered_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row, ordered by value (descending) and, among equal values, by column
    (ascending): scores (B, N) -> values, indices (B, k). Equal values at the k-th place go to the smaller columns.

    Why: `topk` leaves the order of equal values open, so which of two equally similar training samples is a
    neighbour would depend on the kernel, and a bank split across processes could not reproduce it. One entry
    more than k tells whether the k-th place is tied with a column left out; only such rows are redone in full.
    """
    n = scores.shape[1]
    wide = min(k + 1, n)
    values, idx = by_similarity_then_index(*blocked_topk(scores, wide))
    if wide > k:
        for row in (values[:, k - 1] == values[:, k]).nonzero().flatten().tolist():
            line, kth = scores[row], values[row, k - 1]
            above = (line > kth).nonzero().flatten()
            tied = (line == kth).nonzero().flatten()[: wide - len(above)]
            columns = torch.cat([above, tied])
            values[row], idx[row] = by_similarity_then_index(line[columns][None], columns[None])
    return values[:, :k], idx[:, :k]


def fast_bfloat16(device: torch.device) -> bool:
    """Whether bfloat16 matrix products run natively on `device` (CUDA, or a CPU with AVX512-BF16, AMX-BF16 or ARM
    BF16): a precondition of the prefilter's default, not a promise that they are faster than float32 ones."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    # The CPU's instruction sets, from torch's public cpuinfo query (torch 2.14 has it); an older torch has no
    # public way to tell, so the prefilter stays off by default there (prefilter=True still turns it on).
    get_capabilities = getattr(torch.cpu, "get_capabilities", None)
    if get_capabilities is None:
        return False
    capabilities = get_capabilities()
    return any(bool(capabilities.get(flag, False)) for flag in ("avx512_bf16", "amx_bf16", "bf16"))  # x86, ARM


def prefer_bfloat16(bf16_seconds: float, float32_seconds: float, threshold: float = PREFILTER_SPEEDUP) -> bool:
    """Whether a measured bfloat16 product is clearly faster than the float32 one: under `threshold` times its
    time. (The prefilter adds a re-rank and sometimes a widening, so a bare tie is not worth it.)"""
    return bf16_seconds < threshold * float32_seconds


@functools.cache
def product_seconds(dim: int, threads: int, repeats: int = 3) -> tuple[float, float]:
    """(bfloat16, float32): the best of `repeats` timings, in seconds, of a (256 × dim) @ (dim × 4096) product on
    the CPU with `threads` intra-op threads (a cache key, since the ratio depends on it; torch's setting is
    restored after), after one untimed warm-up of each, the two alternating. Measured once per process and
    (dim, threads) pair (what that costs: `benchmarks/results/choices.json`, `knn_calibration`)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(_CALIBRATION_ROWS, dim, generator=g)
        b = torch.randn(_CALIBRATION_COLUMNS, dim, generator=g)
        operands = {torch.bfloat16: (a.bfloat16(), b.bfloat16().T), torch.float32: (a, b.T)}
        outs = {dtype: torch.empty(_CALIBRATION_ROWS, _CALIBRATION_COLUMNS, dtype=dtype) for dtype in operands}
        best = dict.fromkeys(operands, float("inf"))
        with ieee_float32_matmul():
            for repeat in range(repeats + 1):
                for dtype, (left, right) in operands.items():
                    begin = time.perf_counter()
                    torch.matmul(left, right, out=outs[dtype])
                    elapsed = time.perf_counter() - begin
                    if repeat:
                        best[dtype] = min(best[dtype], elapsed)
    finally:
        torch.set_num_threads(previous)
    return best[torch.bfloat16], best[torch.float32]


def prefilter_default(device: torch.device, n_train: int, dim: int) -> tuple[bool, str]:
    """Whether `knn` uses the prefilter when `prefilter=None`, and why, as `protocol["prefilter_choice"]` says:
    off below `PREFILTER_MIN_TRAIN` rows or without native bfloat16 (`fast_bfloat16`); on for CUDA; on a CPU,
    on only if `product_seconds` measures the bfloat16 product `prefer_bfloat16`-faster. The answer is the same
    either way (both searches are exact), so only the time depends on the choice."""
    if n_train < PREFILTER_MIN_TRAIN:
        return False, f"default: off, N = {n_train} < {PREFILTER_MIN_TRAIN} training samples"
    if not fast_bfloat16(device):
        return False, f"default: off, no native bfloat16 matrix products on {device.type}"
    if device.type != "cpu":
        return True, f"default: on, native bfloat16 matrix products on {device.type}"
    bf16_s, float32_s = product_seconds(min(dim, _CALIBRATION_MAX_DIM), torch.get_num_threads())
    on = prefer_bfloat16(bf16_s, float32_s)
    return on, (f"measured: bf16 product {bf16_s / float32_s:.2f}x the float32 time "
                f"({'<' if on else '>='} {PREFILTER_SPEEDUP}x), so {'on' if on else 'off'}")
