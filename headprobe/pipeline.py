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

    tap = results["taps"].setdefault("backbone", {"head": None, "depth": 0, "metrics": {}, "protocol": {}})
    t0 = time.perf_counter()
    for name, spec in recipe.probes.items():
        if name in tap["protocol"]:
            continue  # finished in the run being resumed
        probe = PROBES.get(name)
        kwargs = _probe_kwargs(name, spec, recipe, data.n_classes)
        result = stage(
            f"running probe {name!r} on tap 'backbone'",
            probe,
            feats["train"].features,
            feats["train"].labels,
            feats["test"].features,
            feats["test"].labels,
            **kwargs,
        )
        tap["metrics"].update(result.metrics)
        tap["protocol"][name] = result.protocol
        run_dir.log_metrics({"stage": "probe", "tap": "backbone", "probe": name, **result.metrics})
        run_dir.write_results(results)
    timing["probe_s"] = time.perf_counter() - t0

    results["status"] = "complete"
    run_dir.write_results(results)
    out_results = Results(results, run_dir.path)
    if main and not quiet:
        from .report.table import print_summary

        print_summary(results, run_dir.path)
    return out_results
