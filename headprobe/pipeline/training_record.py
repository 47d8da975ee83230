"""What the training stage puts into the record (`stages.TrainedHeads`): its time, the tuned backbone, the training
protocol, the heads' records and, where heads were tracked, the saddle grid pooled from them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headprobe.pipeline.stages import TrainedHeads
    from headprobe.record.writer import RecordWriter


def record_training(record: RecordWriter, trained: TrainedHeads, resumed: bool) -> None:
    """`trained` into the record, then results.json written. Its seconds (None: nothing was trained) and the curvature
    tracking's share, `resumed` (from a checkpoint, or a later seed's training trained after another) adding to the
    time recorded so far; the heads' records beside any recorded before; `saddle_grid` (claim 4 per cell, with its
    intervals: `stats.saddle_grid`) recomputed from every recorded head once one is tracked."""
    if trained.seconds is not None:
        record.add_time({"train_s": trained.seconds}, restart=not resumed)
        if trained.track_s:
            record.add_time({"track_s": trained.track_s}, restart=not resumed)
            record.put(("timing_ratios", "track_over_train"),
                       trained.track_s / max(record.timing["train_s"], 1e-9), write=False)
    if trained.backbone_tuned is not None:
        record.put("backbone_tuned", trained.backbone_tuned, write=False)
    if "train" in trained.protocol:
        record.put(("protocol", "train"), trained.protocol["train"], write=False)
    record.put("heads", trained.heads, merge=True, write=False)
    record.put("protocol", {k: v for k, v in trained.protocol.items() if k != "train"}, merge=True, write=False)
    if any(h.get("tracked") for h in record.record["heads"].values()):
        from headprobe.stats.saddle_grid import saddle_grid

        record.put("saddle_grid", saddle_grid(record.record), write=False)
    record.write()
