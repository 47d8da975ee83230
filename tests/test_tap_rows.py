"""features/rows.py: a tap read by rows (`TapRows`) gives the rows the whole tensor would, however it is read (slices
across blocks, index tensors, tuples, views' (N, K, D) rows, mapped float16/bfloat16 caches, a head's layers), the
chunked probes give the same numbers on it as on the whole tensor while asking the head for at most a block of rows
at a time, and a probe that reads whole gets whole tensors (`TapData.whole`)."""

import importlib
from types import SimpleNamespace

import pytest
import torch

from headprobe.features.cache import load_cached, save_cached
from headprobe.features.rows import BLOCK_ROWS, TapRows, materialise
from headprobe.pipeline.taps import HeadLayers, head_taps, tap_data
from headprobe.probes import spectrum
from headprobe.probes.builtin.invariance import INVARIANCE
from headprobe.probes.builtin.knn import KNN
from headprobe.probes.builtin.linear import LINEAR
from headprobe.probes.builtin.spectrum import SPECTRUM
from headprobe.probes.builtin.view_mi import VIEW_MI
from headprobe.probes.tap_data import TapData
from headprobe.train.heads import ProjectionHead

knn_module = importlib.import_module("headprobe.probes.knn")  # the package exports the function `knn`


def head(in_dim=8, width=16, depth=2, seed=0) -> ProjectionHead:
    torch.manual_seed(seed)
    h = ProjectionHead(in_dim, depth=depth, width=width, act="relu", bn_hidden=True)
    with torch.no_grad():  # BatchNorm statistics that are not the identity, so eval mode matters
        for module in h.modules():
            if isinstance(module, torch.nn.BatchNorm1d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
    return h.eval()


class Recording:
    """A head's layers that record the most rows they were asked for at once."""

    def __init__(self, layers):
        self.layers, self.largest, self.calls = layers, 0, 0

    training = False

    def __call__(self, x):
        self.largest, self.calls = max(self.largest, len(x)), self.calls + 1
        return self.layers(x)


def features(n=50, d=8, seed=0, k=None):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g) if k is None else torch.randn(n, k, d, generator=g)


def test_reads_match_the_whole_tensor_without_a_transform():
    x = features(23, 5)
    rows = TapRows(x, block_rows=4)
    assert (len(rows), rows.shape, rows.ndim, rows.dtype, rows.device) == (23, x.shape, 2, torch.float32, x.device)
    index = torch.tensor([22, 0, 7, 7, -1])
    for key in (slice(3, 17), slice(None), slice(5, 5), slice(1, 20, 3), 4, -2, index,
                torch.zeros(23, dtype=torch.bool), torch.arange(23) % 3 == 0, (slice(2, 9), 1), (index, slice(1, 3)),
                (6, 2)):
        assert torch.equal(rows[key], x[key]), key
    assert rows[0:23].data_ptr() == x.data_ptr()  # float32 already on the device: a view, as before
    assert materialise(rows) is not None and materialise(rows).data_ptr() == x.data_ptr()
    assert materialise(x) is x and materialise(None) is None
    with pytest.raises(IndexError):
        rows[23]
    with pytest.raises(IndexError):
        rows[index > 100]
    with pytest.raises(AttributeError, match="materialise"):
        rows.mean()


def test_views_are_rows_of_k_views_and_select_and_narrow_read_lazily():
    views = features(30, 4, k=3)
    h = head(4, 6)
    layers = HeadLayers(h, 2)
    whole = layers(views.reshape(-1, 4)).reshape(30, 3, -1)
    rows = TapRows(views, layers, block_rows=7)  # 2 images (6 view rows) per block
    assert rows.shape == (30, 3, 6) and rows.rows_per_block == 2
    assert torch.allclose(rows[3:20], whole[3:20], atol=1e-6)
    assert torch.allclose(rows[(slice(4, 11), 0)], whole[4:11, 0], atol=1e-6)
    first = rows.select(1, 0)
    assert first.shape == (30, 6) and first.ndim == 2 and len(first) == 30
    assert torch.allclose(first[5:9], whole[5:9, 0], atol=1e-6)
    assert torch.allclose(materialise(first), whole[:, 0], atol=1e-6)
    part = rows.narrow(0, 5, 10)
    assert torch.equal(part[1:4], rows[6:9]) and torch.equal(materialise(part), rows[5:15])
    assert torch.equal(views.select(1, 0), views[:, 0])  # the same call on a tensor gives the same rows


def test_a_head_tap_is_exact_in_one_block_and_round_off_in_several():
    x = features(300, 8)
    layers = HeadLayers(head(), 2)
    whole = layers(x)
    one = TapRows(x, layers)
    assert torch.equal(materialise(one), whole) and torch.equal(one[17:233], whole[17:233])
    assert torch.equal(one[torch.tensor([299, 3, 150])], whole[[299, 3, 150]])
    blocked = TapRows(x, layers, block_rows=64)
    assert torch.allclose(materialise(blocked), whole, rtol=1e-6, atol=1e-6)
    assert torch.allclose(blocked[torch.tensor([299, 3, 150, 64])], whole[[299, 3, 150, 64]], rtol=1e-6, atol=1e-6)
    # A row's value does not depend on how it is read: blocks are aligned, a read across them is joined.
    assert torch.equal(blocked[60:130], materialise(blocked)[60:130])


def test_blocks_of_the_heads_batch_multiple_are_bit_identical_to_the_whole_tap():
    from headprobe.train.cached_views import head_taps as layer_outputs

    x = features(9_000, 8)
    h = head()
    for depth in (1, 2):  # what the taps were before: every layer of the head over all rows, 4,096 at a time
        whole = layer_outputs(h, x)[depth - 1]
        assert torch.equal(HeadLayers(h, depth)(x), whole)
        assert torch.equal(materialise(TapRows(x, HeadLayers(h, depth), block_rows=4_096)), whole)
    assert BLOCK_ROWS % HeadLayers.BATCH_ROWS == 0


@pytest.mark.parametrize("store_dtype", ["float16", "bfloat16"])
def test_mapped_half_precision_caches_are_read_by_rows(tmp_path, store_dtype):
    x, labels = features(40, 6), torch.arange(40) % 4
    path = tmp_path / "cache.safetensors"
    assert save_cached(path, "k", {}, x, labels, store_dtype=store_dtype)
    stored, _ = load_cached(path, "k", 40, labels, mapped=True, store_dtype=store_dtype)
    assert stored.dtype == getattr(torch, store_dtype)
    exact = stored.float()
    rows = TapRows(stored, block_rows=8)
    index = torch.tensor([39, 2, 2, 17])
    assert rows.dtype == torch.float32 and torch.equal(rows[5:30], exact[5:30]) and torch.equal(rows[index],
                                                                                                exact[index])
    assert torch.equal(materialise(rows), exact)
    layers = HeadLayers(head(6, 5), 2)
    through = TapRows(stored, layers, block_rows=8)
    assert torch.allclose(materialise(through), layers(exact), rtol=1e-6, atol=1e-6)
    assert torch.allclose(through[index], layers(exact)[index], rtol=1e-6, atol=1e-6)


def test_a_head_in_training_mode_and_non_finite_rows_are_refused():
    h = head()
    with pytest.raises(ValueError, match="training mode"):
        TapRows(features(), HeadLayers(h.train(), 2))
    bad = features(20, 8)
    bad[13, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        TapRows(bad, HeadLayers(head(), 2), block_rows=8)[9:12]  # the block holding row 13 is computed whole
    with pytest.raises(ValueError, match="NaN"):
        TapRows(bad)[10:15]


def tap(n=300, m=80, n_v=120, k=2, d=8, block_rows=64, layers=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    y, test_y = torch.randint(0, 3, (n,), generator=g), torch.randint(0, 3, (m,), generator=g)
    means = torch.randn(3, d, generator=g) * 2
    x, test_x = means[y] + features(n, d, seed + 1), means[test_y] + features(m, d, seed + 2)
    views = features(n_v, d, seed + 3)[:, None] + 0.3 * features(n_v, d, seed + 4, k=k)
    layers = HeadLayers(head(d, 12), 2) if layers is None else layers
    return TapData("h", TapRows(x, layers, block_rows=block_rows), y, TapRows(test_x, layers, block_rows=block_rows),
                   test_y, 3, views=TapRows(views, layers, block_rows=block_rows))


def whole(data: TapData) -> TapData:
    return data.whole(("views",))


def assert_same_output(a, b, rel=0.0):
    assert a.metrics.keys() == b.metrics.keys()
    for key in a.metrics:
        assert a.metrics[key] == pytest.approx(b.metrics[key], rel=rel, abs=0.0 if rel == 0 else 1e-12), key
    for key in a.per_unit:
        left, right = vars(a.per_unit[key]), vars(b.per_unit[key])
        for field, value in left.items():
            if isinstance(value, torch.Tensor):
                assert torch.allclose(value, right[field], rtol=rel, atol=rel * float(value.abs().max())), (key, field)


def test_knn_on_rows_is_bit_identical_to_knn_on_the_whole_tap(monkeypatch):
    monkeypatch.setattr(knn_module, "BANK_ROWS", 100)  # the bank in 3 blocks, each across the tap's blocks
    data = tap()
    assert_same_output(KNN(data, ks=[5, 20], chunk_size=32), KNN(whole(data), ks=[5, 20], chunk_size=32))


def test_the_bank_is_normalised_a_tap_block_at_a_time_with_the_same_bits(monkeypatch):
    from headprobe.probes.knn_prefilter import canonical_normalize

    monkeypatch.setattr(knn_module, "BLOCK_ROWS", 64)
    data = tap()
    whole_bank = materialise(data.train_x)
    expected = canonical_normalize(whole_bank[10:290])
    assert torch.equal(knn_module.normalised_rows(data.train_x, 10, 290, torch.device("cpu")), expected)
    assert torch.equal(knn_module.normalised_rows(whole_bank, 10, 290, torch.device("cpu")), expected)


def test_bank_shards_narrowed_from_rows_merge_to_the_whole_search():
    from headprobe.probes.knn import bank_search, merge_topk
    from headprobe.probes.sharded_knn import local_neighbours, shard_rows

    data = tap()  # 300 training rows in blocks of 64: the shards (150 each) start inside a block
    queries = materialise(data.test_x)
    sims, idx, _ = bank_search(materialise(data.train_x), queries, 7)
    shards = [shard_rows(len(data.train_x), 2, rank) for rank in (0, 1)]
    parts = [local_neighbours(data.train_x.narrow(0, s.start, s.stop - s.start), queries, 7, s.start) for s in shards]
    merged_sims, merged_idx, _ = merge_topk(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), 7)
    assert torch.equal(merged_idx, idx) and torch.equal(merged_sims, sims)


def test_spectrum_on_rows_equals_the_whole_tap(monkeypatch):
    monkeypatch.setattr(spectrum, "CHUNK_ROWS", 100)
    data = tap()
    assert_same_output(SPECTRUM(data), SPECTRUM(whole(data)))
    monkeypatch.setattr(spectrum, "CHUNK_ROWS", 1_000)  # one spectrum block over several of the tap's
    assert_same_output(SPECTRUM(data), SPECTRUM(whole(data)))


def test_the_linear_probe_on_rows_equals_the_whole_tap():
    data = tap()
    assert_same_output(LINEAR(data, block_rows=64), LINEAR(whole(data), block_rows=64))
    assert_same_output(LINEAR(data), LINEAR(whole(data)))


def test_view_probes_on_rows_equal_the_whole_tap():
    data = tap()
    assert_same_output(INVARIANCE(data, chunk_rows=50), INVARIANCE(whole(data), chunk_rows=50))
    assert_same_output(VIEW_MI(data, chunk_rows=50, batch_size=16), VIEW_MI(whole(data), chunk_rows=50,
                                                                            batch_size=16))
    assert_same_output(INVARIANCE(data), INVARIANCE(whole(data)))


def test_chunked_probes_ask_the_head_for_at_most_a_block_of_rows(monkeypatch):
    monkeypatch.setattr(knn_module, "BANK_ROWS", 100)
    monkeypatch.setattr(spectrum, "CHUNK_ROWS", 100)
    layers = Recording(HeadLayers(head(8, 12), 2))
    data = tap(layers=layers, block_rows=40)
    for probe, options in ((KNN, {"ks": [5]}), (SPECTRUM, {}), (INVARIANCE, {"chunk_rows": 50}),
                           (VIEW_MI, {"chunk_rows": 50, "batch_size": 16}), (LINEAR, {"block_rows": 64})):
        probe(data, **options)
    assert layers.calls > 10 and layers.largest <= 40  # views: 20 images x 2 views a block
    layers.largest = 0
    data.whole(("views",))
    assert layers.largest <= 40  # a whole probe's tensors are computed by blocks too


def test_whole_probes_get_whole_tensors_of_what_they_read():
    data = tap()
    full = data.whole(("views",))
    assert all(isinstance(t, torch.Tensor) for t in (full.train_x, full.test_x, full.views))
    assert full.views.shape == data.views.shape and torch.equal(full.train_x, materialise(data.train_x))
    assert isinstance(data.whole().views, TapRows)  # not asked for: left to be read by rows


def test_tap_data_hands_out_head_taps_by_rows():
    x, labels = features(40, 8), torch.arange(40) % 4
    split = SimpleNamespace(features=x, labels=labels)
    views = SimpleNamespace(features=features(10, 8, k=2), params=torch.zeros(10, 2, 1))
    fs = SimpleNamespace(train=split, test=split, n_classes=4, probe_views=views, rotated=None, orbits=None,
                         inert_params=None)
    h = head(8, 12).train()
    taps = head_taps("h", h)
    assert [t.name for t in taps] == ["h@1", "h"] and not h.training  # eval mode: the taps are row-wise
    data = tap_data(fs, taps[-1], SimpleNamespace(seed=0, data=SimpleNamespace(val_fraction=0.2)), block_rows=16)
    assert isinstance(data.train_x, TapRows) and data.views.shape == (10, 2, 12)
    assert torch.allclose(materialise(data.train_x), taps[-1].transform(x), rtol=1e-6, atol=1e-6)
    assert data.to("cpu").train_x is data.train_x


def seen_by(tap_data_, **options):
    """A plug-in probe registered the old way (no `reads`): records what it was handed."""
    from headprobe.probes.tap_data import ProbeOutput

    SEEN.append((type(tap_data_.train_x), type(tap_data_.views)))
    return ProbeOutput({"seen.rows": float(len(tap_data_.train_x))})


SEEN = []


def test_the_pipeline_hands_rows_to_chunked_probes_and_whole_tensors_to_the_others(monkeypatch):
    import contextlib
    from dataclasses import dataclass

    from headprobe.pipeline.taps import run_probes
    from headprobe.probes.builtin.knn import KnnSpec
    from headprobe.registry import PROBES

    @dataclass
    class NoOptions:
        pass

    x, labels = features(40, 8), torch.arange(40) % 4
    split = SimpleNamespace(features=x, labels=labels)
    views = SimpleNamespace(features=features(10, 8, k=2), params=torch.zeros(10, 2, 1))
    fs = SimpleNamespace(train=split, test=split, n_classes=4, probe_views=views, rotated=None, orbits=None,
                         inert_params=None)
    recipe = SimpleNamespace(seed=0, data=SimpleNamespace(val_fraction=0.2),
                             probes={"knn": KnnSpec(ks=[3]), "seen_by": NoOptions()})
    ctx = SimpleNamespace(recipe=recipe, state=SimpleNamespace(device=torch.device("cpu")),
                          stage=lambda _: contextlib.nullcontext())
    whole_for, made_whole = [], TapData.whole
    monkeypatch.setattr(TapData, "whole", lambda self, needs=(): whole_for.append(needs) or made_whole(self, needs))
    PROBES.add("seen_by", f"{__name__}:seen_by", "records its inputs (a test plug-in)", needs=("views",))
    try:
        SEEN.clear()
        outputs = dict(run_probes(ctx, fs, head_taps("h", head(8, 12))[-1], None, ["knn", "seen_by"]))
    finally:
        PROBES.remove("seen_by")
    assert SEEN == [(torch.Tensor, torch.Tensor)] and outputs["seen_by"].metrics == {"seen.rows": 40.0}
    assert whole_for == [("views",)]  # made whole for the plug-in only: the k-NN read the rows
    assert 0 <= outputs["knn"].metrics["knn.k3.acc"] <= 1


def test_chunked_probes_read_rows_on_the_device_without_mixing_devices(monkeypatch):
    """On a (pretend) accelerator the rows arrive there and every chunked probe keeps to it (CUDA's rules)."""
    from fake_accelerator import ACCELERATOR, fake_accelerator

    monkeypatch.setattr(knn_module, "BANK_ROWS", 100)
    monkeypatch.setattr(spectrum, "CHUNK_ROWS", 100)
    runs = ((KNN, {"ks": [5]}), (SPECTRUM, {}), (INVARIANCE, {"chunk_rows": 50}),
            (VIEW_MI, {"chunk_rows": 50, "batch_size": 16}))
    reference = tap()
    expected = [probe(reference, **options).metrics for probe, options in runs]  # before the head moves
    with fake_accelerator():
        data = reference.to(ACCELERATOR)
        assert data.train_x.device == ACCELERATOR and data.train_x[3:70].device == ACCELERATOR
        outputs = [probe(data, **options).metrics for probe, options in runs]
    for on_device, on_cpu in zip(outputs, expected, strict=True):
        assert on_device == pytest.approx(on_cpu, rel=1e-9)
