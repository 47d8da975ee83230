import warnings

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from headprobe.backbones import load_backbone
from headprobe.backbones.base import IMAGENET_MEAN, IMAGENET_STD, Backbone, Preprocess
from headprobe.data import load_data
from headprobe.data.cache_dir import cache_root
from headprobe.features.extract import extract
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
    good.path.chmod(0o644)  # cache files are read-only (root writes them anyway)
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


class _FreshStorages(TorchDispatchMode):
    """Every op output, while active, whose storage is new (not an input's) and at least `min_bytes` long."""

    def __init__(self, min_bytes: int) -> None:
        super().__init__()
        self.min_bytes = min_bytes
        self.fresh: list[tuple[str, tuple[int, ...], int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() >= self.min_bytes:
                ptr = t.untyped_storage().data_ptr()
                if ptr not in inputs:
                    self.fresh.append((str(func), tuple(t.shape), ptr))
        return out


WIDE = 2048  # features much larger than any batch of 28 × 28 pixels, so only whole-output buffers pass the size bar


def _wide_backbone() -> Backbone:
    """A backbone with cheap, wide features: mean colour (B, 3) → Linear(3, 2048)."""
    torch.manual_seed(0)
    return Backbone(nn.Linear(3, WIDE), lambda model, pixels: model(pixels.mean(dim=(2, 3))), id="test:wide",
                    dim=WIDE, preprocess=Preprocess(resize=28, crop=28, mean=IMAGENET_MEAN, std=IMAGENET_STD)).freeze()


def test_extract_writes_batches_into_one_preallocated_buffer():
    data = load_data(DataSpec(limit=LimitSpec(train=40, test=20)))
    bb = _wide_backbone()
    n_bytes = 40 * WIDE * 4
    with _FreshStorages(n_bytes) as spy:
        out = _extract(bb, data, cache=False)  # batches of 16, 16 and 8
    # One (N, D) allocation and nothing else of that size (no torch.cat of the batches, no clone), and the
    # result is that very buffer.
    assert [(shape, ptr) for _, shape, ptr in spy.fresh] == [((40, WIDE), out.features.untyped_storage().data_ptr())]
    assert out.features.shape == (40, WIDE) and not out.features.is_inference()
    with torch.no_grad():
        pixels = torch.stack([bb.preprocess(img) for img in data.train["image"]])
        assert torch.equal(out.features, bb(pixels))


def test_extract_equals_concatenated_batch_outputs_bit_for_bit(setup):
    """What extraction did before writing into a buffer: a forward per batch, then torch.cat."""
    bb, data = setup
    out = _extract(bb, data, cache=False)
    pixels = torch.stack([bb.preprocess(img) for img in data.train["image"]])
    with torch.inference_mode():
        expected = torch.cat([bb(pixels[s : s + 16]).float() for s in range(0, len(pixels), 16)])
    assert torch.equal(out.features, expected)
    rotated = _extract(bb, data, cache=False, rotation=90)
    pixels = torch.stack([bb.preprocess(img.rotate(90, expand=True)) for img in data.train["image"]])
    with torch.inference_mode():
        expected = torch.cat([bb(pixels[s : s + 16]).float() for s in range(0, len(pixels), 16)])
    assert torch.equal(rotated.features, expected)


def test_extract_views_writes_into_one_buffer_and_equals_the_batched_forward():
    from headprobe.data.augment import augment_spec
    from headprobe.features.views import AugmentedViews, extract_views, view_transforms

    data = load_data(DataSpec(limit=LimitSpec(train=40, test=20)))
    bb, spec = _wide_backbone(), augment_spec("crop-flip")
    with _FreshStorages(40 * 2 * WIDE * 4) as spy:
        out = extract_views(bb, data.train, data_info=data.info, augment=spec, views=2, seed=0, batch_size=16,
                            cache=False)
    assert [(shape, ptr) for _, shape, ptr in spy.fresh] == [((80, WIDE), out.features.untyped_storage().data_ptr())]
    assert out.features.shape == (40, 2, WIDE) and out.features.is_contiguous() and out.params.is_contiguous()
    # The same numbers as a forward per batch of the flat views followed by torch.cat.
    augment, normalise = view_transforms(bb.preprocess, spec)
    flat = torch.stack([AugmentedViews(data.train, list(range(80)), 2, augment, 0, normalise)[j] for j in range(80)])
    n_pixels = 3 * 28 * 28
    with torch.inference_mode():
        expected = torch.cat([bb(flat[s : s + 16, :n_pixels].reshape(-1, 3, 28, 28)) for s in range(0, 80, 16)])
    assert torch.equal(out.features.reshape(80, WIDE), expected)
    assert torch.equal(out.params.reshape(80, -1), flat[:, n_pixels:])


def test_features_and_views_are_bitwise_the_same_for_any_worker_count():
    """Every item is a pure function of its index (view k of image i is f(seed, i, k)) and batches come back in
    index order, so 2 worker processes give exactly what the main process gives alone."""
    from headprobe.data.augment import augment_spec
    from headprobe.features.views import extract_views

    data = load_data(DataSpec(limit=LimitSpec(train=40, test=20)))
    bb = _wide_backbone()
    alone, workers = (_extract(bb, data, cache=False, num_workers=w) for w in (0, 2))
    assert torch.equal(alone.features, workers.features)
    options = {"data_info": data.info, "augment": augment_spec("dino"), "views": 3, "seed": 7, "batch_size": 16,
               "cache": False}
    alone, workers = (extract_views(bb, data.train, num_workers=w, **options) for w in (0, 2))
    assert torch.equal(alone.features, workers.features) and torch.equal(alone.params, workers.params)
    assert alone.params.reshape(120, -1).unique(dim=0).shape[0] == 120  # every view is drawn afresh


def test_a_mapped_hit_equals_the_loaded_one(setup):
    from headprobe.features.tensor_file import is_mapped

    bb, data = setup
    first = _extract(bb, data)
    loaded, mapped = _extract(bb, data), _extract(bb, data, mapped=True)
    assert loaded.cached and mapped.cached and is_mapped(mapped.features) and not is_mapped(loaded.features)
    assert torch.equal(mapped.features, first.features) and torch.equal(loaded.features, first.features)
    assert torch.equal(mapped.labels, first.labels)
