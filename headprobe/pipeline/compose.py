"""The study, step by step: recipe → backbone → data → features → heads → taps → probes → results.

Nothing else lives here: each step calls the module that owns it and hands what it returns to the record's one
writer (`record.writer.RecordWriter`), which rewrites `results.json` after every finished step, so a failure keeps
everything computed before it.
"""

from __future__ import annotations

import copy
import json
import platform
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from headprobe.backbones import Backbone, as_backbone
from headprobe.parallel.distributed import collective_timeout_s, process_state
from headprobe.parallel.peers import exchange_peers
from headprobe.parallel.threads import configure_threads, resumed_threads
from headprobe.pipeline import probing, stages, taps, tuned_seeds
from headprobe.pipeline.executors import executors_for
from headprobe.pipeline.geometry_claims import answer_geometry_questions
from headprobe.pipeline.stages import RunContext, RunError
from headprobe.pipeline.training_record import record_training
from headprobe.recipe import Recipe, RecipeError, dump_recipe, expand_sweep, load_recipe, resolve_recipe_data
from headprobe.recipe.environment import DEFAULT_PEER_TIMEOUT_S, peer_timeout_s
from headprobe.recipe.folder_names import is_inside
from headprobe.recipe.sweeps import sweep_size
from headprobe.record.directory import RunDir, check_out_folder, default_run_dir, read_results
from headprobe.record.lock import folder_lock
from headprobe.record.writer import RecordWriter
from headprobe.report.compare import write_compare
from headprobe.report.progress import progress_interval
from headprobe.report.table import print_compare, print_summary
from headprobe.report.trackers import tracking
from headprobe.stats.cross_run import answer_lines

if TYPE_CHECKING:
    from headprobe.backbones import Backbone

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


def _threads(recipe: Recipe, path: Path, resume: bool) -> dict:
    """Set torch's intra-op threads (`parallel.threads.choose_threads`: HEADPROBE_THREADS, on `resume` the count the
    run in `path` recorded, the recipe's runtime.threads, OMP_NUM_THREADS, else from the usable CPUs); returns what
    results.json records. The environment's other settings are checked here too, before anything is written."""

    try:
        progress_interval()  # a bad HEADPROBE_PROGRESS_INTERVAL stops the run here, before anything is written
        return configure_threads(recipe.runtime.threads, resumed_threads(path) if resume else None)
    except ValueError as err:
        raise RecipeError(str(err)) from None


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
    check_out_folder(path)  # not a foreign non-empty folder, and writable (record.directory.check_out_folder)


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


    check_arguments(recipe_or_path, out, overrides)
    if isinstance(backbone, Mapping):
        values, backbone = {"backbone": backbone, **values}, None
    if isinstance(recipe_or_path, Recipe):
        if overrides or values:
            raise RecipeError("overrides apply to a recipe file or dict; edit the Recipe object directly.")
        recipe = recipe_or_path
    else:
        recipe = load_recipe(recipe_or_path, overrides, _overrides_from_keywords(values))
    if recipe.sweep or recipe.sweep_zip:  # run() of a sweep would run its base recipe alone, silently
        raise RecipeError(f"recipe {recipe.name!r} is a sweep of {sweep_size(recipe.sweep, recipe.sweep_zip)} runs; "
                          "run_sweep(...) runs them all (headprobe run does the same), or override sweep={} and "
                          "sweep_zip={} to run its base recipe alone.")
    given = None
    if backbone is not None:
        given, recipe = _own_backbone(backbone, recipe, show=not quiet)

    state = process_state()
    path = Path(out) if out is not None else default_run_dir(recipe.name)
    threads = _threads(recipe, path, resume)
    _check_out(path)
    call = Invocation(path, resume, quiet, refuse_existing=out is not None,
                      reuse_backbone=Path(reuse_backbone) if reuse_backbone is not None else None, threads=threads,
                      peer_timeout_s=peer_timeout_s())
    with folder_lock(path, "resume" if resume else "run", state):
        return _run_locked(recipe, call, state, given)


@dataclass(frozen=True)
class Invocation:
    """How `run` was called: the run folder, whether it resumes there, whether it prints, whether a folder holding a
    run is refused (--out given, no --resume), the run whose backbone tap it takes (`reuse_backbone`), the thread
    choice it records (`_threads`) and the seconds without a heartbeat after which another process is frozen
    (`recipe.environment.peer_timeout_s`)."""

    path: Path
    resume: bool
    quiet: bool
    refuse_existing: bool
    reuse_backbone: Path | None
    threads: dict
    peer_timeout_s: float = DEFAULT_PEER_TIMEOUT_S


def _run_locked(recipe: Recipe, call: Invocation, state: Any, given: Backbone | None) -> Results:
    """`run` with the run folder locked (`folder_lock`): from the resume checks to the summary. `given`: the
    caller's own backbone (`_own_backbone`), or None. Each stage returns a typed value; the record's one writer
    (`RecordWriter`) takes it. The executors of probes and seeds are chosen here, once, for `state`'s processes."""
    from accelerate.utils import set_seed


    main = state.is_main_process
    results, invocation, finished = RecordWriter.begin(recipe.to_dict(), call.path, call.resume,
                                                       call.refuse_existing)
    if finished is not None:
        # Nothing to redo: results.json and its timings stay exactly as the run wrote them. A report the run was
        # stopped in the middle of (results.json is written complete before it) is made now.
        missing = recipe.report and not (call.path / "report.html").is_file()
        if main and missing:
            stages.write_report(RunDir(call.path, writable=True))
        if main and not call.quiet:
            made = " except its report, made now" if missing else ""
            print(f"nothing to do: the run in {call.path} is already complete{made} ({call.path / 'results.json'}).",
                  file=sys.stderr)
        return Results(finished, call.path)
    # Every process checks the directory before the main one writes into it.
    state.wait_for_everyone()
    run_dir = RunDir.create(call.path, writable=main)
    run_dir.write_config(dump_recipe(recipe))
    record = RecordWriter(run_dir, results, invocation, resume=call.resume)
    record.put("environment", _environment(state) | {"threads": call.threads, "peer_timeout_s": call.peer_timeout_s,
                                                     "collective_timeout_s": collective_timeout_s()}, write=False)
    set_seed(recipe.seed)

    probes, seeds = executors_for(state)
    ctx = RunContext(recipe, record, state, probes, seeds, show=main and not call.quiet, peers=exchange_peers(state))
    frozen = recipe.backbone.tune == "frozen"
    with ctx.watching_peers(call.peer_timeout_s), ctx.recording_stops(), tracking(recipe, run_dir) as trackers:
        inputs = stages.load_backbone(ctx, backbone=given)
        record.add_time({"load_s": inputs.load_s})
        record.put("backbone", inputs.backbone.describe(), write=False)  # written with the data, or a failure
        inputs = stages.load_data(ctx, inputs)
        record.put("data", inputs.data_record())
        features = stages.extract_features(ctx, inputs)
        record.add_time(features.seconds)
        record.put("protocol", features.protocol, merge=True, write=False)
        ctx.reading(features)  # each stage from here on ends by verifying the cache files it read
        if not frozen:
            # Score the untuned backbone; then, once per seed, tune a copy of it with the heads on views made on the
            # fly and extract every feature again from it, so that "backbone" and the head taps are scored on the
            # backbone each seed tuned (`tuned_seeds`); the untuned features and views stay recorded beside them.
            _clock_probing(ctx, probing.probe_tap(ctx, features, taps.Tap("backbone_untuned")))
            record.put("protocol", {"features_untuned": features.protocol["features"],
                                    "views_untuned": features.protocol.get("views")}, merge=True, write=False)
            tuned_seeds.tune_and_probe(ctx, inputs)
        else:
            # With several processes and heads, the backbone tap is probed with the head taps, so that its probes
            # are shared out with theirs (alone, its one linear probe is the whole stage's critical path).
            with_heads = bool(recipe.heads) and probes.backbone_with_heads
            if call.reuse_backbone is not None and "backbone" not in results["taps"]:
                probing.reuse_tap(ctx, call.reuse_backbone)
            if not with_heads:
                _clock_probing(ctx, probing.probe_tap(ctx, features, taps.Tap("backbone")))
            if recipe.heads:
                trained = stages.train_heads(ctx, features)
                record_training(record, trained, trained.resumed)
                if trained.seconds is not None:
                    ctx.announce_estimate("training")
                if recipe.geometry.final:
                    t0 = time.perf_counter()
                    for head, geometry in stages.analyse_geometry(ctx, features, trained.first):
                        record.put(("heads", head, "geometry"), geometry)
                    with ctx.stage("answering Q-split and Q-saddle"):
                        geometry_claims = answer_geometry_questions(ctx, features, trained.by_seed)
                    ctx.clock("geometry_s", time.perf_counter() - t0)
                _clock_probing(ctx, probing.probe_heads(ctx, features, trained, backbone=with_heads))
                if recipe.geometry.final:  # after probing, whose answers replace results["claims"]
                    record.put("claims", geometry_claims, merge=True)

        with ctx.stage("checking the cached features read"):
            ctx.verify_cache(final=True)
        record.complete(orbits=_orbit_coordinates(results["taps"]))
        trackers.log_results(results)
        if recipe.report:
            stages.write_report(run_dir)
    if main and not call.quiet:

        print_summary(results, run_dir.path)
        if recipe.report and (run_dir.path / "report.html").is_file():
            print(f"report: {run_dir.path / 'report.html'}")
    return Results(results, run_dir.path)


def _clock_probing(ctx: RunContext, seconds: float | None) -> None:
    """A probing stage's seconds into the record, when it ran any probe."""
    if seconds is not None:
        ctx.clock("probe_s", seconds)


# The recipe sections that decide the backbone tap's numbers: runs of a sweep equal in these probe it once.
BACKBONE_TAP_INPUTS = ("seed", "backbone", "data", "features", "augment", "probes")


def backbone_tap_inputs(recipe: Recipe) -> str:
    """The recipe's `BACKBONE_TAP_INPUTS` as one comparable text."""

    plain = recipe.to_dict()
    return json.dumps({key: plain[key] for key in BACKBONE_TAP_INPUTS}, sort_keys=True, default=str)


def run_sweep(
    recipe_path: str | Path | dict, *, out: str | Path | None = None, overrides: list[str] | None = None,
    quiet: bool = False, backbone: torch.nn.Module | None = None, resume: bool = False, **values: Any,
) -> list[Results]:
    """Run every combination of the recipe's `sweep:` (and `sweep_zip:`) into OUT/<label>/ and compare them
    (OUT/compare.csv/.html). Overrides as in `run`: ``overrides=["k=v"]`` and/or keywords with Python values
    (``train__epochs=1``); `backbone` as in `run`, for every run. Runs whose `BACKBONE_TAP_INPUTS` equal an earlier
    run's take its backbone tap (``taps.backbone.reused_from``) instead of probing the same features again.
    `resume`: every run already in OUT continues as `run(..., resume=True)` does (a finished one is kept as it is),
    the others start.

    >>> run_sweep("recipes/paper_depth_ablation.yaml", train__epochs=5)  # doctest: +SKIP
    """

    check_arguments(recipe_path, out, overrides)
    if values:  # fold every override into the recipe's data once; each combination then starts from it
        recipe_path, overrides = resolve_recipe_data(recipe_path, overrides, _overrides_from_keywords(values)), None

    combos = expand_sweep(recipe_path, overrides)
    recipe = load_recipe(recipe_path, overrides)
    root = Path(out) if out is not None else default_run_dir(recipe.name)
    _check_out(root)
    for label, _ in combos:  # each run writes into its own folder inside the sweep's, never beside it
        if not is_inside(root, root / label):
            raise RecipeError(f"the sweep run {label!r} would be written outside {str(root)!r} (its folder "
                              f"resolves to {str((root / label).resolve())!r}); rename it with sweep_labels.")
    results, probed = [], {}  # probed: the first run of each backbone-tap input, whose backbone tap the others take
    for label, items in combos:
        inputs = backbone_tap_inputs(load_recipe(recipe_path, items))
        results.append(run(recipe_path, out=root / label, overrides=items, quiet=quiet, backbone=backbone,
                           reuse_backbone=probed.get(inputs),
                           resume=resume and (root / label / "results.json").is_file()))
        probed.setdefault(inputs, root / label)
    compare_sweep_runs(root, results, quiet)
    return results


def compare_sweep_runs(root: Path, results: list[Results], quiet: bool) -> None:
    """A sweep's ending: root/compare.csv and compare.html of its runs (and cross_run.json for a head ablation),
    and unless `quiet` the table and where the comparison is; on the main process only."""

    if process_state().is_main_process:

        written = write_compare([r.path for r in results], root)
        if not quiet:
            from rich.console import Console


            print_compare({r.path.name: read_results(r.path) for r in results}, Console(),
                          paths={r.path.name: r.path for r in results})
            if "cross_run" in written:  # a head ablation with a no-head arm: the backbones compared across runs


                print("\n".join(answer_lines(json.loads(written["cross_run"].read_text()))))
            print(f"comparison: {root / 'compare.html'}")
