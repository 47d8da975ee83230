import warnings

import pytest
import torch

from headprobe.backbones import load_backbone
from headprobe.data import load_data
from headprobe.features import cache_root, extract
from headprobe.recipe import DataSpec, LimitSpec


@pytest.fixture
def setup(tiny_dinov2):
    bb = load_backbone(f"hf:{tiny_dinov2}")
    data = load_data(DataSpec(limit=LimitSpec(train=40, test=20)))
    return bb, data


def _extract(bb, data, **kw):
    return extract(bb, data.train, data_info=data.info, split="train", batch_size=16, **kw)


def test_features_equal_a_plain_forward_and_are_cached(setup):
    bb, data = setup
    first = _extract(bb, data)
    assert not first.cached and first.path.exists() and first.path.parent.parent == cache_root()
    pixels = torch.stack([bb.preprocess(img) for img in data.train["image"]])
    with torch.no_grad():
        torch.testing.assert_close(first.features, bb(pixels), atol=1e-5, rtol=1e-5)
    assert first.labels.tolist() == data.train["label"]
    second = _extract(bb, data)
    assert second.cached and second.key == first.key
    assert torch.equal(second.features, first.features)
    assert first.features.requires_grad is False and not first.features.is_inference()


def test_key_changes_with_everything_that_changes_content(setup, tiny_dinov2):
    bb, data = setup
    base = _extract(bb, data).key
    assert _extract(load_backbone(f"hf:{tiny_dinov2}", pooling="mean"), data).key != base
    assert _extract(load_backbone(f"hf:{tiny_dinov2}", resolution=42), data).key != base
    assert extract(bb, data.test, data_info=data.info, split="test").key != base
    other = load_data(DataSpec(limit=LimitSpec(train=41, test=20)))
    assert _extract(bb, other).key != base
    with torch.no_grad():
        bb.model.embeddings.cls_token.add_(1.0)
    bb._fingerprint = None
    assert _extract(bb, data).key != base


def test_corrupt_and_partial_files_are_misses(setup):
    bb, data = setup
    good = _extract(bb, data)
    good.path.write_bytes(good.path.read_bytes()[:100])
    with pytest.warns(UserWarning, match="unusable"):
        again = _extract(bb, data)
    assert not again.cached and torch.equal(again.features, good.features)
    # A leftover temporary file from an interrupted write is never read as the cache.
    tmp = good.path.with_name(f".{good.path.name}.999.tmp")
    tmp.write_bytes(b"partial")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _extract(bb, data).cached


def test_cache_off_writes_nothing(setup):
    bb, data = setup
    out = _extract(bb, data, cache=False)
    assert out.path is None and not (cache_root() / "features").exists()
