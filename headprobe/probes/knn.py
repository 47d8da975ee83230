"""Weighted k-nearest-neighbour probe on frozen features, following the DINO / DINOv2 protocol."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from headprobe.checks import as_tensor, check_labelled_split

_WEIGHTINGS = ("exp", "uniform")
# bfloat16 keeps 8 significant bits: round-to-nearest moves a value by at most 2^-8 of itself.
_BF16_UNIT = 2.0**-8
_FP32_UNIT = 2.0**-24
# Below this many training samples the float32 product is cheap, and the prefilter is not worth its set-up.
_PREFILTER_MIN_TRAIN = 2048
_TOPK_BLOCK = 64


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
    ks: Sequence[int] = (10, 20, 100, 200),
    temperature: float = 0.07,
    weighting: str = "exp",
    chunk_size: int = 256,
    num_classes: int | None = None,
    device: torch.device | str | None = None,
    prefilter: bool | None = None,
) -> KnnResult:
    """Classify each test sample by a weighted vote of its nearest training samples.

    train_features: (N, D), train_labels: (N,), test_features: (M, D), test_labels: (M,).

    Protocol (DINO `eval_knn.py`, DINOv2 `eval/knn.py`): features are L2-normalised and compared by
    cosine similarity s; each query takes its top-k training neighbours, each neighbour votes for its own
    label with weight exp(s / temperature) ("exp") or 1 ("uniform"), and the class with the largest
    summed vote over the first k neighbours is the prediction (ties go to the smaller class index). Among
    equally similar training samples the one with the smaller index is the nearer (`ordered_topk`), so the
    neighbours do not depend on the top-k kernel, and `sharded_knn` over a bank split across processes
    reproduces them.

    A k larger than N is clamped to N; the clamp is recorded in `protocol["effective_ks"]`. Queries are
    processed `chunk_size` at a time, so memory is O(chunk_size × N), and the similarities that choose and
    weight the neighbours are float32 on `device` (default: the device of `train_features`).

    `prefilter` (default: on where bfloat16 matrix products are native -- CUDA, or CPUs with AVX512-BF16/AMX --
    and N ≥ 2048) finds candidates with a bfloat16 product, about twice as fast as float32 on such CPUs, then
    re-ranks them in float32. It changes no result: a query is accepted only when a rigorous bound on the
    bfloat16 error proves that no training sample outside its candidates can be among its float32 top-k;
    otherwise its candidates are widened, and failing that it is recomputed against the whole bank in float32.
    How many queries needed either is recorded in `protocol["prefilter"]`. NumPy arrays are accepted too.
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
    ks = [int(k) for k in ks]
    if not ks:
        raise ValueError("ks is empty; pass at least one neighbour count, e.g. ks=(10, 20).")
    if min(ks) <= 0:
        raise ValueError(f"ks must be positive neighbour counts but got {ks}.")
    if len(set(ks)) != len(ks):
        raise ValueError(f"ks contains duplicates ({ks}); list each neighbour count once.")
    if weighting not in _WEIGHTINGS:
        raise ValueError(f"weighting {weighting!r} is not supported; use one of {_WEIGHTINGS}.")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive but got {temperature}; DINO uses 0.07.")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive but got {chunk_size}.")
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

    bank = F.normalize(train_features.to(device, torch.float32), dim=1)
    bank_labels = train_labels.to(device, torch.int64)
    if prefilter is None:
        prefilter = n_train >= _PREFILTER_MIN_TRAIN and _fast_bfloat16(device)
    search = _Bf16Prefilter(bank, max_k) if prefilter else None
    predictions = {k: torch.empty(n_test, dtype=torch.int64) for k in ks}
    for start in range(0, n_test, chunk_size):
        queries = F.normalize(test_features[start : start + chunk_size].to(device, torch.float32), dim=1)
        if search is None:
            sims, idx = ordered_topk(queries @ bank.T, max_k)
        else:
            sims, idx = search.topk(queries)
        neighbour_labels = bank_labels[idx]
        if weighting == "exp":
            # Subtracting each row's top similarity rescales that query's votes by a constant, which leaves
            # the argmax unchanged but keeps exp() finite for small temperatures.
            weights = ((sims - sims[:, :1]) / temperature).exp()
        else:
            weights = torch.ones_like(sims)
        for k in ks:
            votes = torch.zeros(len(queries), num_classes, device=device)
            votes.scatter_add_(1, neighbour_labels[:, : effective[k]], weights[:, : effective[k]])
            predictions[k][start : start + len(queries)] = votes.argmax(dim=1).cpu()

    targets = test_labels.cpu().long()
    metrics = {f"knn.k{k}.acc": (predictions[k] == targets).double().mean().item() for k in ks}
    protocol = {
        "ks": ks,
        "effective_ks": {k: effective[k] for k in ks},
        "temperature": temperature,
        "weighting": weighting,
        "normalize": True,
        "chunk_size": chunk_size,
        "n_train": n_train,
        "n_test": n_test,
        "n_classes": num_classes,
        "similarity": "float32",
        "prefilter": search.stats if search is not None else None,
    }
    if search is not None:
        protocol["similarity"] = "float32, candidates from a certified bfloat16 prefilter"
    return KnnResult(metrics=metrics, predictions=predictions, protocol=protocol)


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


def by_similarity_then_index(values: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """values, idx: (B, C) -> both reordered by value (descending), then by index (ascending) among equal values."""
    by_index = idx.argsort(dim=1)
    values, idx = values.gather(1, by_index), idx.gather(1, by_index)
    values, order = values.sort(dim=1, descending=True, stable=True)
    return values, idx.gather(1, order)


def blocked_topk(scores: torch.Tensor, k: int, block: int = _TOPK_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row, like `scores.topk(k, dim=1)`; scores: (B, N) -> values, indices (B, k).

    Why not `topk` directly: over long rows it costs about twice a contiguous max-reduction. Split each row into
    blocks of `block` entries; each of the row's k largest entries lies in a block whose maximum is at least the
    k-th largest value, and at most k blocks have such a maximum, so the k blocks with the largest maxima hold
    all of them. One max per block, a top-k over the N/block maxima and one over k·block gathered entries
    give the same values (ties may list different indices).
    """
    n = scores.shape[1]
    if k * block * 4 > n or n < block:
        return scores.topk(k, dim=1)
    if scores.dtype == torch.bfloat16:
        # Max and top-k over the bits read as int16 run ~6x and ~1.5x faster than over bfloat16 on the CPU.
        # int16 order is the values' order among non-negative values and puts every negative one below them,
        # so a block holding a positive value gets its true maximum, a block of negatives a wrong one below
        # zero. When the k-th largest block maximum is positive, the k blocks chosen are therefore exactly
        # right, and they hold at least k positive values, among which int16 order picks the top k.
        bits = scores.view(torch.int16)
        chosen = _block_max(bits, block).topk(k, dim=1)
        if bool((chosen.values[:, -1] > 0).all()):
            values, columns = _gather_blocks(bits, chosen.indices, block)
            top_values, where = values.topk(k, dim=1)
            return top_values.view(torch.bfloat16), columns.gather(1, where)
    top_blocks = _block_max(scores, block).topk(k, dim=1).indices
    values, columns = _gather_blocks(scores, top_blocks, block)
    top_values, where = values.topk(k, dim=1)
    return top_values, columns.gather(1, where)


def _gather_blocks(scores: torch.Tensor, blocks: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scores: (B, N), blocks: (B, k) block indices -> their entries (B, k·block) and column indices (B, k·block);
    columns past N (a shorter last block) hold -inf (or the dtype's minimum)."""
    b, n = scores.shape
    k = blocks.shape[1]
    columns = (blocks.unsqueeze(2) * block + torch.arange(block, device=scores.device)).flatten(1)
    row_bytes = block * scores.element_size()
    if n % block == 0 and scores.is_contiguous() and row_bytes % 8 == 0:
        # Whole blocks moved as int64 words: a quarter of the gathers of moving 16-bit entries one by one.
        words = scores.view(b, n // block, block).view(torch.int64)
        index = blocks.unsqueeze(2).expand(b, k, row_bytes // 8)
        return words.gather(1, index).view(scores.dtype).view(b, k * block), columns
    valid = columns < n
    low = float("-inf") if scores.is_floating_point() else torch.iinfo(scores.dtype).min
    return scores.gather(1, columns.clamp_max(n - 1)).masked_fill(~valid, low), columns


def _block_max(scores: torch.Tensor, block: int) -> torch.Tensor:
    """scores: (B, N) -> (B, ceil(N / block)) maxima of consecutive blocks of `block` columns (the last may be
    shorter)."""
    b, n = scores.shape
    full = n // block
    maxima = scores[:, : full * block].view(b, full, block).amax(dim=2)
    if full * block < n:
        maxima = torch.cat([maxima, scores[:, full * block :].amax(dim=1, keepdim=True)], dim=1)
    return maxima


def _fast_bfloat16(device: torch.device) -> bool:
    """Whether bfloat16 matrix products run natively (and so faster than float32) on `device`."""
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


class _Bf16Prefilter:
    """Exact float32 top-k of cosine similarities, with candidates found by a bfloat16 product.

    Why not just the float32 product: on hardware with native bfloat16 the product over the whole bank -- the
    k-NN's whole cost -- runs about twice as fast, and a certificate keeps the answer that of float32.

    Certificate. For unit vectors q, x with bfloat16 roundings q + δq, x + δx, the computed bfloat16 score ŝ
    of the exact cosine s obeys |ŝ − s| ≤ E + r|ŝ|, where
        E = ‖δq‖‖x‖ + ‖q‖‖δx‖ + ‖δq‖‖δx‖ + γ_D (‖q‖ + ‖δq‖)(‖x‖ + ‖δx‖)
    (Cauchy–Schwarz on the three rounding terms; γ_D = D·2⁻²⁴ / (1 − D·2⁻²⁴) bounds float32 accumulation in any
    order) and r = 2⁻⁸ / (1 − 2⁻⁸) covers rounding the result to bfloat16. With the maximum of ‖x‖ and ‖δx‖ over
    the bank, E depends only on the query. A sample outside the candidates has ŝ ≤ c, the smallest candidate
    score, so its float32 score is at most c + r|c| + E + γ_D‖q‖‖x‖. When the k-th best re-ranked float32
    score of the candidates exceeds that, the candidates hold the whole float32 top-k.
    """

    def __init__(self, bank: torch.Tensor, k: int, oversample: int = 2, widen: int = 8) -> None:
        n, d = bank.shape
        self.bank, self.k = bank, k
        # The bfloat16 bank is padded with zero rows to whole blocks of blocked_topk, whose scores are set to
        # -inf after each product: every block is then whole, and gathered as whole blocks.
        self.low = torch.zeros(-(-n // _TOPK_BLOCK) * _TOPK_BLOCK, d, dtype=torch.bfloat16, device=bank.device)
        self.low[:n] = bank
        self.candidates = min(n, max(oversample * k, k + 16))
        self.wide = min(n, widen * self.candidates)
        self.gamma = d * _FP32_UNIT / (1 - d * _FP32_UNIT)
        self.ratio = _BF16_UNIT / (1 - _BF16_UNIT)
        # x − bf16(x) is exact in float32; a float32 norm of D terms is within D·2⁻²⁴ of the true one, so a
        # factor (1 + 2γ_D) keeps the bound from being rounded down. Rows are taken in blocks, so that the
        # float32 temporaries stay small next to the bank.
        norm, error, step = 0.0, 0.0, 8192
        for s in range(0, n, step):
            rows = bank[s : s + step]
            norm = max(norm, float(rows.norm(dim=1).max()))
            error = max(error, float((rows - self.low[s : s + len(rows)].float()).norm(dim=1).max()))
        self.bank_norm, self.bank_error = norm * (1 + 2 * self.gamma), error * (1 + 2 * self.gamma)
        self.buffer: torch.Tensor | None = None
        self.rows_buffer: torch.Tensor | None = None
        self.stats = {"queries": 0, "candidates": self.candidates, "widened": 0, "full_float32": 0}

    def error_bound(self, queries: torch.Tensor) -> torch.Tensor:
        """queries: (B, D) -> (B,) float64 E: |ŝ − q·x| ≤ E + r|ŝ| for every bank row x (see the class docstring)."""
        q_norm = queries.double().norm(dim=1)
        q_error = (queries.to(torch.bfloat16).float() - queries).double().norm(dim=1)
        return (q_error * self.bank_norm + q_norm * self.bank_error + q_error * self.bank_error
                + self.gamma * (q_norm + q_error) * (self.bank_norm + self.bank_error))

    def _rerank(self, queries: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """queries: (B, D), idx: (B, C) -> float32 scores (B, C) sorted descending, and their bank indices.

        The candidates' rows are gathered about 16 MiB at a time, into a buffer kept across calls (like the
        product's: fresh ones cost page faults each time), and multiplied in place.
        """
        d = queries.shape[1]
        step = max(1, 2**22 // (idx.shape[1] * d))
        if self.rows_buffer is None or self.rows_buffer.numel() < min(step, len(queries)) * idx.shape[1] * d:
            self.rows_buffer = queries.new_empty(min(step, len(queries)) * idx.shape[1] * d)
        parts = []
        for s in range(0, len(queries), step):
            # index_select and a multiply-sum: 2.4 + 1.4 ms for 256 queries × 40 candidates × 384 dims, against
            # 8.2 + 4.4 ms for advanced indexing and bmm.
            block = idx[s : s + step]
            rows = self.rows_buffer[: block.numel() * d].view(block.numel(), d)
            torch.index_select(self.bank, 0, block.flatten(), out=rows)
            rows = rows.view(*block.shape, d).mul_(queries[s : s + step, None, :])
            parts.append(rows.sum(dim=2))
        return by_similarity_then_index(torch.cat(parts), idx)

    def topk(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """queries: (B, D) unit rows -> (B, k) float32 similarities, descending, and (B, k) bank indices."""
        low_q = queries.to(torch.bfloat16)
        bound = self.error_bound(queries) + self.gamma * queries.double().norm(dim=1) * self.bank_norm
        # Written into one buffer kept across chunks: a fresh chunk × N result per chunk costs page faults
        # worth about a seventh of the product itself.
        if self.buffer is None or len(self.buffer) < len(queries):
            self.buffer = torch.empty(len(queries), len(self.low), dtype=torch.bfloat16, device=queries.device)
        approx = self.buffer[: len(queries)]
        if queries.is_cuda:
            # The bound assumes float32 accumulation; cuBLAS may otherwise reduce bfloat16 partial sums.
            allowed = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
            try:
                torch.matmul(low_q, self.low.T, out=approx)
            finally:
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = allowed
        else:
            torch.matmul(low_q, self.low.T, out=approx)
        approx[:, len(self.bank) :] = float("-inf")
        sims = torch.empty(len(queries), self.k, dtype=torch.float32, device=queries.device)
        idx = torch.empty(len(queries), self.k, dtype=torch.int64, device=queries.device)
        pending = torch.arange(len(queries), device=queries.device)
        self.stats["queries"] += len(queries)
        for width in dict.fromkeys((self.candidates, self.wide)):
            rows = approx if len(pending) == len(queries) else approx[pending]
            low_scores, cand = blocked_topk(rows, width)
            scores, cand = self._rerank(queries[pending], cand)
            floor = low_scores[:, -1].double()
            outside = floor + self.ratio * floor.abs() + bound[pending]
            certified = scores[:, self.k - 1].double() > outside if width < len(self.bank) else (
                torch.ones(len(pending), dtype=torch.bool, device=queries.device))
            done = pending[certified]
            sims[done], idx[done] = scores[certified, : self.k], cand[certified, : self.k]
            pending = pending[~certified]
            if len(pending) == 0:
                return sims, idx
            if width == self.candidates:
                self.stats["widened"] += len(pending)
        self.stats["full_float32"] += len(pending)
        exact, exact_idx = ordered_topk(queries[pending] @ self.bank.T, self.k)
        sims[pending], idx[pending] = exact, exact_idx
        return sims, idx
