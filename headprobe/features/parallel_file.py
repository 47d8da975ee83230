"""One cache file written by every process of a multi-process run at once, each `pwrite`-ing its own rows.

Why one file and not one shard file per process plus an index: a cache file written this way is an ordinary cache
file (`features.cache`), the one a single process writes: the same tensors at the same offsets of the data (tensors
ordered as safetensors' `save_file` orders them), the same metadata and checksums. Its readers are the cache-hit
path unchanged: every process memory-maps it (`tensor_file.map_tensors`) and reads rows by index (`gather_rows`),
and a later run with any number of processes hits it. Shard files would need a row-source class in every consumer
(probes, head training, geometry) and an index that a different process count reads differently. Only the header's
byte order can differ from `save_file`'s, whose metadata order varies from one process to the next.

How (`ParallelCacheFile`, every process calls each step, collectively):

1. `open`: process 0 creates the file under a temporary name (``.<name>.<pid>.<host>-<token>.tmp``) at its final size,
   its header written with placeholder checksums of the final length, so every tensor's offset is known; every
   process opens it and checks that it sees that very header (a node that does not share the cache folder sees no
   file, or another one). Unless all of them do, the file is removed and the caller falls back (`None`).
2. `write`: each process writes its rows where they belong (row j of a tensor at its offset + j × row bytes), in
   any order; nothing is gathered and no process holds more than the batch it writes.
3. `commit`: a barrier; process 0 computes the checksums by a streamed read (`tensor_file.file_checksum`), rewrites
   the header, makes the file read-only and renames it into place. Every process learns whether that succeeded.

A file being written never counts as a hit: it has its temporary name until it is complete. A run killed meanwhile
leaves only the temporary, which the next `open` for the same file removes (its writer's pid is dead on this host,
or, written from another host, it has not changed for `ABANDONED_AFTER_S`).

>>> shared = ParallelCacheFile.open(path, {"features": (torch.float32, (n, d)), "labels": (torch.int64, (n,))},
...                                 metadata, state)  # doctest: +SKIP
>>> shared.write("features", rows, first=state.process_index, step=state.num_processes)  # doctest: +SKIP
>>> shared.commit()  # True: the file is in place  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import secrets
import socket
import time
import warnings
from pathlib import Path

import torch

from headprobe.features.tensor_file import CODES, TensorEntry, checksum_hasher, file_checksum
from headprobe.parallel.atomic import writer_alive

__all__ = ["ABANDONED_AFTER_S", "ParallelCacheFile", "RowWriter", "create_file", "remove_abandoned", "seal_file"]

# safetensors' dtype order (its `Dtype` enum); `save_file` lays tensors out by descending dtype, then by name.
_SAFETENSORS_ORDER = ["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64"]
# A temporary from another host whose writer cannot be asked: abandoned when untouched this long (every batch a
# writer writes changes its modification time).
ABANDONED_AFTER_S = 24 * 3600.0

Shapes = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def _layout(shapes: Shapes) -> list[tuple[str, torch.dtype, tuple[int, ...], int, int]]:
    """[(name, dtype, shape, begin, end)] in save_file's order, offsets relative to the start of the data."""
    order = sorted(shapes, key=lambda name: (-_SAFETENSORS_ORDER.index(CODES[shapes[name][0]]), name))
    out, offset = [], 0
    for name in order:
        dtype, shape = shapes[name]
        nbytes = math.prod(shape) * dtype.itemsize
        out.append((name, dtype, tuple(shape), offset, offset + nbytes))
        offset += nbytes
    return out


def _header(shapes: Shapes, metadata: dict[str, str], checksums: dict[str, str]) -> bytes:
    """The 8-byte length and the JSON header, padded with spaces so the data starts 8-byte aligned (as save_file)."""
    header = {"__metadata__": metadata | {"checksums": json.dumps(checksums)}}
    for name, dtype, shape, begin, end in _layout(shapes):
        header[name] = {"dtype": CODES[dtype], "shape": list(shape), "data_offsets": [begin, end]}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-(8 + len(blob)) % 8)
    return len(blob).to_bytes(8, "little") + blob


def _placeholder(shapes: Shapes, algorithm: str) -> dict[str, str]:
    """Checksums of the final length (every digest of `algorithm` has the same), so the header keeps its length."""
    return {name: f"{algorithm}:{'0' * len(checksum_hasher(algorithm).hexdigest())}" for name in shapes}


def _entries(shapes: Shapes, header_bytes: int) -> dict[str, TensorEntry]:
    return {name: TensorEntry(dtype, shape, header_bytes + begin, end - begin)
            for name, dtype, shape, begin, end in _layout(shapes)}


def create_file(path: Path | str, shapes: Shapes, metadata: dict[str, str], algorithm: str
                ) -> dict[str, TensorEntry]:
    """Create `path` at its final size, its header holding placeholder checksums → {name: TensorEntry}. The data's
    blocks are allocated now where the file system can (`posix_fallocate`), so a full disk fails here, before any
    process has written a row, rather than in the middle of a write."""
    head = _header(shapes, metadata, _placeholder(shapes, algorithm))
    entries = _entries(shapes, len(head))
    size = len(head) + sum(entry.nbytes for entry in entries.values())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except (AttributeError, OSError) as err:  # not every file system allocates ahead (then: a sparse file)
            if isinstance(err, OSError) and err.errno == 28:  # ENOSPC: the disk is full
                raise
            os.ftruncate(fd, size)
        _pwrite_all(fd, head, 0)
    finally:
        os.close(fd)
    return entries


def seal_file(path: Path | str, shapes: Shapes, metadata: dict[str, str], algorithm: str) -> dict[str, str]:
    """Checksum every tensor of `path` (created by `create_file`, its rows all written) by a streamed read and write
    them into its header → the checksums. Holds one `CHUNK_BYTES` buffer whatever the file's size."""
    head = _header(shapes, metadata, _placeholder(shapes, algorithm))
    entries = _entries(shapes, len(head))
    fd = os.open(path, os.O_RDWR)
    try:
        checksums = {name: file_checksum(fd, entries[name], algorithm) for name in shapes}
        final = _header(shapes, metadata, checksums)
        if len(final) != len(head):
            raise RuntimeError("the header changed length when its checksums were filled in")
        _pwrite_all(fd, final, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    return checksums


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(f"a write at offset {offset} wrote nothing")
        view, offset = view[written:], offset + written


class RowWriter:
    """Writes rows of the tensors of a file made by `create_file`: row j of a tensor (its leading index, or the
    flat index over its leading dimensions when the rows given are narrower) goes to its offset + j × row bytes."""

    def __init__(self, path: Path | str, entries: dict[str, TensorEntry]) -> None:
        self.entries = entries
        self.fd = os.open(path, os.O_WRONLY)

    def write(self, name: str, rows: torch.Tensor, first: int = 0, step: int = 1) -> None:
        """rows: (B, ...) → rows first, first + step, ..., first + (B - 1)·step of tensor `name`, in its dtype."""
        entry = self.entries[name]
        if rows.dtype != entry.dtype:
            raise ValueError(f"rows of {name!r} are {rows.dtype}, the file holds it as {entry.dtype}")
        if not len(rows):
            return
        raw = rows.detach().cpu().contiguous().reshape(len(rows), -1).view(torch.uint8).numpy()
        row_bytes = raw.shape[1]
        last = first + (len(rows) - 1) * step
        if first < 0 or (last + 1) * row_bytes > entry.nbytes:
            raise IndexError(f"row {last} of {name!r} is past its {entry.nbytes // row_bytes} rows")
        if step == 1:
            _pwrite_all(self.fd, raw, entry.start + first * row_bytes)
            return
        for i, row in enumerate(raw):  # interleaved rows: one write each (a batch's rows are not adjacent)
            _pwrite_all(self.fd, row, entry.start + (first + i * step) * row_bytes)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _host_token() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def remove_abandoned(path: Path) -> list[Path]:
    """Remove the temporaries of `path` that killed writers left: from this host, those whose pid is dead; from
    another host, those untouched for `ABANDONED_AFTER_S`. Returns the removed paths."""
    removed, host = [], _host_token()
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        pid, _, rest = tmp.name[len(path.name) + 2 : -len(".tmp")].partition(".")
        with contextlib.suppress(OSError):
            if not pid.isdigit():
                continue
            if (writer_alive(int(pid)) if rest.startswith(host + "-")
                    else time.time() - tmp.stat().st_mtime < ABANDONED_AFTER_S):
                continue
            tmp.unlink()
            removed.append(tmp)
    return removed


class ParallelCacheFile:
    """A cache file every process of the run writes its rows into (see the module's docstring). `open`, `write` and
    `commit` are called by every process; `open` and `commit` are collective."""

    def __init__(self, path: Path, tmp: Path, shapes: Shapes, metadata: dict[str, str], algorithm: str,
                 writer: RowWriter, state) -> None:
        self.path, self.tmp, self.shapes, self.metadata, self.algorithm = path, tmp, shapes, metadata, algorithm
        self.writer, self.state, self.error = writer, state, None

    @classmethod
    def open(cls, path: Path, shapes: Shapes, metadata: dict[str, str], state, algorithm: str
             ) -> ParallelCacheFile | None:
        """Process 0 creates the temporary file; None on every process unless every process can write into that
        very file (the cache folder not writable, or not shared between the nodes)."""
        from headprobe.parallel.collectives import all_objects

        world, main = state.num_processes, state.process_index == 0
        tmp, problem = None, None
        if main:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{_host_token()}-{secrets.token_hex(4)}.tmp")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                remove_abandoned(path)
                create_file(tmp, shapes, metadata, algorithm)
            except OSError as err:
                problem = f"{type(err).__name__}: {err}"
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
        name, problem = all_objects((str(tmp), problem), world)[0]
        writer = None
        if problem is None:
            expected = _header(shapes, metadata, _placeholder(shapes, algorithm))
            try:
                with open(name, "rb") as f:
                    if f.read(len(expected)) != expected:
                        raise OSError(f"{name} is not the file process 0 created (the cache folder is not shared)")
                writer = RowWriter(name, _entries(shapes, len(expected)))
            except OSError as err:
                problem = f"process {state.process_index}: {type(err).__name__}: {err}"
        problems = [p for p in all_objects(problem, world) if p]
        if problems:
            if writer is not None:
                writer.close()
            if main and tmp is not None:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
            if main:
                warnings.warn(f"the feature cache file {path} cannot be written by every process at once "
                              f"({problems[0]}); gathering the features onto every process instead.", stacklevel=3)
            return None
        return cls(path, Path(name), shapes, metadata, algorithm, writer, state)

    def write(self, name: str, rows: torch.Tensor, first: int = 0, step: int = 1) -> None:
        """`RowWriter.write`; a failed write (an I/O error) is kept for `commit`, which then reports failure on
        every process, and later writes are skipped."""
        if self.error is not None:
            return
        try:
            self.writer.write(name, rows, first, step)
        except OSError as err:
            self.error = f"process {self.state.process_index}: {type(err).__name__}: {err}"

    def commit(self) -> bool:
        """Wait for every process's rows, then process 0 checksums, seals and renames the file into place → whether
        the file is in place (the same answer on every process). On failure the temporary is removed."""
        from headprobe.parallel.collectives import all_objects

        self.writer.close()
        world, main = self.state.num_processes, self.state.process_index == 0
        errors = [e for e in all_objects(self.error, world) if e]
        problem = errors[0] if errors else None
        if main:
            try:
                if problem is None:
                    seal_file(self.tmp, self.shapes, self.metadata, self.algorithm)
                    os.chmod(self.tmp, 0o444)  # read-only, as every cache file (`cache._write_atomically`)
                    os.replace(self.tmp, self.path)
            except OSError as err:
                problem = f"{type(err).__name__}: {err}"
            if problem is not None:
                with contextlib.suppress(OSError):
                    self.tmp.unlink(missing_ok=True)
                warnings.warn(f"the feature cache file {self.path} could not be completed ({problem}); the "
                              "features are extracted again and gathered onto every process.", stacklevel=3)
        return all_objects(problem, world)[0] is None
