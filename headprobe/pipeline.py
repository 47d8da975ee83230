"""The study, step by step: recipe → backbone → data → features → probes → results.

Nothing else lives here: each step calls the module that owns it.
"""

from __future__ import annotations

import dataclasses
import platform
import time
from pathlib import Path
from typing import Any

from .recipe import Recipe, RecipeError, dump_recipe, load_recipe
from .runs import RunDir, default_run_dir, new_results


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


def _probe_kwargs(name: str, spec: Any, recipe: Recipe, n_classes: int) -> dict:
    options = dataclasses.asdict(spec)
    if name == "linear":
        options.update(val_fraction=recipe.data.val_fraction, seed=recipe.seed)
    if name == "knn":
        options.update(num_classes=n_classes)
    return options


def _train_and_probe_heads(recipe, backbone, data, feats, results, run_dir, state, show, resume, probe_tap):
    """Views → head training → every head tap probed; fills results["heads"] and results["buffer"]."""
    import dataclasses

    from .data.augment import augment_spec
    from .features import extract_views
    from .train import head_taps, latest_checkpoint, train_heads

    timing = results["timing"]
    spec = augment_spec(recipe.augment.preset, **recipe.augment.options)
    t0 = time.perf_counter()
    with _progress(show) as progress:
        views = extract_views(
            backbone, data.train, data_info=data.info, augment=spec, views=recipe.augment.views, seed=recipe.seed,
            batch_size=recipe.features.batch_size, precision=recipe.features.precision, cache=recipe.features.cache,
            num_workers=recipe.features.num_workers, state=state, progress=progress,
        )
        timing["extract_views_s"] = time.perf_counter() - t0
        results["protocol"]["views"] = {"augment": dataclasses.asdict(spec) | {"preset": recipe.augment.preset},
                                        "views": recipe.augment.views, "cache_key": views.key, "hit": views.cached}
        resume_from = latest_checkpoint(run_dir.path / "checkpoints") if resume else None
        states, summary = train_heads(
            recipe.heads, views.features, objective_name=recipe.objective.name,
            objective_options=recipe.objective.options, train=recipe.train, seed=recipe.seed,
            checkpoint_dir=(run_dir.path / "checkpoints") if run_dir.writable else None, resume_from=resume_from,
            log=run_dir.log_metrics, progress=progress,
        )
    timing["train_s"] = summary.pop("train_s")
    results["protocol"]["train"] = dataclasses.asdict(recipe.train) | {
        "objective": recipe.objective.name, "objective_options": recipe.objective.options, **summary}
    t0 = time.perf_counter()
    for head_spec in recipe.heads:
        name = head_spec.name
        trained = states.get(name)
        results["heads"][name] = {
            "config": dataclasses.asdict(head_spec),
            "train": {"steps": summary["steps"], "status": trained.status if trained else "untrained (no parameters)",
                      "final_loss": trained.last_loss if trained else None,
                      "message": trained.message if trained else ""},
            "geometry": {},
        }
        if trained is None:
            probe_tap(name, name, 0, feats["train"].features, feats["test"].features)
            continue
        train_taps = head_taps(trained.head, feats["train"].features)
        test_taps = head_taps(trained.head, feats["test"].features)
        for depth, (tr, te) in enumerate(zip(train_taps, test_taps, strict=True), start=1):
            tap_name = name if depth == trained.head.depth else f"{name}@{depth}"
            probe_tap(tap_name, name, depth, tr, te)
        results["buffer"][name] = buffer_verdict(results["taps"], name)
        run_dir.write_results(results)
    timing["head_probe_s"] = time.perf_counter() - t0


def buffer_verdict(taps: dict, head: str, tolerance: float = 0.01) -> dict:
    """Does the head lose class information the backbone keeps? Compares the backbone tap with the head output.

    "buffer": the head output scores lower than the backbone (by more than `tolerance`) on the probes both
    have; "no loss": within tolerance; the per-metric differences are the evidence.
    """
    before, after = taps["backbone"]["metrics"], taps[head]["metrics"]
    shared = [m for m in before if m in after and m.endswith(".acc")]
    drops = {m: before[m] - after[m] for m in shared}
    verdict = "buffer" if drops and max(drops.values()) > tolerance else "no loss"
    return {"verdict": verdict, "evidence": {"accuracy_drop": drops, "tolerance": tolerance}}


def _environment(state) -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
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


def run(
    recipe_or_path: Recipe | str | Path | dict,
    *,
    out: str | Path | None = None,
    overrides: list[str] | None = None,
    resume: bool = False,
    quiet: bool = False,
) -> Results:
    """Run a recipe (object, YAML path or dict) end to end; returns `Results`.

    >>> results = run("recipes/quickstart.yaml", overrides=["data.limit.train=200"])  # doctest: +SKIP
    >>> results.metrics()["linear.acc"]  # doctest: +SKIP
    """
    from accelerate.utils import set_seed

    from .distributed import process_state

    if isinstance(recipe_or_path, Recipe):
        if overrides:
            raise RecipeError("overrides apply to a recipe file or dict; edit the Recipe object directly.")
        recipe = recipe_or_path
    else:
        recipe = load_recipe(recipe_or_path, overrides)

    state = process_state()
    main = state.is_main_process
    path = Path(out) if out is not None else default_run_dir(recipe.name)
    results = new_results(recipe.to_dict())
    if resume:
        if not (path / "results.json").is_file():
            raise RecipeError(f"--resume needs --out pointing at an earlier run; {path}/results.json does not exist.")
        previous = RunDir(path).read_results()
        if previous.get("recipe") != recipe.to_dict():
            raise RecipeError(
                f"--resume: the recipe differs from the one recorded in {path}/results.json; "
                "resume with the same recipe and overrides, or start a new run with another --out."
            )
        results["taps"] = previous.get("taps", {})
    elif out is not None and (path / "results.json").exists():
        raise RecipeError(f"--out {path} already holds a run; pass --resume to continue it or choose another --out.")
    # Every process checks the directory before the main one writes into it.
    state.wait_for_everyone()
    run_dir = RunDir.create(path, writable=main)
    run_dir.write_config(dump_recipe(recipe))
    results["environment"] = _environment(state)
    set_seed(recipe.seed)
    timing = results["timing"]

    def stage(name: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (KeyboardInterrupt, RecipeError):
            raise
        except Exception as err:
            results["status"] = "failed"
            results["error"] = {"stage": name, "message": f"{type(err).__name__}: {err}"}
            run_dir.write_results(results)
            raise RunError(name, err, run_dir.path if main else None) from err

    from .backbones import load_backbone
    from .data import load_data
    from .features import extract
    from .registry import PROBES

    t0 = time.perf_counter()
    backbone = stage(
        f"loading backbone {recipe.backbone.id}",
        load_backbone,
        recipe.backbone.id,
        pooling=recipe.backbone.pooling,
        resolution=recipe.backbone.resolution,
        revision=recipe.backbone.revision,
    )
    timing["load_s"] = time.perf_counter() - t0
    results["backbone"] = backbone.describe()
    data = stage(f"loading data {recipe.data.source}", load_data, recipe.data)
    results["data"] = data.info | {"class_names": data.class_names}
    run_dir.write_results(results)

    feats = {}
    t0 = time.perf_counter()
    with _progress(main and not quiet) as progress:
        for split, ds in (("train", data.train), ("test", data.test)):
            feats[split] = stage(
                f"extracting {split} features",
                extract,
                backbone,
                ds,
                data_info=data.info,
                split=split,
                batch_size=recipe.features.batch_size,
                precision=recipe.features.precision,
                cache=recipe.features.cache,
                num_workers=recipe.features.num_workers,
                state=state,
                progress=progress,
            )
    timing["extract_s"] = time.perf_counter() - t0
    results["protocol"]["features"] = {
        "pooling": recipe.backbone.pooling,
        "precision": recipe.features.precision,
        "cache": {split: {"key": f.key, "hit": f.cached} for split, f in feats.items()},
    }

    t0 = time.perf_counter()
    train_y, test_y = feats["train"].labels, feats["test"].labels

    def probe_tap(tap_name: str, head: str | None, depth: int, train_x, test_x) -> None:
        tap = results["taps"].setdefault(tap_name, {"head": head, "depth": depth, "metrics": {}, "protocol": {}})
        for name, spec in recipe.probes.items():
            if name in tap["protocol"]:
                continue  # finished in the run being resumed
            kwargs = _probe_kwargs(name, spec, recipe, data.n_classes)
            result = stage(f"running probe {name!r} on tap {tap_name!r}", PROBES.get(name),
                           train_x, train_y, test_x, test_y, **kwargs)
            tap["metrics"].update(result.metrics)
            tap["protocol"][name] = result.protocol
            run_dir.log_metrics({"stage": "probe", "tap": tap_name, "probe": name, **result.metrics})
            run_dir.write_results(results)

    probe_tap("backbone", None, 0, feats["train"].features, feats["test"].features)
    timing["probe_s"] = time.perf_counter() - t0

    if recipe.heads:
        stage("training heads", _train_and_probe_heads, recipe, backbone, data, feats, results, run_dir, state,
              main and not quiet, resume, probe_tap)
        timing["probe_s"] += results["timing"].pop("head_probe_s", 0.0)

    results["status"] = "complete"
    run_dir.write_results(results)
    out_results = Results(results, run_dir.path)
    if main and not quiet:
        from .report.table import print_summary

        print_summary(results, run_dir.path)
    return out_results
