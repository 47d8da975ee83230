"""The stages of a run as public functions that pass typed values: load inputs → extract features → train heads
(or tune the backbone with them) → geometry. Probing the taps is `pipeline.probing`; `compose.run` composes both.

A stage writes nothing: it returns what it made, with what the record keeps of it (`recorded`, `seconds`), and
`compose.run` hands that to the record's one writer (`record.writer.RecordWriter`). Each stage's work runs inside
`with ctx.stage(name):` (`RunContext.stage`), which records a failure (or Ctrl-C) in `results.json` before it
propagates, so finished work stays on disk and `--resume` goes on from it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from headprobe.backbones import apply_tuning
from headprobe.backbones import load_backbone as load
from headprobe.data.augment import augment_spec
from headprobe.data.loader import pipeline_record
from headprobe.features.extract import extract, load_image
from headprobe.features.orbits import extract_orbits
from headprobe.features.views import extract_views
from headprobe.geometry.analyse import PARTS, analyse_head, size_estimate

# RunError and write_report are part of the stages' API (pipeline, analyse and the tests use them from here).
from headprobe.pipeline.context import RunContext, RunError, write_report  # noqa: F401
from headprobe.pipeline.time_estimate import views_estimate
from headprobe.recipe import Recipe
from headprobe.recipe.null_heads import is_null, trainable_specs
from headprobe.recipe.probe_inputs import orbit_request, probe_needs
from headprobe.registry import OBJECTIVES
from headprobe.stats.saddle_grid import tally_history
from headprobe.train.cached_views import latest_checkpoint
from headprobe.train.cached_views import train_heads as train_loop
from headprobe.train.engine import seed_of
from headprobe.train.null_heads import NullHead, build_null_heads
from headprobe.train.objectives import objective_protocol
from headprobe.train.pretrained_heads import PretrainedHead, load_pretrained_heads
from headprobe.train.tuned import save_tuned_backbone, train_tuned


@dataclass
class Inputs:
    """The backbone and (once `load_data` has run) the data; `load_s`: the seconds loading the backbone took."""

    backbone: Any
    data: Any = None
    load_s: float = 0.0

    def data_record(self) -> dict:
        """results["data"]: the data's description and its class names."""
        return self.data.info | {"class_names": self.data.class_names}


@dataclass
class FeatureSet:
    """What extraction made for the probes and the heads: clean train/test `Features`, rotated copies
    {split: (x (4N, D), rotation label)}, orbits {sweep: (N_o, T, D)}, cached views (`ViewFeatures`)."""

    train: Any
    test: Any
    n_classes: int
    rotated: dict | None = None
    orbits: dict | None = None
    views: Any = None
    inert_params: dict[str, str] | None = None
    # The views the view probes measure (`ViewFeatures`): the test images' (held out) or `views` itself.
    probe_views: Any = None
    # What the record keeps: results["protocol"] entries (views, views_probed, features) and the stage's seconds.
    protocol: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    def read(self) -> list[torch.Tensor]:
        """The memory-mapped cache tensors the run reads (`RunContext.reading` guards them:
        `features.cache.UnchangedCache`)."""
        return [t for part in (self.train, self.test, self.views, self.probe_views) if part is not None
                for t in vars(part).values() if isinstance(t, torch.Tensor)]


@dataclass
class HeadPair:
    """A head and its predictor (None without one), as geometry needs them."""

    head: Any
    predictor: Any = None


@dataclass
class TrainedHeads:
    """The trained heads of each seed ({seed: {name: HeadState}}); `first` is the first seed's. What the record
    keeps: `heads` (results["heads"] entries), `protocol` (train, seeds), the stage's `seconds` (None: nothing was
    trained), whether it `resumed` from a checkpoint, the curvature tracking's `track_s` and the `backbone_tuned`."""

    by_seed: dict[int, dict]
    heads: dict = field(default_factory=dict)
    protocol: dict = field(default_factory=dict)
    seconds: float | None = None
    resumed: bool = False
    track_s: float = 0.0
    backbone_tuned: dict | None = None

    @property
    def first(self) -> dict:
        return next(iter(self.by_seed.values()))


def load_backbone(ctx: RunContext, backbone: Any = None) -> Inputs:
    """The backbone: `backbone` (a `Backbone` given to `pipeline.run`), else loaded from recipe.backbone; the data
    follows (`load_data`), so that a failure there finds the backbone recorded."""

    recipe, t0 = ctx.recipe, time.perf_counter()
    spec = recipe.backbone
    extra = {k: v for k, v in (("part", spec.part), ("num_heads", spec.num_heads)) if v is not None}
    if backbone is None:
        with ctx.stage(f"loading backbone {spec.id}"):
            backbone = load(spec.id, pooling=spec.pooling, resolution=spec.resolution, revision=spec.revision,
                            layer=spec.layer, layers=spec.layers, seed=recipe.seed, **extra)
    return Inputs(backbone, load_s=time.perf_counter() - t0)


def load_data(ctx: RunContext, inputs: Inputs) -> Inputs:
    """`inputs` with the recipe's data loaded."""
    from headprobe.data import load_data as load

    with ctx.stage(f"loading data {ctx.recipe.data.source}"):
        data = load(ctx.recipe.data)
    return dataclasses.replace(inputs, data=data)


def held_out_view_seed(seed: int) -> int:
    """The augmentation seed of the test images' views: its own stream, so no held-out view repeats the draws
    (crop boxes, flips, jitter) of a training view."""

    return seed_of(seed, "held-out views", "test")


def extract_features(ctx: RunContext, inputs: Inputs, tuned: bool = False, geometry: bool = True) -> FeatureSet:
    """Clean features, and exactly what the probes and heads need besides: rotated copies, orbits, views.
    tuned: the backbone has been tuned with the heads (they need views again only for their final geometry, which
    `geometry` False leaves out: a later seed's tuned backbone, whose heads' geometry is not analysed)."""

    recipe, backbone, data, t0 = ctx.recipe, inputs.backbone, inputs.data, time.perf_counter()
    f = recipe.features
    options = {"data_info": data.info, "batch_size": f.batch_size, "precision": f.precision, "cache": f.cache,
               "num_workers": f.num_workers, "mapped": f.memory_map, "store_dtype": f.store_dtype, "state": ctx.state}
    needs, cache, clean = probe_needs(recipe), {}, {}
    with ctx.stage("reading the training images' colours"):
        out = FeatureSet(None, None, data.n_classes, inert_params=grey_params(data.train))
    with ctx.progress() as progress:
        for split, ds in (("train", data.train), ("test", data.test)):
            with ctx.stage(f"extracting {split} features"):
                clean[split] = extract(backbone, ds, split=split, progress=progress, **options)
            cache[split] = {"key": clean[split].key, "hit": clean[split].cached}
        out.train, out.test = clean["train"], clean["test"]
        if "rotated" in needs:
            out.rotated = {}
            for split, ds in (("train", data.train), ("test", data.test)):
                parts = [clean[split].features]
                for angle in (90, 180, 270):
                    with ctx.stage(f"extracting {split} features rotated {angle}°"):
                        rotated = extract(backbone, ds, split=split, rotation=angle, progress=progress, **options)
                    parts.append(rotated.features)
                    cache[f"{split}-rot{angle}"] = {"key": rotated.key, "hit": rotated.cached}
                out.rotated[split] = (torch.cat(parts), torch.arange(4).repeat_interleave(len(parts[0])))
        orbits = orbit_request(recipe)
        if orbits is not None:
            with ctx.stage("extracting orbits"):
                out.orbits = extract_orbits(backbone, data.test, sweeps=list(orbits.sweeps),
                                            n_images=orbits.n_images, data_info=data.info, batch_size=f.batch_size,
                                            precision=f.precision, cache=f.cache, state=ctx.state,
                                            progress=progress, record=cache, store_dtype=f.store_dtype)
        out.seconds["extract_s"] = time.perf_counter() - t0
        # Training views feed frozen-path head training and the geometry of trained heads; the tuned path makes its
        # own views on the fly. The view probes measure held-out views (augment.probe_views: the test images') unless
        # the recipe asks for the training views.
        heads_need = recipe.heads and (recipe.backbone.tune == "frozen"
                                       or (tuned and geometry and recipe.geometry.final))
        probing, held_out = "views" in needs, recipe.augment.probe_views == "test"
        spec = augment_spec(recipe.augment.preset, **recipe.augment.options) if heads_need or probing else None
        if ctx.show and (heads_need or probing):  # the views often take longest: said before they start

            # the images the clean extraction forwarded: rotated copies and orbit frames too
            extracted = sum(len(ds) for split, ds in (("train", data.train), ("test", data.test))
                            for key in (split, *(f"{split}-rot{a}" for a in (90, 180, 270)))
                            if key in cache and not cache[key]["hit"])
            extracted += sum(frames.shape[0] * frames.shape[1] for sweep, frames in (out.orbits or {}).items()
                             if not cache.get(f"orbits-{sweep}", {}).get("hit", True))
            images = len(data.train) * bool(heads_need or (probing and not held_out)) + \
                len(data.test) * bool(probing and held_out)
            line = views_estimate(out.seconds["extract_s"], extracted, recipe.augment.views * images)
            if line:
                print(line, file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        if heads_need or (probing and not held_out):
            with ctx.stage("extracting augmented views"):
                out.views = extract_views(backbone, data.train, augment=spec, views=recipe.augment.views,
                                          seed=recipe.seed, progress=progress, **options)
            out.protocol["views"] = {
                "augment": dataclasses.asdict(spec) | {"preset": recipe.augment.preset},
                "views": recipe.augment.views, "cache_key": out.views.key, "hit": out.views.cached}
        if probing:
            seed = held_out_view_seed(recipe.seed) if held_out else recipe.seed
            out.probe_views = out.views
            if held_out:
                with ctx.stage("extracting augmented views of the test images"):
                    out.probe_views = extract_views(backbone, data.test, augment=spec, views=recipe.augment.views,
                                                    seed=seed, progress=progress, **options)
            out.protocol["views_probed"] = {
                "split": "test" if held_out else "train", "n_images": len(out.probe_views.features),
                "views": recipe.augment.views, "seed": seed, "cache_key": out.probe_views.key,
                "hit": out.probe_views.cached, "heads_trained_on": "train" if recipe.heads else None}
        if heads_need or probing:
            out.seconds["extract_views_s"] = time.perf_counter() - t0
    out.protocol["features"] = {
        "pooling": recipe.backbone.pooling, "layer": recipe.backbone.layer, "layers": recipe.backbone.layers,
        "resolution": backbone.preprocess.crop, "precision": f.precision, "cache": cache,
        "store_dtype": f.store_dtype, "memory_map": f.memory_map,
        "input_pipeline": pipeline_record(f.num_workers, ctx.state.device)}
    return out


def train_heads(ctx: RunContext, features: FeatureSet) -> TrainedHeads:
    """Train every head once per seed (`recipe.seed_list`) on the same cached views, where the seed executor puts
    each seed (`ctx.seeds`); one seed trains exactly as a single-seed run does (checkpoints in checkpoints/, else
    checkpoints/seed-S/). The training records go to the record's metrics.jsonl as they come."""

    recipe, record, seeds = ctx.recipe, ctx.record, ctx.recipe.seed_list
    several = len(seeds) > 1
    trainable = trainable_specs(recipe.heads)
    pretrained = load_pretrained_heads(ctx)
    by_seed, summaries, resumed, track_s = {}, {}, False, 0.0

    def log(entry: dict, seed: int) -> None:
        record.log(entry | {"seed": seed} if several else entry)

    writes_checkpoints = ctx.seeds.writes_checkpoints(seeds, record) if trainable else record.writable

    def train_one(seed: int, log_seed) -> tuple[dict, dict]:
        checkpoints = record.path / "checkpoints" / (f"seed-{seed}" if several else "")
        resume_from = latest_checkpoint(checkpoints) if record.resume else None
        with ctx.progress() as progress, ctx.stage("training heads" + (f" (seed {seed})" if several else "")):
            states, summary = train_loop(
                trainable, features.views.features, objective_name=recipe.objective.name,
                objective_options=recipe.objective.options, train=recipe.train, seed=seed,
                checkpoint_dir=checkpoints if writes_checkpoints else None, resume_from=resume_from, log=log_seed,
                progress=progress, track=recipe.geometry, device=ctx.state.device)
        return states, summary | {"resumed": resume_from is not None}  # travels with the summary when shared

    trained = ctx.seeds.train(ctx, seeds, trainable, features.views.features.shape[-1], train_one, log) \
        if trainable else {}
    train_s = {}
    for seed, (by_seed[seed], summaries[seed]) in trained.items():
        train_s[seed] = summaries[seed].pop("train_s")
        track_s += summaries[seed].pop("track_s")
        resumed = summaries[seed].pop("resumed") or resumed
    out = TrainedHeads(by_seed, resumed=resumed, track_s=track_s)
    if trainable:
        out.seconds = ctx.seeds.stage_seconds(seeds, train_s)
        summary = summaries[seeds[0]]
        out.protocol["train"] = _training_protocol(recipe, summary, {})
    else:
        out.by_seed, summary = {seed: {} for seed in seeds}, {"steps": 0}
    tracked = _tracked(recipe, out.by_seed)
    dim = features.views.features.shape[-1]
    for seed, states in out.by_seed.items():
        states.update(pretrained)  # the same frozen module for every seed: it is not retrained
        states.update(build_null_heads(recipe.heads, dim, seed))  # never trained: built from the seed alone
    for spec in recipe.heads:
        first = out.first.get(spec.name)
        out.heads[spec.name] = {
            "config": dataclasses.asdict(spec),
            "train": {"steps": 0 if spec.type == "pretrained" or is_null(spec) else summary["steps"],
                      "status": first.status if first else "untrained (no parameters)",
                      "final_loss": first.last_loss if first else None,
                      "message": first.message if first else ""},
            "geometry": {}} | ({"tracked": tracked[spec.name]} if spec.name in tracked else {})
        if spec.type == "pretrained":
            out.heads[spec.name]["checkpoint"] = first.head.record.to_dict()
        elif several:
            out.heads[spec.name]["train_seeds"] = {
                str(seed): {"status": t.status, "final_loss": t.last_loss} if (t := states.get(spec.name))
                else {"status": "untrained (no parameters)", "final_loss": None}
                for seed, states in out.by_seed.items()}
    if several:
        out.protocol["seeds"] = {
            "seeds": seeds, "varies": "head initialisation and batch order (the training seed)",
            "shared": "backbone features, the cached augmented views (drawn with `seed`), the probes' own splits and "
                      "seeds; geometry analyses the first seed's heads"}
    return out


def _tracked(recipe: Recipe, by_seed: dict) -> dict:
    """{head: {seed: tally of its tracked points}} (`stats.saddle_grid.tally_history`: claim 4's per-cell counts
    and the escape scale lr·|λ_min|·Δsteps), for results["heads"][H]["tracked"]; {} without tracking."""

    if not recipe.geometry.track_every:
        return {}
    frozen = recipe.backbone.tune == "frozen" and not recipe.backbone.id.startswith("scratch:")
    return tally_history(by_seed, [h.name for h in recipe.heads], recipe.train.lr, frozen)


def _training_protocol(recipe: Recipe, summary: dict, extra: dict) -> dict:
    """results["protocol"]["train"]: the training settings, the objective and the training summary."""
    return dataclasses.asdict(recipe.train) | {
        "objective": recipe.objective.name, "objective_options": recipe.objective.options,
        "objective_protocol": objective_protocol(recipe.objective.name, recipe.objective.options), **summary, **extra}


def tune_backbone(ctx: RunContext, inputs: Inputs, seed: int, several: bool = False) -> TrainedHeads:
    """Tune the backbone together with the heads on views made on the fly (`headprobe.train.tuned`), with training
    seed `seed`, and save what tuning changed; the caller extracts every feature again from the tuned backbone.
    With `several` seeds (`pipeline.tuned_seeds`) this is one of them: its checkpoints and tuned weights go to
    checkpoints/seed-S/ (else checkpoints/) and its training records carry the seed."""

    recipe, record, spec = ctx.recipe, ctx.record, ctx.recipe.backbone
    lora = dataclasses.asdict(spec.lora) if spec.tune == "lora" else {}
    which = f" (seed {seed})" if several else ""
    with ctx.stage(f"tuning the backbone ({spec.tune}){which}"):
        tuning = apply_tuning(inputs.backbone, spec.tune, seed=seed, **lora)
    checkpoints = record.path / "checkpoints" / (f"seed-{seed}" if several else "")
    resume_from = latest_checkpoint(checkpoints) if record.resume else None
    augment = augment_spec(recipe.augment.preset, **recipe.augment.options)
    with ctx.progress() as progress, ctx.stage(f"training the tuned backbone and heads{which}"):
        states, summary = train_tuned(
            inputs.backbone, recipe.heads, inputs.data.train, augment=augment,
            views=recipe.augment.views, objective_name=recipe.objective.name,
            objective_options=recipe.objective.options, train=recipe.train, seed=seed,
            precision=recipe.features.precision, num_workers=recipe.features.num_workers,
            checkpoint_dir=checkpoints if record.writable else None, resume_from=resume_from,
            log=(lambda entry: record.log(entry | {"seed": seed})) if several else record.log, progress=progress,
            track=recipe.geometry, state=ctx.state)
    # Identity heads trained the backbone too, but have no layers to probe or analyse.
    out = TrainedHeads({seed: {name: s for name, s in states.items() if list(s.modules().parameters())}},
                       seconds=summary.pop("train_s"), resumed=resume_from is not None,
                       track_s=summary.pop("track_s", 0.0), backbone_tuned=inputs.backbone.describe())
    if record.writable:
        with ctx.stage(f"saving the tuned backbone{which}"):
            saved = save_tuned_backbone(inputs.backbone, checkpoints)
        out.backbone_tuned["saved"] = str(saved.relative_to(record.path))
    out.protocol["train"] = _training_protocol(recipe, summary, {"tuning": tuning})
    tracked = _tracked(recipe, {seed: states})
    for head in recipe.heads:
        trained = states[head.name]
        out.heads[head.name] = {
            "config": dataclasses.asdict(head),
            "train": {"steps": summary["steps"], "status": trained.status, "final_loss": trained.last_loss,
                      "message": trained.message, "with_backbone": spec.tune},
            "geometry": {}} | ({"tracked": tracked[head.name]} if head.name in tracked else {})
    return out


def analyse_geometry(ctx: RunContext, features: FeatureSet, heads: dict) -> Iterator[tuple[str, dict]]:
    """Per-head geometry at the end of training (`geometry.analyse.analyse_head`): yields (head, its geometry record)
    as each head is done; heads: {name: state} with `.head` and `.predictor` (the first seed's heads, or heads loaded
    from a checkpoint)."""

    objective = OBJECTIVES.get(ctx.recipe.objective.name)
    n, k, dim = features.views.features.shape
    for name, trained in heads.items():
        if isinstance(trained, PretrainedHead):
            yield name, {"skipped": "a pretrained head: the loss it was trained with is not the recipe's objective"}
            continue
        if isinstance(trained, NullHead):
            yield name, {"skipped": "a null head, never trained: probed as a reference, its geometry not analysed"}
            continue
        if ctx.show:  # said before the work starts: its time depends on these sizes
            print(f"geometry of head {name!r}: {size_estimate(trained.head, dim, n, k, ctx.recipe.geometry.rows)}",
                  file=sys.stderr, flush=True)
        with ctx.progress() as progress:
            task = progress.add_task(f"geometry of head {name!r}", total=len(PARTS))
            with ctx.stage(f"analysing the geometry of head {name!r}"):
                geometry = analyse_head(trained.head, trained.predictor, objective, ctx.recipe.objective.options,
                                        features.train.features, features.views.features,
                                        rows=ctx.recipe.geometry.rows, seed=ctx.recipe.seed,
                                        on_part=lambda part, task=task, progress=progress: progress.advance(task))
        yield name, geometry


def grey_params(dataset, n_images: int = 64) -> dict[str, str] | None:
    """{"saturation"|"hue"|"grayscale": reason} when the first `n_images` images are all grey, else None: colour
    augmentations cannot change grey images (R = G = B: digits, Fashion-MNIST), so augment_r2 skips them rather
    than average R² ≈ 0 of unobservable parameters into aug_r2.mean (every tap gets the same list)."""
    import numpy as np


    for i in range(min(n_images, len(dataset))):
        pixels = np.asarray(load_image(dataset, i).convert("RGB"))
        if not ((pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all()):
            return None
    reason = f"the images are grey (R = G = B in the first {min(n_images, len(dataset))} training images)"
    return {"saturation": reason, "hue": reason, "grayscale": reason}
