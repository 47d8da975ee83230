"""The neighbour counts of the k-NN probe: DINO's default list and the one check of a list given, without torch
(the recipe checks it before any model loads; `knn`, `sharded_knn` and `probes.builtin.knn` read it from here)."""

from __future__ import annotations

from collections.abc import Sequence

# The neighbour counts of DINO's k-NN evaluation (eval_knn.py's nb_knn): the default of `knn`, of `sharded_knn` and
# of the recipe's probes.knn.ks, written here once.
DEFAULT_KS = (10, 20, 100, 200)


def neighbour_counts(ks: Sequence[int], name: str = "ks") -> list[int]:
    """`ks` as a list of ints; ValueError naming `name` (e.g. "probes.knn.ks" in a recipe) when it is empty, holds a
    count below 1 or a count twice. The one check of the neighbour counts: `knn`, `sharded_knn` and the recipe's."""
    ks = [int(k) for k in ks]
    if not ks:
        raise ValueError(f"{name} is empty; give at least one neighbour count, e.g. {name}=[10, 20].")
    if min(ks) <= 0:
        raise ValueError(f"{name} = {ks}: neighbour counts must be positive, e.g. {name}=[10, 20].")
    if len(set(ks)) != len(ks):
        raise ValueError(f"{name} = {ks} lists a k twice (duplicates); list each neighbour count once.")
    return ks
