"""A tap read by rows: `TapRows` hands a probe the rows it asks for, converted to float32 on its device and passed
through the tap's layers (a head up to a depth), computed a block of rows at a time from the stored backbone
features, so a probe that reads its tap in blocks never holds the tap whole; `materialise` gives the whole tensor
to one that needs every row at once.

A stored tensor (N, *lead, D) — in memory or memory-mapped from the feature cache, in any store dtype — is seen as
N rows of shape (*lead, D'): the clean features (N, D), the views (N_v, K, D) (N_v rows of K views each), the
orbits (N_o, T, D). The transform maps (B, D) float32 rows to (B, D'), one row at a time: row i's output depends on
row i alone. A head in eval mode is (Linear, BatchNorm with its running statistics, activations); one in training
mode is not (BatchNorm would use each block's statistics), so a module in training mode is refused.

Blocks: the rows are cut into aligned blocks of `BLOCK_ROWS` stored rows (N_v views rows count K each) and a
block is computed whole and kept until another block is read (one block per `TapRows`, shared by its `narrow`
and `select` views). A read inside one block is a view of it; a read across blocks is joined from them. So a row's
value never depends on how a probe slices the tap, and a tap of at most one block (every tap of the quickstart) is
computed exactly as the whole tap was. The head's own batches (`train.cached_views.head_taps`: 4,096 rows) start
at the same rows as over the whole tap where a block's stored rows are a multiple of 4,096, so plain taps are
bit-identical to the whole computation at any N. Rows taken by an index tensor outside the kept block are gathered
(`tensor_file.gather_rows`: no mapped page made resident) and passed through the transform together: the same
values to float32 round-off. Without a transform a slice is converted directly (a float32 tensor already on the
device is returned as a view, as before).

>>> rows = TapRows(torch.arange(12.0).reshape(6, 2), lambda x: 2 * x, block_rows=4)
>>> rows.shape, rows[1:5].tolist() == (2 * torch.arange(2.0, 10.0).reshape(4, 2)).tolist()
(torch.Size([6, 2]), True)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from headprobe.features.cache import as_float32
from headprobe.features.tensor_file import gather_rows

__all__ = ["BLOCK_ROWS", "TapRows", "materialise"]

# Stored rows computed (converted, passed through the tap's layers) at once: at most 16,384 × D' float32 values
# per TapRows held beside what a probe keeps (64 MiB at D' = 1,024); the same as `probes.spectrum.CHUNK_ROWS`, so
# the spectrum's blocks are the tap's, and a multiple of the head's 4,096-row batches. Every tap of the quickstart
# (at most 5,388 rows) is one block.
BLOCK_ROWS = 16_384


class _KeptBlock:
    """The one block a TapRows (and its narrowed and selected views) keeps: (index, tensor) or None."""

    def __init__(self) -> None:
        self.index: int | None = None
        self.rows: torch.Tensor | None = None


class TapRows:
    """A read-only row source over `stored` (N, *lead, D): rows (N, *lead, D') in float32 on `device`, computed by
    `transform` ((B, D) -> (B, D'), row-wise; None: the stored features themselves) `block_rows` stored rows at a
    time. Reads: `len(x)`, `x.shape`, `x.ndim`, `x.dtype` (float32), `x.device`, `x[i]`, `x[i:j]`, `x[index]` (a
    LongTensor of rows), `x[rows, ...]` (rows selected first, the rest indexed in the result), and the lazy views
    `x.narrow(0, start, length)` and `x.select(dim, index)` (dim >= 1), which read the same blocks. `name` names the
    tap in errors. A block holding NaN or infinity raises ValueError as it is read."""

    reads_by_rows = True  # what `headprobe.checks` recognises, below this package
    def __init__(self, stored: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor] | None = None, *,
                 device: torch.device | str | None = None, block_rows: int | None = None, name: str = "tap"):
        if stored.ndim < 2:
            raise ValueError(f"{name}: a tap's stored features must be (N, ..., D), got shape {tuple(stored.shape)}.")
        if getattr(transform, "training", False):
            raise ValueError(f"{name}: the tap's layers are in training mode, where BatchNorm uses each block's "
                             "statistics and a row's output depends on the other rows; call head.eval() first.")
        block_rows = BLOCK_ROWS if block_rows is None else block_rows
        if block_rows < 1:
            raise ValueError(f"block_rows must be positive but got {block_rows}.")
        self.stored, self.transform, self.name = stored, transform, name
        self.device = torch.device(device) if device is not None else stored.device
        self.block_rows = block_rows
        per_row = math.prod(stored.shape[1:-1])
        # Rows per block: whole rows (an image's K views together), at least one.
        self.rows_per_block = max(1, block_rows // max(per_row, 1))
        self.first, self.count = 0, stored.shape[0]
        self.selects: tuple[tuple[int, int], ...] = ()
        self.kept = _KeptBlock()
        self._width: int | None = None if transform is not None else stored.shape[-1]

    # -- what a tensor says about itself
    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def shape(self) -> torch.Size:
        if self._width is None:
            self._width = int(self.transform(as_float32(self.stored[:1].reshape(-1, self.stored.shape[-1])[:1],
                                                        self.device)).shape[-1])
        full = [self.count, *self.stored.shape[1:-1], self._width]
        for dim, _ in self.selects:
            del full[dim]
        return torch.Size(full)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.count

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def __repr__(self) -> str:
        return (f"TapRows({self.name!r}, shape={tuple(self.shape)}, stored {self.stored.dtype}, "
                f"{'transformed' if self.transform is not None else 'as stored'}, block_rows={self.block_rows})")

    def __getattr__(self, attribute: str):
        raise AttributeError(f"{type(self).__name__} has no attribute {attribute!r}: a tap handed out by rows is read "
                             f"by slices (x[i:j]) or index tensors (x[idx]); a probe that reads it whole calls "
                             "headprobe.features.rows.materialise(x) first (or declares reads=WHOLE).")

    # -- lazy views
    def _view(self, **changes) -> TapRows:
        view = object.__new__(TapRows)
        view.__dict__.update(self.__dict__, **changes)
        return view

    def narrow(self, dim: int, start: int, length: int) -> TapRows:
        """Rows start .. start + length (dim 0 only), read through the same blocks (the same values)."""
        if dim != 0:
            raise ValueError(f"{self.name}: TapRows.narrow takes rows (dim 0), not dim {dim}.")
        if not (0 <= start and 0 <= length and start + length <= self.count):
            raise IndexError(f"{self.name}: rows {start}..{start + length} are outside its {self.count} rows.")
        return self._view(first=self.first + start, count=length)

    def select(self, dim: int, index: int) -> TapRows:
        """x[:, ..., index] along `dim` (>= 1) of every row read, as torch's `select`; the same blocks are read."""
        if dim < 0:
            dim += self.ndim
        if not 1 <= dim < self.ndim:
            raise ValueError(f"{self.name}: TapRows.select takes a dimension within a row (1..{self.ndim - 1}), "
                             f"not {dim}.")
        return self._view(selects=(*self.selects, (dim, index)))

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> TapRows:
        """The same rows on `device` (a new TapRows, its own kept block); float32 is the only dtype."""
        if dtype not in (None, torch.float32):
            raise ValueError(f"{self.name}: a TapRows gives float32 rows; convert the rows read instead.")
        if device is None or torch.device(device) == self.device:
            return self
        return self._view(device=torch.device(device), kept=_KeptBlock())

    # -- reads
    def __getitem__(self, key) -> torch.Tensor:
        rest = ()
        if isinstance(key, tuple):
            key, rest = (key[0], key[1:]) if key else (slice(None), ())
        if key is Ellipsis or key is None:
            raise TypeError(f"{self.name}: select rows first (x[rows, ...]); a TapRows is read by rows.")
        if isinstance(key, int):
            if not -self.count <= key < self.count:
                raise IndexError(f"{self.name}: row {key} is outside its {self.count} rows.")
            key %= self.count
            out = self._slice(key, key + 1)[0]
            return out[rest] if rest else out
        if isinstance(key, slice):
            start, stop, step = key.indices(self.count)
            out = self._slice(start, max(start, stop)) if step == 1 else self._rows(torch.arange(start, stop, step))
        else:
            index = torch.as_tensor(key)
            if index.dtype == torch.bool:
                if index.shape != (self.count,):
                    raise IndexError(f"{self.name}: a mask of shape {tuple(index.shape)} for {self.count} rows.")
                index = index.nonzero().flatten()
            if index.dtype.is_floating_point or index.ndim != 1:
                raise TypeError(f"{self.name}: rows are selected by an int, a slice or a 1-D integer or boolean "
                                f"tensor, not {index.dtype} of shape {tuple(index.shape)}.")
            out = self._rows(index)
        return out[(slice(None), *rest)] if rest else out

    def _selected(self, rows: torch.Tensor) -> torch.Tensor:
        for dim, index in self.selects:
            rows = rows.select(dim, index)
        return rows

    def _checked(self, rows: torch.Tensor) -> torch.Tensor:
        # A sum is not finite whenever an entry is not (or it overflows, then the full test decides).
        if rows.numel() and not torch.isfinite(rows.sum()) and not torch.isfinite(rows).all():
            raise ValueError(f"{self.name} contains NaN or infinite values; check the backbone's output (e.g. "
                             "for fp16 overflow) or the head.")
        return rows

    def _through(self, stored: torch.Tensor) -> torch.Tensor:
        """Stored rows (B, *lead, D) -> float32 (B, *lead, D') on the device, through the transform."""
        x = as_float32(stored, self.device)
        if self.transform is None:
            return x
        flat = self.transform(x.reshape(-1, x.shape[-1]))
        return self._checked(flat.reshape(*x.shape[:-1], flat.shape[-1]))

    def _block(self, i: int) -> torch.Tensor:
        """Block i of the whole stored tensor (rows i·R .. (i+1)·R), computed once and kept."""
        if self.kept.index != i:
            self.kept.index, self.kept.rows = None, None  # the old block goes before the new one is computed
            start = i * self.rows_per_block
            self.kept.rows = self._through(self.stored[start : start + self.rows_per_block])
            self.kept.index = i
        return self.kept.rows

    def _slice(self, start: int, stop: int) -> torch.Tensor:
        """Rows start .. stop of this view."""
        start, stop = self.first + start, self.first + stop
        if self.transform is None:
            return self._selected(self._checked(as_float32(self.stored[start:stop], self.device)))
        if start == stop:
            return torch.empty((0, *self.shape[1:]), device=self.device)
        r = self.rows_per_block
        parts = [self._block(i)[max(start - i * r, 0) : stop - i * r] for i in range(start // r, (stop - 1) // r + 1)]
        return self._selected(parts[0] if len(parts) == 1 else torch.cat(parts))

    def _rows(self, index: torch.Tensor) -> torch.Tensor:
        """Rows `index` (1-D int) of this view."""
        index = index.to(torch.int64)
        if index.numel() and (int(index.min()) < -self.count or int(index.max()) >= self.count):
            raise IndexError(f"{self.name}: row index out of range for its {self.count} rows.")
        index = torch.where(index < 0, index + self.count, index) + self.first
        r = self.rows_per_block
        blocks = index // r
        if self.transform is not None and index.numel() and bool((blocks == blocks[0]).all()) and (
                self.kept.index == int(blocks[0]) or self.stored.shape[0] <= r):
            block = int(blocks[0])
            return self._selected(self._block(block)[(index - block * r).to(self.device)])
        gathered = gather_rows(self.stored, index.cpu()) if self.stored.device.type == "cpu" else \
            self.stored[index.to(self.stored.device)]
        if self.transform is None:
            return self._selected(self._checked(as_float32(gathered, self.device)))
        if not len(gathered):
            return torch.empty((0, *self.shape[1:]), device=self.device)
        return self._selected(torch.cat([self._through(gathered[s : s + r]) for s in range(0, len(gathered), r)]))


def materialise(x):
    """The whole tap as a tensor: a tensor (or None) is returned as it is; a `TapRows` gives its float32 rows,
    computed block by block into one preallocated tensor (a tap of one block: that block; untransformed float32
    features already on the device: a view of them, as `as_float32` gives)."""
    if not isinstance(x, TapRows):
        return x
    n = len(x)
    if x.transform is None or n == 0:
        return x[0:n]
    r = x.rows_per_block
    first_block, last_block = x.first // r, (x.first + n - 1) // r
    if first_block == last_block:
        return x[0:n]
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    start = 0
    while start < n:
        stop = min(n, ((x.first + start) // r + 1) * r - x.first)
        out[start:stop] = x[start:stop]
        start = stop
    return out
