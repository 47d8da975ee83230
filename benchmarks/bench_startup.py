"""Start-up time of the light commands: `headprobe --help`, `list`, `validate`, `claims` and `report`, each a fresh
`python -m headprobe` process, timed to its first line of output and to its exit (target: exit within 1.5 s, and for
`report`, which then draws its figures, its summary within 1.5 s). With `--before REF`, the same commands from the
git revision REF (`git archive`, in a temporary folder), so the file holds the numbers before and after a change.

Also recorded: the load average (the machine may be shared), the CPU (lscpu's model name) and, per command, the
heavy libraries it imported (none is the point: torch alone takes 1.5-6 s to import, cold or under load).

    python benchmarks/bench_startup.py [--quick] [--before REF]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from _common import Report, parse_args

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 1.5
HEAVY = ("torch", "transformers", "accelerate", "sklearn", "timm", "open_clip", "datasets")
COMMANDS = {"--help": ["--help"], "list": ["list"], "validate": ["validate", "recipes/quickstart.yaml"],
            "claims": ["claims", "RUN"], "report": ["report", "RUN"]}
# `python -m headprobe ARGS`, then the heavy modules it imported, on stderr's last line.
CLI = "\n".join([
    "import json, sys", "from headprobe.cli import main", "try:", "    code = main(sys.argv[1:])",
    "except SystemExit as stop:", "    code = stop.code", "sys.stdout.flush()",
    f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)", "sys.exit(code or 0)"])


def write_run(path: Path) -> Path:
    """A small finished run with answers (one head), as `claims` and `report` read it."""
    from headprobe.stats.answers import claims_record
    from headprobe.stats.claims import answer_questions
    from headprobe.stats.measures import tap_measures

    metrics = {"backbone": {"linear.acc": 0.95, "rotation.acc": 0.80, "knn.k20.acc": 0.90, "linear.C": 1.0},
               "h": {"linear.acc": 0.94, "rotation.acc": 0.70, "knn.k20.acc": 0.91, "linear.C": 10.0}}
    taps = {tap: {"head": None if tap == "backbone" else "h", "depth": 0 if tap == "backbone" else 1,
                  "metrics": values} for tap, values in metrics.items()}
    results = {"status": "complete", "recipe": {"name": "startup", "heads": [{"name": "h", "type": "mlp"}]},
               "backbone": {"id": "scratch:vit-tiny"}, "data": {"source": "sklearn-digits"}, "taps": taps,
               "heads": {"h": {"train": {"steps": 10, "status": "complete"}}},
               "claims": claims_record(answer_questions(tap_measures(taps), {}, {"h": "h"}))}
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.json").write_text(json.dumps(results))
    (path / "metrics.jsonl").write_text("")
    return path


def time_command(tree: Path, argv: list[str]) -> tuple[float, float, list[str], str | None]:
    """(seconds to the first line of output, seconds to exit, heavy modules imported, the error's last line or
    None) of one command run from the source tree `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HEADPROBE_THREADS": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CLI, *argv], cwd=tree, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.readline()
    first = time.perf_counter() - start
    proc.stdout.read()
    err = proc.stderr.read().strip().splitlines() or [""]
    total = time.perf_counter() - start
    if proc.wait() != 0:
        return first, total, [], err[-1]
    return first, total, json.loads(err[-1]), None


def source_tree(ref: str, into: Path) -> Path:
    """The files of git revision `ref` of this repository, unpacked under `into`."""
    archive = into / "tree.tar"
    subprocess.run(["git", "archive", "--output", str(archive), ref], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                "unknown")


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], repeats=5, quick_repeats=1,
                      extra=lambda p: p.add_argument("--before", metavar="REF", default=None,
                                                     help="also time the commands of this git revision"))
    with tempfile.TemporaryDirectory() as tmp:
        run = write_run(Path(tmp) / "run")
        trees = {"now": ROOT}
        if args.before:
            trees[f"before ({args.before})"] = source_tree(args.before, Path(tmp))
        report = Report("startup", args, {"commands": {k: " ".join(v) for k, v in COMMANDS.items()},
                                          "target_first_output_s": TARGET_S})
        report.extra["lscpu_model"] = lscpu_model()
        report.extra["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        heavy: dict[str, dict[str, list[str]]] = {}
        for label, tree in trees.items():
            for name, argv in COMMANDS.items():
                argv = [str(run) if a == "RUN" else a for a in argv]
                firsts, totals = [], []
                for _ in range(args.repeats):
                    first, total, imported, error = time_command(tree, argv)
                    firsts.append(first)
                    totals.append(total)
                heavy.setdefault(label, {})[name] = imported
                median_first = report.timing(f"{label}: {name}, first output", firsts)
                median_exit = report.timing(f"{label}: {name}, exit", totals, heavy_imported=imported, error=error)
                if error:
                    report.note(f"{label}: `headprobe {' '.join(COMMANDS[name])}` failed: {error}")
                if label == "now":  # `report` is timed to its summary, every other command to its exit
                    seconds, until = (median_first, "first output") if name == "report" else (median_exit, "exit")
                    report.check(f"headprobe {name}: {until}", "the 1.5 s target", f"<= {TARGET_S} s",
                                 f"{seconds:.2f} s (imports {', '.join(imported) or 'no heavy library'})",
                                 seconds <= TARGET_S and not imported and not error)
        report.extra["heavy_imported"] = heavy
        report.note("`report` draws its figures with matplotlib after its first output (the summary); its exit "
                    "time is that drawing.")
        report.finish()


if __name__ == "__main__":
    main()
