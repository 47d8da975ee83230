"""Two processes (torchrun, gloo on CPU, standing in for two nodes) extract into one cache file together
(`features.parallel_file`): the file and the features every process gets equal one process's, and nothing is
gathered (each process gets the file, memory-mapped).

Extraction on the CPU depends slightly on an image's batch (7e-7 on the tiny DINOv2: batches of 1 against 6), and
two processes batch other images together than one, so the files are bit for bit equal at batch size 1 and equal
to the float16 store's rounding otherwise; within a run every process gets exactly the file's bytes."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from timeouts import HANG_TIMEOUT_S

from headprobe.features.tensor_file import map_tensors, read_header

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SCRIPT = """
import json, os, sys
import torch
from headprobe.backbones import load_backbone
from headprobe.data import load_data
from headprobe.data.augment import augment_spec
from headprobe.features import extract as extraction
from headprobe.features import views as view_extraction
from headprobe.features.tensor_file import is_mapped
from headprobe.parallel.distributed import process_state
from headprobe.recipe import DataSpec, LimitSpec

checkpoint, out, store_dtype, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
state = process_state()
gather = extraction.gather_shards
if state.num_processes > 1:
    def refused(*args, **kwargs):
        raise AssertionError("the features were gathered onto every process")
    extraction.gather_shards = view_extraction.gather_shards = refused
backbone = load_backbone("hf:" + checkpoint)
data = load_data(DataSpec(limit=LimitSpec(train=37, test=5)))
options = {"data_info": data.info, "batch_size": batch, "mapped": True, "store_dtype": store_dtype, "state": state}
record = {}
for attempt in ("miss", "hit"):
    clean = extraction.extract(backbone, data.train, split="train", **options)
    views = view_extraction.extract_views(backbone, data.train, augment=augment_spec("crop-flip"), views=3,
                                          seed=0, **options)
    record[attempt] = {"cached": [clean.cached, views.cached], "mapped": [is_mapped(clean.features),
                       is_mapped(views.features), is_mapped(views.params)],
                       "files": [str(clean.path), str(extraction.cache_root() / "views" / f"{views.key}.safetensors")]}
    torch.save({"features": clean.features.clone(), "labels": clean.labels.clone(),
                "views": views.features.clone(), "params": views.params.clone()},
               os.path.join(out, f"{attempt}-{state.process_index}.pt"))
# The fallback: process 0 cannot create the shared file (a read-only cache folder), so the shards are gathered.
extraction.gather_shards = view_extraction.gather_shards = gather
if state.num_processes > 1:
    from headprobe.features import parallel_file
    def read_only(path, *args):
        raise PermissionError(13, "Permission denied", str(path))
    parallel_file.create_file = read_only
test = extraction.extract(backbone, data.test, split="test", **options)
record["fallback"] = {"cached": test.cached, "mapped": is_mapped(test.features)}
torch.save({"features": test.features.clone()}, os.path.join(out, f"fallback-{state.process_index}.pt"))
with open(os.path.join(out, f"record-{state.process_index}.json"), "w") as f:
    json.dump(record, f)
"""


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    entries, _ = read_header(path)
    return {name: t.clone() for name, t in map_tensors(path, entries).items()}


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="torchrun missing")
@pytest.mark.parametrize(("store_dtype", "batch"), [("float32", 1), ("float16", 6)])
def test_two_processes_write_one_cache_file_equal_to_one_process(tiny_dinov2, tmp_path, store_dtype, batch):
    def same(a: torch.Tensor, b: torch.Tensor, what) -> None:
        if batch == 1:
            assert a.dtype == b.dtype and torch.equal(a, b), what
        else:  # one float16 step apart at most, where the batch changed the last float32 bit
            torch.testing.assert_close(a.float(), b.float(), atol=2e-3, rtol=1e-3, msg=str(what))

    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    for name, launcher in (("one", [sys.executable]), ("two", [torchrun, "--nproc_per_node", "2"])):
        (tmp_path / name).mkdir()
        env = {**os.environ, "HEADPROBE_CACHE": str(tmp_path / f"cache-{name}"), "OMP_NUM_THREADS": "1"}
        done = subprocess.run([*launcher, str(script), tiny_dinov2, str(tmp_path / name), store_dtype,
                               str(batch)], env=env,
                              capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-3000:]
    one = json.loads((tmp_path / "one" / "record-0.json").read_text())
    assert one["miss"]["cached"] == [False, False] and one["hit"]["cached"] == [True, True]
    for rank in (0, 1):
        two = json.loads((tmp_path / "two" / f"record-{rank}.json").read_text())
        # Every process gets the one file, memory-mapped: no (N, D) buffer, gathered or loaded, on any process.
        assert two["miss"]["mapped"] == [True, True, True] and two["hit"]["mapped"] == [True, True, True]
        assert two["miss"]["cached"] == [False, False] and two["hit"]["cached"] == [True, True]
        for attempt in ("miss", "hit"):
            alone = torch.load(tmp_path / "one" / f"{attempt}-0.pt")
            together = torch.load(tmp_path / "two" / f"{attempt}-{rank}.pt")
            for key, value in alone.items():
                same(together[key], value, (attempt, rank, key))
        # Gathered where the file could not be written: the same features, in memory on every process.
        assert two["fallback"] == {"cached": False, "mapped": False}
        same(torch.load(tmp_path / "two" / f"fallback-{rank}.pt")["features"],
             torch.load(tmp_path / "one" / "fallback-0.pt")["features"], ("fallback", rank))
        # What each process got is the two-process file's bytes, exactly.
        files = [_tensors(Path(path)) for path in two["miss"]["files"]]
        got = torch.load(tmp_path / "two" / f"miss-{rank}.pt")
        assert torch.equal(got["features"], files[0]["features"]) and torch.equal(got["labels"], files[0]["labels"])
        assert torch.equal(got["views"], files[1]["features"]) and torch.equal(got["params"], files[1]["params"])
    two = json.loads((tmp_path / "two" / "record-0.json").read_text())
    for file_one, file_two in zip(one["miss"]["files"], two["miss"]["files"], strict=True):
        assert Path(file_one).name == Path(file_two).name  # the same key
        first, second = _tensors(Path(file_one)), _tensors(Path(file_two))
        assert first.keys() == second.keys()
        for name in first:
            same(first[name], second[name], name)
        entries_one, meta_one = read_header(Path(file_one))
        entries_two, meta_two = read_header(Path(file_two))
        assert entries_one == entries_two  # the same layout
        assert {k: v for k, v in meta_one.items() if k != "checksums" or batch == 1} == {
            k: v for k, v in meta_two.items() if k != "checksums" or batch == 1}  # and metadata (checksums: batch 1)
    for name in ("one", "two"):  # nothing left behind under a temporary name
        assert not [p for p in (tmp_path / f"cache-{name}").rglob("*.tmp")]
