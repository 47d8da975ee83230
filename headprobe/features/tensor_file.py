"""safetensors files used without loading them whole: the JSON header (never unpickled), checksums of a tensor's
bytes computed in fixed-size chunks, tensors memory-mapped from the file, their resident pages handed back, and a
writer that streams tensors to disk chunk by chunk.

A mapped tensor is an ordinary CPU tensor over a private (copy-on-write) mapping of the file: nothing is read until it
is indexed. Indexing scattered rows through the mapping would map far more than the rows (the kernel maps whole
page-cache folios around each fault: 5,120 random 1.5 KiB rows of a 293 MiB file left all of it resident,
`benchmarks/results/choices.json`, `mapped_rows`), so `gather_rows` reads a batch's rows with one `pread` each into a
fresh tensor, which touches no mapped page: training over a view cache larger than memory holds the batch, not the file
(peak RSS 853 MiB over a 5.7 GiB view cache, at 0.94x the in-memory steps/s: `benchmarks/results/memmap.json`).
Sequential passes (`mean_over_rows`) go through the mapping a chunk at a time and `release_pages` drops what they
mapped from the resident set (the kernel's page cache may keep it; the next read faults it back in).

Writing into a mapped tensor changes this process's copy only, never the file, and `release_pages` discards such
writes: treat mapped tensors as read-only. A file replaced by a rename (how the feature cache writes) leaves existing
mappings on the old file; a file edited in place changes them, and truncating it makes their reads fail (SIGBUS), so
never edit a cache file in place while a run uses it: `changed_mappings` tells (the run checks it as each stage that
read the files ends, `feature_cache.UnchangedCache`).

Why not safetensors' own reader and writer: `safe_open` and `load_file` hand out whole tensors or contiguous slices,
and `save_file` needs every tensor in memory; none gathers scattered rows without mapping pages, checksums in chunks
or streams a tensor to disk. The files stay plain safetensors: `safe_open` reads them, and the cache writes with
`save_file` wherever the tensors fit in memory.

>>> entries, meta = read_header(path)  # doctest: +SKIP
>>> views = map_tensors(path, entries)["features"]  # doctest: +SKIP
>>> batch = gather_rows(views, idx, v1)  # (B, D): B reads, no mapped page  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["CHUNK_BYTES", "TensorEntry", "changed_mappings", "checksum_hasher", "file_checksum", "gather_rows",
           "is_mapped", "map_tensors", "mean_over_rows", "read_header", "release_pages", "write_streamed"]

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
CODES = {dtype: code for code, dtype in DTYPES.items()}
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit
CHUNK_BYTES = 16 * 2**20  # what checksumming and streamed writing hold at a time


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a file: dtype, shape, and where its bytes are (absolute offset in the file, length)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    nbytes: int


def read_header(path: Path | str) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """({name: TensorEntry}, the file's metadata) from a safetensors header, checked against the file's size, so a
    truncated or hand-edited file fails here with a sentence rather than later with a crash."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ValueError(f"it has {size} bytes, fewer than a safetensors header's 8-byte length")
        n = int.from_bytes(prefix, "little")
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise ValueError(f"its header claims {n} bytes and the file has {size} (truncated or not safetensors)")
        header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    entries = {}
    for name, entry in header.items():
        try:
            dtype, shape = DTYPES[entry["dtype"]], tuple(int(s) for s in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"its header entry for {name!r} is malformed ({entry!r})") from None
        nbytes = math.prod(shape) * dtype.itemsize
        if begin < 0 or end - begin != nbytes or 8 + n + end > size:
            raise ValueError(f"its tensor {name!r} ({list(shape)}, {entry['dtype']}) needs bytes {begin}..{end} "
                             f"of the data and the file has {size - 8 - n} (truncated)")
        entries[name] = TensorEntry(dtype, shape, 8 + n + begin, nbytes)
    return entries, meta


def checksum_hasher(algorithm: str):
    """A streaming hasher (`.update`, `.hexdigest`) for "xxh3_128" (the `xxhash` package) or "blake2b" (128 bits)."""
    if algorithm == "xxh3_128":
        try:
            import xxhash
        except ImportError:
            raise ValueError("it was checksummed with xxh3_128 and the xxhash package is not installed") from None
        return xxhash.xxh3_128()
    if algorithm == "blake2b":
        return hashlib.blake2b(digest_size=16)
    raise ValueError(f"its checksum algorithm {algorithm!r} is unknown")


def file_checksum(path: Path | str | int, entry: TensorEntry, algorithm: str) -> str:
    """``"<algorithm>:<hex digest>"`` of one tensor's bytes read from the file (a path, or the descriptor of an open
    one) in `CHUNK_BYTES` pieces (ordinary reads into one reused buffer, not a mapping, so the resident set stays
    bounded); equals `feature_cache.tensor_checksum` of the loaded tensor."""
    if not isinstance(path, int):
        with Path(path).open("rb", buffering=0) as f:
            return file_checksum(f.fileno(), entry, algorithm)
    hasher = checksum_hasher(algorithm)
    buffer = memoryview(bytearray(max(1, min(CHUNK_BYTES, entry.nbytes))))
    offset, left = entry.start, entry.nbytes
    while left:
        got = os.preadv(path, [buffer[: min(left, len(buffer))]], offset)
        if not got:
            raise ValueError("it ends inside its tensor data (truncated)")
        hasher.update(buffer[:got])
        offset, left = offset + got, left - got
    return f"{algorithm}:{hasher.hexdigest()}"


@dataclass(frozen=True)
class _Mapping:
    """A live mapping of a whole file: the mmap (weakly: mapped tensors keep it alive), its length, the open file
    (closed with the mmap) that `gather_rows` reads from, its path, its identity when it was mapped (`_identity`)
    and the checksums verified through it ({name: (entry, checksum)})."""

    mm: weakref.ref
    length: int
    file: object
    path: str
    identity: tuple[int, ...]
    verified: dict


_MAPPINGS: dict[int, _Mapping] = {}  # by base address


def _identity(fd: int) -> tuple[int, ...]:
    """What changes when a file is written: device, inode, size, modification time (ns). Not the status-change
    time: a rename onto the file's name changes it too (the old inode loses its link), which changes no byte. A
    same-size rewrite that sets the modification time back (``rsync --inplace --times``) shows only in the checksums."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def map_tensors(path: Path | str, entries: dict[str, TensorEntry], checksums: dict[str, str] | None = None
                ) -> dict[str, torch.Tensor]:
    """{name: CPU tensor over a private mapping of the file}: nothing is read until it is indexed. `checksums`
    ({name: "<algorithm>:<hex>"}) are verified first through the very file that is mapped (ValueError when one
    does not match), and kept with the mapping so `changed_mappings` can verify them again."""
    f = Path(path).open("rb", buffering=0)
    try:
        identity = _identity(f.fileno())
        verified = {}
        for name, recorded in (checksums or {}).items():
            if file_checksum(f.fileno(), entries[name], recorded.partition(":")[0]) != recorded:
                raise ValueError(f"the checksum of its {name!r} tensor does not match its content (corrupted or "
                                 "edited)")
            verified[name] = (entries[name], recorded)
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # writable for torch, never written back
    except BaseException:
        f.close()
        raise
    weakref.finalize(mm, f.close)
    whole = np.frombuffer(mm, dtype=np.uint8)
    for base, mapping in list(_MAPPINGS.items()):
        if mapping.mm() is None:
            del _MAPPINGS[base]
    _MAPPINGS[whole.ctypes.data] = _Mapping(weakref.ref(mm), len(mm), f, str(path), identity, verified)
    out = {}
    for name, entry in entries.items():
        raw = torch.from_numpy(whole[entry.start : entry.start + entry.nbytes])
        out[name] = raw.view(entry.dtype).view(entry.shape) if entry.nbytes else torch.empty(entry.shape,
                                                                                            dtype=entry.dtype)
    return out


def _mapping_of(tensor: torch.Tensor) -> tuple[int, _Mapping] | None:
    """(base address, mapping) of the live mapping `tensor` lies in, else None."""
    if tensor.device.type != "cpu":
        return None
    ptr = tensor.untyped_storage().data_ptr()
    for base, mapping in _MAPPINGS.items():
        if base <= ptr < base + mapping.length and mapping.mm() is not None:
            return base, mapping
    return None


def changed_mappings(tensors: Iterable[torch.Tensor], checksums: bool = True) -> list[str]:
    """"<path>: <what changed>" for each file that one of `tensors` is mapped from (ordinary tensors are skipped)
    and that changed since it was mapped: its identity (`_identity`, read from the open file, so a file replaced by
    a rename, whose old inode the mapping keeps, has not changed) or, with `checksums`, the checksums verified when
    it was mapped, computed again from the file."""
    seen, changed = set(), []
    for tensor in tensors:
        found = _mapping_of(tensor)
        if found is None or found[0] in seen:
            continue
        seen.add(found[0])
        mapping = found[1]
        fd = mapping.file.fileno()
        now = _identity(fd)
        if now != mapping.identity:
            what = "size" if now[2] != mapping.identity[2] else "modification time"
            changed.append(f"{mapping.path}: its {what} changed (written in place)")
            continue
        for name, (entry, recorded) in mapping.verified.items() if checksums else ():
            try:
                again = file_checksum(fd, entry, recorded.partition(":")[0])
            except ValueError as err:
                again = str(err)
            if again != recorded:
                changed.append(f"{mapping.path}: the checksum of its {name!r} tensor no longer matches")
                break
    return changed


def is_mapped(tensor: torch.Tensor) -> bool:
    """Whether `tensor` lies in a file mapping made by `map_tensors`."""
    return _mapping_of(tensor) is not None


def gather_rows(tensor: torch.Tensor, *index: torch.Tensor) -> torch.Tensor:
    """``tensor[index]`` for integer index tensors over its leading dimensions (``views[idx, v]``: (B, D)). For a
    mapped tensor whose trailing dimensions are contiguous, each row is read from the file with one `pread` into
    the result, so no mapped page becomes resident; otherwise this is ordinary indexing. The values are the same."""
    found = _mapping_of(tensor)
    lead = len(index)
    if found is None or not hasattr(os, "preadv") or not tensor[(0,) * lead].is_contiguous() or tensor.numel() == 0:
        return tensor[index]
    base, mapping = found
    for dim, i in enumerate(index):
        if i.numel() and (int(i.min()) < 0 or int(i.max()) >= tensor.shape[dim]):
            raise IndexError(f"index {int(i.max()) if int(i.min()) >= 0 else int(i.min())} is out of bounds for "
                             f"dimension {dim} with size {tensor.shape[dim]}")
    item = tensor.element_size()
    offsets = sum((i.to(torch.int64) * stride for i, stride in zip(index, tensor.stride(), strict=False)),
                  torch.zeros((), dtype=torch.int64)) * item + (tensor.data_ptr() - base)
    out = torch.empty((len(offsets), *tensor.shape[lead:]), dtype=tensor.dtype)
    flat = memoryview(out.view(torch.uint8).numpy().reshape(-1))
    fd, row_bytes = mapping.file.fileno(), tensor[(0,) * lead].numel() * item
    for r, offset in enumerate(offsets.tolist()):
        if os.preadv(fd, [flat[r * row_bytes : (r + 1) * row_bytes]], offset) != row_bytes:
            raise OSError(f"the mapped file ended inside row {r} (truncated while in use)")
    return out


def release_pages(tensor: torch.Tensor) -> bool:
    """Drop the resident pages of the mapping `tensor` lies in (`madvise(MADV_DONTNEED)`); False, doing nothing,
    for an ordinary tensor or where the platform has no madvise."""
    found = _mapping_of(tensor)
    mm = found[1].mm() if found is not None else None
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    mm.madvise(mmap.MADV_DONTNEED)
    return True


def write_streamed(path: Path | str, tensors: dict[str, tuple[torch.dtype, tuple[int, ...], Iterable[torch.Tensor]]],
                   metadata: dict[str, str], algorithm: str) -> dict[str, str]:
    """Write a safetensors file whose tensors arrive in chunks: {name: (dtype, shape, chunks)}, each tensor's chunks
    in row order, together exactly its bytes. Each tensor's checksum (`algorithm`) is computed as it is written and
    stored as JSON in the metadata under "checksums" (the feature cache's format); returns them. Holds one chunk at
    a time, so a file larger than memory can be written."""
    digest_len = len(checksum_hasher(algorithm).hexdigest())
    placeholder = {name: f"{algorithm}:{'0' * digest_len}" for name in tensors}
    header, offset = {}, 0
    for name, (dtype, shape, _) in tensors.items():
        nbytes = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": CODES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes

    def encoded(checksums: dict[str, str]) -> bytes:
        blob = json.dumps({"__metadata__": metadata | {"checksums": json.dumps(checksums)}, **header}).encode()
        return blob + b" " * (-(8 + len(blob)) % 8)  # the data starts 8-byte aligned, as safetensors writes it

    first = encoded(placeholder)
    checksums = {}
    with Path(path).open("wb") as f:
        f.write(len(first).to_bytes(8, "little") + first)
        for name, (dtype, shape, chunks) in tensors.items():
            hasher, written = checksum_hasher(algorithm), 0
            for chunk in chunks:
                if chunk.dtype != dtype:
                    raise ValueError(f"a chunk of {name!r} is {chunk.dtype}, the tensor is declared {dtype}")
                raw = chunk.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
                hasher.update(raw)
                f.write(memoryview(raw))
                written += raw.nbytes
            expected = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            if written != expected:
                raise ValueError(f"the chunks of {name!r} hold {written} bytes; its shape {list(shape)} needs "
                                 f"{expected}")
            checksums[name] = f"{algorithm}:{hasher.hexdigest()}"
        final = encoded(checksums)
        if len(final) != len(first):
            raise RuntimeError("the header changed length when its checksums were filled in")
        f.seek(8)
        f.write(final)
    return checksums


def mean_over_rows(tensor: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """The mean of `tensor` (N, ..., D) over every dimension but the last → (D,), in its dtype, summed in float64
    over chunks of `rows` leading rows (default: `CHUNK_BYTES` of them; a mapped tensor's pages are released after
    each), so it holds one chunk and its value does not depend on where the tensor lives."""
    if rows is None:
        rows = max(1, CHUNK_BYTES // max(1, tensor[:1].numel() * tensor.element_size()))
    total = torch.zeros(tensor.shape[-1], dtype=torch.float64, device=tensor.device)
    for start in range(0, tensor.shape[0], rows):
        total += tensor[start : start + rows].reshape(-1, tensor.shape[-1]).sum(0, dtype=torch.float64)
        release_pages(tensor)
    return (total / max(1, tensor[..., 0].numel())).to(tensor.dtype)
