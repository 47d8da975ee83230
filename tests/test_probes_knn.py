import sys

import numpy as np
import pytest
import torch
from sklearn.neighbors import KNeighborsClassifier

from headprobe.probes import knn
from headprobe.probes.knn import prefer_bfloat16, prefilter_default, product_seconds
from headprobe.probes.knn_prefilter import BF16_UNIT, Bf16Prefilter, Float32TopK, canonical_dot, canonical_normalize

KNN_MODULE = sys.modules["headprobe.probes.knn"]  # the module; `headprobe.probes.knn` names the function

pytestmark = pytest.mark.usefixtures("single_thread")


def brute_force_knn(train, train_labels, test, k, temperature, num_classes):
    """The DINO vote, one query at a time, in float64 numpy."""
    train = train / np.linalg.norm(train, axis=1, keepdims=True)
    test = test / np.linalg.norm(test, axis=1, keepdims=True)
    predictions = []
    for query in test:
        sims = train @ query
        nearest = np.argsort(-sims)[:k]
        weights = np.exp(sims[nearest] / temperature)
        votes = np.bincount(train_labels[nearest], weights=weights, minlength=num_classes)
        predictions.append(int(np.argmax(votes)))
    return np.array(predictions)


def make_data(n_train=300, n_test=60, dim=16, num_classes=5, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(num_classes, dim))
    train_labels = rng.integers(0, num_classes, n_train)
    test_labels = rng.integers(0, num_classes, n_test)
    train = centers[train_labels] + 1.5 * rng.normal(size=(n_train, dim))
    test = centers[test_labels] + 1.5 * rng.normal(size=(n_test, dim))
    return train, train_labels, test, test_labels


def as_tensors(*arrays):
    return [torch.from_numpy(a).float() if a.dtype.kind == "f" else torch.from_numpy(a) for a in arrays]


def test_matches_brute_force_reference():
    train, train_labels, test, test_labels = make_data()
    ks = (1, 5, 20, 300)
    result = knn(*as_tensors(train, train_labels, test, test_labels), ks=ks, temperature=0.07)
    for k in ks:
        expected = brute_force_knn(train, train_labels, test, k, 0.07, 5)
        np.testing.assert_array_equal(result.predictions[k].numpy(), expected, err_msg=f"k={k}")
        assert result.predictions[k].dtype == torch.int64
        assert result.metrics[f"knn.k{k}.acc"] == pytest.approx((expected == test_labels).mean())
    assert result.protocol["n_train"] == 300 and result.protocol["n_test"] == 60
    assert result.protocol["n_classes"] == 5


def test_chunk_size_does_not_change_predictions():
    data = as_tensors(*make_data())
    small, large = knn(*data, ks=(3, 20), chunk_size=7), knn(*data, ks=(3, 20), chunk_size=1000)
    for k in (3, 20):
        assert torch.equal(small.predictions[k], large.predictions[k])
    assert small.metrics == large.metrics


@pytest.mark.parametrize("prefilter", [False, True])
def test_bank_read_in_blocks_smaller_than_n_and_k_changes_no_bit(prefilter):
    train, train_labels, test, test_labels = as_tensors(*make_data())
    train = torch.cat([train, train[:40]])  # exact ties across blocks: the smaller index must stay the nearer
    train_labels = torch.cat([train_labels, train_labels[:40]])
    ks = (1, 3, 20)
    whole = knn(train, train_labels, test, test_labels, ks=ks, prefilter=prefilter, bank_rows=len(train))
    blocked = knn(train, train_labels, test, test_labels, ks=ks, prefilter=prefilter, bank_rows=7, chunk_size=5)
    for k in ks:
        assert torch.equal(blocked.predictions[k], whole.predictions[k])
    assert blocked.metrics == whole.metrics and blocked.protocol["bank_rows"] == 7
    # The neighbours themselves, similarities and indices, bit for bit (exact equality: the similarities are
    # canonical, so no block sees another value).
    sims, idx, _ = KNN_MODULE.bank_search(train, test, 20, prefilter=prefilter, bank_rows=len(train))
    block_sims, block_idx, stats = KNN_MODULE.bank_search(train, test, 20, prefilter=prefilter, bank_rows=7,
                                                          chunk_size=5)
    assert torch.equal(block_sims, sims) and torch.equal(block_idx, idx)
    assert (stats is None) is not prefilter
    if prefilter:
        assert stats["queries"] == len(test) * -(-len(train) // 7)


@pytest.mark.parametrize("k", [1, 4, 15])
def test_uniform_weighting_matches_sklearn(k):
    train, train_labels, test, test_labels = make_data(seed=1)
    result = knn(*as_tensors(train, train_labels, test, test_labels), ks=(k,), weighting="uniform")
    reference = KNeighborsClassifier(n_neighbors=k, algorithm="brute", metric="cosine")
    reference.fit(train, train_labels)
    np.testing.assert_array_equal(result.predictions[k].numpy(), reference.predict(test))


def test_tiny_temperature_reduces_to_nearest_neighbour_without_overflow():
    # exp(s / 1e-3) overflows float32 unless the vote is computed stably.
    train, train_labels, test, test_labels = make_data(seed=2)
    result = knn(*as_tensors(train, train_labels, test, test_labels), ks=(1, 20), temperature=1e-3)
    assert torch.equal(result.predictions[20], result.predictions[1])


def test_k_larger_than_train_set_is_clamped_and_recorded():
    train, train_labels, test, test_labels = make_data(n_train=8, n_test=10, seed=3)
    result = knn(*as_tensors(train, train_labels, test, test_labels), ks=(5, 50))
    assert result.protocol["effective_ks"] == {5: 5, 50: 8}
    expected = brute_force_knn(train, train_labels, test, 8, 0.07, 5)
    np.testing.assert_array_equal(result.predictions[50].numpy(), expected)


def test_half_precision_input_is_computed_in_float32():
    train, train_labels, test, test_labels = as_tensors(*make_data(seed=4))
    half = knn(train.half(), train_labels, test.half(), test_labels, ks=(10,))
    upcast = knn(train.half().float(), train_labels, test.half().float(), test_labels, ks=(10,))
    assert torch.equal(half.predictions[10], upcast.predictions[10])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    data = as_tensors(*make_data(seed=5))
    cpu, cuda = knn(*data, ks=(5, 20)), knn(*data, ks=(5, 20), device="cuda")
    for k in (5, 20):
        assert torch.equal(cpu.predictions[k], cuda.predictions[k])
    # The bfloat16 prefilter on the GPU (cuBLAS products) against the float32 product on the CPU.
    data = clustered(4000, 300, 48, seed=4)
    exact = knn(*data, ks=(5, 20), prefilter=False)
    fast = knn(*data, ks=(5, 20), prefilter=True, device="cuda")
    for k in (5, 20):
        assert torch.equal(exact.predictions[k], fast.predictions[k])


def _bad_inputs():
    x, y = torch.randn(20, 4), torch.arange(20) % 3
    return [
        (dict(train_features=x[None]), "must be 2-D"),
        (dict(train_labels=y[:-1]), "same samples"),
        (dict(train_features=x[:0], train_labels=y[:0]), "is empty"),
        (dict(test_features=torch.randn(20, 5)), "dimension 4 but test_features has 5"),
        (dict(train_labels=y.float()), "integer class indices"),
        (dict(train_labels=y - 1), "negative label"),
        (dict(test_features=torch.full((20, 4), float("nan"))), "NaN or infinite"),
        (dict(ks=(0, 10)), "positive"),
        (dict(ks=()), "ks is empty"),
        (dict(ks=(10, 10)), "duplicates"),
        (dict(num_classes=2), "num_classes is 2"),
        (dict(weighting="cosine"), "not supported"),
        (dict(temperature=0.0), "temperature must be positive"),
        (dict(chunk_size=0), "chunk_size must be positive"),
    ]


@pytest.mark.parametrize("override, message", _bad_inputs())
def test_rejects_bad_inputs_with_a_sentence(override, message):
    x, y = torch.randn(20, 4), torch.arange(20) % 3
    kwargs = dict(train_features=x, train_labels=y, test_features=x, test_labels=y) | override
    with pytest.raises(ValueError, match=message):
        knn(**kwargs)


@pytest.mark.parametrize(
    ("n", "k", "block"), [(1000, 5, 64), (1000, 3, 7), (130, 2, 64), (5000, 40, 64), (4096, 5, 64), (2048, 3, 32)]
)
def test_blocked_topk_equals_topk(n, k, block):
    from headprobe.probes.knn import blocked_topk

    scores = torch.randn(17, n, generator=torch.Generator().manual_seed(n + k))
    values, indices = blocked_topk(scores, k, block=block)
    expected_values, expected_indices = scores.topk(k, dim=1)
    torch.testing.assert_close(values, expected_values, rtol=0, atol=0)
    torch.testing.assert_close(indices, expected_indices, rtol=0, atol=0)
    # bfloat16 rows, the prefilter's case (block maxima taken on the bits as int16), with a tail block shorter
    # than the rest: as they come; with whole blocks of negatives, whose int16 maxima are wrong; and mostly
    # negative, where the k-th block maximum is negative and the float path must take over.
    negative_blocks = scores.clone()
    negative_blocks[:, : n // 2] = -negative_blocks[:, : n // 2].abs() - 0.01
    for case in (scores, negative_blocks, scores - 3.0):
        low = case.to(torch.bfloat16)
        values, indices = blocked_topk(low, k, block=block)
        torch.testing.assert_close(values, low.topk(k, dim=1).values, rtol=0, atol=0)
        torch.testing.assert_close(low.gather(1, indices), values, rtol=0, atol=0)


def test_prefilter_error_bound_holds_for_every_pair():
    g = torch.Generator().manual_seed(0)
    bank = torch.nn.functional.normalize(torch.randn(3000, 96, generator=g) + 2.0, dim=1)
    queries = torch.nn.functional.normalize(torch.randn(200, 96, generator=g) + 2.0, dim=1)
    search = Bf16Prefilter(bank, k=10)
    approx = (queries.to(torch.bfloat16) @ search.low[: len(bank)].T).double()
    exact = queries.double() @ bank.double().T
    allowed = search.error_bound(queries)[:, None] + BF16_UNIT / (1 - BF16_UNIT) * approx.abs()
    slack = allowed - (approx - exact).abs()
    assert slack.min() >= 0
    # Not vacuous: the bound is within a small factor of the worst error actually made.
    assert (approx - exact).abs().max() > allowed.max() / 20


def clustered(n_train, n_test, dim, seed):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(5, dim, generator=g)
    y, yq = torch.randint(5, (n_train,), generator=g), torch.randint(5, (n_test,), generator=g)
    return (centres[y] + 2 * torch.randn(n_train, dim, generator=g), y,
            centres[yq] + 2 * torch.randn(n_test, dim, generator=g), yq)


def test_prefilter_gives_the_float32_answer():
    data = clustered(4000, 300, 48, seed=1)
    ks = (1, 10, 20)
    fast = knn(*data, ks=ks, prefilter=True, chunk_size=128)
    exact = knn(*data, ks=ks, prefilter=False)
    for k in ks:
        torch.testing.assert_close(fast.predictions[k], exact.predictions[k], rtol=0, atol=0)
    assert fast.protocol["prefilter"]["queries"] == 300
    assert exact.protocol["prefilter"] is None and exact.protocol["similarity"] == "float32"
    assert "bfloat16" in fast.protocol["similarity"]
    # The float32 answer exactly, similarities included: both searches return the certified top-k of the same
    # canonical similarities, so the exp-weighted votes agree too.
    fast_exp, exact_exp = (knn(*data, ks=ks, prefilter=p, weighting="exp") for p in (True, False))
    assert fast_exp.metrics == exact_exp.metrics
    assert all(torch.equal(fast_exp.predictions[k], exact_exp.predictions[k]) for k in ks)
    # Default: on for a bank this large exactly when `prefilter_default` (native bfloat16, then a timing) says so.
    default = knn(*data, ks=ks)
    on, why = prefilter_default(torch.device("cpu"), 4000, 48)
    assert (default.protocol["prefilter"] is not None) == on and default.protocol["prefilter_choice"] == why
    assert fast.protocol["prefilter_choice"] == "explicit: prefilter=True"
    assert exact.protocol["prefilter_choice"] == "explicit: prefilter=False"


def test_prefilter_widens_or_falls_back_when_bfloat16_cannot_separate_neighbours():
    g = torch.Generator().manual_seed(2)
    x, y, q, yq = clustered(3000, 40, 32, seed=3)
    # 100 and then 1000 near-copies of one point close to the first query, 1e-3 apart: their similarities to
    # that query differ by ~1e-4, which float32 resolves and bfloat16 does not.
    unit = torch.nn.functional.normalize
    centre = unit(q[:1], dim=1) + 0.3 * unit(torch.randn(1, 32, generator=g), dim=1)
    for copies, expected in ((100, "widened"), (1000, "full_float32")):
        bank = x.clone()
        bank[:copies] = centre + 1e-3 * torch.randn(copies, 32, generator=g)
        labels = torch.randint(5, (3000,), generator=g)
        fast = knn(bank, labels, q, yq, ks=(5, 20), prefilter=True, weighting="uniform")
        exact = knn(bank, labels, q, yq, ks=(5, 20), prefilter=False, weighting="uniform")
        assert fast.protocol["prefilter"][expected] >= 1
        for k in (5, 20):
            torch.testing.assert_close(fast.predictions[k], exact.predictions[k], rtol=0, atol=0)


def test_numpy_arrays_give_the_same_result_as_tensors():
    train, train_labels, test, test_labels = make_data(seed=2)
    from_numpy = knn(train.astype(np.float32), train_labels, test[::-1].astype(np.float32), test_labels[::-1],
                     ks=(5,))
    from_torch = knn(*as_tensors(train, train_labels, np.ascontiguousarray(test[::-1]),
                                 np.ascontiguousarray(test_labels[::-1])), ks=(5,))
    assert torch.equal(from_numpy.predictions[5], from_torch.predictions[5])
    with pytest.raises(TypeError, match="train_features must be a torch.Tensor or a NumPy array but is a list"):
        knn(train.tolist(), train_labels, test, test_labels)


def test_prefer_bfloat16_only_when_clearly_faster():
    assert prefer_bfloat16(0.05, 0.1) and prefer_bfloat16(0.079, 0.1)
    assert not prefer_bfloat16(0.081, 0.1) and not prefer_bfloat16(0.2, 0.1)
    assert not prefer_bfloat16(0.135, 0.090)  # an AVX512-BF16 Xeon without AMX: bfloat16 1.5x slower
    assert prefer_bfloat16(0.09, 0.1, threshold=0.95) and not prefer_bfloat16(0.1, 0.1, threshold=1.0)


@pytest.mark.parametrize(("timings", "on"), [((0.135, 0.090), False), ((0.03, 0.09), True)])
def test_cpu_default_follows_the_measured_timings(monkeypatch, timings, on):
    calls = []
    monkeypatch.setattr(KNN_MODULE, "fast_bfloat16", lambda device: True)
    monkeypatch.setattr(KNN_MODULE, "product_seconds", lambda dim, threads: calls.append((dim, threads)) or timings)
    chosen, why = prefilter_default(torch.device("cpu"), 50_000, 384)
    assert chosen is on and calls == [(384, torch.get_num_threads())]
    assert why.startswith(f"measured: bf16 product {timings[0] / timings[1]:.2f}x the float32 time")
    data = clustered(2500, 40, 16, seed=6)
    result = knn(*data, ks=(5,))
    assert (result.protocol["prefilter"] is not None) is on and result.protocol["prefilter_choice"].startswith("meas")
    # Explicit settings, small banks and CPUs without native bfloat16 never time anything.
    calls.clear()
    for setting in (True, False):
        forced = knn(*data, ks=(5,), prefilter=setting)
        assert (forced.protocol["prefilter"] is not None) is setting
        assert forced.protocol["prefilter_choice"] == f"explicit: prefilter={setting}"
        assert torch.equal(forced.predictions[5], result.predictions[5])
    assert knn(*clustered(500, 40, 16, seed=6), ks=(5,)).protocol["prefilter"] is None
    monkeypatch.setattr(KNN_MODULE, "fast_bfloat16", lambda device: False)
    assert prefilter_default(torch.device("cpu"), 50_000, 384) == (
        False, "default: off, no native bfloat16 matrix products on cpu")
    assert calls == []


def test_product_timings_are_measured_once_per_process():
    product_seconds.cache_clear()
    first = product_seconds(32, 1)
    assert product_seconds(32, 1) == first and product_seconds.cache_info().hits == 1
    assert all(t > 0 for t in first) and torch.get_num_threads() == 1


def test_similarities_do_not_depend_on_the_bank_size_or_the_batch():
    # A 384-dimensional product's entries change with its shape; the canonical similarities do not.
    g = torch.Generator().manual_seed(7)
    bank, queries = canonical_normalize(torch.randn(5000, 384, generator=g)), torch.randn(50, 384, generator=g)
    assert torch.equal(canonical_normalize(queries)[:7], canonical_normalize(queries[:7]))
    queries = canonical_normalize(queries)
    whole = Float32TopK(bank, 30).topk(queries)
    part = Float32TopK(bank[:1234], 30).topk(queries[:9])
    assert torch.equal(canonical_dot(queries[:, None], bank[whole[1]]), whole[0])
    assert torch.equal(canonical_dot(queries[:9, None], bank[part[1]]), part[0])
    for row in range(9):  # every pair scored in both lists has one value
        common, here, there = np.intersect1d(whole[1][row].numpy(), part[1][row].numpy(), return_indices=True)
        assert len(common) > 0 and torch.equal(whole[0][row, here], part[0][row, there])


def test_float32_search_is_exact_on_exact_ties_beyond_its_widened_candidates():
    g = torch.Generator().manual_seed(8)
    bank = canonical_normalize(torch.randn(400, 24, generator=g))
    bank[50:300] = bank[7]  # 251 equal rows: more than the 8 x 21 widened candidates for k = 5
    queries = canonical_normalize(torch.cat([bank[7:8] + 0.01 * torch.randn(3, 24, generator=g),
                                             torch.randn(5, 24, generator=g)]))
    search = Float32TopK(bank, 5)
    sims, idx = search.topk(queries)
    assert search.stats["exhaustive"] >= 3
    every = canonical_dot(queries[:, None], bank[None])
    for row in range(len(queries)):
        expected = np.lexsort((np.arange(400), -every[row].numpy()))[:5]  # by similarity, then by index
        assert idx[row].tolist() == expected.tolist() and torch.equal(sims[row], every[row, expected])
    assert idx[:3].tolist() == [[7, 50, 51, 52, 53]] * 3


@pytest.mark.parametrize("ks, message", [([], "empty"), ([5, 0], "must be positive"), ([5, 5], "lists a k twice")])
def test_knn_sharded_knn_and_the_recipe_refuse_the_same_neighbour_counts_alike(ks, message):
    """One check of the neighbour counts (`neighbour_counts`): the estimator, its sharded form and the recipe's
    check say the same sentence, the recipe naming its key."""
    from headprobe.probes.builtin.knn import KnnSpec, check_knn
    from headprobe.probes.declaration import TrainImages
    from headprobe.probes.sharded_knn import sharded_knn

    x, y = torch.randn(20, 4), torch.arange(20) % 3
    with pytest.raises(ValueError, match=f"^ks .*{message}"):
        knn(x, y, x, y, ks=ks)
    with pytest.raises(ValueError, match=f"^ks .*{message}"):
        sharded_knn(x, y, x, y, offset=0, world=1, ks=ks)
    with pytest.raises(ValueError, match=f"^probes.knn.ks .*{message}"):
        check_knn(KnnSpec(ks=ks), TrainImages(None, "the recipe"))
