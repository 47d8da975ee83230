"""The k-NN probe: DINO's weighted k-nearest-neighbour vote (cosine similarity, top-k votes weighted exp(s/T)), its
accuracy for each k; with several processes on a large bank, sharded over the processes (`sharded_knn`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from headprobe.registry import POSITIVE, at_least

from ..declaration import CHUNKS, CLASS_CHANCE, INFORMATION, Metric, Probe, TrainImages
from ..knn_counts import DEFAULT_KS, neighbour_counts
from ..tap_data import ProbeOutput, TapData


@dataclass
class KnnSpec:
    # The neighbour counts (default: DINO's, `probes.knn.DEFAULT_KS`, the estimator's own default too).
    ks: list[int] = field(default_factory=lambda: list(DEFAULT_KS), metadata=at_least(1))
    temperature: float = field(default=0.07, metadata=POSITIVE)
    weighting: Literal["exp", "uniform"] = "exp"
    # Test queries per similarity block: memory only (O(chunk_size × N)), never the predictions.
    chunk_size: int = field(default=256, metadata=at_least(1))
    # With several processes: true = each searches 1/W of the training bank and the partial top-k lists are merged
    # (DINOv2's sharded k-NN; the same predictions); false = each tap's whole k-NN runs on one process; null =
    # shard from 65,536 training rows (probe_sharing.SHARD_BANK_ROWS), below which one process's k-NN is cheaper.
    shard_bank: bool | None = None


def check_knn(options: KnnSpec, train: TrainImages) -> None:
    """ks: not empty, no k twice, none above the training images."""
    ks = neighbour_counts(options.ks, "probes.knn.ks")
    for i, k in enumerate(ks):
        if train.count is not None and k > train.count:
            raise ValueError(f"probes.knn.ks[{i}] = {k} is more neighbours than the {train.count} training "
                             f"images ({train.source}); use ks of at most {train.count}, e.g. "
                             f"probes.knn.ks=[{min(10, train.count)}], or train on more images.")


def measure_knn(tap: TapData, *, shard_bank: bool | None, processes: tuple[int, int] | None = None,
                **options) -> ProbeOutput:
    """The k-NN probe. processes=(rank, world), given by the run when W > 1 processes call it together (which the
    run decides from `shard_bank`: `probe_sharing.shard_knn_bank`): each searches its 1/W of the training bank and
    they merge their partial top-k (`sharded_knn`)."""
    from headprobe.stats.bootstrap import TEST_IMAGES, PerUnit

    from ..knn import knn as knn_probe

    if processes is not None and processes[1] > 1:
        from ..sharded_knn import shard_rows, sharded_knn

        rank, world = processes
        rows = shard_rows(len(tap.train_x), world, rank)
        # narrow, not a slice: a tap read by rows stays read by rows (a tensor gives the same view).
        shard = tap.train_x.narrow(0, rows.start, rows.stop - rows.start)
        result = sharded_knn(shard, tap.train_y[rows], tap.test_x, tap.test_y, offset=rows.start,
                             world=world, num_classes=tap.n_classes, **options)
    else:
        result = knn_probe(tap.train_x, tap.train_y, tap.test_x, tap.test_y, num_classes=tap.n_classes, **options)
    y = tap.test_y.cpu().long()
    per_unit = {f"knn.k{k}.acc": PerUnit((pred == y).double(), TEST_IMAGES) for k, pred in result.predictions.items()}
    return ProbeOutput(dict(result.metrics), result.protocol, per_unit)


KNN = Probe(
    "knn", measure_knn, "DINO weighted k-NN: cosine similarity, top-k votes weighted exp(s/T)",
    options=KnnSpec, check=check_knn, reads=CHUNKS,
    reads_why="the bank knn.BANK_ROWS rows and the queries chunk_size rows at a time; holds the (M, k) neighbours",
    cost=1.0, cost_source="benchmarks/results/probe_costs.json", shards_bank=True,
    metrics=(
        Metric("knn.k{k}.acc", "test accuracy of a weighted {k}-nearest-neighbour vote (cosine, train images as the "
               "neighbours)", "fraction of test images", "higher = more class information", CLASS_CHANCE,
               role=INFORMATION, predicted=-1, answers=("Q-class",), headline=2, headline_name="knn.k20.acc"),
    ),
)
