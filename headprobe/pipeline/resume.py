"""`headprobe run --resume --out DIR` without a recipe: the run in DIR continues from the recipe it recorded
(DIR/config.yaml, as resolved when it started: overrides included), and a sweep's folder (runs in sub-folders, each
with its config.yaml) continues every run in it that is not complete, then compares them all again as the sweep
did (`compose.compare_sweep_runs`).

>>> resume_folder("runs/intr")  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

from headprobe.recipe import RecipeError

CONFIG = "config.yaml"


def sweep_runs(folder: Path) -> list[Path]:
    """The run folders directly inside `folder` (those holding a config.yaml), by name."""
    return sorted(p for p in folder.iterdir() if p.is_dir() and (p / CONFIG).is_file()) if folder.is_dir() else []


def resume_folder(out: str | Path, quiet: bool = False) -> list:
    """Continue the run in `out` from its config.yaml, or each unfinished run of the sweep in `out`; the `Results`
    of every run (a finished one is returned as it is). RecipeError where `out` holds neither."""
    from headprobe.pipeline.compose import compare_sweep_runs, run

    out = Path(out)
    if (out / CONFIG).is_file():
        return [run(out / CONFIG, out=out, resume=(out / "results.json").is_file(), quiet=quiet)]
    runs = sweep_runs(out)
    if not runs:
        where = "does not exist" if not out.exists() else f"holds no {CONFIG}, nor sub-folders with one (a sweep)"
        raise RecipeError(f"--resume --out {out}: {out} {where}; point --out at a run or sweep folder that "
                          "`headprobe run` wrote, or give the recipe: `headprobe run RECIPE --out DIR`.")
    results = [run(path / CONFIG, out=path, resume=(path / "results.json").is_file(), quiet=quiet) for path in runs]
    compare_sweep_runs(out, results, quiet)
    return results
