"""The geometry stage's questions (`stats.geometry_claims`): Q-split from the run's trained heads of every seed,
Q-saddle from constructed collapsed states (`geometry.saddle`), both into results.json["claims"]."""

from __future__ import annotations

import copy
import dataclasses
import sys
import time

import torch

from headprobe.geometry.analyse import objective_closure
from headprobe.geometry.effective import scalar_loss
from headprobe.geometry.pullback import batchnorm_mode
from headprobe.geometry.saddle import LOSSES, SaddleSpec, collapsed_states
from headprobe.geometry.split_share import batch_shares, predicts_zero_m
from headprobe.stats.geometry_claims import SplitMeasure, answer_saddle, answer_split
from headprobe.train.heads import ProjectionHead

# Q-split's evaluation: batches of images (two views each), Gaussian probes per batch (`split_share.m_share`).
SPLIT_BATCHES, SPLIT_BATCH, SPLIT_PROBES = 8, 8, 4


def split_measures(by_seed: dict[int, dict], objective, options: dict, views: torch.Tensor,
                   seed: int = 0) -> list[SplitMeasure]:
    """Each trained head's `SplitMeasure` over the seeds of by_seed ({seed: {name: state with .head and
    .predictor}}; None states, the identity head, and pretrained heads are left out); views: (N, K ≥ 2, D)."""
    from headprobe.train.pretrained_heads import PretrainedHead

    rows = views[: SPLIT_BATCHES * SPLIT_BATCH].double()
    found: dict[str, dict] = {}
    for s, heads in by_seed.items():
        for name, state in heads.items():
            if state is None or isinstance(state, PretrainedHead) or not list(state.head.parameters()):
                continue
            head = copy.deepcopy(state.head).double()
            predictor = copy.deepcopy(state.predictor).double() if state.predictor is not None else None
            fn = objective_closure(objective, options, predictor)
            entry = found.setdefault(name, {"batch": {}, "running": {}, "head": head})
            for mode in ("batch", "running"):
                with batchnorm_mode([predictor], mode):  # the predictor in the head's mode, as in training
                    entry[mode][s] = batch_shares(head, lambda h1, h2, fn=fn: scalar_loss(fn(h1, h2)), rows,
                                                  SPLIT_BATCHES, SPLIT_BATCH, SPLIT_PROBES, mode, seed)
    return [SplitMeasure(name, e["batch"], e["running"], predicts_zero_m(e["head"], "batch"),
                         predicts_zero_m(e["head"], "running")) for name, e in found.items()]


SADDLE_SEEDS = 3


def saddle_spec(geometry, seed: int) -> SaddleSpec | None:
    """The recipe's Q-saddle states (`geometry.saddle_states` per seed, seeds seed .. seed + 2, its collapse
    threshold); None when it asks for none."""
    if not geometry.saddle_states:
        return None
    return SaddleSpec(seeds=tuple(range(seed, seed + SADDLE_SEEDS)), states=geometry.saddle_states,
                      threshold=geometry.collapse_threshold)


def answer_geometry_questions(ctx, features, by_seed: dict[int, dict]) -> dict:
    """{"Q-split": ..., "Q-saddle": ...} for results.json["claims"]: Q-split on the run's cached views, Q-saddle on
    the recipe's constructed states (`saddle_spec`) under the SimSiam and the target loss."""
    from headprobe.registry import OBJECTIVES

    recipe = ctx.recipe
    claims = answer_split(split_measures(by_seed, OBJECTIVES.get(recipe.objective.name), recipe.objective.options,
                                         features.views.features, recipe.seed), seed=recipe.seed)
    spec = saddle_spec(recipe.geometry, recipe.seed)
    if spec is None:
        return claims
    if ctx.show:  # said before the work starts: its time depends on these sizes
        print(f"Q-saddle: {spec.sizes()}; under the {' and the '.join(LOSSES)} losses", file=sys.stderr,
              flush=True)
    start = time.perf_counter()
    states = {loss: collapsed_states(dataclasses.replace(spec, loss=loss), ProjectionHead) for loss in LOSSES}
    claims |= answer_saddle(states, spec.sizes(), seed=recipe.seed)
    claims["Q-saddle"]["time_s"] = time.perf_counter() - start
    return claims
