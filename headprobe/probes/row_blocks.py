"""The rows of a tap as the linear probe reads them: in blocks of at most `BLOCK_ROWS` rows, each block read by a
slice `x[i:j]` or a gather `x[index]` of the tap and converted as it is read, so no more than one block of a tap is
held at once (#38).

A tap is anything with `len`, `.shape` (N, D), `.dtype` and row indexing by a slice or an int64 index tensor: a
`torch.Tensor` (also a memory-mapped float16 one) or a row source such as the pipeline's tap rows. `Rows` adds
which rows (an index, e.g. the fitting part of a validation split) and the map the probe sees them through: per
coordinate standardisation, applied to each block, or the whitening (`headprobe.probes.whitening`), folded into the
weights instead (`Rows.logit_weights`): whitening each block (D · r products per row) would cost some 20 times the
loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from headprobe.checks import check_finite, check_labelled_split

# Rows of a tap read at once by the linear probe, once it reads in blocks: it then holds some 3 blocks (48 MiB per
# block of 768-d float32 rows, twice that in the float64 products of the whitened probe).
BLOCK_ROWS = 16_384
# Taps (and test and validation sets) of at most this many rows are read whole, as one block, and fitted as before
# (a whitened copy of the tap, bit-identical results: the quickstart, CIFAR's 50k and Fashion-MNIST's 60k training
# images, about 530 MiB above the inputs at 65,536 x 768); longer ones block by block. Reading in blocks costs 2.3x
# the CPU time at 100k x 768 (`benchmarks/results/linear_chunks.json`: each evaluation reads every block again), so
# it starts where the whole path's memory (~2.5 copies of the tap) is what stops a run, not before.
WHOLE_ROWS = 65_536


@dataclass(frozen=True)
class Whitening:
    """z = (x − mean) · projection, float64 (mean (D,), projection (D, r)): applied by folding it into the
    weights, `Rows.logit_weights` / `Rows.pull_back`."""

    mean: torch.Tensor
    projection: torch.Tensor


@dataclass(frozen=True)
class Rows:
    """Rows `index` (int64, or None for all, in order) of `source` (N, D), read `block_rows` at a time as `dtype` on
    `device`, standardised by (mean, scale) (elementwise, in `dtype`) or whitened (`whitening`) on the way."""

    source: object
    device: torch.device
    dtype: torch.dtype
    block_rows: int = BLOCK_ROWS
    index: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    whitening: Whitening | None = None

    @classmethod
    def of(cls, source, device=None, dtype: torch.dtype | None = None, block_rows: int | None = None) -> Rows:
        """All rows of `source`, on its device (or `device`), in float32 (float64 for float64 sources)."""
        if dtype is None:
            dtype = torch.float64 if source.dtype == torch.float64 else torch.float32
        device = torch.device(device) if device is not None else getattr(source, "device", torch.device("cpu"))
        return cls(source, device, dtype, BLOCK_ROWS if block_rows is None else block_rows)

    def __len__(self) -> int:
        return len(self.source) if self.index is None else len(self.index)

    @property
    def dim(self) -> int:
        """The dimension the probe's weights have: r when whitened, else D."""
        return self.source.shape[1] if self.whitening is None else self.whitening.projection.shape[1]

    def take(self, index: torch.Tensor) -> Rows:
        """These rows' rows `index` (positions among these rows)."""
        index = torch.as_tensor(index, dtype=torch.int64).cpu()
        return replace(self, index=index if self.index is None else self.index[index])

    def standardized(self, mean: torch.Tensor, scale: torch.Tensor) -> Rows:
        return replace(self, mean=mean, scale=scale)

    def whitened(self, whitening: Whitening) -> Rows:
        return replace(self, whitening=whitening)

    def read(self, start: int, stop: int) -> torch.Tensor:
        """Rows start..stop of these rows, as read from the source and converted, before any map."""
        rows = self.source[start:stop] if self.index is None else self.source[self.index[start:stop]]
        return rows.to(self.device, self.dtype)

    def blocks(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(start, block) over these rows, as read and converted to `dtype`, standardised if so; whitened rows come
        as read, for `logit_weights` to multiply (converted to float64 a cache-sized piece at a time)."""
        for start in range(0, len(self), self.block_rows):
            block = self.read(start, min(start + self.block_rows, len(self)))
            if self.whitening is None and self.mean is not None:
                block = (block - self.mean) / self.scale  # never in place: a block may be a view of the tap
            yield start, block

    def features(self) -> Iterator[tuple[int, torch.Tensor]]:
        """(start, block) of the rows in the probe's coordinates: `blocks`, or whitened, (x − mean) P in float64."""
        for start, block in self.blocks():
            if self.whitening is not None:
                block = (block.to(torch.float64) - self.whitening.mean) @ self.whitening.projection
            yield start, block

    def logit_weights(self, Wt: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Wt: (F, dim), b: (F,) in the probe's coordinates -> the (F, D) weights and (F,) intercepts that give the
        same logits from `blocks`: Wt and b, or, whitened, W̃ = Wt Pᵀ and b − W̃ mean in float64."""
        if self.whitening is None:
            return Wt, b.to(Wt.dtype)
        weights = Wt.double() @ self.whitening.projection.T
        return weights, b.double() - weights @ self.whitening.mean

    def pull_back(self, grad_w: torch.Tensor, grad_b: torch.Tensor) -> torch.Tensor:
        """The gradients (F, D), (F,) of `logit_weights`' weights and intercepts -> the gradient (F, dim) of the
        probe's weights Wt (the intercepts' gradient is the same): (grad_w − grad_b meanᵀ) P when whitened."""
        if self.whitening is None:
            return grad_w
        return (grad_w - grad_b[:, None] * self.whitening.mean) @ self.whitening.projection


def check_labelled_rows(name: str, features, labels: torch.Tensor, block_rows: int) -> None:
    """`check_labelled_split` for a tap that is read in blocks: its shape, dtype and labels as that checks them, its
    values (finite) block by block. A tensor of at most `block_rows` rows is checked whole, as before."""
    if isinstance(features, torch.Tensor) and len(features) <= block_rows:
        check_labelled_split(name, features, labels)
        return
    # Shape, dtype and labels on a stand-in that holds no memory (one zero, expanded); the values block by block.
    check_labelled_split(name, torch.zeros((), dtype=features.dtype).expand(tuple(features.shape)), labels)
    for start in range(0, len(features), block_rows):
        check_finite(f"{name}_features", features[start : start + block_rows],
                     "check the backbone's output (e.g. for fp16 overflow)")
