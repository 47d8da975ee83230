"""The k-NN probe's neighbour search: each query's exact top-k training rows by float32 cosine similarity, found from
a float32 product (`Float32TopK`) or from a certified bfloat16 one (`Bf16Prefilter`), with the same answer bit for bit.

Canonical similarity. The float32 similarity of a unit query q and a unit bank row x is `canonical_dot`: the D
products q_i·x_i, summed by a fixed pairwise tree that depends on D alone. A matrix product's entries are not that:
BLAS kernels block the sum by the matrices' shapes (at D = 384, a product against a bank and against a slice of it
differ in the last bits of many entries), so neither a bank split across processes (`sharded_knn`) nor another
kernel could reproduce them. Elementwise products and sums are IEEE-rounded alike on every shape. So a search
uses a product only to find candidates, re-ranks them by `canonical_dot`, and orders them by (similarity descending,
index ascending); a query is accepted only when a rigorous bound on the product's error proves that no row outside
its candidates can be among its top-k by that order. Otherwise the candidates are widened, and failing that every row
the bound cannot rule out is re-ranked.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

# bfloat16 keeps 8 significant bits: round-to-nearest moves a value by at most 2^-8 of itself.
BF16_UNIT = 2.0**-8
FP32_UNIT = 2.0**-24
TOPK_BLOCK = 64
# Elements of the re-rank's gathered rows per step: 16 MiB of float32.
_RERANK_ELEMENTS = 2**22


def by_similarity_then_index(values: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """values, idx: (B, C) -> both reordered by value (descending), then by index (ascending) among equal values."""
    by_index = idx.argsort(dim=1)
    values, idx = values.gather(1, by_index), idx.gather(1, by_index)
    values, order = values.sort(dim=1, descending=True, stable=True)
    return values, idx.gather(1, order)


def blocked_topk(scores: torch.Tensor, k: int, block: int = TOPK_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row, like `scores.topk(k, dim=1)`; scores: (B, N) -> values, indices (B, k).

    Why not `topk` directly: over long rows it costs several contiguous max-reductions
    (`benchmarks/results/choices.json`, `knn_blocked_topk`, which times this function against `topk` too).
    Split each row into blocks of `block` entries; each of the row's k largest entries lies in a block whose
    maximum is at least the k-th largest value, and at most k blocks have such a maximum, so the k blocks with
    the largest maxima hold all of them. One max per block, a top-k over the N/block maxima and one over k·block
    gathered entries give the same values (ties may list different indices).
    """
    n = scores.shape[1]
    if k * block * 4 > n or n < block:
        return scores.topk(k, dim=1)
    if scores.dtype == torch.bfloat16:
        # Block maxima over the bits read as int16 run several times faster than over bfloat16 on the CPU
        # (`benchmarks/results/choices.json`, `knn_int16_bits`).
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


def pairwise_sum_(rows: torch.Tensor) -> torch.Tensor:
    """rows: (P, D) float32, overwritten -> (P,) their sums (a view into `rows`), by a fixed tree: the last half of
    the columns is added onto the first, until one is left. Each value depends only on its own row, never on P, the
    memory layout or the device, unlike a reduction kernel's, whose blocking follows the shape."""
    width = rows.shape[1]
    while width > 1:
        half = width // 2
        rows[:, :half] += rows[:, width - half : width]
        width -= half
    return rows[:, 0]


def canonical_dot(queries: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """queries: (..., D), rows: (..., D) (broadcast) -> (...) float32 dot products summed as `pairwise_sum_` sums:
    the similarity every search in this module returns."""
    products = (queries.float() * rows.float()).contiguous()
    return pairwise_sum_(products.view(-1, products.shape[-1])).view(products.shape[:-1]).clone()


def canonical_normalize(features: torch.Tensor, eps: float = 1e-12, step: int = 8192) -> torch.Tensor:
    """features: (N, D) -> (N, D) float32 rows divided by max(‖row‖, eps), like `F.normalize`, but with each norm
    summed by `pairwise_sum_`, so that a row's unit vector does not depend on how many rows share the call (a bank or
    its shard, a chunk of queries) nor on the device. Rows are taken `step` at a time to keep temporaries small."""
    features = features.float()
    out = torch.empty_like(features, memory_format=torch.contiguous_format)
    for s in range(0, len(features), step):
        rows = features[s : s + step]
        norms = pairwise_sum_(rows.square()).sqrt().clamp_min(eps)
        torch.div(rows, norms[:, None], out=out[s : s + step])
    return out


@contextmanager
def ieee_float32_matmul() -> Iterator[None]:
    """Float32 matrix products in IEEE float32 while inside (`torch.set_float32_matmul_precision("highest")`), never
    TF32 or bfloat16 passes, which the certificates do not cover; the previous setting is restored after."""
    precision = torch.get_float32_matmul_precision()
    if precision == "highest":
        yield
        return
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)


def _largest_norm(rows: torch.Tensor, minus: torch.Tensor | None = None, step: int = 8192) -> float:
    """The largest norm of a row (of rows − minus, minus cast to float32: a rounding error), taken in blocks of rows
    so that the float32 temporaries stay small."""
    def block(s: int) -> torch.Tensor:
        return rows[s : s + step] if minus is None else rows[s : s + step] - minus[s : s + step].float()

    return max((float(block(s).norm(dim=1).max()) for s in range(0, len(rows), step)), default=0.0)


class Float32TopK:
    """Exact top-k of `canonical_dot` similarities, with candidates from a float32 product.

    bank: (N, D) unit rows; k ≤ N. Certificate: a float32 dot product of D terms, summed in any order, is within
    γ_D‖q‖‖x‖ of the exact one (γ_D = D·2⁻²⁴ / (1 − D·2⁻²⁴)), so a product entry g and the canonical similarity m
    of the same pair differ by at most δ = 2γ_D‖q‖ max‖x‖. A row outside the candidates has g ≤ c, the smallest
    candidate entry, so m ≤ c + δ; when the k-th best candidate similarity exceeds that, the candidates hold the
    top-k. A query that fails even with `widen` times the candidates is answered from every row with g within 2δ
    of its k-th largest entry: the k rows of the largest g have m ≥ g_k − δ, every other row m < g_k − δ.
    `candidates` (default `default_candidates(k)`) rows per query are re-ranked first.
    """

    def __init__(self, bank: torch.Tensor, k: int, candidates: int | None = None, widen: int = 8) -> None:
        n, d = bank.shape
        if not 0 < k <= n:
            raise ValueError(f"k must lie in 1..{n} (the bank's rows) but is {k}.")
        self.bank, self.k = bank, k
        self.candidates = min(n, self.default_candidates(k) if candidates is None else max(k, candidates))
        self.wide = min(n, widen * self.candidates)
        self.gamma = d * FP32_UNIT / (1 - d * FP32_UNIT)
        # A float32 norm of D terms is within γ_D of the true one, so a factor (1 + 2γ_D) keeps the bound up.
        self.bank_norm = _largest_norm(bank) * (1 + 2 * self.gamma)
        self.buffer: torch.Tensor | None = None
        self.rows_buffer: torch.Tensor | None = None
        self.stats = {"queries": 0, "candidates": self.candidates, "widened": 0, "exhaustive": 0}

    @staticmethod
    def default_candidates(k: int) -> int:
        """k plus a quarter (at least 4). Why so few: the float32 certificate's slack δ (~5e-5 at D = 384) is far
        below the gap between a query's k-th and (k + k/4)-th product entries but for ties, so the first re-rank
        almost always certifies (no query widened at k = 20 with 25 candidates; against the 40 = 2k of before,
        about the same time: `benchmarks/results/choices.json`, `knn_candidates`; ties widen, exactly as
        before)."""
        return k + max(4, -(-k // 4))

    def scores(self, queries: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """queries: (B, D), idx: (B, C) bank rows -> (B, C) `canonical_dot` similarities.

        The rows are gathered about 16 MiB at a time, into a buffer kept across calls (fresh ones cost page faults
        each time), and multiplied and summed in place: index_select and elementwise work cost a fraction of
        advanced indexing and a batched product.
        """
        d, c = queries.shape[1], idx.shape[1]
        step = max(1, _RERANK_ELEMENTS // max(1, c * d))
        size = min(step, len(queries)) * c * d
        if self.rows_buffer is None or self.rows_buffer.numel() < size:
            self.rows_buffer = queries.new_empty(size)
        out = queries.new_empty(idx.shape)
        for s in range(0, len(queries), step):
            block = idx[s : s + step]
            rows = self.rows_buffer[: block.numel() * d].view(block.numel(), d)
            torch.index_select(self.bank, 0, block.flatten(), out=rows)
            rows.view(*block.shape, d).mul_(queries[s : s + step, None, :])
            out[s : s + step] = pairwise_sum_(rows).view(block.shape)
        return out

    def rerank(self, queries: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """queries: (B, D), idx: (B, C) -> their similarities, ordered by (similarity, index), and the indices."""
        return by_similarity_then_index(self.scores(queries, idx), idx)

    def certified(self, queries: torch.Tensor, approx: torch.Tensor, slack: torch.Tensor, ratio: float
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The queries whose top-k the approximate scores certify: queries (B, D), approx (B, ≥N) with
        |approx − m| ≤ slack + ratio·|approx| for every row -> sims (B, k), idx (B, k), and the (P,) positions of
        the queries still pending, whose rows of sims and idx are left unset."""
        b, n = len(queries), len(self.bank)
        sims = torch.empty(b, self.k, dtype=torch.float32, device=queries.device)
        idx = torch.empty(b, self.k, dtype=torch.int64, device=queries.device)
        pending = torch.arange(b, device=queries.device)
        for width in dict.fromkeys((self.candidates, self.wide)):
            rows = approx if len(pending) == b else approx[pending]
            low_scores, cand = blocked_topk(rows, width)
            scores, cand = self.rerank(queries[pending], cand)
            if width < n:
                # x + ratio·|x| grows with x, so c + ratio·|c| + slack bounds every row scored at most c.
                floor = low_scores[:, -1].double()
                certified = scores[:, self.k - 1].double() > floor + ratio * floor.abs() + slack[pending]
            else:
                certified = torch.ones(len(pending), dtype=torch.bool, device=queries.device)
            done = pending[certified]
            sims[done], idx[done] = scores[certified, : self.k], cand[certified, : self.k]
            pending = pending[~certified]
            if len(pending) == 0 or width == self.wide:
                break
            self.stats["widened"] += len(pending)
        return sims, idx, pending

    def product(self, queries: torch.Tensor) -> torch.Tensor:
        """queries: (B, D) -> (B, N) float32 products with the bank, in IEEE float32 (never TF32 or bfloat16,
        which the bound does not cover), written into a buffer kept across calls."""
        if self.buffer is None or len(self.buffer) < len(queries):
            self.buffer = queries.new_empty(len(queries), len(self.bank))
        out = self.buffer[: len(queries)]
        with ieee_float32_matmul():
            torch.matmul(queries, self.bank.T, out=out)
        return out

    def topk(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """queries: (B, D) unit rows -> (B, k) similarities, by (similarity descending, index ascending), and
        (B, k) bank indices."""
        self.stats["queries"] += len(queries)
        approx = self.product(queries)
        slack = 2 * self.gamma * queries.double().norm(dim=1) * self.bank_norm
        sims, idx, pending = self.certified(queries, approx, slack, 0.0)
        self.stats["exhaustive"] += len(pending)
        for row in pending.tolist():
            sims[row], idx[row] = self._exhaustive(queries[row], approx[row], float(slack[row]))
        return sims, idx

    def _exhaustive(self, query: torch.Tensor, approx: torch.Tensor, slack: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One query's top-k from every row whose product entry is within 2·slack of its k-th largest."""
        kth = float(approx.topk(self.k).values[-1])
        columns = (approx.double() >= kth - 2 * slack).nonzero().flatten()
        step = max(1, _RERANK_ELEMENTS // query.shape[0])
        values = torch.cat([self.scores(query[None], part[None])[0] for part in columns.split(step)])
        values, columns = by_similarity_then_index(values[None], columns[None])
        return values[0, : self.k], columns[0, : self.k]


class Bf16Prefilter(Float32TopK):
    """Exact top-k of `canonical_dot` similarities (the answer of `Float32TopK`), with candidates from a bfloat16
    product.

    Why: on hardware with native bfloat16 the product over the whole bank -- the k-NN's whole cost -- can run about
    twice as fast, and a certificate keeps the answer that of float32.

    Certificate. For unit vectors q, x with bfloat16 roundings q + δq, x + δx, the computed bfloat16 score ŝ
    of the exact cosine s obeys |ŝ − s| ≤ E + r|ŝ|, where
        E = ‖δq‖‖x‖ + ‖q‖‖δx‖ + ‖δq‖‖δx‖ + γ_D (‖q‖ + ‖δq‖)(‖x‖ + ‖δx‖)
    (Cauchy–Schwarz on the three rounding terms; γ_D bounds float32 accumulation in any order) and
    r = 2⁻⁸ / (1 − 2⁻⁸) covers rounding the result to bfloat16. With the maximum of ‖x‖ and ‖δx‖ over the bank, E
    depends only on the query. A sample outside the candidates has ŝ ≤ c, the smallest candidate score, so its
    canonical similarity is at most c + r|c| + E + γ_D‖q‖‖x‖. When the k-th best re-ranked candidate exceeds that,
    the candidates hold the whole top-k; a query that fails even after widening goes to `Float32TopK`
    (`stats["full_float32"]`).
    """

    @staticmethod
    def default_candidates(k: int) -> int:
        """2k (at least k + 16): the bfloat16 certificate's slack (2⁻⁸ of a score, plus E) needs a wider margin
        than float32's (with 2k, 4 of the k-NN benchmark's 10,000 queries at k = 20 widened)."""
        return max(2 * k, k + 16)

    def __init__(self, bank: torch.Tensor, k: int, candidates: int | None = None, widen: int = 8) -> None:
        super().__init__(bank, k, candidates, widen)
        n, d = bank.shape
        # The bfloat16 bank is padded with zero rows to whole blocks of blocked_topk, whose scores are set to
        # -inf after each product: every block is then whole, and gathered as whole blocks.
        self.low = torch.zeros(-(-n // TOPK_BLOCK) * TOPK_BLOCK, d, dtype=torch.bfloat16, device=bank.device)
        self.low[:n] = bank
        self.ratio = BF16_UNIT / (1 - BF16_UNIT)
        # x − bf16(x) is exact in float32; the factor (1 + 2γ_D) keeps its float32 norm from being rounded down.
        self.bank_error = _largest_norm(bank, minus=self.low[:n]) * (1 + 2 * self.gamma)
        self.fallback: Float32TopK | None = None
        self.stats = {"queries": 0, "candidates": self.candidates, "widened": 0, "full_float32": 0}

    def error_bound(self, queries: torch.Tensor) -> torch.Tensor:
        """queries: (B, D) -> (B,) float64 E: |ŝ − q·x| ≤ E + r|ŝ| for every bank row x (see the class docstring)."""
        q_norm = queries.double().norm(dim=1)
        q_error = (queries.to(torch.bfloat16).float() - queries).double().norm(dim=1)
        return (q_error * self.bank_norm + q_norm * self.bank_error + q_error * self.bank_error
                + self.gamma * (q_norm + q_error) * (self.bank_norm + self.bank_error))

    def product(self, queries: torch.Tensor) -> torch.Tensor:
        """queries: (B, D) -> (B, N') bfloat16 products with the padded bank (padding columns -inf), accumulated in
        float32, written into a buffer kept across calls (a fresh chunk × N result per chunk costs page faults worth
        about a seventh of the product itself)."""
        low_q = queries.to(torch.bfloat16)
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
        return approx

    def topk(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """queries: (B, D) unit rows -> (B, k) similarities, by (similarity descending, index ascending), and
        (B, k) bank indices: those of `Float32TopK.topk`."""
        self.stats["queries"] += len(queries)
        approx = self.product(queries)
        slack = self.error_bound(queries) + self.gamma * queries.double().norm(dim=1) * self.bank_norm
        sims, idx, pending = self.certified(queries, approx, slack, self.ratio)
        if len(pending):
            self.stats["full_float32"] += len(pending)
            if self.fallback is None:
                self.fallback = Float32TopK(self.bank, self.k)
            sims[pending], idx[pending] = self.fallback.topk(queries[pending])
        return sims, idx
