"""The on-disk feature cache's files: one safetensors file per key, a checksum of every tensor in its metadata
(verified on every load), written under a temporary name and renamed; see `features` for what is cached."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from pathlib import Path

import torch

__all__ = ["FORMAT_VERSION", "cache_root", "load_cached", "save_cached", "tensor_checksum"]

FORMAT_VERSION = 2  # 2: per-tensor checksums in the metadata


def tensor_checksum(tensor: torch.Tensor, algorithm: str | None = None) -> str:
    """``"<algorithm>:<hex digest>"`` of a CPU tensor's raw bytes: xxh3-128 when `xxhash` is installed (several
    GB/s), else BLAKE2b-128 (standard library). `algorithm` ("xxh3_128" | "blake2b") recomputes a recorded one."""
    algorithm = algorithm or ("xxh3_128" if _xxhash() is not None else "blake2b")
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    if algorithm == "xxh3_128":
        xxhash = _xxhash()
        if xxhash is None:
            raise ValueError("it was checksummed with xxh3_128 and the xxhash package is not installed")
        return f"xxh3_128:{xxhash.xxh3_128_hexdigest(raw)}"
    if algorithm == "blake2b":
        return f"blake2b:{hashlib.blake2b(raw, digest_size=16).hexdigest()}"
    raise ValueError(f"its checksum algorithm {algorithm!r} is unknown")


def _xxhash():
    try:
        import xxhash
    except ImportError:
        return None
    return xxhash


def cache_root() -> Path:
    return Path(os.environ.get("HEADPROBE_CACHE", Path.home() / ".cache" / "headprobe")).expanduser()


def load_cached(path: Path, key: str, n: int, labels: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(features, labels-or-params) from a cache file whose key, row count and checksums match (and whose labels
    equal `labels`, when given), else None; an unusable file is reported and deleted."""
    from safetensors import safe_open

    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            second = meta.get("second", "labels")
            feats = f.get_tensor("features")
            stored = f.get_tensor(second)
        if meta.get("key") != key or feats.shape[0] != n or stored.shape[0] != n:
            raise ValueError(f"it holds {feats.shape[0]} rows for key {meta.get('key')!r}, expected {n} for {key!r}")
        checksums = json.loads(meta.get("checksums", "null"))
        if not isinstance(checksums, dict):
            raise ValueError("it records no checksums of its tensors")
        for name, tensor in (("features", feats), (second, stored)):
            recorded = checksums.get(name)
            if not isinstance(recorded, str) or tensor_checksum(tensor, recorded.partition(":")[0]) != recorded:
                raise ValueError(f"the checksum of its {name!r} tensor does not match its content (corrupted "
                                 "or edited)")
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


def save_cached(
    path: Path, key: str, description: dict, feats: torch.Tensor, labels: torch.Tensor, second: str = "labels"
) -> bool:
    """Write one cache file (temporary name, then rename); False, with one warning per cache folder, when it
    cannot be written (read-only or full): the cache is an optimisation, the run goes on without it."""
    from safetensors.torch import save_file

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tensors = {"features": feats.contiguous(), second: labels.contiguous()}
    checksums = {name: tensor_checksum(t) for name, t in tensors.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(tmp), metadata={"key": key, "second": second, "checksums": json.dumps(checksums),
                                               "description": json.dumps(description, default=str)})
        os.replace(tmp, path)
    except Exception as err:  # OSError, or safetensors' own error wrapping one (read-only, disk full)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        folder = path.parent.parent
        if folder not in _UNWRITABLE:
            _UNWRITABLE.add(folder)
            warnings.warn(f"the feature cache {folder} cannot be written ({type(err).__name__}: {err}); carrying "
                          "on without caching (point HEADPROBE_CACHE at a writable folder, or set "
                          "features.cache: false).", stacklevel=3)
        return False
    return True
