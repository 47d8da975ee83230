"""Corrupted feature caches never pass (issue #18): flipped bytes inside the tensor data, a valid file with the right
key but other values, and permuted labels are detected by checksums and the label comparison, warned about,
deleted and recomputed; an unwritable cache warns once and the extraction goes on uncached."""

import json
import warnings

import pytest
import torch

from headprobe.backbones import load_backbone
from headprobe.data import load_data
from headprobe.data.cache_dir import cache_root
from headprobe.features import cache as feature_cache
from headprobe.features.cache import tensor_checksum
from headprobe.features.extract import extract
from headprobe.recipe import DataSpec, LimitSpec


@pytest.fixture(scope="module")
def setup():
    bb = load_backbone("scratch:vit-tiny", pooling="cls", seed=0)
    data = load_data(DataSpec(limit=LimitSpec(train=40, test=20)))
    return bb, data


def _extract(bb, data, **kw):
    return extract(bb, data.train, data_info=data.info, split="train", batch_size=20, **kw)


def _recomputed(bb, data, good, message):
    with pytest.warns(UserWarning, match=message):
        again = _extract(bb, data)
    assert not again.cached and torch.equal(again.features, good.features)
    assert torch.equal(again.labels, torch.as_tensor(data.train["label"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _extract(bb, data).cached  # rewritten, and good again


def test_flipped_bytes_inside_the_tensor_data_are_detected(setup):
    bb, data = setup
    good = _extract(bb, data)
    raw = bytearray(good.path.read_bytes())
    header = 8 + int.from_bytes(raw[:8], "little")
    end = min(len(raw), header + 20_000)
    raw[header:end] = bytes(b ^ 0xFF for b in raw[header:end])  # still a valid safetensors file
    good.path.chmod(0o644)  # cache files are read-only (root writes them anyway)
    good.path.write_bytes(bytes(raw))
    _recomputed(bb, data, good, "checksum of its 'features' tensor does not match")


def _write(path, feats, labels, key, checksums=None):
    from safetensors.torch import save_file

    meta = {"key": key, "second": "labels"}
    if checksums is not None:
        meta["checksums"] = json.dumps(checksums)
    save_file({"features": feats.contiguous(), "labels": labels.contiguous()}, str(path), metadata=meta)


def test_a_valid_file_with_the_right_key_but_other_values(setup):
    bb, data = setup
    good = _extract(bb, data)
    other = torch.randn_like(good.features)
    _write(good.path, other, good.labels, good.key)  # no checksums: an older or hand-made file
    _recomputed(bb, data, good, "records no checksums")
    _write(good.path, other, good.labels, good.key, {"features": tensor_checksum(good.features),
                                                     "labels": tensor_checksum(good.labels)})
    _recomputed(bb, data, good, "checksum of its 'features' tensor does not match")


def test_permuted_labels_are_detected_even_with_matching_checksums(setup):
    bb, data = setup
    good = _extract(bb, data)
    labels = good.labels[torch.randperm(len(good.labels), generator=torch.Generator().manual_seed(0))]
    assert not torch.equal(labels, good.labels)
    _write(good.path, good.features, labels, good.key, {"features": tensor_checksum(good.features),
                                                        "labels": tensor_checksum(labels)})
    _recomputed(bb, data, good, r"its labels differ from the dataset's at \d+ of 40 images")


def test_checksums_use_a_recorded_algorithm():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    for algorithm in ("blake2b", "xxh3_128"):
        if algorithm == "xxh3_128":
            pytest.importorskip("xxhash")
        digest = tensor_checksum(t, algorithm)
        assert digest.startswith(algorithm + ":") and digest == tensor_checksum(t.clone(), algorithm)
        assert digest != tensor_checksum(t + 1e-6 * (t == 5), algorithm)


def test_an_unwritable_cache_warns_once_and_carries_on(setup, monkeypatch, tmp_path):
    bb, data = setup
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("HEADPROBE_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(feature_cache, "_UNWRITABLE", set())
    with pytest.warns(UserWarning, match="cannot be written.*carrying on without caching") as record:
        first = _extract(bb, data)
        second = extract(bb, data.test, data_info=data.info, split="test", batch_size=20)
    assert len([w for w in record if "cannot be written" in str(w.message)]) == 1
    assert not first.cached and first.path is None and second.path is None
    assert first.features.shape == (40, bb.dim)


def test_corrupted_caches_are_detected_when_mapped_too(setup, monkeypatch):
    """Mapped hits are checked like loaded ones, over the file in chunks (a few here, from a small chunk size)."""
    from headprobe.features import tensor_file
    from headprobe.features.tensor_file import is_mapped

    bb, data = setup
    good = _extract(bb, data)
    monkeypatch.setattr(tensor_file, "CHUNK_BYTES", 4096)
    hit = _extract(bb, data, mapped=True)
    assert hit.cached and is_mapped(hit.features) and torch.equal(hit.features, good.features)
    raw = bytearray(good.path.read_bytes())
    raw[-3] ^= 0x01  # one bit of the last tensor's last chunk
    edited = good.path.with_name("edited")
    edited.write_bytes(bytes(raw))
    edited.replace(good.path)  # replaced by a rename, as the cache writes: the live mapping keeps the file it mapped
    assert torch.equal(hit.features, good.features)
    with pytest.warns(UserWarning, match="checksum of its '(features|labels)' tensor does not match"):
        again = _extract(bb, data, mapped=True)
    assert not again.cached and torch.equal(again.features, good.features)
    good.path.chmod(0o644)
    good.path.write_bytes(good.path.read_bytes()[:-100])
    with pytest.warns(UserWarning, match=r"unusable \(its tensor .* \(truncated\)\)"):
        assert not _extract(bb, data, mapped=True).cached


def test_a_streamed_cache_file_loads_like_a_saved_one(tmp_path):
    """`save_cached_streamed` writes, a chunk at a time, the file `load_cached` checks and reads (whole or mapped)."""
    from headprobe.features.cache import load_cached, save_cached_streamed

    views, params = torch.randn(50, 3, 8), torch.rand(50, 3, 2)
    parts = {"features": (torch.float32, (50, 3, 8), (views[s : s + 16] for s in range(0, 50, 16))),
             "params": (torch.float32, (50, 3, 2), iter([params]))}
    path = tmp_path / "views.safetensors"
    assert save_cached_streamed(path, "key", {"what": "test"}, parts)
    for mapped in (False, True):
        feats, stored = load_cached(path, "key", 50, mapped=mapped)
        assert torch.equal(feats, views) and torch.equal(stored, params)
    with pytest.warns(UserWarning, match="holds 50 rows for key 'key', expected 51"):
        assert load_cached(path, "key", 51) is None
    with pytest.raises(ValueError, match="a cache file holds 'features' and 'params', got \\['features'\\]"):
        save_cached_streamed(path, "key", {}, {"features": parts["features"]})


def test_cache_files_are_written_read_only(setup):
    bb, data = setup
    good = _extract(bb, data)
    assert good.path.stat().st_mode & 0o777 == 0o444


def test_an_empty_headprobe_cache_is_unset_not_the_current_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HEADPROBE_CACHE", "")
    assert cache_root() == tmp_path / "home" / ".cache" / "headprobe"
    monkeypatch.setenv("HEADPROBE_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def _overwrite_in_place(path):
    """What `cp other path` or `rsync --inplace` does: new bytes into the same inode (root writes a 0444 file; others
    would have to chmod it first)."""
    raw = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(raw[:8], "little")
    raw[header:] = bytes(b ^ 0x5A for b in raw[header:])
    path.chmod(0o644)
    with open(path, "r+b") as f:
        f.write(raw)


def test_a_mapped_file_written_in_place_is_caught_and_a_renamed_one_is_not(setup, monkeypatch):
    from headprobe.features import tensor_file
    from headprobe.features.cache import CacheChangedError, UnchangedCache

    bb, data = setup
    good = _extract(bb, data)
    hit = _extract(bb, data, mapped=True)
    guard = UnchangedCache([hit.features, hit.labels, torch.zeros(3)])  # the ordinary tensor is not checked
    guard.check(final=True)
    fresh = good.path.with_name("fresh")
    fresh.write_bytes(good.path.read_bytes())
    fresh.replace(good.path)  # a new version by rename: the mapping keeps its inode, nothing changed under the run
    guard.check(final=True)
    hit = _extract(bb, data, mapped=True)  # the new file, mapped
    guard = UnchangedCache([hit.features, hit.labels])
    _overwrite_in_place(good.path)
    assert not torch.equal(hit.features, good.features)  # the mapping sees the new bytes
    with pytest.raises(CacheChangedError, match=r"changed on disk while this run was reading it \(.*written in place"):
        guard.check()
    # A rewrite that leaves every identity field as it was is caught by the checksums, verified again at the end.
    with pytest.warns(UserWarning, match="does not match"):
        assert not _extract(bb, data).cached  # the damaged file recomputed and written again
    monkeypatch.setattr(tensor_file, "_identity", lambda fd: (0,))
    again = _extract(bb, data, mapped=True)
    guard = UnchangedCache([again.features])
    guard.check()
    _overwrite_in_place(good.path)
    with pytest.raises(CacheChangedError, match="the checksum of its 'features' tensor no longer matches"):
        guard.check(final=True)


def test_the_full_check_is_spaced_by_its_cost_but_always_made_at_the_end(setup, monkeypatch):
    from headprobe.features.cache import FULL_CHECK_SHARE, UnchangedCache

    bb, data = setup
    _extract(bb, data)
    hit = _extract(bb, data, mapped=True)
    calls = []
    real = feature_cache.changed_mappings
    monkeypatch.setattr(feature_cache, "changed_mappings", lambda t, checksums: calls.append(checksums) or real(
        t, checksums))
    guard = UnchangedCache([hit.features])
    guard.check()
    guard.check_s = 1e6  # a full check that took "forever": the next ones check identity only
    guard.check()
    guard.check(final=True)
    assert calls == [True, False, True] and FULL_CHECK_SHARE >= 50


# --- a cache file written in place while a run reads it ----------------------------------------------------------

RUN = {"heads": [{"name": "relu", "act": "relu", "width": 16, "out_dim": 8}], "objective": {"name": "vicreg"},
       "augment": {"preset": "crop-flip", "views": 2}, "train": {"epochs": 2, "batch_size": 50},
       "probes": {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5]}}}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["in place", "by rename"])
def test_a_cache_file_changed_during_a_run_fails_it_and_resume_recovers(tiny_recipe, tmp_path, monkeypatch, how):
    """Overwritten in place while the heads train (the train features are mapped and probed after): the run fails
    with the sentence, records no number computed from the new bytes, and --resume gives the reference numbers.
    Replaced by a rename instead, the run goes on with the bytes it verified."""
    from headprobe.pipeline import RunError, run, stages

    recipe = {**tiny_recipe, **RUN}
    reference = run(recipe, out=tmp_path / "reference", quiet=True)
    train_file = cache_root() / "features" / (
        reference["protocol"]["features"]["cache"]["train"]["key"] + ".safetensors")
    train_heads = stages.train_heads

    def changing(ctx, features):
        if how == "in place":
            _overwrite_in_place(train_file)
        else:
            other = train_file.with_name("other")
            other.write_bytes(b"not features at all")
            other.replace(train_file)
        return train_heads(ctx, features)

    monkeypatch.setattr(stages, "train_heads", changing)
    out = tmp_path / "run"
    if how == "by rename":
        assert run(recipe, out=out, quiet=True)["taps"]["relu"]["metrics"] == reference["taps"]["relu"]["metrics"]
        return
    with pytest.raises(RunError, match="CacheChangedError: a feature cache file changed on disk while this run was "
                                       f"reading it \\({train_file}: its"):
        run(recipe, out=out, quiet=True)
    failed = json.loads((out / "results.json").read_text())
    assert failed["status"] == "failed" and "--resume" in failed["error"]["message"]
    assert set(failed["taps"]) == {"backbone"}  # probed before the change; no head tap was probed on the new bytes
    assert failed["taps"]["backbone"]["metrics"] == reference["taps"]["backbone"]["metrics"]
    monkeypatch.setattr(stages, "train_heads", train_heads)
    with pytest.warns(UserWarning, match="checksum of its 'features' tensor does not match"):  # found and recomputed
        resumed = run(recipe, out=out, resume=True, quiet=True)
    assert resumed["status"] == "complete"
    for name, tap in reference["taps"].items():
        assert resumed["taps"][name]["metrics"] == tap["metrics"], name
