"""A cache file written by W processes at once (`features.parallel_file`), simulated with W writers in one process:
the same tensors, byte for byte, as `save_cached` of the whole tensors, checksums `load_cached` verifies, and a file
left unfinished is never a hit."""

import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from headprobe.features import parallel_file
from headprobe.features.cache import checksum_algorithm, file_metadata, load_cached, save_cached, store_dtype_of
from headprobe.features.parallel_file import ParallelCacheFile, RowWriter, create_file, remove_abandoned, seal_file
from headprobe.features.tensor_file import is_mapped, read_header


@dataclass
class OneProcess:
    num_processes: int = 1
    process_index: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0


def _data_bytes(path):
    """The bytes after the header (every tensor's data) and the header as JSON."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return raw[8 + n :], json.loads(raw[8 : 8 + n])


def _write_in_parallel(path, feats, second, name, store_dtype, world, batch, seed=0):
    """What W processes do, in one process: process 0 creates the file and writes `second` (labels: whole; params:
    each process its rows), each process r writes its interleaved rows r, r + W, ... in batches of `batch`, the
    batches of all processes in a shuffled order; then process 0 seals and renames."""
    n = feats.shape[0]
    dtype = store_dtype_of(store_dtype)
    shapes = {"features": (dtype, tuple(feats.shape)), name: (second.dtype, tuple(second.shape))}
    metadata = file_metadata("key", {"what": "test"}, name)
    tmp = path.with_name(f".{path.name}.tmp")
    entries = create_file(tmp, shapes, metadata, checksum_algorithm())
    writers = [RowWriter(tmp, entries) for _ in range(world)]
    flat = feats.reshape(-1, feats.shape[-1]).to(dtype)
    flat_second = second.reshape(flat.shape[0], -1) if name == "params" else None
    jobs = []
    for rank in range(world):
        mine = list(range(rank, flat.shape[0], world))
        for start in range(0, len(mine), batch):
            jobs.append((rank, mine[start], mine[start : start + batch]))
    random.Random(seed).shuffle(jobs)
    for rank, first, rows in jobs:
        writers[rank].write("features", flat[rows], first, world)
        if flat_second is not None:
            writers[rank].write(name, flat_second[rows], first, world)
    if flat_second is None:
        writers[0].write(name, second)
    for writer in writers:
        writer.close()
    seal_file(tmp, shapes, metadata, checksum_algorithm())
    os.replace(tmp, path)
    assert n == second.shape[0]


@pytest.mark.parametrize("store_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_w_writers_make_the_file_save_cached_makes(tmp_path, store_dtype, world):
    g = torch.Generator().manual_seed(world)
    feats, labels = torch.randn(23, 6, generator=g), torch.randint(0, 10, (23,), generator=g)
    whole, parallel = tmp_path / "whole.safetensors", tmp_path / "parallel.safetensors"
    assert save_cached(whole, "key", {"what": "test"}, feats, labels, store_dtype=store_dtype)
    _write_in_parallel(parallel, feats, labels, "labels", store_dtype, world, batch=4)
    (data_whole, header_whole), (data_parallel, header_parallel) = _data_bytes(whole), _data_bytes(parallel)
    assert data_parallel == data_whole  # every tensor's bytes, at the same offsets
    assert header_parallel == header_whole  # the same entries, metadata and checksums (JSON order aside)
    for mapped in (False, True):
        hit = load_cached(parallel, "key", 23, labels, mapped=mapped, store_dtype=store_dtype)
        assert hit is not None and is_mapped(hit[0]) == mapped
        assert torch.equal(hit[0].float(), feats.to(store_dtype_of(store_dtype)).float())


def test_view_features_and_their_params_written_by_flat_row(tmp_path):
    """Views (N, K, D) and params (N, K, P): flat row j = view j % K of image j // K, each process its rows."""
    g = torch.Generator().manual_seed(0)
    feats, params = torch.randn(11, 3, 5, generator=g), torch.rand(11, 3, 4, generator=g)
    whole, parallel = tmp_path / "whole.safetensors", tmp_path / "parallel.safetensors"
    assert save_cached(whole, "key", {"what": "test"}, feats, params, second="params", store_dtype="float16")
    _write_in_parallel(parallel, feats, params, "params", "float16", world=2, batch=3)
    assert _data_bytes(parallel) == _data_bytes(whole)
    hit = load_cached(parallel, "key", 11, mapped=True, store_dtype="float16")
    assert torch.equal(hit[1], params) and torch.equal(hit[0], feats.half())


def test_an_unsealed_or_truncated_file_is_refused(tmp_path):
    """A file whose rows were written but whose checksums were not (a writer killed before `seal_file`), or that is
    cut short, is never a hit, even under the final name."""
    feats, labels = torch.randn(10, 4), torch.arange(10)
    path = tmp_path / "f.safetensors"
    shapes = {"features": (torch.float32, (10, 4)), "labels": (torch.int64, (10,))}
    metadata = file_metadata("key", {}, "labels")
    entries = create_file(path, shapes, metadata, checksum_algorithm())
    writer = RowWriter(path, entries)
    writer.write("features", feats)
    writer.write("labels", labels)
    writer.close()
    with pytest.warns(UserWarning, match="checksum of its 'features' tensor does not match"):
        assert load_cached(path, "key", 10, labels) is None
    assert not path.exists()  # an unusable file is deleted
    _write_in_parallel(path, feats, labels, "labels", "float32", world=2, batch=3)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.warns(UserWarning, match="truncated"):
        assert load_cached(path, "key", 10, labels) is None


def test_rows_outside_the_tensor_or_of_another_dtype_are_refused(tmp_path):
    entries = create_file(tmp_path / "f", {"features": (torch.float32, (4, 2))}, {}, checksum_algorithm())
    writer = RowWriter(tmp_path / "f", entries)
    with pytest.raises(IndexError, match="row 4"):
        writer.write("features", torch.zeros(2, 2), first=2, step=2)
    with pytest.raises(ValueError, match="float16"):
        writer.write("features", torch.zeros(1, 2).half())
    writer.close()


def test_one_process_opens_writes_and_commits_through_the_collective_steps(tmp_path):
    path = tmp_path / "features" / "k.safetensors"
    feats, labels = torch.randn(9, 3), torch.arange(9)
    shapes = {"features": (torch.float32, (9, 3)), "labels": (torch.int64, (9,))}
    shared = ParallelCacheFile.open(path, shapes, file_metadata("k", {}), OneProcess(), checksum_algorithm())
    assert shared.tmp.exists() and not path.exists()  # a file being written is never under the final name
    shared.write("features", feats)
    shared.write("labels", labels)
    assert shared.commit() and not shared.tmp.exists()
    hit = load_cached(path, "k", 9, labels, mapped=True)
    assert torch.equal(hit[0], feats) and is_mapped(hit[0])
    assert not os.access(path, os.W_OK) or os.geteuid() == 0  # read-only, as every cache file


def test_a_failed_write_fails_the_commit_and_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "k.safetensors"
    shapes = {"features": (torch.float32, (4, 2)), "labels": (torch.int64, (4,))}
    shared = ParallelCacheFile.open(path, shapes, file_metadata("k", {}), OneProcess(), checksum_algorithm())

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(parallel_file.os, "pwrite", full)
    shared.write("features", torch.zeros(4, 2))
    monkeypatch.undo()
    with pytest.warns(UserWarning, match="could not be completed .*No space left"):
        assert not shared.commit()
    assert sorted(tmp_path.iterdir()) == []


def test_an_unwritable_folder_opens_nothing(tmp_path, monkeypatch):
    """Process 0 cannot create the file (a read-only or full cache folder): every process falls back, nothing is
    left behind."""

    def read_only(path, *args):
        Path(path).write_bytes(b"half")  # what a failed creation may leave
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(parallel_file, "create_file", read_only)
    with pytest.warns(UserWarning, match="cannot be written by every process .*Permission denied"):
        assert ParallelCacheFile.open(tmp_path / "k.safetensors", {"features": (torch.float32, (2, 2))}, {},
                                      OneProcess(), checksum_algorithm()) is None
    assert list(tmp_path.iterdir()) == []


def test_abandoned_temporaries_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    path = tmp_path / "k.safetensors"
    host = parallel_file._host_token()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    killed = path.with_name(f".{path.name}.{dead_pid}.{host}-00aa.tmp")
    live = path.with_name(f".{path.name}.{os.getpid()}.{host}-00bb.tmp")
    remote_new = path.with_name(f".{path.name}.{dead_pid}.ffffffff-00cc.tmp")
    remote_old = path.with_name(f".{path.name}.{dead_pid}.eeeeeeee-00dd.tmp")
    other_file = path.with_name(f".other.safetensors.{dead_pid}.{host}-00ee.tmp")
    for tmp in (killed, live, remote_new, remote_old, other_file):
        tmp.write_bytes(b"x")
    old = remote_old.stat().st_mtime - parallel_file.ABANDONED_AFTER_S - 60
    os.utime(remote_old, (old, old))
    assert sorted(remove_abandoned(path)) == sorted([killed, remote_old])
    assert live.exists() and remote_new.exists() and other_file.exists()


def test_the_header_lays_the_tensors_out_as_safetensors_does(tmp_path):
    """Every dtype pair the cache writes: the data offsets of `create_file` are save_file's."""
    for dtype in ("float32", "float16", "bfloat16"):
        for second in (torch.arange(3), torch.zeros(3, 2)):
            whole = tmp_path / f"{dtype}-{second.dtype}.safetensors"
            save_cached(whole, "k", {}, torch.zeros(3, 2), second, store_dtype=dtype)
            shapes = {"features": (store_dtype_of(dtype), (3, 2)), "labels": (second.dtype, tuple(second.shape))}
            entries = create_file(tmp_path / "new", shapes, file_metadata("k", {}), checksum_algorithm())
            assert {name: e.start for name, e in entries.items()} == {
                name: e.start for name, e in read_header(whole)[0].items()}
