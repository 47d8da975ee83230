"""The study, step by step: recipe → backbone → data → features → heads → taps → probes → results.

Nothing else lives here: each step calls the module that owns it. `results.json` is rewritten
after every finished step, so a failure keeps everything computed before it.
"""

from __future__ import annotations

import dataclasses
import functools
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .objectives import objective_protocol
from .recipe import Recipe, RecipeError, dump_recipe, load_recipe
from .runs import RunDir, default_run_dir, new_results
from .stats import TEST_IMAGES, bootstrap_resamples, load_per_unit, save_per_unit, tap_uncertainty

VIEW_PROBES = ("invariance", "view_mi", "augment_r2")


class RunError(RuntimeError):
    """A failure while running; says which stage failed. Finished work is already on disk."""

    def __init__(self, stage: str, err: BaseException, run_dir: Path | None) -> None:
        where = f" (partial results kept in {run_dir})" if run_dir else ""
        super().__init__(f"while {stage}: {type(err).__name__}: {err}{where}")
        self.stage, self.run_dir = stage, run_dir


class Results:
    """What `run` returns: the `results.json` content plus where it was written."""

    def __init__(self, data: dict, path: Path | None) -> None:
        self.data, self.path = data, path

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def metrics(self, tap: str = "backbone") -> dict[str, float]:
        """Flat metrics of one tap, e.g. ``results.metrics()["linear.acc"]``."""
        return self.data["taps"][tap]["metrics"]

    def __repr__(self) -> str:
        taps = {name: tap["metrics"] for name, tap in self.data["taps"].items()}
        return f"Results(path={str(self.path)!r}, taps={taps})"


def _environment(state) -> dict:
    import accelerate
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "platform": platform.platform(),
        "device": str(state.device),
        "num_processes": state.num_processes,
    }


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        disable=not enabled, transient=False,
    )


class _Study:
    """One run's state; each method is one step of the data flow in DESIGN.md."""

    def __init__(self, recipe: Recipe, run_dir: RunDir, results: dict, state, show: bool, resume: bool) -> None:
        self.recipe, self.run_dir, self.results, self.state = recipe, run_dir, results, state
        self.show, self.resume = show, resume
        self.tuned = False  # set once the backbone has been tuned (backbone.tune != frozen)
        self.timing = results["timing"]
        # Per tap, the per-unit values of its mean-over-units metrics, and one set of bootstrap resamples per
        # kind of unit shared by every tap (paired comparisons): see headprobe.stats.
        self.per_unit: dict[str, dict] = {}
        self.resamples: dict = {}

    def stage(self, name: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            # Ctrl-C: say so in results.json (not "running" forever); finished stages stay and --resume goes on.
            self._record_stop("interrupted", name, "interrupted (KeyboardInterrupt); finished stages are kept: "
                              f"`headprobe run RECIPE --resume --out {self.run_dir.path}`", report=False)
            raise
        except RecipeError:
            raise
        except Exception as err:
            self._record_stop("failed", name, f"{type(err).__name__}: {err}", report=self.recipe.report)
            raise RunError(name, err, self.run_dir.path if self.state.is_main_process else None) from err

    def _record_stop(self, status: str, stage: str, message: str, report: bool) -> None:
        """Write why the run stopped into results.json. Only the run in progress records it; a later analysis
        of a recorded run (`headprobe geometry`) that fails leaves that run's status, error and report alone."""
        if self.results.get("status") != "running":
            return
        self.results["status"] = status
        self.results["error"] = {"stage": stage, "message": message}
        self.run_dir.write_results(self.results)
        if report:
            _write_report(self.run_dir)

    def _clock_training(self, seconds: float, resumed: bool) -> None:
        """Training time; resumed from a checkpoint, the time of the steps done before it counts too."""
        self.timing["train_s"] = (self.timing.get("train_s", 0.0) if resumed else 0.0) + seconds

    def _clock(self, key: str, since: float) -> None:
        self.timing[key] = self.timing.get(key, 0.0) + time.perf_counter() - since

    # --- inputs ---------------------------------------------------------------------------------

    def load(self) -> None:
        from .backbones import load_backbone
        from .data import load_data

        recipe, t0 = self.recipe, time.perf_counter()
        spec = recipe.backbone
        self.backbone = self.stage(
            f"loading backbone {spec.id}", load_backbone, spec.id, pooling=spec.pooling, resolution=spec.resolution,
            revision=spec.revision, layer=spec.layer, layers=spec.layers, seed=recipe.seed,
        )
        self._clock("load_s", t0)
        self.results["backbone"] = self.backbone.describe()
        self.data = self.stage(f"loading data {recipe.data.source}", load_data, recipe.data)
        self.results["data"] = self.data.info | {"class_names": self.data.class_names}
        self.run_dir.write_results(self.results)

    def _extract_kwargs(self) -> dict:
        f = self.recipe.features
        return {"data_info": self.data.info, "batch_size": f.batch_size, "precision": f.precision,
                "cache": f.cache, "num_workers": f.num_workers, "state": self.state}

    def extract(self) -> None:
        from .data.augment import augment_spec
        from .features import extract, extract_views

        recipe, t0 = self.recipe, time.perf_counter()
        cache = {}
        self.feats, self.rotated, self.views, self.orbits = {}, None, None, None
        with _progress(self.show) as progress:
            for split, ds in (("train", self.data.train), ("test", self.data.test)):
                self.feats[split] = self.stage(f"extracting {split} features", extract, self.backbone, ds,
                                               split=split, progress=progress, **self._extract_kwargs())
                cache[split] = {"key": self.feats[split].key, "hit": self.feats[split].cached}
            if "rotation" in recipe.probes:
                self.rotated = {}
                for split, ds in (("train", self.data.train), ("test", self.data.test)):
                    parts = [self.feats[split].features]
                    for angle in (90, 180, 270):
                        out = self.stage(f"extracting {split} features rotated {angle}°", extract, self.backbone,
                                         ds, split=split, rotation=angle, progress=progress,
                                         **self._extract_kwargs())
                        parts.append(out.features)
                        cache[f"{split}-rot{angle}"] = {"key": out.key, "hit": out.cached}
                    n = len(parts[0])
                    self.rotated[split] = (torch.cat(parts), torch.arange(4).repeat_interleave(n))
            if "orbits" in recipe.probes:
                from .features import extract_orbits

                spec = recipe.probes["orbits"]
                self.orbits = self.stage("extracting orbits", extract_orbits, self.backbone, self.data.test,
                                         sweeps=spec.sweeps, n_images=spec.n_images,
                                         batch_size=recipe.features.batch_size, progress=progress)
            self._clock("extract_s", t0)
            # Views feed the view probes, frozen-path head training, and the geometry of trained heads; the
            # tuned path makes its own views on the fly, so the untuned backbone needs them only for probes.
            heads_need = recipe.heads and (recipe.backbone.tune == "frozen" or (self.tuned and recipe.geometry.final))
            if heads_need or any(p in recipe.probes for p in VIEW_PROBES):
                t0 = time.perf_counter()
                spec = augment_spec(recipe.augment.preset, **recipe.augment.options)
                self.views = self.stage("extracting augmented views", extract_views, self.backbone, self.data.train,
                                        augment=spec, views=recipe.augment.views, seed=recipe.seed,
                                        progress=progress, **self._extract_kwargs())
                self._clock("extract_views_s", t0)
                self.results["protocol"]["views"] = {
                    "augment": dataclasses.asdict(spec) | {"preset": recipe.augment.preset},
                    "views": recipe.augment.views, "cache_key": self.views.key, "hit": self.views.cached}
        self.results["protocol"]["features"] = {
            "pooling": recipe.backbone.pooling, "layer": recipe.backbone.layer, "layers": recipe.backbone.layers,
            "resolution": self.backbone.preprocess.crop, "precision": recipe.features.precision, "cache": cache}

    # --- taps and probes ------------------------------------------------------------------------

    def tap_data(self, name: str, transform=None):
        """The inputs of every probe at one tap; `transform` maps backbone features to this tap."""
        from .probes.suite import TapData

        def at(x: torch.Tensor) -> torch.Tensor:
            return x if transform is None else transform(x)

        views = params = None
        if self.views is not None:
            n, k, d = self.views.features.shape
            views = at(self.views.features.reshape(n * k, d)).reshape(n, k, -1)
            params = self.views.params
        rot = {}
        if self.rotated is not None:
            for split, (x, y) in self.rotated.items():
                rot[f"rotated_{split}_x"], rot[f"rotated_{split}_y"] = at(x), y
        orbits = orbit_labels = None
        if self.orbits is not None:
            orbits = {s: at(t.reshape(-1, t.shape[-1])).reshape(t.shape[0], t.shape[1], -1)
                      for s, t in self.orbits.items()}
            # extract_orbits takes the first N test images, so their classes are the first N test labels
            orbit_labels = self.feats["test"].labels[: next(iter(self.orbits.values())).shape[0]]
        return TapData(name, at(self.feats["train"].features), self.feats["train"].labels,
                       at(self.feats["test"].features), self.feats["test"].labels, self.data.n_classes,
                       seed=self.recipe.seed, val_fraction=self.recipe.data.val_fraction, views=views,
                       view_params=params, orbits=orbits, orbit_labels=orbit_labels,
                       inert_params=self._inert_params, **rot)

    @functools.cached_property
    def _inert_params(self) -> dict[str, str] | None:
        """Colour augmentations cannot change grey images (R = G = B: digits, Fashion-MNIST): augment_r2 skips
        them rather than average R² ≈ 0 of unobservable parameters into aug_r2.mean. Every tap gets the same
        list, so the backbone's and each head's means stay over the same parameters."""
        return _grey_params(self.data.train)

    def probe_tap(self, tap_name: str, head: str | None, depth: int, transform=None) -> None:
        from .registry import PROBES

        t0 = time.perf_counter()
        tap = self.results["taps"].setdefault(tap_name, {"head": head, "depth": depth, "metrics": {},
                                                         "protocol": {}})
        todo = [name for name in self.recipe.probes if name not in tap["protocol"]]
        store = self.run_dir.path / "per_unit" / f"{tap_name}.safetensors"
        per_unit = self.per_unit.setdefault(tap_name, load_per_unit(store) if self.resume else {})
        if not todo:
            self._record_uncertainty(tap_name)
            return  # finished in the run being resumed
        data = self.tap_data(tap_name, transform)
        for name in todo:
            options = dataclasses.asdict(self.recipe.probes[name])
            out = self.stage(f"running probe {name!r} on tap {tap_name!r}", PROBES.get(name), data, **options)
            tap["metrics"].update(out.metrics)
            tap["protocol"][name] = out.protocol
            per_unit.update(out.per_unit)
            if out.per_unit and self.run_dir.writable:
                store.parent.mkdir(exist_ok=True)
                save_per_unit(store, per_unit)
            self.run_dir.log_metrics({"stage": "probe", "tap": tap_name, "probe": name, **out.metrics})
            self.run_dir.write_results(self.results)
        self._record_uncertainty(tap_name)
        self._clock("probe_s", t0)

    def _record_uncertainty(self, tap_name: str) -> None:
        """taps[tap]["uncertainty"][metric]: a 95% interval and how it was obtained (headprobe.stats)."""
        for p in self.per_unit[tap_name].values():
            if p.unit not in self.resamples:
                strata = self.feats["test"].labels if p.unit == TEST_IMAGES else None
                self.resamples[p.unit] = bootstrap_resamples(len(p.values), seed=self.recipe.seed, strata=strata)
        tap = self.results["taps"][tap_name]
        stratified = {TEST_IMAGES: True}
        tap["uncertainty"] = tap_uncertainty(tap["metrics"], self.per_unit[tap_name], self.resamples, stratified)
        self.run_dir.write_results(self.results)

    # --- heads ----------------------------------------------------------------------------------

    def train_heads(self) -> None:
        from .train import latest_checkpoint, train_heads

        recipe, run_dir = self.recipe, self.run_dir
        resume_from = latest_checkpoint(run_dir.path / "checkpoints") if self.resume else None
        with _progress(self.show) as progress:
            self.states, summary = self.stage(
                "training heads", train_heads, recipe.heads, self.views.features,
                objective_name=recipe.objective.name, objective_options=recipe.objective.options,
                train=recipe.train, seed=recipe.seed,
                checkpoint_dir=(run_dir.path / "checkpoints") if run_dir.writable else None,
                resume_from=resume_from, log=run_dir.log_metrics, progress=progress, track=recipe.geometry,
                device=self.state.device,
            )
        self._clock_training(summary.pop("train_s"), resumed=resume_from is not None)
        track_s = summary.pop("track_s")
        if track_s:
            # Curvature tracking runs inside the training loop: report its share of training time.
            self.timing["track_s"] = track_s
            self.results.setdefault("timing_ratios", {})["track_over_train"] = track_s / max(self.timing["train_s"],
                                                                                               1e-9)
        self.results["protocol"]["train"] = dataclasses.asdict(recipe.train) | {
            "objective": recipe.objective.name, "objective_options": recipe.objective.options,
            "objective_protocol": objective_protocol(recipe.objective.name, recipe.objective.options), **summary}
        for spec in recipe.heads:
            trained = self.states.get(spec.name)
            self.results["heads"][spec.name] = {
                "config": dataclasses.asdict(spec),
                "train": {"steps": summary["steps"],
                          "status": trained.status if trained else "untrained (no parameters)",
                          "final_loss": trained.last_loss if trained else None,
                          "message": trained.message if trained else ""},
                "geometry": {},
            }
        self.run_dir.write_results(self.results)

    # --- tuned backbone (backbone.tune != frozen) ---------------------------------------------------

    def train_tuned(self) -> None:
        """Score the untuned backbone as tap "backbone_untuned", tune it together with the heads on views made on
        the fly (`headprobe.train_tuned`), save what tuning changed, and extract every feature again from the tuned
        backbone, so that "backbone" and the head taps are scored on it."""
        from .backbones import apply_tuning
        from .data.augment import augment_spec
        from .train import latest_checkpoint
        from .train_tuned import save_tuned_backbone, train_tuned

        recipe, run_dir, spec = self.recipe, self.run_dir, self.recipe.backbone
        self.probe_tap("backbone_untuned", None, 0)
        protocol = self.results["protocol"]
        protocol["features_untuned"], protocol["views_untuned"] = protocol["features"], protocol.get("views")
        lora = dataclasses.asdict(spec.lora) if spec.tune == "lora" else {}
        record = self.stage(f"tuning the backbone ({spec.tune})", apply_tuning, self.backbone, spec.tune,
                            seed=recipe.seed, **lora)
        checkpoints = run_dir.path / "checkpoints"
        resume_from = latest_checkpoint(checkpoints) if self.resume else None
        with _progress(self.show) as progress:
            states, summary = self.stage(
                "training the tuned backbone and heads", train_tuned, self.backbone, recipe.heads, self.data.train,
                augment=augment_spec(recipe.augment.preset, **recipe.augment.options), views=recipe.augment.views,
                objective_name=recipe.objective.name, objective_options=recipe.objective.options, train=recipe.train,
                seed=recipe.seed, precision=recipe.features.precision, num_workers=recipe.features.num_workers,
                checkpoint_dir=checkpoints if run_dir.writable else None,
                resume_from=resume_from, log=run_dir.log_metrics,
                progress=progress, track=recipe.geometry, state=self.state,
            )
        # Identity heads trained the backbone too, but have no layers to probe or analyse.
        self.states = {name: s for name, s in states.items() if list(s.modules().parameters())}
        self._clock_training(summary.pop("train_s"), resumed=resume_from is not None)
        self.results["backbone_tuned"] = self.backbone.describe()
        if run_dir.writable:
            saved = self.stage("saving the tuned backbone", save_tuned_backbone, self.backbone, checkpoints)
            self.results["backbone_tuned"]["saved"] = str(saved.relative_to(run_dir.path))
        protocol["train"] = dataclasses.asdict(recipe.train) | {
            "objective": recipe.objective.name, "objective_options": recipe.objective.options,
            "objective_protocol": objective_protocol(recipe.objective.name, recipe.objective.options), **summary,
            "tuning": record}
        for head in recipe.heads:
            trained = states[head.name]
            self.results["heads"][head.name] = {
                "config": dataclasses.asdict(head),
                "train": {"steps": summary["steps"], "status": trained.status, "final_loss": trained.last_loss,
                          "message": trained.message, "with_backbone": spec.tune},
                "geometry": {},
            }
        self.run_dir.write_results(self.results)
        self.tuned = True
        self.extract()

    def analyse_geometry(self) -> None:
        from .geometry.analyse import analyse_head
        from .registry import OBJECTIVES

        t0 = time.perf_counter()
        objective = OBJECTIVES.get(self.recipe.objective.name)
        for name, trained in self.states.items():
            geometry = self.stage(f"analysing the geometry of head {name!r}", analyse_head, trained.head,
                                  trained.predictor, objective, self.recipe.objective.options,
                                  self.feats["train"].features, self.views.features, rows=self.recipe.geometry.rows,
                                  seed=self.recipe.seed)
            self.results["heads"][name]["geometry"] = geometry
            self.run_dir.write_results(self.results)
        self._clock("geometry_s", t0)

    def probe_heads(self) -> None:
        from .buffer import buffer_verdict
        from .train import head_taps

        for spec in self.recipe.heads:
            trained = self.states.get(spec.name)
            if trained is None:
                self.probe_tap(spec.name, spec.name, 0)
                continue
            head = trained.head
            for depth in range(1, head.depth + 1):
                tap_name = spec.name if depth == head.depth else f"{spec.name}@{depth}"
                self.probe_tap(tap_name, spec.name, depth,
                               transform=lambda x, d=depth, h=head: head_taps(h, x)[d - 1])
            self.results["buffer"][spec.name] = buffer_verdict(self.results["taps"], spec.name, self.per_unit,
                                                               self.resamples)
            self.run_dir.write_results(self.results)


def _orbit_coordinates(taps: dict) -> dict:
    """{sweep: {tap: (n_images, T, 2) PCA coordinates}} gathered from the orbit probe, for the report."""
    out: dict = {}
    for tap_name, tap in taps.items():
        for sweep, entry in tap.get("protocol", {}).get("orbits", {}).get("sweeps", {}).items():
            if "pca" in entry:
                out.setdefault(sweep, {})[tap_name] = entry["pca"]
    return out


def _write_report(run_dir: RunDir) -> None:
    """report.html + plots/; never fails a run over its report (`headprobe report RUN_DIR` rebuilds it)."""
    if not run_dir.writable:
        return
    from .report.html import write_report

    try:
        write_report(run_dir.path)
    except Exception as err:
        print(f"warning: report.html not written ({type(err).__name__}: {err}); "
              f"run `headprobe report {run_dir.path}` to retry.", file=sys.stderr)


def _grey_params(dataset, n_images: int = 64) -> dict[str, str] | None:
    """{"saturation"|"hue"|"grayscale": reason} when the first `n_images` images are all grey, else None."""
    import numpy as np

    for i in range(min(n_images, len(dataset))):
        pixels = np.asarray(dataset[i]["image"].convert("RGB"))
        if not ((pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all()):
            return None
    reason = f"the images are grey (R = G = B in the first {min(n_images, len(dataset))} training images)"
    return {"saturation": reason, "hue": reason, "grayscale": reason}


def _check_out(path: Path) -> None:
    """--out must be (or become) a folder: refuse a file, or a file where one of its parents should be."""
    for folder in (path, *path.parents):
        if folder.exists() and not folder.is_dir():
            which = "is" if folder == path else f"is inside {str(folder)!r}, which is"
            raise RecipeError(f"--out {str(path)!r} {which} a file, not a folder; pass a folder for the run "
                              "(new or an earlier run's), e.g. --out runs/my_study.")


def _overrides_from_keywords(keywords: dict[str, Any]) -> dict[str, Any]:
    """``train__epochs=1`` and ``**{"train.epochs": 1}`` → {"train.epochs": 1} (values stay Python objects)."""
    return {key.replace("__", "."): value for key, value in keywords.items()}


def run(
    recipe_or_path: Recipe | str | Path | dict,
    *,
    out: str | Path | None = None,
    overrides: list[str] | None = None,
    resume: bool = False,
    quiet: bool = False,
    **values: Any,
) -> Results:
    """Run a recipe (object, YAML path or dict) end to end; returns `Results`.

    Overrides: ``overrides=["train.epochs=1"]`` (YAML-typed strings, as ``--set``) and/or keywords whose values are
    Python objects, ``run("r.yaml", **{"train.epochs": 1})`` or ``run("r.yaml", train__epochs=1)`` (``__`` is a
    dot); keywords apply after `overrides`. Resuming a finished run does nothing and returns its results.

    >>> results = run("recipes/quickstart.yaml", overrides=["data.limit.train=200"])  # doctest: +SKIP
    >>> results = run("recipes/quickstart.yaml", data__limit__train=256, train__epochs=1)  # doctest: +SKIP
    >>> results.metrics()["linear.acc"]  # doctest: +SKIP
    """
    from accelerate.utils import set_seed

    from .distributed import process_state

    if isinstance(recipe_or_path, Recipe):
        if overrides or values:
            raise RecipeError("overrides apply to a recipe file or dict; edit the Recipe object directly.")
        recipe = recipe_or_path
    else:
        recipe = load_recipe(recipe_or_path, overrides, _overrides_from_keywords(values))

    state = process_state()
    main = state.is_main_process
    path = Path(out) if out is not None else default_run_dir(recipe.name)
    _check_out(path)
    results = new_results(recipe.to_dict())
    if resume:
        if not (path / "results.json").is_file():
            raise RecipeError(f"--resume needs --out pointing at an earlier run; {path}/results.json does not exist.")
        try:
            previous = RunDir(path).read_results()
        except ValueError as err:
            raise RecipeError(f"--resume: {err}") from None
        if previous.get("recipe") != recipe.to_dict():
            raise RecipeError(
                f"--resume: the recipe differs from the one recorded in {path}/results.json; "
                "resume with the same recipe and overrides, or start a new run with another --out."
            )
        if previous.get("status") == "complete":
            # Nothing to redo: results.json, its timings and the report stay exactly as the run wrote them.
            if main and not quiet:
                print(f"nothing to do: the run in {path} is already complete ({path / 'results.json'}).",
                      file=sys.stderr)
            return Results(previous, path)
        results["taps"] = previous.get("taps", {})
        # Finished probes are not redone (`probe_tap`), so their time stays counted; training resumed from a
        # checkpoint adds its time to the recorded one (`train_heads`). Every other stage is redone and re-timed.
        results["timing"] = {k: v for k, v in previous.get("timing", {}).items() if k in ("probe_s", "train_s")}
    elif out is not None and (path / "results.json").exists():
        raise RecipeError(f"--out {path} already holds a run; pass --resume to continue it or choose another --out.")
    # Every process checks the directory before the main one writes into it.
    state.wait_for_everyone()
    run_dir = RunDir.create(path, writable=main)
    run_dir.write_config(dump_recipe(recipe))
    results["environment"] = _environment(state)
    set_seed(recipe.seed)

    study = _Study(recipe, run_dir, results, state, show=main and not quiet, resume=resume)
    study.load()
    study.extract()
    if recipe.backbone.tune != "frozen":  # tuned path: see _Study.train_tuned
        study.train_tuned()
    study.probe_tap("backbone", None, 0)
    if recipe.heads:
        if recipe.backbone.tune == "frozen":
            study.train_heads()
        if recipe.geometry.final:
            study.analyse_geometry()
        study.probe_heads()

    timing = results["timing"]
    extracted = timing.get("extract_s", 0.0) + timing.get("extract_views_s", 0.0)
    if extracted > 0:
        # Probes work on cached features: all of them together should cost less than extracting those.
        results.setdefault("timing_ratios", {})["probe_over_extract"] = timing.get("probe_s", 0.0) / extracted
    results["orbits"] = _orbit_coordinates(results["taps"])
    results["status"] = "complete"
    run_dir.write_results(results)
    if recipe.report:
        _write_report(run_dir)
    if main and not quiet:
        from .report.table import print_summary

        print_summary(results, run_dir.path)
    return Results(results, run_dir.path)


def run_sweep(
    recipe_path: str | Path | dict, *, out: str | Path | None = None, overrides: list[str] | None = None,
    quiet: bool = False, **values: Any,
) -> list[Results]:
    """Run every combination of the recipe's `sweep:` into OUT/<label>/ and compare them (OUT/compare.csv/.html).
    Overrides as in `run`: ``overrides=["k=v"]`` and/or keywords with Python values (``train__epochs=1``).

    >>> run_sweep("recipes/paper_depth_ablation.yaml", train__epochs=5)  # doctest: +SKIP
    """
    from .recipe import _resolve, expand_sweep

    if values:  # fold every override into the recipe's data once; each combination then starts from it
        recipe_path, overrides = _resolve(recipe_path, overrides, _overrides_from_keywords(values)), None

    combos = expand_sweep(recipe_path, overrides)
    recipe = load_recipe(recipe_path, overrides)
    root = Path(out) if out is not None else default_run_dir(recipe.name)
    _check_out(root)
    results = [run(recipe_path, out=root / label, overrides=items, quiet=quiet) for label, items in combos]
    from .distributed import process_state

    if process_state().is_main_process:
        from .report.compare import write_compare

        write_compare([r.path for r in results], root)
        if not quiet:
            from rich.console import Console

            from .report.table import compare_table
            from .runs import read_results

            Console().print(compare_table({r.path.name: read_results(r.path) for r in results}))
            print(f"comparison: {root / 'compare.html'}")
    return results
