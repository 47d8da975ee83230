"""``headprobe run | validate | list | report | compare``.

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


def cmd_run(args: argparse.Namespace) -> int:
    from .pipeline import RunError, run, run_sweep
    from .recipe import RecipeError, load_recipe

    try:
        recipe = load_recipe(args.recipe, args.set)
    except RecipeError as err:
        return _error(str(err), EXIT_USAGE)
    _warn_about_launch()
    try:
        if recipe.sweep:
            if args.resume:
                return _error("--resume continues one run; resume each run of a sweep by its own --out.", EXIT_USAGE)
            run_sweep(args.recipe, out=args.out, overrides=args.set, quiet=not _is_main_process())
        else:
            run(args.recipe, out=args.out, overrides=args.set, resume=args.resume, quiet=not _is_main_process())
    except RecipeError as err:
        return _error(str(err), EXIT_USAGE)
    except RunError as err:
        return _error(str(err), EXIT_FAILED)
    except OSError as err:
        return _error(_os_error_sentence(err, args.out), EXIT_FAILED)
    except KeyboardInterrupt:
        return _error("interrupted; the run directory keeps every finished stage (status \"interrupted\"), and "
                      "`headprobe run RECIPE --resume --out RUN_DIR` continues it.", EXIT_INTERRUPTED)
    return EXIT_OK


def _warn_about_launch() -> None:
    """One warning line when a launcher asked for several processes and this one sees fewer (`launch_check`)."""
    from .distributed import process_state
    from .launch_check import warn_if_fewer_processes

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
    import math

    from rich.markup import escape

    from .recipe import RecipeError, load_recipe

    try:
        recipe = load_recipe(args.recipe, args.set)
    except RecipeError as err:
        return _error(str(err), EXIT_USAGE)
    probes = ", ".join(recipe.probes)
    # load_recipe has validated every combination of the sweep, as `run` will make them.
    runs = f"; sweep: {math.prod(len(v) for v in recipe.sweep.values())} runs" if recipe.sweep else ""
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
            table.add_row(f"[bold]{escape(entry.usage)}[/]", escape(entry.help))
        console.print(table)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from .report.html import write_report
    from .report.table import print_summary
    from .runs import read_results

    try:
        results = read_results(args.run_dir)
    except (FileNotFoundError, ValueError) as err:
        return _error(str(err), EXIT_USAGE)
    console = _console()
    print_summary(results, Path(args.run_dir), console=console)
    try:
        path = write_report(args.run_dir)
    except OSError as err:
        return _error(f"could not write the report into {args.run_dir}: {err}", EXIT_FAILED)
    console.print(f"report: {path} (figures in {path.parent / 'plots'})", markup=False)
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from .report.compare import default_out_dir, run_labels, write_compare
    from .report.table import compare_table
    from .runs import read_results

    try:
        labels = run_labels(args.run_dirs)
        runs = {label: read_results(path) for label, path in labels.items()}
    except (FileNotFoundError, ValueError) as err:
        return _error(str(err), EXIT_USAGE)
    console = _console()
    out = Path(args.out) if args.out else default_out_dir(args.run_dirs)
    # Said first: without --out the files go next to the runs, not necessarily into the current directory.
    console.print(f"writing compare.csv and compare.html into {out}", markup=False, soft_wrap=True)
    console.print(compare_table(runs))
    try:
        written = write_compare(list(labels.values()), out)
    except OSError as err:
        return _error(f"could not write the comparison into {out}: {err}", EXIT_FAILED)
    except ValueError as err:  # runs that cannot be paired across (cross_run.compare_sweep)
        return _error(str(err), EXIT_USAGE)
    if "cross_run" in written:
        import json

        from .cross_run import answer_lines

        for line in answer_lines(json.loads(written["cross_run"].read_text())):
            console.print(line, markup=False, soft_wrap=True)
    console.print(f"comparison: {', '.join(str(p) for p in written.values())}", markup=False)
    return EXIT_OK


def cmd_geometry(args: argparse.Namespace) -> int:
    from .analyse import analyse_run
    from .pipeline import RunError

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
    p = sub.add_parser("run", help="run a recipe end to end")
    p.add_argument("recipe")
    p.add_argument("--set", **overrides)
    p.add_argument("--out", help="run directory (default runs/<recipe name>-<timestamp>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out, keeping finished probes")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("validate", help="check a recipe without loading any model")
    p.add_argument("recipe")
    p.add_argument("--set", **overrides)
    p.set_defaults(fn=cmd_validate)

    p = sub.add_parser("list", help="registered names per family")
    p.add_argument("family", nargs="?")
    p.set_defaults(fn=cmd_list)

    p = sub.add_parser("report", help="print a run's summary and rebuild its report.html and plots/")
    p.add_argument("run_dir")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("geometry", help="evaluate the heads' geometry of a finished run, without retraining")
    p.add_argument("run_dir")
    p.add_argument("--rows", type=int, default=None, help="training samples to evaluate on (default: the recipe's)")
    p.set_defaults(fn=cmd_geometry)

    p = sub.add_parser("compare", help="side-by-side table of several runs (terminal, compare.csv, compare.html)")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--out", help="folder for compare.csv and compare.html (default: the deepest folder holding "
                                 "all the runs)")
    p.set_defaults(fn=cmd_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
