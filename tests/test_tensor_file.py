"""safetensors files without loading them whole: the header, chunked checksums, mapped tensors, streamed writes."""

import json

import pytest
import torch
from safetensors import safe_open

from headprobe.features import tensor_file
from headprobe.features.cache import checksum_algorithm, tensor_checksum
from headprobe.features.tensor_file import (
    file_checksum,
    gather_rows,
    is_mapped,
    map_tensors,
    mean_over_rows,
    read_header,
    release_pages,
    write_streamed,
)


@pytest.fixture
def tensors():
    g = torch.Generator().manual_seed(0)
    return {"features": torch.randn(37, 3, 5, generator=g), "params": torch.randn(37, 3, 2, generator=g).double()}


def _chunks(t, rows):
    return (t[s : s + rows] for s in range(0, len(t), rows))


def _streamed(path, tensors, rows=8):
    parts = {name: (t.dtype, tuple(t.shape), _chunks(t, rows)) for name, t in tensors.items()}
    return write_streamed(path, parts, {"key": "k"}, checksum_algorithm())


def test_a_streamed_file_is_a_safetensors_file_with_the_tensors_and_their_checksums(tmp_path, tensors):
    path = tmp_path / "t.safetensors"
    checksums = _streamed(path, tensors)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        assert meta["key"] == "k" and json.loads(meta["checksums"]) == checksums
        for name, t in tensors.items():
            assert torch.equal(f.get_tensor(name), t)
    assert checksums == {name: tensor_checksum(t) for name, t in tensors.items()}


def test_a_chunk_of_the_wrong_size_or_dtype_is_refused(tmp_path, tensors):
    short = {"features": (torch.float32, (37, 3, 5), iter([tensors["features"][:30]]))}
    with pytest.raises(ValueError, match="hold 1800 bytes; its shape \\[37, 3, 5\\] needs 2220"):
        write_streamed(tmp_path / "a", short, {}, "blake2b")
    wrong = {"features": (torch.float32, (37, 3, 5), iter([tensors["features"].double()]))}
    with pytest.raises(ValueError, match="is torch.float64, the tensor is declared torch.float32"):
        write_streamed(tmp_path / "b", wrong, {}, "blake2b")


@pytest.mark.parametrize("algorithm", ["blake2b", "xxh3_128"])
def test_chunked_checksums_equal_the_whole_tensor_checksum(tmp_path, tensors, monkeypatch, algorithm):
    if algorithm == "xxh3_128":
        pytest.importorskip("xxhash")
    path = tmp_path / "t.safetensors"
    _streamed(path, tensors)
    monkeypatch.setattr(tensor_file, "CHUNK_BYTES", 64)  # many chunks, one of them partial
    entries, _ = read_header(path)
    for name, t in tensors.items():
        assert file_checksum(path, entries[name], algorithm) == tensor_checksum(t, algorithm)


def test_a_truncated_file_fails_in_the_header_check(tmp_path, tensors):
    path = tmp_path / "t.safetensors"
    _streamed(path, tensors)
    raw = path.read_bytes()
    path.write_bytes(raw[:-5])
    with pytest.raises(ValueError, match=r"'params' .* needs bytes 2220..3996 .* \(truncated\)"):
        read_header(path)
    path.write_bytes(raw[:6])
    with pytest.raises(ValueError, match="fewer than a safetensors header"):
        read_header(path)


def test_mapped_tensors_equal_the_file_and_survive_a_page_release(tmp_path, tensors):
    path = tmp_path / "t.safetensors"
    _streamed(path, tensors)
    entries, _ = read_header(path)
    mapped = map_tensors(path, entries)
    ordinary = tensors["features"].clone()
    assert is_mapped(mapped["features"]) and is_mapped(mapped["features"][3:]) and not is_mapped(ordinary)
    idx = torch.tensor([5, 0, 36, 5])
    before = mapped["features"][idx, torch.tensor([0, 2, 1, 1])]
    assert release_pages(mapped["features"]) and not release_pages(ordinary)
    assert torch.equal(mapped["features"], tensors["features"]) and torch.equal(mapped["params"], tensors["params"])
    assert torch.equal(before, tensors["features"][idx, torch.tensor([0, 2, 1, 1])])


def test_mean_over_rows_is_the_mean_and_the_same_mapped_or_not(tmp_path, tensors):
    path = tmp_path / "t.safetensors"
    _streamed(path, tensors)
    mapped = map_tensors(path, read_header(path)[0])["features"]
    expected = tensors["features"].double().mean((0, 1)).float()
    assert torch.equal(mean_over_rows(tensors["features"], rows=4), expected)
    assert torch.equal(mean_over_rows(mapped, rows=4), mean_over_rows(tensors["features"], rows=4))


def _resident(path):
    """Bytes of `path`'s mappings resident in this process (Linux /proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()[0] if line.strip() else ""
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_gather_rows_reads_the_rows_without_making_the_mapping_resident(tmp_path):
    big = torch.randn(4096, 4, 96)  # 6 MiB: a random batch through the mapping would map most of it
    path = tmp_path / "big.safetensors"
    _streamed(path, {"features": big}, rows=1024)
    mapped = map_tensors(path, read_header(path)[0])["features"]
    g = torch.Generator().manual_seed(0)
    idx, v = torch.randint(4096, (512,), generator=g), torch.randint(4, (512,), generator=g)
    rows = gather_rows(mapped, idx, v)
    assert torch.equal(rows, big[idx, v]) and not is_mapped(rows)
    assert torch.equal(gather_rows(mapped[100:], idx[:5], v[:5]), big[100:][idx[:5], v[:5]])  # a view at an offset
    assert torch.equal(gather_rows(big, idx, v), big[idx, v])  # an ordinary tensor: ordinary indexing
    with pytest.raises(IndexError, match="index 4096 is out of bounds for dimension 0 with size 4096"):
        gather_rows(mapped, torch.tensor([4096]), torch.tensor([0]))
    try:
        resident = _resident(path)
    except OSError:
        pytest.skip("no /proc/self/smaps here")
    assert resident < 256 * 1024, resident  # the batch was read, not mapped
    mapped[idx, v]  # the same rows indexed through the mapping do make pages resident
    assert _resident(path) > resident
