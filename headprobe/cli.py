"""``headprobe run | submit | validate | plan | list | report | compare | claims | geometry | export-heads``.

Exit codes: 0 done; 2 bad recipe or arguments (nothing written); 1 a failure
while running (finished work stays on disk).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _is_main_process() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0"


def _error(message: str, code: int) -> int:
    from rich.markup import escape

    # Messages quote user input and library errors (``[/<tag>]``, ``[cls``): never read them as markup.
    _console(stderr=True).print(f"[bold red]error:[/] {escape(str(message))}", soft_wrap=True)
    return code


def quiet_libraries(verbose: bool, environ: dict | None = None) -> bool:
    """Silence transformers' weight-loading bars and its config warnings (its errors still show) unless asked for
    them (--verbose, or HEADPROBE_VERBOSE=1); returns whether it did. Processes started from here (torchrun's)
    inherit TRANSFORMERS_VERBOSITY."""
    import os

    environ = os.environ if environ is None else environ
    if verbose or environ.get("HEADPROBE_VERBOSE", "").strip() not in ("", "0"):
        return False
    environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    return True


def _said_once(message: str, code: int) -> int:
    """`code`, with `message` printed by the main process only: under a launcher every process stops alike (the same
    recipe, the same Ctrl-C, a failure each meets), and a process that failed alone has told the main one, which
    records and says it (`pipeline.context.RunContext.record_stop`)."""
    return _error(message, code) if _is_main_process() else code


def cmd_run(args: argparse.Namespace) -> int:
    from headprobe.pipeline.compose import RunError, run, run_sweep
    from headprobe.pipeline.context import PeerStop
    from headprobe.pipeline.resume import resume_folder

    from .recipe import RecipeError, load_recipe

    if args.recipe is None and (args.set or not (args.resume and args.out)):
        # Without a recipe only a resume knows what to run: the one recorded in --out.
        return _error("give a recipe (`headprobe run RECIPE`), or continue a run or sweep from the recipe it "
                      "recorded with `headprobe run --resume --out DIR` (no --set: the recorded recipe is run).",
                      EXIT_USAGE) if _is_main_process() else EXIT_USAGE
    try:
        recipe = None if args.recipe is None else load_recipe(args.recipe, args.set)
    except RecipeError as err:
        # Every process of a launch reads the same recipe: the main one says what is wrong, once.
        return _error(str(err), EXIT_USAGE) if _is_main_process() else EXIT_USAGE
    quiet_libraries(args.verbose)
    _warn_about_launch()
    try:
        if recipe is None:
            resume_folder(args.out, quiet=not _is_main_process())
        elif recipe.sweep or recipe.sweep_zip:
            run_sweep(args.recipe, out=args.out, overrides=args.set, quiet=not _is_main_process(), resume=args.resume)
        else:
            run(args.recipe, out=args.out, overrides=args.set, resume=args.resume, quiet=not _is_main_process())
    except RecipeError as err:
        return _said_once(str(err), EXIT_USAGE)
    except PeerStop as err:  # another process was lost or froze: the first one left says it
        return _error(str(err), EXIT_FAILED) if err.speaks else EXIT_FAILED
    except RunError as err:
        return _said_once(str(err), EXIT_FAILED)
    except OSError as err:
        return _said_once(_os_error_sentence(err, args.out), EXIT_FAILED)
    except KeyboardInterrupt as stop:
        from .parallel.signals import StopSignal

        # A scheduler's SIGTERM / SIGUSR1 exits 128 + its number, as shells report it.
        signalled = isinstance(stop, StopSignal)
        return _said_once(f"interrupted{f' by {stop.name}' if signalled else ''}; the run directory keeps every "
                          "finished stage (status \"interrupted\"), and `headprobe run RECIPE --resume --out RUN_DIR` "
                          "continues it.", stop.exit_code if signalled else EXIT_INTERRUPTED)
    return EXIT_OK


def cmd_submit(args: argparse.Namespace) -> int:
    from .pipeline.submit import SubmitOptions, submit
    from .recipe import RecipeError

    options = SubmitOptions(time_min=args.time, cpus=args.cpus, gpus=args.gpus, mem_gb=args.mem_gb,
                            partition=args.partition, local=args.local, logs=Path(args.logs) if args.logs else None)
    try:
        job, run_dir = submit(args.recipe, out=args.out, overrides=args.set, options=options)
    except (RecipeError, ValueError) as err:
        return _error(str(err), EXIT_USAGE)
    console = _console()
    console.print(f"submitted job {job.job_id}: run directory {run_dir}; log {job.paths.stdout} "
                  f"(stderr {job.paths.stderr}); a requeued job resumes the run", markup=False, soft_wrap=True)
    if not args.wait:
        return EXIT_OK
    try:
        job.result()
    except Exception as err:  # submitit re-raises the job's failure with its traceback from the log
        return _error(f"job {job.job_id} failed: {str(err).strip().splitlines()[-1]} (log: {job.paths.stderr})",
                      EXIT_FAILED)
    console.print(f"job {job.job_id} done: {run_dir / 'results.json'}", markup=False, soft_wrap=True)
    return EXIT_OK


def _warn_about_launch() -> None:
    """One warning line when a launcher asked for several processes and this one sees fewer (`launch_check`)."""
    from headprobe.parallel.distributed import process_state
    from headprobe.parallel.launch_check import warn_if_fewer_processes

    state = process_state()
    warn_if_fewer_processes(state.num_processes, show=state.is_main_process)


def _os_error_sentence(err: OSError, out: str | None) -> str:
    """A failed write or read (full disk, read-only folder) as one sentence naming the file and the fix."""
    where = f" {err.filename}" if err.filename else ""
    reason = err.strerror or str(err)
    folder = f" {out}" if out else " the run folder"
    return (f"could not write{where}: {reason}; free disk space or choose a writable --out (what finished is kept "
            f"in{folder}, and `headprobe run RECIPE --resume --out RUN_DIR` continues it).")


def cmd_validate(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from .recipe import RecipeError, load_recipe
    from .recipe.environment import check_environment

    try:
        recipe = load_recipe(args.recipe, args.set)
        check_environment()  # the variables a run reads, as it reads them
    except RecipeError as err:
        return _error(str(err), EXIT_USAGE)
    from .data.sources import missing_data

    missing = missing_data(recipe.data.source)  # what `run` would stop on before loading any model
    if missing:
        return _error(missing, EXIT_USAGE)
    probes = ", ".join(recipe.probes)
    # load_recipe has validated every combination of the sweep, as `run` will make them.
    from .recipe.sweeps import sweep_size

    size = sweep_size(recipe.sweep, recipe.sweep_zip)
    runs = f"; sweep: {size} runs" if size else ""
    _console().print(
        "[green]ok[/] "
        + escape(f"{args.recipe}: {recipe.backbone.id} ({recipe.backbone.pooling}) on {recipe.data.source}; "
                 f"probes: {probes}{runs}"),
        soft_wrap=True,
    )
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from .registry import FAMILIES, did_you_mean

    if args.family and args.family not in FAMILIES:
        guess = did_you_mean(args.family, list(FAMILIES))
        hint = f" Did you mean {guess!r}?" if guess else ""
        return _error(f"unknown family {args.family!r}; allowed: {', '.join(FAMILIES)}.{hint}", EXIT_USAGE)
    console = _console()
    for family, registry in FAMILIES.items():
        if args.family and family != args.family:
            continue
        table = Table(title=family, title_justify="left", show_header=False, box=None, padding=(0, 2))
        for entry in registry:
            help = entry.help if entry.reading is None else f"{entry.help}; {entry.reading}"
            table.add_row(f"[bold]{escape(entry.usage)}[/]", escape(help))
        console.print(table)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from headprobe.record.directory import read_results
    from headprobe.record.lock import RunLock

    from .recipe import RecipeError
    from .report.html import write_report
    from .report.table import print_summary

    try:
        results = read_results(args.run_dir)
    except (FileNotFoundError, ValueError) as err:
        return _error(str(err), EXIT_USAGE)
    console = _console()
    print_summary(results, Path(args.run_dir), console=console)
    try:
        with RunLock(args.run_dir, "report"):  # not while a run, resume or geometry writes there
            path = write_report(args.run_dir)
    except RecipeError as err:  # the folder is locked, or HEADPROBE_LOCK_TIMEOUT is no number of seconds
        return _error(str(err), EXIT_USAGE)
    except OSError as err:
        return _error(f"could not write the report into {args.run_dir}: {err}", EXIT_FAILED)
    console.print(f"report: {path} (figures in {path.parent / 'plots'})", markup=False)
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from headprobe.record.directory import read_results

    from .report.compare import default_out_dir, run_labels, write_compare
    from .report.table import print_compare

    try:
        labels = run_labels(args.run_dirs)
        runs = {label: read_results(path) for label, path in labels.items()}
    except (FileNotFoundError, ValueError) as err:
        return _error(str(err), EXIT_USAGE)
    console = _console()
    out = Path(args.out) if args.out else default_out_dir(args.run_dirs)
    # Said first: without --out the files go next to the runs, not necessarily into the current directory.
    console.print(f"writing compare.csv and compare.html into {out}", markup=False, soft_wrap=True)
    print_compare(runs, console, args.width, labels)
    try:
        written = write_compare(list(labels.values()), out)
    except OSError as err:
        return _error(f"could not write the comparison into {out}: {err}", EXIT_FAILED)
    except ValueError as err:  # runs that cannot be paired across (cross_run.cross_run_answers)
        return _error(str(err), EXIT_USAGE)
    if "cross_run" in written:
        import json

        from headprobe.stats.cross_run import answer_lines

        for line in answer_lines(json.loads(written["cross_run"].read_text())):
            console.print(line, markup=False, soft_wrap=True)
    console.print(f"comparison: {', '.join(str(p) for p in written.values())}", markup=False)
    return EXIT_OK


def cmd_claims(args: argparse.Namespace) -> int:
    from headprobe.record.directory import read_results

    from .report.claims_table import ACROSS_HEADER, claims_rows, cross_run_rows, format_claims, training_lines
    from .report.compare import run_labels, sweep_runs
    from .stats.saddle_grid import grid_text

    try:
        labels = run_labels(sweep_runs(args.run_dirs))
        results = {label: read_results(path) for label, path in labels.items()}
        rows = claims_rows(results, args.secondary, training_lines(labels))
        # A head ablation (a no-head arm and others, by seed): its answers pooled over runs and across runs.
        answers = None
        if len(labels) > 1:  # torch only here: the intervals across runs are computed, not read
            from headprobe.stats.cross_run import cross_run_answers

            answers = cross_run_answers(list(labels.values()))
    except (FileNotFoundError, ValueError) as err:
        return _error(str(err), EXIT_USAGE)
    within, across = ([], []) if answers is None else (
        cross_run_rows(answers, "within", args.secondary),
        cross_run_rows(answers, "across", args.secondary) + cross_run_rows(answers, "against_null", args.secondary))
    if args.format == "csv":
        text = format_claims(rows + within + across, "csv")
    else:
        text = format_claims(rows + within, args.format)
        text += "\n" + format_claims(across, args.format, ACROSS_HEADER) if across else ""
        text += grid_text(results)
    if args.out is None:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        Path(args.out).write_text(text, encoding="utf-8")
    except OSError as err:
        return _error(f"could not write {args.out}: {err.strerror or err}; choose a writable --out.", EXIT_FAILED)
    _console().print(f"claims: {args.out} ({len(rows) + len(within) + len(across)} rows)", markup=False)
    return EXIT_OK


def cmd_export_heads(args: argparse.Namespace) -> int:
    from headprobe.record.saved_heads import SavedHeadsError, export_heads
    from headprobe.train.cached_views import CheckpointError

    try:
        path = export_heads(args.run_dir, args.out)
    except (SavedHeadsError, CheckpointError, ValueError) as err:
        return _error(str(err), EXIT_USAGE)
    except OSError as err:
        where = f" {err.filename}" if err.filename else ""
        return _error(f"could not write the heads{where}: {err.strerror or err}; choose a writable --out (a "
                      ".safetensors file in a folder you can write to).", EXIT_FAILED)
    _console().print(f"heads: {path} (headprobe.load_heads({str(path)!r}) rebuilds them)", markup=False,
                     soft_wrap=True)
    return EXIT_OK


def cmd_geometry(args: argparse.Namespace) -> int:
    from headprobe.pipeline.analyse import analyse_run
    from headprobe.pipeline.compose import RunError

    quiet_libraries(args.verbose)
    # Bad arguments stop here, before the run directory is read or touched (geometry.rows has the same bound).
    if args.rows is not None and args.rows < 2:
        return _error(f"--rows = {args.rows} is out of range; it must be >= 2 (training samples to evaluate the "
                      "geometry on), or leave it out to use the recipe's geometry.rows.", EXIT_USAGE)
    # A failure here never changes the run's recorded status: `stages.RunContext.stage` leaves a finished run's
    # results.json as it was (see stages.RunContext.record_stop).
    try:
        results = analyse_run(args.run_dir, rows=args.rows, quiet=not _is_main_process())
    except (FileNotFoundError, ValueError) as err:
        return _error(str(err), EXIT_USAGE)
    except RunError as err:
        return _error(str(err), EXIT_FAILED)
    console = _console()
    for head, entry in results["heads"].items():
        geo = entry.get("geometry", {})
        if geo:
            curv, eff = geo.get("curvature", {}), geo.get("effective_hessian", {})
            console.print(f"{head}: λ_min {curv.get('lambda_min', float('nan')):.3g}, "
                          f"λ_max {curv.get('lambda_max', float('nan')):.3g}, "
                          f"‖M‖/‖H‖ {eff.get('m_ratio', float('nan')):.3g}, "
                          f"G variation {geo.get('pullback', {}).get('variation', float('nan')):.3g}", markup=False)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="headprobe", description="Probe backbones before, inside and after projection heads."
    )
    parser.add_argument("--version", action="version", version=f"headprobe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    overrides = {"action": "append", "default": [], "metavar": "KEY=VALUE",
                 "help": "override a recipe value, e.g. --set backbone.pooling=mean (YAML-typed; repeatable)"}
    verbose = {"action": "store_true", "help": "show transformers' weight-loading bars and warnings (also "
                                               "HEADPROBE_VERBOSE=1)"}
    p = sub.add_parser("run", help="run a recipe end to end")
    p.add_argument("recipe", nargs="?", help="the recipe (YAML); with --resume it may be left out: the run or sweep "
                                             "in --out continues from the recipe it recorded")
    p.add_argument("--set", **overrides)
    p.add_argument("--out", help="run directory (default runs/<recipe name>-<timestamp>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out, keeping finished probes (a sweep's folder: its unfinished runs)")
    p.add_argument("--verbose", **verbose)
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("submit", help="run a recipe as a SLURM job (submitit; pip install 'headprobe[slurm]')")
    p.add_argument("recipe")
    p.add_argument("--set", **overrides)
    p.add_argument("--out", help="run directory (default runs/<recipe name>-<timestamp>, fixed at submission)")
    p.add_argument("--time", type=int, default=60, help="time limit in minutes (default 60)")
    p.add_argument("--cpus", type=int, default=8, help="CPUs for the task (default 8; threads follow them)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs on the node (default 0)")
    p.add_argument("--mem-gb", type=float, default=None, help="memory in GB (default: the partition's)")
    p.add_argument("--partition", default=None, help="SLURM partition (default: the cluster's)")
    p.add_argument("--logs", default=None, help="submitit's folder for job files and logs (default: next to the "
                                                "run directory, in submitit/)")
    p.add_argument("--local", action="store_true", help="run the job on this machine (submitit's local executor)")
    p.add_argument("--wait", action="store_true", help="wait for the job to finish and report how it ended")
    p.set_defaults(fn=cmd_submit)

    p = sub.add_parser("validate", help="check a recipe, and that its data is on this machine, without loading any "
                                        "model")
    p.add_argument("recipe")
    p.add_argument("--set", **overrides)
    p.set_defaults(fn=cmd_validate)
    from .pipeline.plan import add_plan_parser

    add_plan_parser(sub, overrides)

    p = sub.add_parser("list", help="registered names per family")
    p.add_argument("family", nargs="?")
    p.set_defaults(fn=cmd_list)

    p = sub.add_parser("report", help="print a run's summary and rebuild its report.html and plots/")
    p.add_argument("run_dir")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("geometry", help="evaluate the heads' geometry of a finished run, without retraining")
    p.add_argument("run_dir")
    p.add_argument("--rows", type=int, default=None, help="training samples to evaluate on (default: the recipe's)")
    p.add_argument("--verbose", **verbose)
    p.set_defaults(fn=cmd_geometry)

    p = sub.add_parser("claims", help="the answers of one or more runs as the paper's table: z / h(z) (Δ [95%% CI], "
                                      "n); for a head ablation (a sweep folder, or its runs) also per arm, pooled over "
                                      "its seeds and across runs against the no-head backbone")
    p.add_argument("run_dirs", nargs="+", help="run folders, or a sweep's folder (its runs)")
    p.add_argument("--format", choices=("md", "latex", "csv"), default="md",
                   help="md (Markdown), latex (booktabs tabular) or csv (every number unrounded); default md")
    p.add_argument("--out", help="file to write (default: print to the terminal)")
    p.add_argument("--secondary", action="store_true", help="add a row per secondary measure under each answer")
    p.set_defaults(fn=cmd_claims)
    p = sub.add_parser("export-heads", help="write a finished run's trained heads into one safetensors file")
    p.add_argument("run_dir")
    p.add_argument("--out", help="the file to write (default RUN_DIR/heads.safetensors)")
    p.set_defaults(fn=cmd_export_heads)

    p = sub.add_parser("compare", help="side-by-side table of several runs (terminal, compare.csv, compare.html)")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--out", help="folder for compare.csv and compare.html (default: the deepest folder holding "
                                 "all the runs)")
    p.add_argument("--width", type=int, default=None,
                   help="columns of the printed table (default: the terminal's; as wide as it needs in a log or pipe)")
    p.set_defaults(fn=cmd_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .parallel.threads import prefer_passive_waiting

    # Before torch loads its OpenMP runtime (it reads the wait policy once): idle threads sleep, never spin against
    # other jobs on a shared machine.
    prefer_passive_waiting()
    from .report.warning_lines import one_line_warnings

    one_line_warnings()
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
