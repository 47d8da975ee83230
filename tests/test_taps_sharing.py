"""How the probes of a run are shared out among processes (`taps.share_of_probes`)."""

from collections import Counter

import pytest

from headprobe.taps import share_of_probes

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
