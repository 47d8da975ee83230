import numpy as np
import pytest
import torch
from sklearn.neighbors import KNeighborsClassifier

from headprobe.probes import knn


@pytest.fixture(autouse=True)
def single_thread():
    # These tensors are tiny: on a busy machine, waking intra-op threads costs far more than the math.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
