"""The geometry stage's questions (`stats.geometry_claims`, `stats.whiten_claim`, `stats.metric_claim`): Q-whiten,
Q-metric (`pipeline.metric_claim`) and Q-split from the run's trained heads of every seed, Q-saddle from
constructed collapsed states (`geometry.saddle`); each question's `GeometryAnswers`, which the record writer puts
into results.json["claims"]."""

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
from headprobe.geometry.whiten import batch_isotropy
from headprobe.pipeline.metric_claim import metric_measures
from headprobe.stats.geometry_answers import GeometryAnswers
from headprobe.stats.geometry_claims import SplitMeasure, answer_saddle, answer_split, with_override
from headprobe.stats.metric_claim import Q_METRIC, answer_metric
from headprobe.stats.whiten_claim import Q_WHITEN, WhitenMeasure, answer_whiten
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


# Q-whiten's evaluation: disjoint batches of up to the training batch size (two views each), rows sampled per batch.
WHITEN_BATCHES, WHITEN_ROWS = 4, 4


def whiten_batches(n: int, batch_size: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(image indices (b,), rows of the stacked [z1; z2] (WHITEN_ROWS,)) of each Q-whiten evaluation batch:
    WHITEN_BATCHES disjoint batches of b = min(batch_size, n // WHITEN_BATCHES) images (fewer when n < 2 images per
    batch), drawn from `seed`, the same for every head, seed and state."""
    b = min(batch_size, n // WHITEN_BATCHES) if n >= 2 * WHITEN_BATCHES else n
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=gen)
    count = min(WHITEN_BATCHES, n // b) if b >= 2 else 0
    return [(order[i * b:(i + 1) * b], torch.randperm(2 * b, generator=gen)[:WHITEN_ROWS]) for i in range(count)]


def _is_linear(head) -> bool:
    return getattr(head, "kind", None) == "linear" and any(True for _ in head.parameters())


def whiten_measures(by_seed: dict[int, dict], specs, objective, options: dict, views: torch.Tensor,
                    batch_size: int, seed: int = 0) -> list[WhitenMeasure]:
    """Each trained linear head's `WhitenMeasure` over the seeds of by_seed ({seed: {name: state with .head and
    .predictor}}), against the head (and predictor) at its initial weights, rebuilt from (seed, name) as the
    training built them (`train.engine.build_head`: the `null_heads: [init]` copy's weights); views: (N, K ≥ 2, D).
    Both in float64 and eval mode."""
    from headprobe.recipe.null_heads import trainable_specs
    from headprobe.train.engine import build_head

    batches = whiten_batches(views.shape[0], batch_size, seed)
    out = []
    for spec in trainable_specs(specs):
        found: dict = {"trained": {}, "init": {}, "premise": [], "ranks": set(), "captured": True}
        for s, heads in by_seed.items():
            state = heads.get(spec.name)
            if state is None or not _is_linear(state.head):
                continue
            initial = build_head(spec, views.shape[-1], s)
            for name, (head, predictor) in (("trained", (state.head, state.predictor)), ("init", initial)):
                head = copy.deepcopy(head).double().eval()
                predictor = copy.deepcopy(predictor).double().eval() if predictor is not None else None
                fn = objective_closure(objective, options, predictor)
                found[name][s] = []
                for j, (idx, rows) in enumerate(batches):
                    b = len(idx)
                    rec = batch_isotropy(head, lambda h, fn=fn, b=b: scalar_loss(fn(h[:b], h[b:])),
                                         views[idx, 0].double(), views[idx, 1].double(), rows, seed + j)
                    found[name][s].append(rec["isotropy_error"])
                    found["premise"].append(rec["premise"] | {"seed": s, "state": name, "batch": j})
                    found["ranks"] |= {r["rank"] for r in rec["rows"]}
                    found["captured"] &= all(r.get("captured", True) for r in rec["rows"])
        if found["trained"]:
            out.append(WhitenMeasure(spec.name, found["trained"], found["init"], found["premise"],
                                     tuple(sorted(found["ranks"])), found["captured"]))
    return out


SADDLE_SEEDS = 3


def saddle_spec(geometry, seed: int) -> SaddleSpec | None:
    """The recipe's Q-saddle states (`geometry.saddle_states` per seed, seeds seed .. seed + 2, its collapse
    threshold, head types `saddle_heads` and BatchNorm arms `saddle_arms`); None when it asks for none."""
    if not geometry.saddle_states or not geometry.saddle_heads or not geometry.saddle_arms:
        return None
    return SaddleSpec(heads=tuple(dict.fromkeys(geometry.saddle_heads)), seeds=tuple(range(seed, seed + SADDLE_SEEDS)),
                      states=geometry.saddle_states, threshold=geometry.collapse_threshold,
                      arms=tuple(dict.fromkeys(geometry.saddle_arms)))


def answer_geometry_questions(ctx, features, by_seed: dict[int, dict]) -> dict[str, GeometryAnswers]:
    """{"Q-whiten": ..., "Q-metric": ..., "Q-split": ..., "Q-saddle": ...}, each question's `GeometryAnswers`:
    Q-whiten, Q-metric and Q-split on the run's cached views, Q-saddle on the recipe's constructed states
    (`saddle_spec`) under the SimSiam and the target loss; each question with the recipe's `claims:` margin where it
    sets one, and that override recorded with its answers."""
    from headprobe.registry import OBJECTIVES
    from headprobe.stats.geometry_claims import Q_SADDLE, Q_SPLIT

    recipe = ctx.recipe
    objective, options = OBJECTIVES.get(recipe.objective.name), recipe.objective.options
    views = features.views.features
    (whiten, split, saddle), overrides = zip(*(with_override(q, recipe.claims) for q in (Q_WHITEN, Q_SPLIT, Q_SADDLE)),
                                             strict=True)
    answers = [answer_whiten(whiten_measures(by_seed, recipe.heads, objective, options, views,
                                             recipe.train.batch_size, recipe.seed), whiten, seed=recipe.seed)]
    answers += _metric_answer(recipe, by_seed, objective, options, views)
    answers.append(answer_split(split_measures(by_seed, objective, options, views, recipe.seed), split,
                                seed=recipe.seed))
    overrides = dict((*overrides, with_override(Q_METRIC, recipe.claims)[1]))
    spec = saddle_spec(recipe.geometry, recipe.seed)
    if spec is not None:
        if ctx.show:  # said before the work starts: its time depends on these sizes
            print(f"Q-saddle: {spec.sizes()}; under the {' and the '.join(LOSSES)} losses", file=sys.stderr,
                  flush=True)
        start = time.perf_counter()
        states = {loss: collapsed_states(dataclasses.replace(spec, loss=loss), ProjectionHead) for loss in LOSSES}
        answer = answer_saddle(states, spec.sizes(), saddle, seed=recipe.seed)
        answers.append(dataclasses.replace(answer, time_s=time.perf_counter() - start))
    return {a.key: dataclasses.replace(a, override=overrides[a.key]) for a in answers}


def _metric_answer(recipe, by_seed: dict[int, dict], objective, options: dict,
                   views: torch.Tensor) -> list[GeometryAnswers]:
    """[Q-metric's answers] from `pipeline.metric_claim.metric_measures` (none where geometry.metric_batches is 0)."""
    if not recipe.geometry.metric_batches:
        return []
    question, _ = with_override(Q_METRIC, recipe.claims)
    start = time.perf_counter()
    measures = metric_measures(by_seed, recipe.heads, objective, options, views, recipe.geometry, recipe.seed)
    answer = answer_metric(measures, question, seed=recipe.seed)
    g = recipe.geometry
    return [dataclasses.replace(answer, sizes=f"{g.metric_batches} evaluation batches of up to {g.metric_batch} "
                                f"images (two views), {g.metric_rows} sampled images each, per head, seed and state "
                                "(trained, init)", time_s=time.perf_counter() - start)]
