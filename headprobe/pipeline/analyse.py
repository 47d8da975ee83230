"""Geometry of a finished run's heads, without retraining: `headprobe geometry RUN_DIR`.

Rebuilds the backbone, data and cached view features from the run's `config.yaml` (cache hits
when the run's cache is still there), loads each head from the last checkpoint, evaluates the
per-head geometry (`geometry.analyse.analyse_head`) and writes it into `results.json`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from headprobe.parallel.distributed import process_state
from headprobe.parallel.threads import configure_threads, resumed_threads
from headprobe.pipeline import stages
from headprobe.pipeline.geometry_claims import answer_geometry_questions
from headprobe.pipeline.time_estimate import geometry_estimate
from headprobe.recipe import load_recipe
from headprobe.record.directory import RunDir, read_results
from headprobe.record.lock import folder_lock
from headprobe.record.writer import RecordWriter
from headprobe.train.cached_views import CheckpointError, build_head, latest_checkpoint, load_checkpoint


def analyse_run(run_dir: str | Path, *, rows: int | None = None, quiet: bool = False) -> dict:
    """Fill results["heads"][H]["geometry"] of a finished frozen-backbone run; returns the updated results. The run
    folder is locked meanwhile (`record.lock`: a run, resume or report writing there at the same time is refused)."""

    state = process_state()
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"{run_dir} is not a folder; pass a run directory written by `headprobe run`.")
    with folder_lock(run_dir, "geometry", state):
        return _analyse_locked(run_dir, rows, quiet, state)


def _analyse_locked(run_dir: str | Path, rows: int | None, quiet: bool, state) -> dict:

    run = RunDir(run_dir)
    results = read_results(run.path)
    config = run.path / "config.yaml"
    if not config.is_file():
        raise FileNotFoundError(f"{config} is missing; pass a run directory written by `headprobe run`.")
    recipe = load_recipe(config)
    if not recipe.heads:
        raise ValueError(f"the run in {run.path} trained no heads; there is no head geometry to analyse.")
    if recipe.backbone.tune != "frozen":
        raise ValueError(f"the run in {run.path} tuned its backbone ({recipe.backbone.tune}); re-analysing it needs "
                         "the tuned weights, so set geometry.final: true in the recipe and run it again.")
    seeds = recipe.seed_list
    # Several seeds: geometry analyses the first seed's heads, as the run itself does.
    folder = run.path / "checkpoints" / (f"seed-{seeds[0]}" if len(seeds) > 1 else "")
    checkpoint = latest_checkpoint(folder)
    if checkpoint is None:
        raise FileNotFoundError(f"{folder} holds no step-*.pt; the heads' weights are needed.")
    try:
        saved = load_checkpoint(checkpoint)["heads"]
    except CheckpointError as err:
        raise stages.RunError("reading the heads' checkpoint", err, None) from None
    if rows is not None:
        recipe.geometry.rows = rows
    if not quiet:  # said before the long part starts: loading and extracting again can take minutes


        print(geometry_estimate(results, sum(1 for spec in recipe.heads if spec.name in saved), recipe.geometry.rows),
              file=sys.stderr, flush=True)
    # The run's own count, so the analysis sums as the run did (`parallel.threads`)
    configure_threads(recipe.runtime.threads, resumed_threads(run.path))
    # This analysis's own loading and extraction are not the run's: clocked apart (geometry_timing), so
    # results["timing"] keeps what the run measured. No invocation: a failure leaves the run's status alone.
    record = RecordWriter(run, results, invocation=None, timing={})
    ctx = stages.RunContext(recipe, record, state, show=not quiet)
    inputs = stages.load_backbone(ctx)
    record.add_time({"load_s": inputs.load_s})
    record.put("backbone", inputs.backbone.describe(), write=False)
    inputs = stages.load_data(ctx, inputs)
    record.put("data", inputs.data_record())
    features = stages.extract_features(ctx, inputs)
    record.add_time(features.seconds)
    record.put("protocol", features.protocol, merge=True, write=False)
    ctx.reading(features)
    heads = {}
    for spec in recipe.heads:
        if spec.name not in saved:
            continue  # the identity head has no weights and no geometry
        head, predictor = build_head(spec, inputs.backbone.dim, seeds[0])
        head.load_state_dict(saved[spec.name]["head"])
        if predictor is not None:
            predictor.load_state_dict(saved[spec.name]["predictor"])
        heads[spec.name] = stages.HeadPair(head.eval(), predictor.eval() if predictor else None)
    t0 = time.perf_counter()
    for head, geometry in stages.analyse_geometry(ctx, features, heads):
        record.put(("heads", head, "geometry"), geometry)
    with ctx.stage("answering Q-split and Q-saddle"):
        geometry_claims = answer_geometry_questions(ctx, features, {seeds[0]: heads})
    record.put("claims", geometry_claims, merge=True)
    ctx.clock("geometry_s", time.perf_counter() - t0)
    with ctx.stage("checking the cached features read"):
        ctx.verify_cache(final=True)
    record.put("geometry_from", str(checkpoint.relative_to(run.path)), write=False)
    record.put("geometry_timing", record.timing)  # the analysis's own
    if recipe.report:
        stages.write_report(run)
    return results
