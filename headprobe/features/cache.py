"""The on-disk feature cache's files: one safetensors file per key, a checksum of every tensor in its metadata
(verified on every load, in fixed-size chunks), written under a temporary name and renamed; see `features` for what
is cached. A hit is loaded whole, or memory-mapped (`mapped=True`: nothing is read until it is indexed, see
`tensor_file`), so a view cache larger than memory can be used.

Store dtype (`features.store_dtype`): the features tensor is stored as float32, float16 or bfloat16 (half the bytes
for the last two; the labels or view parameters stay as they are). A hit loaded whole comes back as float32; a
mapped hit stays in the stored dtype, mapped, and its readers upcast the rows they take (`as_float32`): the probes'
taps, the heads' batches and the geometry all compute in float32 or float64. A file whose features are not in the
dtype asked for is a miss, never a hit, whatever its key."""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from collections.abc import Iterable
from pathlib import Path

import torch

from headprobe.features.tensor_file import changed_mappings, checksum_hasher, map_tensors, read_header, write_streamed
from headprobe.parallel.atomic import replace_atomically

__all__ = ["FORMAT_VERSION", "STORE_DTYPES", "CacheChangedError", "UnchangedCache", "as_float32", "as_stored",
           "checksum_algorithm", "file_metadata", "load_cached", "save_cached", "save_cached_streamed",
           "store_dtype_of", "tensor_checksum"]

FORMAT_VERSION = 2  # 2: per-tensor checksums in the metadata
# features.store_dtype → the dtype the cache file holds the features in.
STORE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def store_dtype_of(name: str) -> torch.dtype:
    """The torch dtype of a `features.store_dtype` name; ValueError naming the allowed ones otherwise."""
    if name not in STORE_DTYPES:
        raise ValueError(f"features.store_dtype {name!r} is not a dtype the feature cache stores; use one of "
                         f"{', '.join(STORE_DTYPES)}.")
    return STORE_DTYPES[name]


def as_stored(feats: torch.Tensor, store_dtype: str) -> torch.Tensor:
    """`feats` rounded to the store dtype: what a cache file of that dtype will hold (float32 is returned as it is)."""
    dtype = store_dtype_of(store_dtype)
    return feats if feats.dtype == dtype else feats.to(dtype)


def as_float32(feats: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """`feats` as float32 (on `device`, when given): the upcast every reader of stored features applies; a float32
    tensor already there is returned as it is (a mapped one stays mapped)."""
    return feats.to(device=device, dtype=torch.float32)


def checksum_algorithm() -> str:
    """xxh3-128 when `xxhash` is installed (several GB/s), else BLAKE2b-128 (standard library)."""
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return "blake2b"
    return "xxh3_128"


def tensor_checksum(tensor: torch.Tensor, algorithm: str | None = None) -> str:
    """``"<algorithm>:<hex digest>"`` of a CPU tensor's raw bytes (`checksum_algorithm` unless `algorithm`,
    "xxh3_128" | "blake2b", recomputes a recorded one)."""
    algorithm = algorithm or checksum_algorithm()
    hasher = checksum_hasher(algorithm)
    hasher.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    return f"{algorithm}:{hasher.hexdigest()}"


def load_cached(path: Path, key: str, n: int, labels: torch.Tensor | None = None, mapped: bool = False,
                store_dtype: str = "float32") -> tuple[torch.Tensor, torch.Tensor] | None:
    """(features, labels-or-params) from a cache file whose key, row count, features dtype (`store_dtype`) and
    checksums match (and whose labels equal `labels`, when given), else None; an unusable file is reported and
    deleted. The checksums are computed over the file in chunks, so checking holds a few MiB whatever the file's
    size. mapped: the tensors are memory-mapped from the file (`tensor_file.map_tensors`) instead of loaded, the
    features in their stored dtype; loaded whole, the features come back as float32."""
    dtype = store_dtype_of(store_dtype)
    if not path.exists():
        return None
    try:
        entries, meta = read_header(path)
        second = meta.get("second", "labels")
        if "features" not in entries or second not in entries:
            raise ValueError(f"it holds the tensors {sorted(entries)}, not 'features' and {second!r}")
        rows = entries["features"].shape[0] if entries["features"].shape else 0
        if meta.get("key") != key or rows != n or (entries[second].shape or (0,))[0] != n:
            raise ValueError(f"it holds {rows} rows for key {meta.get('key')!r}, expected {n} for {key!r}")
        if entries["features"].dtype != dtype:
            raise ValueError(f"it stores its features as {entries['features'].dtype}, expected {dtype} "
                             f"(features.store_dtype: {store_dtype})")
        checksums = json.loads(meta.get("checksums", "null"))
        if not isinstance(checksums, dict):
            raise ValueError("it records no checksums of its tensors")
        for name in ("features", second):
            if not isinstance(checksums.get(name), str):
                raise ValueError(f"the checksum of its {name!r} tensor does not match its content (corrupted "
                                 "or edited)")
        # Verified through the file that is mapped: a rename onto `path` meanwhile cannot slip other bytes in.
        tensors = map_tensors(path, {name: entries[name] for name in ("features", second)},
                              {name: checksums[name] for name in ("features", second)})
        feats, stored = tensors["features"], tensors[second]
        if not mapped:
            feats = feats.clone() if feats.dtype == torch.float32 else feats.float()
            stored = stored.clone()
        if labels is not None and not torch.equal(stored, labels):
            wrong = int((stored != labels).sum()) if stored.shape == labels.shape else n
            raise ValueError(f"its labels differ from the dataset's at {wrong} of {n} images")
    except Exception as err:  # any unreadable file is a miss, never a crash
        warnings.warn(f"feature cache {path} is unusable ({err}); deleting it and recomputing.", stacklevel=3)
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return None
    return feats, stored


# Cache folders already reported as not writable in this process (one warning each, not one per file).
_UNWRITABLE: set[Path] = set()


def file_metadata(key: str, description: dict, second: str = "labels") -> dict[str, str]:
    """A cache file's metadata but its checksums (which every writer adds under "checksums", as JSON)."""
    return {"key": key, "second": second, "description": json.dumps(description, default=str)}


def save_cached(
    path: Path, key: str, description: dict, feats: torch.Tensor, labels: torch.Tensor, second: str = "labels",
    store_dtype: str = "float32",
) -> bool:
    """Write one cache file (temporary name, then rename), its features in `store_dtype`; False, with one warning
    per cache folder, when it cannot be written (read-only or full): the cache is an optimisation, the run goes on
    without it."""
    from safetensors.torch import save_file

    tensors = {"features": as_stored(feats, store_dtype).contiguous(), second: labels.contiguous()}
    checksums = {name: tensor_checksum(t) for name, t in tensors.items()}
    metadata = file_metadata(key, description, second) | {"checksums": json.dumps(checksums)}
    return _write_atomically(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def save_cached_streamed(path: Path, key: str, description: dict,
                         tensors: dict[str, tuple[torch.dtype, tuple[int, ...], Iterable[torch.Tensor]]],
                         second: str = "params") -> bool:
    """`save_cached` for tensors that arrive in row chunks ({"features": (dtype, shape, chunks), second: ...},
    `tensor_file.write_streamed`): one chunk is held at a time, so a cache larger than memory can be written."""
    if set(tensors) != {"features", second}:
        raise ValueError(f"a cache file holds 'features' and {second!r}, got {sorted(tensors)}")
    metadata = file_metadata(key, description, second)
    return _write_atomically(path, lambda tmp: write_streamed(tmp, tensors, metadata, checksum_algorithm()))


def _write_atomically(path: Path, write) -> bool:
    """write(temporary path), then rename it to `path`; False (one warning per cache folder) where that fails."""

    def write_read_only(tmp: Path) -> None:
        write(tmp)
        # Written once, then read-only: a new version comes by rename, never by writing into this file, so a run's
        # mapping of it keeps its bytes (UnchangedCache checks that nobody wrote into it anyway).
        os.chmod(tmp, 0o444)

    try:
        replace_atomically(path, write_read_only)
    except Exception as err:  # OSError, or safetensors' own error wrapping one (read-only, disk full)
        folder = path.parent.parent
        if folder not in _UNWRITABLE:
            _UNWRITABLE.add(folder)
            warnings.warn(f"the feature cache {folder} cannot be written ({type(err).__name__}: {err}); carrying "
                          "on without caching (point HEADPROBE_CACHE at a writable folder, or set "
                          "features.cache: false).", stacklevel=4)
        return False
    return True


class CacheChangedError(RuntimeError):
    """A memory-mapped cache file a run reads changed under it; nothing computed since its last check is recorded."""


# A full re-checksum costs at most 1/FULL_CHECK_SHARE of the time between two of them (the identity check, a few
# system calls, runs at every check).
FULL_CHECK_SHARE = 100


class UnchangedCache:
    """Proof that the memory-mapped cache files a run reads are the bytes it verified when it opened them, taken
    where they are read (`check`: the run calls it as each stage that read them ends, `RunContext.stage`): each
    file's identity (inode, size, modification time, from the open file) every time, and its checksums again at
    the end of the run and otherwise as often as costs at most 1/`FULL_CHECK_SHARE` of the run's time. A file
    replaced by a rename is not a change (the mapping keeps the old inode); a file written in place is. Tensors that
    are not mapped (loaded whole, or just extracted) cannot change and are not checked."""

    def __init__(self, tensors: Iterable[torch.Tensor]) -> None:
        from headprobe.features.tensor_file import is_mapped

        self.tensors = [t for t in tensors if t is not None and is_mapped(t)]
        self.checked_at, self.check_s = float("-inf"), 0.0

    def check(self, final: bool = False) -> None:
        """Raise `CacheChangedError` (a sentence naming each changed file and what to do) when one changed;
        final: the results about to be written are the run's last, so the checksums are verified whatever the
        cost."""
        if not self.tensors:
            return
        start = time.perf_counter()
        full = final or start - self.checked_at >= FULL_CHECK_SHARE * self.check_s
        changed = changed_mappings(self.tensors, checksums=full)
        if full:
            self.checked_at = time.perf_counter()
            self.check_s = self.checked_at - start
        if changed:
            raise CacheChangedError(
                "a feature cache file changed on disk while this run was reading it (" + "; ".join(changed) + "), "
                "so what was computed from it since the last write of results.json is not recorded. Cache files "
                "are replaced only by renaming a new file onto them; nothing should write into one. `headprobe run "
                "RECIPE --resume --out RUN_DIR` goes on from the last results written (a damaged cache file is "
                "detected and recomputed).")
