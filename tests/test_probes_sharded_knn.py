"""The k-NN with its bank split across processes gives exactly the single-process k-NN's predictions, ties included."""

import os
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from headprobe.probes.knn import knn, ordered_topk
from headprobe.probes.sharded_knn import local_neighbours, merge_neighbours, shard_rows, sharded_knn, vote


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


def simulated_shards(train_x, train_y, test_x, world: int, k: int):
    """Each shard's partial lists, as each process would compute them, stacked as the all-gather stacks them."""
    parts = []
    for rank in range(world):
        rows = shard_rows(len(train_x), world, rank)
        sims, idx = local_neighbours(train_x[rows], test_x, k, rows.start, chunk_size=7)
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


@pytest.mark.parametrize("world", [2, 3, 7])
@pytest.mark.parametrize("weighting", ["exp", "uniform"])
def test_merged_shards_equal_one_bank_on_tied_data(world, weighting):
    train_x, train_y, test_x, test_y = tied_data()
    ks = (1, 4, 9, 30)
    single = knn(train_x, train_y, test_x, test_y, ks=ks, weighting=weighting, prefilter=False)
    sims, idx, labels = merge_neighbours(*simulated_shards(train_x, train_y, test_x, world, max(ks)), max(ks))
    reference_sims, reference_idx = ordered_topk(torch.nn.functional.normalize(test_x, dim=1)
                                                 @ torch.nn.functional.normalize(train_x, dim=1).T, max(ks))
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
    one = sharded_knn(train_x, train_y, test_x, test_y, offset=0, world=1, ks=(3, 10))
    single = knn(train_x, train_y, test_x, test_y, ks=(3, 10), prefilter=False)
    assert one.metrics == single.metrics
    assert all(torch.equal(one.predictions[k], single.predictions[k]) for k in (3, 10))
    assert one.protocol["shards"] == 1 and one.protocol["n_train"] == 150


def test_shard_rows_cover_the_bank_once():
    for n, world in ((10, 3), (2, 4), (100, 7)):
        rows = [shard_rows(n, world, r) for r in range(world)]
        assert [i for s in rows for i in range(s.start, s.stop)] == list(range(n))
        assert max(s.stop - s.start for s in rows) - min(s.stop - s.start for s in rows) <= 1
    with pytest.raises(ValueError, match="rank 3"):
        shard_rows(10, 3, 3)


def _worker(rank: int, world: int, port: int, out: dict) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        train_x, train_y, test_x, test_y = tied_data()
        rows = shard_rows(len(train_x), world, rank)
        result = sharded_knn(train_x[rows], train_y[rows], test_x, test_y, offset=rows.start, world=world,
                             ks=(1, 4, 9), chunk_size=16)
        out[rank] = (result.metrics, {k: v.tolist() for k, v in result.predictions.items()})
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
    train_x, train_y, test_x, test_y = tied_data()
    single = knn(train_x, train_y, test_x, test_y, ks=(1, 4, 9), prefilter=False)
    for rank in (0, 1):
        metrics, predictions = results[rank]
        assert metrics == single.metrics
        assert predictions == {k: v.tolist() for k, v in single.predictions.items()}
