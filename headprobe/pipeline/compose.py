"""The study, step by step: recipe → backbone → data → features → heads → taps → probes → results.

Nothing else lives here: each step calls the module that owns it. `results.json` is rewritten
after every finished step, so a failure keeps everything computed before it.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from headprobe.parallel.peers import exchange_peers
from headprobe.pipeline import probing, stages, taps
from headprobe.pipeline.stages import RunContext, RunError
from headprobe.recipe import Recipe, RecipeError, dump_recipe, load_recipe
from headprobe.record.directory import RunDir, check_out_folder, default_run_dir, metrics_from_json, new_results
from headprobe.record.lock import folder_lock

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


def _threads(recipe: Recipe) -> dict:
    """Set torch's intra-op threads (`parallel.threads.choose_threads`: HEADPROBE_THREADS, the recipe's
    runtime.threads, OMP_NUM_THREADS, else from the usable CPUs and the load); returns what results.json records.
    The environment's other settings are checked here too, before anything is written."""
    from headprobe.parallel.threads import configure_threads
    from headprobe.report.progress import progress_interval

    try:
        progress_interval()  # a bad HEADPROBE_PROGRESS_INTERVAL stops the run here, before anything is written
        return configure_threads(recipe.runtime.threads)
    except ValueError as err:
        raise RecipeError(str(err)) from None


def _what_it_computes(recipe: dict | None) -> dict | None:
    """A recorded recipe without `runtime` (how the machine is used, not what is computed): a resumed run may use
    other threads, and runs recorded before `runtime` existed resume."""
    return {k: v for k, v in recipe.items() if k != "runtime"} if isinstance(recipe, dict) else recipe


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


def check_arguments(recipe_or_path: Any, out: Any, overrides: Any) -> None:
    """TypeError, naming the argument, what it got and what it takes, for arguments of the wrong type (a string
    `overrides` would otherwise be read one character at a time)."""
    def got(value: Any) -> str:
        return f"{type(value).__name__} {value!r}"[:120]

    if not isinstance(recipe_or_path, (Recipe, str, Path, dict)):
        raise TypeError(f"recipe_or_path takes a Recipe, a YAML file's path (str or Path) or a dict; got "
                        f"{got(recipe_or_path)}.")
    if out is not None and not isinstance(out, (str, Path)):
        raise TypeError(f"out takes a folder's path (str or Path) or None; got {got(out)}.")
    if isinstance(overrides, str):
        raise TypeError(f"overrides takes a list of 'KEY=VALUE' strings; got the string {overrides!r}: write "
                        f"overrides=[{overrides!r}].")
    if overrides is not None and (not isinstance(overrides, (list, tuple))
                                  or not all(isinstance(o, str) for o in overrides)):
        raise TypeError(f"overrides takes a list of 'KEY=VALUE' strings, e.g. ['train.epochs=1']; got "
                        f"{got(overrides)}.")


def _overrides_from_keywords(keywords: dict[str, Any]) -> dict[str, Any]:
    """``train__epochs=1`` and ``**{"train.epochs": 1}`` → {"train.epochs": 1} (values stay Python objects)."""
    return {key.replace("__", "."): value for key, value in keywords.items()}


def _own_backbone(obj: torch.nn.Module, recipe: Recipe, show: bool) -> tuple[Any, Recipe]:
    """(the `Backbone` of a module passed to `run`, the recipe recording it as backbone.id: module:<class>)."""
    import copy

    from headprobe.backbones import Backbone, as_backbone
    from headprobe.parallel.distributed import process_state

    backbone = as_backbone(obj, recipe.backbone.resolution)
    if show and not isinstance(obj, Backbone) and process_state().is_main_process:
        print(f"backbone: {backbone.id} gets {backbone.preprocess.crop}-px centre crops normalised with the ImageNet "
              "mean and std (a bare module's contract); pass headprobe.load_backbone(module=..., preprocess=..., "
              "dim=...) to choose another preprocessing.", file=sys.stderr)
    recipe = copy.deepcopy(recipe)
    recipe.backbone.id = backbone.id
    return backbone, recipe


def run(
    recipe_or_path: Recipe | str | Path | dict,
    *,
    out: str | Path | None = None,
    overrides: list[str] | None = None,
    resume: bool = False,
    quiet: bool = False,
    backbone: torch.nn.Module | Mapping[str, Any] | None = None,
    reuse_backbone: str | Path | None = None,
    **values: Any,
) -> Results:
    """Run a recipe (object, YAML path or dict) end to end; returns `Results`.

    `backbone`: your own network instead of ``recipe.backbone.id``: a `Backbone` (``load_backbone(module=net,
    preprocess=Preprocess(...), dim=D)``) as it is, or a bare ``torch.nn.Module`` under the contract of
    `backbones.own_module` (ImageNet mean/std, ``backbone.resolution`` px, default 224; ``(B, 3, H, W) -> (B, D)``).
    The run records it as ``backbone.id: module:<its class>``. A mapping is an override of the recipe's
    ``backbone:`` section, as the other keywords are.
    `reuse_backbone`: a finished run with the same `BACKBONE_TAP_INPUTS` whose backbone tap is taken instead of
    probed again (`probing.reuse_tap`; a sweep passes its first such run); ignored for a tuned backbone.

    Overrides: ``overrides=["train.epochs=1"]`` (YAML-typed strings, as ``--set``) and/or keywords whose values are
    Python objects, ``run("r.yaml", **{"train.epochs": 1})`` or ``run("r.yaml", train__epochs=1)`` (``__`` is a
    dot); keywords apply after `overrides`. Resuming a finished run does nothing and returns its results.

    >>> results = run("recipes/quickstart.yaml", overrides=["data.limit.train=200"])  # doctest: +SKIP
    >>> results = run("recipes/quickstart.yaml", data__limit__train=256, train__epochs=1)  # doctest: +SKIP
    >>> results.metrics()["linear.acc"]  # doctest: +SKIP
    """

    from headprobe.parallel.distributed import process_state

    check_arguments(recipe_or_path, out, overrides)
    if isinstance(backbone, Mapping):
        values, backbone = {"backbone": backbone, **values}, None
    if isinstance(recipe_or_path, Recipe):
        if overrides or values:
            raise RecipeError("overrides apply to a recipe file or dict; edit the Recipe object directly.")
        recipe = recipe_or_path
    else:
        recipe = load_recipe(recipe_or_path, overrides, _overrides_from_keywords(values))
    given = None
    if backbone is not None:
        given, recipe = _own_backbone(backbone, recipe, show=not quiet)

    state = process_state()
    threads = _threads(recipe)
    path = Path(out) if out is not None else default_run_dir(recipe.name)
    _check_out(path)
    with folder_lock(path, "resume" if resume else "run", state):
        return _run_locked(recipe, path, out, state, resume, quiet, given, reuse_backbone, threads)


def _run_locked(recipe: Recipe, path: Path, out: str | Path | None, state, resume: bool, quiet: bool, given,
                reuse_backbone: str | Path | None, threads: dict) -> Results:
    """`run` with the run folder locked (`folder_lock`): from the resume checks to the summary. `given`: the
    caller's own backbone (`_own_backbone`), or None; `threads`: the thread choice (`_threads`), recorded."""
    from accelerate.utils import set_seed

    from headprobe.report.trackers import tracking

    main = state.is_main_process
    results = new_results(recipe.to_dict())
    invocation = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "resume": resume,
                  "status": "running", "timing": {}}
    results["invocations"] = [invocation]
    if resume:
        if not (path / "results.json").is_file():
            raise RecipeError(f"--resume needs --out pointing at an earlier run; {path}/results.json does not exist.")
        try:
            previous = RunDir(path).read_results()
        except ValueError as err:
            raise RecipeError(f"--resume: {err}") from None
        if _what_it_computes(previous.get("recipe")) != _what_it_computes(recipe.to_dict()):
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
        # Every invocation keeps the time of the stages it ran (a run from before `invocations` had one).
        earlier = previous.get("invocations") or [{"started": None, "resume": False, "status": previous.get("status"),
                                                   "timing": previous.get("timing", {})}]
        results["invocations"] = [*earlier, invocation]
    elif out is not None and (path / "results.json").exists():
        raise RecipeError(f"--out {path} already holds a run; pass --resume to continue it or choose another --out.")
    # Every process checks the directory before the main one writes into it.
    state.wait_for_everyone()
    run_dir = RunDir.create(path, writable=main)
    run_dir.write_config(dump_recipe(recipe))
    results["environment"] = _environment(state) | {"threads": threads}
    set_seed(recipe.seed)

    ctx = RunContext(recipe, run_dir, results, state, show=main and not quiet, resume=resume,
                     peers=exchange_peers(state), invocation=invocation)
    with ctx.recording_stops(), tracking(recipe, run_dir) as trackers:
        inputs = stages.load_inputs(ctx, backbone=given)
        features = stages.extract_features(ctx, inputs)
        if recipe.backbone.tune != "frozen":
            # Score the untuned backbone, tune it with the heads on views made on the fly, then extract every
            # feature again from the tuned backbone, so that "backbone" and the head taps are scored on it.
            probing.probe_tap(ctx, features, taps.Tap("backbone_untuned"))
            trained = stages.tune_backbone(ctx, inputs)
            features = stages.extract_features(ctx, inputs, tuned=True)
        # With several processes and frozen-backbone heads, the backbone tap is probed with the head taps, so that
        # its probes are shared out with theirs (alone, its one linear probe is the whole stage's critical path).
        with_heads = bool(recipe.heads) and recipe.backbone.tune == "frozen" and state.num_processes > 1
        if reuse_backbone is not None and recipe.backbone.tune == "frozen" and "backbone" not in results["taps"]:
            probing.reuse_tap(ctx, Path(reuse_backbone))
        if not with_heads:
            probing.probe_tap(ctx, features, taps.Tap("backbone"))
        if recipe.heads:
            if recipe.backbone.tune == "frozen":
                trained = stages.train_heads(ctx, features)
            if recipe.geometry.final:
                stages.analyse_geometry(ctx, features, trained.first)
            probing.probe_heads(ctx, features, trained, backbone=with_heads)

        timing = results["timing"]
        extracted = timing.get("extract_s", 0.0) + timing.get("extract_views_s", 0.0)
        if extracted > 0:
            # Probes work on cached features: all of them together should cost less than extracting those.
            results.setdefault("timing_ratios", {})["probe_over_extract"] = timing.get("probe_s", 0.0) / extracted
        results["orbits"] = _orbit_coordinates(results["taps"])
        results["status"] = invocation["status"] = "complete"
        run_dir.write_results(results)
        trackers.log_results(results)
        if recipe.report:
            stages.write_report(run_dir)
    if main and not quiet:
        from headprobe.report.table import print_summary

        print_summary(results, run_dir.path)
        if recipe.report and (run_dir.path / "report.html").is_file():
            print(f"report: {run_dir.path / 'report.html'}")
    return Results(results, run_dir.path)


# The recipe sections that decide the backbone tap's numbers: runs of a sweep equal in these probe it once.
BACKBONE_TAP_INPUTS = ("seed", "backbone", "data", "features", "augment", "probes")


def backbone_tap_inputs(recipe: Recipe) -> str:
    """The recipe's `BACKBONE_TAP_INPUTS` as one comparable text."""
    import json

    plain = recipe.to_dict()
    return json.dumps({key: plain[key] for key in BACKBONE_TAP_INPUTS}, sort_keys=True, default=str)


def run_sweep(
    recipe_path: str | Path | dict, *, out: str | Path | None = None, overrides: list[str] | None = None,
    quiet: bool = False, backbone: torch.nn.Module | None = None, **values: Any,
) -> list[Results]:
    """Run every combination of the recipe's `sweep:` (and `sweep_zip:`) into OUT/<label>/ and compare them
    (OUT/compare.csv/.html). Overrides as in `run`: ``overrides=["k=v"]`` and/or keywords with Python values
    (``train__epochs=1``); `backbone` as in `run`, for every run. Runs whose `BACKBONE_TAP_INPUTS` equal an earlier
    run's take its backbone tap (``taps.backbone.reused_from``) instead of probing the same features again.

    >>> run_sweep("recipes/paper_depth_ablation.yaml", train__epochs=5)  # doctest: +SKIP
    """
    from headprobe.recipe import expand_sweep, resolve_recipe_data

    check_arguments(recipe_path, out, overrides)
    if values:  # fold every override into the recipe's data once; each combination then starts from it
        recipe_path, overrides = resolve_recipe_data(recipe_path, overrides, _overrides_from_keywords(values)), None

    combos = expand_sweep(recipe_path, overrides)
    recipe = load_recipe(recipe_path, overrides)
    root = Path(out) if out is not None else default_run_dir(recipe.name)
    _check_out(root)
    results, probed = [], {}  # probed: the first run of each backbone-tap input, whose backbone tap the others take
    for label, items in combos:
        inputs = backbone_tap_inputs(load_recipe(recipe_path, items))
        results.append(run(recipe_path, out=root / label, overrides=items, quiet=quiet, backbone=backbone,
                           reuse_backbone=probed.get(inputs)))
        probed.setdefault(inputs, root / label)
    from headprobe.parallel.distributed import process_state

    if process_state().is_main_process:
        from headprobe.report.compare import write_compare

        written = write_compare([r.path for r in results], root)
        if not quiet:
            from rich.console import Console

            from headprobe.record.directory import read_results
            from headprobe.report.table import compare_table

            Console().print(compare_table({r.path.name: read_results(r.path) for r in results}))
            if "cross_run" in written:  # a head ablation with a no-head arm: the backbones compared across runs
                import json

                from headprobe.stats.cross_run import answer_lines

                print("\n".join(answer_lines(json.loads(written["cross_run"].read_text()))))
            print(f"comparison: {root / 'compare.html'}")
    return results
