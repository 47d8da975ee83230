"""How the probes of a run are shared out among processes (`probe_sharing.share_of_probes`)."""

from collections import Counter

import pytest

from headprobe.pipeline.probe_sharing import share_of_probes

ORDER = ["linear", "knn", "spectrum"]


def shares(pending, world):
    return [share_of_probes(pending, ORDER, rank, world) for rank in range(world)]


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_every_pending_probe_runs_once(world):
    pending = [ORDER, ["knn"], [], ORDER, ["linear", "spectrum"]]  # a resumed run: some probes already done
    dealt = Counter((i, name) for share in shares(pending, world) for i, names in share.items() for name in names)
    assert dealt == Counter((i, name) for i, names in enumerate(pending) for name in names)


def test_each_probe_is_split_evenly_between_two_processes():
    pending = [ORDER] * 4
    per_rank = [Counter(name for names in share.values() for name in names) for share in shares(pending, 2)]
    assert per_rank == [Counter({"linear": 2, "knn": 2, "spectrum": 2})] * 2
    # One tap: its probes go to different processes rather than all to the first.
    one_tap = shares([ORDER], 2)
    assert one_tap == [{0: ["linear", "spectrum"]}, {0: ["knn"]}]


def test_a_unit_keeps_the_recipe_order_of_its_probes():
    for share in shares([ORDER] * 3, 2):
        for names in share.values():
            assert names == sorted(names, key=ORDER.index)


def test_one_process_runs_everything():
    pending = [ORDER, ["knn"]]
    assert share_of_probes(pending, ORDER, 0, 1) == {0: ORDER, 1: ["knn"]}


COSTS = {"linear": 3.0, "knn": 1.0, "spectrum": 0.5}


@pytest.mark.parametrize("world", [2, 3])
def test_timed_probes_go_longest_first_to_the_least_loaded_process(world):
    pending = [ORDER] * 3 + [["knn", "spectrum"]]
    split = [share_of_probes(pending, ORDER, rank, world, costs=COSTS) for rank in range(world)]
    dealt = Counter((i, name) for share in split for i, names in share.items() for name in names)
    assert dealt == Counter((i, name) for i, names in enumerate(pending) for name in names)  # each once
    loads = [sum(COSTS[name] for names in share.values() for name in names) for share in split]
    total, longest = sum(loads), max(COSTS.values())
    # LPT is within 4/3 of the best split, which is at least the mean load and at least the longest probe.
    assert max(loads) <= 4 / 3 * max(total / world, longest) + 1e-12, loads
    if world == 2:  # round-robin would give 9.0 and 6.0 (two of the three linear probes to one process)
        assert sorted(loads) == [7.5, 7.5]
        unbalanced = [share_of_probes(pending, ORDER, rank, 2) for rank in range(2)]
        assert sorted(sum(COSTS[n] for names in s.values() for n in names) for s in unbalanced) == [6.0, 9.0]


def test_an_untimed_probe_costs_the_mean_of_the_timed_ones():
    split = [share_of_probes([ORDER] * 2, ORDER, rank, 2, costs={"linear": 4.0, "knn": 2.0}) for rank in range(2)]
    # spectrum counts 3.0: linear 4 | linear 4, then spectrum 3 | spectrum 3, knn 2 | knn 2.
    assert [sorted(n for names in s.values() for n in names) for s in split] == [["knn", "linear", "spectrum"]] * 2


def test_the_knn_bank_is_sharded_when_asked_or_when_large():
    from headprobe.pipeline.probe_sharing import SHARD_BANK_ROWS, shard_knn_bank

    assert not shard_knn_bank(None, SHARD_BANK_ROWS - 1) and shard_knn_bank(None, SHARD_BANK_ROWS)
    assert shard_knn_bank(True, 10) and not shard_knn_bank(False, 10**7)
