"""The study, step by step: recipe → backbone → data → features → heads → taps → probes → results.

Nothing else lives here: each step calls the module that owns it. `results.json` is rewritten
after every finished step, so a failure keeps everything computed before it.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Any

import torch

from . import stages, taps
from .recipe import Recipe, RecipeError, dump_recipe, load_recipe
from .runs import RunDir, check_out_folder, default_run_dir, metrics_from_json, new_results
from .stages import RunContext, RunError

__all__ = ["Results", "RunError", "run", "run_sweep"]


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


def _orbit_coordinates(taps: dict) -> dict:
    """{sweep: {tap: (n_images, T, 2) PCA coordinates}} gathered from the orbit probe, for the report."""
    out: dict = {}
    for tap_name, tap in taps.items():
        for sweep, entry in tap.get("protocol", {}).get("orbits", {}).get("sweeps", {}).items():
            if "pca" in entry:
                out.setdefault(sweep, {})[tap_name] = entry["pca"]
    return out


def _check_out(path: Path) -> None:
    """--out must be (or become) a folder: refuse a file, or a file where one of its parents should be."""
    for folder in (path, *path.parents):
        if folder.exists() and not folder.is_dir():
            which = "is" if folder == path else f"is inside {str(folder)!r}, which is"
            raise RecipeError(f"--out {str(path)!r} {which} a file, not a folder; pass a folder for the run "
                              "(new or an earlier run's), e.g. --out runs/my_study.")
    check_out_folder(path)  # not a foreign non-empty folder, and writable (runs.check_out_folder)


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
        results["taps"] = metrics_from_json(previous.get("taps", {}))  # null (NaN in JSON) back to NaN
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

    ctx = RunContext(recipe, run_dir, results, state, show=main and not quiet, resume=resume)
    with ctx.recording_stops():
        inputs = stages.load_inputs(ctx)
        features = stages.extract_features(ctx, inputs)
        if recipe.backbone.tune != "frozen":
            # Score the untuned backbone, tune it with the heads on views made on the fly, then extract every
            # feature again from the tuned backbone, so that "backbone" and the head taps are scored on it.
            taps.probe_tap(ctx, features, taps.Tap("backbone_untuned"))
            trained = stages.tune_backbone(ctx, inputs)
            features = stages.extract_features(ctx, inputs, tuned=True)
        # With several processes and frozen-backbone heads, the backbone tap is probed with the head taps, so that
        # its probes are shared out with theirs (alone, its one linear probe is the whole stage's critical path).
        with_heads = bool(recipe.heads) and recipe.backbone.tune == "frozen" and state.num_processes > 1
        if not with_heads:
            taps.probe_tap(ctx, features, taps.Tap("backbone"))
        if recipe.heads:
            if recipe.backbone.tune == "frozen":
                trained = stages.train_heads(ctx, features)
            if recipe.geometry.final:
                stages.analyse_geometry(ctx, features, trained.first)
            taps.probe_heads(ctx, features, trained, backbone=with_heads)

        timing = results["timing"]
        extracted = timing.get("extract_s", 0.0) + timing.get("extract_views_s", 0.0)
        if extracted > 0:
            # Probes work on cached features: all of them together should cost less than extracting those.
            results.setdefault("timing_ratios", {})["probe_over_extract"] = timing.get("probe_s", 0.0) / extracted
        results["orbits"] = _orbit_coordinates(results["taps"])
        results["status"] = "complete"
        run_dir.write_results(results)
        if recipe.report:
            stages.write_report(run_dir)
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
    from .recipe import expand_sweep, resolve_recipe_data

    if values:  # fold every override into the recipe's data once; each combination then starts from it
        recipe_path, overrides = resolve_recipe_data(recipe_path, overrides, _overrides_from_keywords(values)), None

    combos = expand_sweep(recipe_path, overrides)
    recipe = load_recipe(recipe_path, overrides)
    root = Path(out) if out is not None else default_run_dir(recipe.name)
    _check_out(root)
    results = [run(recipe_path, out=root / label, overrides=items, quiet=quiet) for label, items in combos]
    from .distributed import process_state

    if process_state().is_main_process:
        from .report.compare import write_compare

        written = write_compare([r.path for r in results], root)
        if not quiet:
            from rich.console import Console

            from .report.table import compare_table
            from .runs import read_results

            Console().print(compare_table({r.path.name: read_results(r.path) for r in results}))
            if "cross_run" in written:  # a head ablation with a no-head arm: the backbones compared across runs
                import json

                from .cross_run import answer_lines

                print("\n".join(answer_lines(json.loads(written["cross_run"].read_text()))))
            print(f"comparison: {root / 'compare.html'}")
    return results
