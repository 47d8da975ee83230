"""The k-NN with its bank split across processes gives exactly the single-process k-NN's predictions, ties included."""

import os
import socket
import sys
import threading

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from headprobe.probes.knn import knn, ordered_topk
from headprobe.probes.knn_prefilter import Float32TopK, canonical_normalize
from headprobe.probes.sharded_knn import (
    local_neighbours,
    merge_neighbours,
    shard_rows,
    shard_search,
    sharded_knn,
    vote,
)

SHARDED_MODULE = sys.modules["headprobe.probes.sharded_knn"]
KNN_MODULE = sys.modules["headprobe.probes.knn"]


def tied_data(seed: int = 0):
    """Digits-like data full of exact ties: the training bank is 12 distinct directions, each repeated with several
    labels, so many queries have neighbours at equal similarity with different classes at the k-th place."""
    g = torch.Generator().manual_seed(seed)
    directions = torch.randn(12, 6, generator=g)
    which = torch.randint(0, 12, (150,), generator=g)
    train_x = directions[which] * torch.rand(150, 1, generator=g).add(0.5)  # scaled copies: equal cosines
    train_y = torch.randint(0, 4, (150,), generator=g)
    test_x = torch.cat([directions[torch.randint(0, 12, (30,), generator=g)], torch.randn(30, 6, generator=g)])
    test_y = torch.randint(0, 4, (60,), generator=g)
    return train_x, train_y, test_x, test_y


def simulated_shards(train_x, train_y, test_x, world: int, k: int, prefilter: bool | None = False):
    """Each shard's partial lists, as each process would compute them, stacked as the all-gather stacks them."""
    parts = []
    for rank in range(world):
        rows = shard_rows(len(train_x), world, rank)
        sims, idx = local_neighbours(train_x[rows], test_x, k, rows.start, chunk_size=7, prefilter=prefilter)
        labels = torch.where(idx >= 0, train_y[idx.clamp_min(0)], 0)
        parts.append((sims, idx, labels))
    return [torch.stack(t) for t in zip(*parts, strict=True)]


def test_ordered_topk_breaks_ties_by_smaller_index():
    scores = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 3.0, 0.0, 3.0]] * 2 + [[0.5] * 8])
    for k in range(1, 9):
        values, idx = ordered_topk(scores, k)
        for row in range(len(scores)):
            expected = np.lexsort((np.arange(8), -scores[row].numpy()))[:k]  # by value, then by column
            assert idx[row].tolist() == expected.tolist(), (k, row)
            assert values[row].tolist() == scores[row, expected].tolist()


def test_ordered_topk_matches_a_full_sort_on_long_rows():
    # Long rows take blocked_topk's block path; rounded scores make ties at the k-th place common.
    scores = (torch.rand(40, 5000, generator=torch.Generator().manual_seed(1)) * 50).round()
    values, idx = ordered_topk(scores, 20)
    for row in range(len(scores)):
        expected = np.lexsort((np.arange(5000), -scores[row].numpy()))[:20]
        assert idx[row].tolist() == expected.tolist()


def whole_bank_search(train_x, test_x, k):
    """The neighbours `knn` finds over the whole bank: similarities and indices, (M, k) each."""
    return Float32TopK(canonical_normalize(train_x), k).topk(canonical_normalize(test_x))


@pytest.mark.parametrize("world", [2, 3, 7])
@pytest.mark.parametrize("weighting", ["exp", "uniform"])
def test_merged_shards_equal_one_bank_on_tied_data(world, weighting):
    train_x, train_y, test_x, test_y = tied_data()
    ks = (1, 4, 9, 30)
    single = knn(train_x, train_y, test_x, test_y, ks=ks, weighting=weighting, prefilter=False)
    sims, idx, labels = merge_neighbours(*simulated_shards(train_x, train_y, test_x, world, max(ks)), max(ks))
    reference_sims, reference_idx = whole_bank_search(train_x, test_x, max(ks))
    assert torch.equal(idx, reference_idx) and torch.equal(sims, reference_sims)
    assert torch.equal(labels, train_y[idx])
    ties = 0
    for k in ks:
        merged = vote(sims, labels, k, 4, 0.07, weighting)
        assert torch.equal(merged, single.predictions[k]), k
        ties += int((sims[:, k - 1] == sims[:, k]).sum()) if k < max(ks) else 0
    assert ties > 20  # the data do put equal similarities at the k-th place


def test_a_shard_shorter_than_k_pads_and_the_padding_is_never_chosen():
    train_x, train_y, test_x, test_y = tied_data(2)
    train_x, train_y = train_x[:23], train_y[:23]
    single = knn(train_x, train_y, test_x, test_y, ks=(20,), prefilter=False)
    stacked = simulated_shards(train_x, train_y, test_x, 4, 20)  # shards of 6, 6, 6, 5 rows
    assert (stacked[1] == -1).any()
    sims, idx, labels = merge_neighbours(*stacked, 20)
    assert (idx >= 0).all()
    assert torch.equal(vote(sims, labels, 20, 4, 0.07, "exp"), single.predictions[20])


def test_one_process_is_knn():
    train_x, train_y, test_x, test_y = tied_data(3)
    for prefilter in (False, True):
        one = sharded_knn(train_x, train_y, test_x, test_y, offset=0, world=1, ks=(3, 10), prefilter=prefilter)
        single = knn(train_x, train_y, test_x, test_y, ks=(3, 10), prefilter=prefilter)
        assert one.metrics == single.metrics
        assert all(torch.equal(one.predictions[k], single.predictions[k]) for k in (3, 10))
        assert one.protocol["shards"] == 1 and one.protocol["n_train"] == 150
        assert one.protocol["similarity"] == single.protocol["similarity"]
    assert one.protocol["prefilter"]["per_shard"] == [single.protocol["prefilter"]]


def clustered(n_train, n_test, dim, seed, copies=0):
    """Five noisy classes; with `copies`, the first rows are near-copies of one point next to the first query, which
    bfloat16 cannot tell apart (so the prefilter widens its candidates or falls back to float32), and the next
    `copies` exact copies of one row (so the float32 search must re-rank every tied row)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(5, dim, generator=g)
    y, yq = torch.randint(5, (n_train,), generator=g), torch.randint(5, (n_test,), generator=g)
    x = centres[y] + 2 * torch.randn(n_train, dim, generator=g)
    q = centres[yq] + 2 * torch.randn(n_test, dim, generator=g)
    if copies:
        unit = torch.nn.functional.normalize
        centre = unit(q[:1], dim=1) + 0.3 * unit(torch.randn(1, dim, generator=g), dim=1)
        x[:copies] = centre + 1e-3 * torch.randn(copies, dim, generator=g)
        x[copies : 2 * copies] = x[2 * copies]
        q[1] = x[2 * copies] + 0.01 * torch.randn(dim, generator=g)
    return x, y, q, yq


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("prefilter", [True, False])
@pytest.mark.parametrize("copies", [0, 700])
def test_merged_shards_equal_one_bank_with_and_without_the_prefilter(world, prefilter, copies):
    train_x, train_y, test_x, test_y = clustered(3001, 60, 40, seed=world, copies=copies)
    ks = (1, 10, 20)
    single = knn(train_x, train_y, test_x, test_y, ks=ks, prefilter=prefilter, chunk_size=16)
    assert (single.protocol["prefilter"] is not None) is prefilter
    assert single.protocol["prefilter_choice"] == f"explicit: prefilter={prefilter}"
    if prefilter and copies:  # bfloat16 could not separate the copies: candidates widened, or float32 redone
        assert single.protocol["prefilter"]["widened"] + single.protocol["prefilter"]["full_float32"] >= 1
    stacked = simulated_shards(train_x, train_y, test_x, world, max(ks), prefilter)
    sims, idx, labels = merge_neighbours(*stacked, max(ks))
    reference_sims, reference_idx = whole_bank_search(train_x, test_x, max(ks))
    assert torch.equal(idx, reference_idx) and torch.equal(sims, reference_sims)
    if copies:  # the exact copies are more than the float32 search's widened candidates: every tied row re-ranked
        assert idx[1].tolist() == list(range(copies, copies + max(ks)))
        search = Float32TopK(canonical_normalize(train_x), max(ks))
        search.topk(canonical_normalize(test_x))
        assert search.stats["exhaustive"] >= 1
    for k in ks:
        assert torch.equal(vote(sims, labels, k, 5, 0.07, "exp"), single.predictions[k]), k
    # The prefilter is on each shard too, with its statistics.
    rows = shard_rows(len(train_x), world, 0)
    *_, stats = shard_search(train_x[rows], test_x, max(ks), 0, prefilter=prefilter)
    assert (stats is not None and stats["queries"] == 60) is prefilter


class ThreadedRanks:
    """The collectives `sharded_knn` calls, for `world` ranks run as threads of this process (one rank each)."""

    def __init__(self, world: int) -> None:
        self.world, self.barrier, self.local, self.slots = world, threading.Barrier(world), threading.local(), {}

    def all_objects(self, obj, world):
        self.slots[self.local.rank] = obj
        self.barrier.wait()
        gathered = [self.slots[r] for r in range(world)]
        self.barrier.wait()
        return gathered

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(SHARDED_MODULE, "all_objects", self.all_objects)
        monkeypatch.setattr(SHARDED_MODULE, "all_rows", lambda t, world: torch.cat(self.all_objects(t, world)))
        monkeypatch.setattr(SHARDED_MODULE, "sum_over_ranks", lambda v, world, device: sum(self.all_objects(v, world)))
        monkeypatch.setattr(SHARDED_MODULE, "max_over_ranks", lambda v, world, device: max(self.all_objects(v, world)))

    def run(self, function):
        results, errors = {}, []

        def one(rank):
            self.local.rank = rank
            try:
                results[rank] = function(rank)
            except BaseException as error:  # noqa: BLE001 -- reported below, after every rank has stopped
                errors.append(error)
                self.barrier.abort()

        threads = [threading.Thread(target=one, args=(rank,)) for rank in range(self.world)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return [results[rank] for rank in range(self.world)]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("prefilter", [True, False, None])
def test_sharded_knn_equals_knn_with_the_same_prefilter_setting(monkeypatch, world, prefilter):
    train_x, train_y, test_x, test_y = clustered(2500, 50, 32, seed=5, copies=300)
    ks = (1, 5, 20)
    ranks = ThreadedRanks(world)
    ranks.install(monkeypatch)
    # The default's timing, fixed: two calibrations (a rank's thread sees another intra-op thread count than the
    # main thread, so each measures its own) may otherwise fall on either side of the threshold.
    monkeypatch.setattr(KNN_MODULE, "product_seconds", lambda dim, threads: (0.5, 1.0))

    def rank_result(rank):
        rows = shard_rows(len(train_x), world, rank)
        return sharded_knn(train_x[rows], train_y[rows], test_x, test_y, offset=rows.start, world=world, ks=ks,
                           chunk_size=16, prefilter=prefilter)

    results = ranks.run(rank_result)
    single = knn(train_x, train_y, test_x, test_y, ks=ks, prefilter=prefilter)
    for result in results:
        assert result.metrics == single.metrics
        assert all(torch.equal(result.predictions[k], single.predictions[k]) for k in ks)
        assert result.protocol["shards"] == world and result.protocol["n_train"] == 2500
        assert result.protocol["prefilter_choice"] == single.protocol["prefilter_choice"]
        assert result.protocol["similarity"] == single.protocol["similarity"]
        stats = result.protocol["prefilter"]
        assert (stats is None) is (single.protocol["prefilter"] is None)
        if stats is not None:
            assert stats["queries"] == 50 * world and len(stats["per_shard"]) == world
            assert stats["widened"] == sum(part["widened"] for part in stats["per_shard"])
        assert result.protocol == results[0].protocol


def test_a_failing_shard_stops_every_process_instead_of_leaving_them_waiting(monkeypatch):
    train_x, train_y, test_x, test_y = clustered(600, 20, 16, seed=2)
    ranks = ThreadedRanks(2)
    ranks.install(monkeypatch)
    real = SHARDED_MODULE.shard_search

    def search(*args, **kwargs):
        if ranks.local.rank == 1:
            raise MemoryError("simulated out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(SHARDED_MODULE, "shard_search", search)
    errors = {}

    def rank_result(rank):
        rows = shard_rows(len(train_x), 2, rank)
        try:
            sharded_knn(train_x[rows], train_y[rows], test_x, test_y, offset=rows.start, world=2, ks=(5,))
        except (RuntimeError, MemoryError) as err:
            errors[rank] = err

    ranks.run(rank_result)  # returns: no rank is left waiting in the gather
    assert isinstance(errors[1], MemoryError)
    assert isinstance(errors[0], RuntimeError) and "process 1 failed (MemoryError: simulated" in str(errors[0])


def test_shard_rows_cover_the_bank_once():
    for n, world in ((10, 3), (2, 4), (100, 7)):
        rows = [shard_rows(n, world, r) for r in range(world)]
        assert [i for s in rows for i in range(s.start, s.stop)] == list(range(n))
        assert max(s.stop - s.start for s in rows) - min(s.stop - s.start for s in rows) <= 1
    with pytest.raises(ValueError, match="rank 3"):
        shard_rows(10, 3, 3)


GLOO_CASES = [("tied", None), ("clustered", True), ("clustered", False)]


def gloo_data(case: str):
    return tied_data() if case == "tied" else clustered(2200, 40, 24, seed=9, copies=200)


def _worker(rank: int, world: int, port: int, out: dict) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for case, prefilter in GLOO_CASES:
            train_x, train_y, test_x, test_y = gloo_data(case)
            rows = shard_rows(len(train_x), world, rank)
            result = sharded_knn(train_x[rows], train_y[rows], test_x, test_y, offset=rows.start, world=world,
                                 ks=(1, 4, 9), chunk_size=16, prefilter=prefilter)
            out[rank, case, prefilter] = (result.metrics, {k: v.tolist() for k, v in result.predictions.items()},
                                          result.protocol["prefilter_choice"])
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.distributed
def test_two_gloo_processes_equal_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(2, port, out), nprocs=2, join=True)
        results = dict(out)
    for case, prefilter in GLOO_CASES:
        single = knn(*gloo_data(case), ks=(1, 4, 9), prefilter=prefilter)
        for rank in (0, 1):
            metrics, predictions, choice = results[rank, case, prefilter]
            assert metrics == single.metrics
            assert predictions == {k: v.tolist() for k, v in single.predictions.items()}
            assert choice == single.protocol["prefilter_choice"]
