"""The paper's regime: the backbone tuned together with its heads (`backbone.tune`: last:N, lora, full), once per
training seed.

A tuned backbone is itself a product of the training seed, so with `seeds: [0, 1, 2]` the backbone tap differs per
seed as the head taps do. `tune_and_probe` tunes a fresh copy of the untuned backbone with its heads for each seed
(seed s trains and scores exactly as the run with `seeds: [s]` does), extracts every feature again from it and
probes the backbone tap and every head tap of that seed (units (tap, s), per-unit stores ``TAP.seed-S``) before the
next seed starts. Then every tap's seed aggregate, the verdicts and the paper's answers are made over the seeds
(`probing.answer_heads`), each seed's head against the backbone tuned with it. `backbone_untuned`, where every seed
starts, is probed once, before (`compose.run`). With one seed nothing is copied and the units carry no seed, as
before.

Checkpoints and the tuned weights of seed s go to ``checkpoints/seed-S/`` (one seed: ``checkpoints/``), so an
interrupted run resumes each seed where it stopped: a finished seed's last checkpoint restores its backbone and
heads without a step more, a seed cut short continues from its last checkpoint exactly as it would have gone on
(`train.tuned`), and the probes already recorded are not run again. Every process trains each seed together (one
global batch over the processes, `train.tuned`): the seed executor, which shares seeds out on the cached path, has no
part here.
"""

from __future__ import annotations

import copy
import dataclasses
import time

from headprobe.pipeline import probing, stages
from headprobe.pipeline.taps import Tap
from headprobe.pipeline.training_record import record_training

__all__ = ["tune_and_probe"]


def tune_and_probe(ctx, inputs: stages.Inputs) -> None:
    """Per seed of `ctx.recipe.seed_list`: tune the backbone with the heads, record the training, extract the
    features again, analyse the first seed's final geometry, probe the backbone and head taps; then the seeds'
    aggregates, verdicts and answers. `inputs`: the untuned backbone (the first seed tunes it in place) and the
    data."""
    from headprobe.pipeline.geometry_claims import answer_geometry_questions

    recipe, record = ctx.recipe, ctx.record
    seeds = recipe.seed_list
    several = len(seeds) > 1
    # Tuning changes the weights in place: every later seed starts from a copy of the untuned ones, kept on the CPU.
    kept = copy.deepcopy(inputs.backbone).cpu() if several else None
    every, compared, kept_records, features = [], {}, {}, None
    ran = False
    for i, seed in enumerate(seeds):
        backbone = inputs.backbone if i == 0 else kept if i == len(seeds) - 1 else copy.deepcopy(kept)
        seeded = dataclasses.replace(inputs, backbone=backbone)
        trained = stages.tune_backbone(ctx, seeded, seed, several)
        _record_training(ctx, trained, seed, several, kept_records)
        features = stages.extract_features(ctx, seeded, tuned=True, geometry=i == 0)
        # The first seed's extraction is the one recorded (the settings are every seed's; the weights are
        # backbone_tuned.seeds); each seed's cache files are verified while they are read.
        record.add_time(features.seconds)
        record.put("protocol", features.protocol if i == 0 else {}, merge=True, write=False)
        ctx.reading(features)
        if i == 0 and recipe.geometry.final:
            t0 = time.perf_counter()
            for head, geometry in stages.analyse_geometry(ctx, features, trained.first):
                record.put(("heads", head, "geometry"), geometry)
            # each seed tunes its own backbone: Q-split reads the first seed's heads on its features
            with ctx.stage("answering Q-split and Q-saddle"):
                geometry_claims = answer_geometry_questions(ctx, features, {seed: trained.first})
            ctx.clock("geometry_s", time.perf_counter() - t0)
        units, compared = probing.head_units(ctx, trained.by_seed, seeded=several, tuned=True)
        for part in ([(Tap("backbone"), seed if several else None)], units):
            t0 = ctx.probes.start_clock()
            probed = probing.probe_units(ctx, features, part)
            if probed.ran:
                ran = True
                ctx.clock("probe_s", time.perf_counter() - t0)
            every += part
        if several:
            backbone.cpu()  # off the device, so the next seed has it to itself
    t0 = time.perf_counter()
    probing.answer_heads(ctx, features, every, compared, probed.taps)
    if ran:
        ctx.clock("probe_s", time.perf_counter() - t0)
    if recipe.geometry.final:  # after probing, whose answers replace results["claims"]
        record.put("claims", geometry_claims, merge=True)


def _record_training(ctx, trained: stages.TrainedHeads, seed: int, several: bool, kept: dict) -> None:
    """One seed's training into the record. With several seeds, `kept` gathers what the record shows of all of them
    so far: each head's record is the first seed's with every seed's status and loss (`train_seeds`), as on the
    cached path, and `backbone_tuned` holds each seed's tuned weights (`seeds`: fingerprint, saved)."""
    heads, protocol, tuned = trained.heads, trained.protocol, trained.backbone_tuned
    first = not kept
    if several:
        for name, entry in trained.heads.items():
            shown = kept.setdefault("heads", {}).setdefault(name, entry)
            shown.setdefault("train_seeds", {})[str(seed)] = {
                "status": entry["train"]["status"], "final_loss": entry["train"]["final_loss"]}
        kept.setdefault("protocol", protocol | {"seeds": {
            "seeds": ctx.recipe.seed_list,
            "varies": "the tuned backbone and its heads: head (and LoRA) initialisation, batch order, the views "
                      "made on the fly and dropout (the training seed)",
            "shared": "the untuned backbone every seed starts from (backbone_untuned; a scratch backbone's "
                      "initialisation is drawn with `seed`), the held-out views and the probes' own splits and "
                      "seeds (drawn with `seed`); geometry analyses the first seed's backbone and heads"}})
        shown_tuned = kept.setdefault("backbone_tuned", {
            **{k: v for k, v in tuned.items() if k not in ("fingerprint", "saved")}, "seeds": {}})
        shown_tuned["seeds"][str(seed)] = {k: tuned[k] for k in ("fingerprint", "saved") if k in tuned}
        heads, protocol, tuned = kept["heads"], kept["protocol"], shown_tuned
    # The run's training time adds up the seeds of this invocation (and, resumed, the time recorded before).
    shown = dataclasses.replace(trained, heads=heads, protocol=protocol, backbone_tuned=tuned)
    record_training(ctx.record, shown, trained.resumed or not first)
    ctx.announce_estimate("training")
