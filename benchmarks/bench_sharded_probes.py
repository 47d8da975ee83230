"""Probes shared across processes: the probe stage of one `headprobe run` under torchrun with 2 processes against 1.

The same recipe -- offline DINOv2 ViT-S/14 at 56 px on sklearn digits, two 2-layer heads; the linear (7 C values),
k-NN, spectrum and invariance probes on all 5 taps (with --quick: fewer images, 5 C values, no invariance) -- runs
with its feature and view caches already warm, so no run extracts; each run's own `timing.probe_s` (the main
process's wall clock over the probe stage, from when every process has reached it: every probe, the intervals and
the verdicts) is compared.
Configurations, alternated run by run: 1 process with 1 thread, 1 process with 2 threads (what a user runs without
torchrun), `torchrun --nproc_per_node 2` with 1 thread per process, and two independent 1-process runs side by side
(the most two processes can gain here: each probe runs slower when both cores are busy). The two-process run must
also give the same metrics, intervals and verdicts.

`--workload quickstart` measures the probe stage of `recipes/quickstart.yaml` instead (every probe it runs -- linear,
k-NN, spectrum, invariance, view MI, augment R², orbits -- on its 19 (tap, seed) units; 3 epochs instead of 30,
which changes the heads but not what probing them costs, and no report), written to
results/sharded_probes_quickstart.json.

    python benchmarks/bench_sharded_probes.py [--quick] [--repeats N] [--workload synthetic|quickstart]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import Report, parse_args

TARGET = 1.6
JOB = """
import json, sys
from headprobe import run
run(json.loads(sys.argv[1]), out=sys.argv[2], quiet=True)
"""


def recipe(quick: bool) -> dict:
    n_train, n_test = (600, 200) if quick else (1400, 397)
    probes = {"linear": {"C_grid": [0.001, 0.01, 0.1, 1.0, 10.0]}, "knn": {"ks": [10, 20]}, "spectrum": {}}
    if not quick:
        probes = {"linear": {"C_grid": [10.0**k for k in range(-3, 4)]}, "knn": {"ks": [10, 20, 100]},
                  "spectrum": {}, "invariance": {}}
    return {
        "name": "sharded_probes", "seed": 0,
        "backbone": {"id": "offline:dinov2-vits14", "pooling": "cls", "resolution": 56},
        "data": {"source": "sklearn-digits", "limit": {"train": n_train, "test": n_test}},
        "features": {"batch_size": 100},
        "heads": [{"name": "relu", "act": "relu", "width": 256}, {"name": "swish", "act": "swish", "width": 256}],
        "objective": {"name": "vicreg"},
        "augment": {"preset": "crop-flip", "views": 2},
        "train": {"epochs": 1, "batch_size": 200},
        "probes": probes,
        "report": False,
    }


def quickstart_recipe(quick: bool) -> dict:
    """recipes/quickstart.yaml as a run would resolve it, with 3 training epochs (2 and seeds [0, 1] with --quick)
    and no report: the probe stage as `make demo` runs it."""
    from headprobe.recipe import resolve_recipe_data

    overrides = ["report=false", "train.epochs=2", "seeds=[0,1]"] if quick else ["report=false", "train.epochs=3"]
    return resolve_recipe_data(Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml", overrides, None)


def probed_units(results: dict) -> int:
    """How many (tap, seed) units a run probed: a tap trained under several seeds counts each."""
    return sum(len(tap.get("seeds") or {}) or 1 for tap in results["taps"].values())


def launch(processes: int, threads: int, job: Path, spec: dict, out: Path, cache: Path) -> tuple[float, dict]:
    """One run; (its wall seconds, its results.json)."""
    torchrun = Path(sys.executable).parent / "torchrun"
    launcher = [sys.executable] if processes == 1 else [str(torchrun), "--nproc_per_node", str(processes)]
    env = {**os.environ, "HEADPROBE_CACHE": str(cache), "OMP_NUM_THREADS": str(threads),
           "OPENBLAS_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    done = subprocess.run([*launcher, str(job), json.dumps(spec), str(out)], env=env, capture_output=True,
                          text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the {processes}-process run failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start, json.loads((out / "results.json").read_text())


def launch_side_by_side(job: Path, spec: dict, outs: list[Path], cache: Path) -> list[float]:
    """Two independent 1-process, 1-thread runs at once; each one's probe_s. Against one run alone this measures
    what two cores give two processes on this machine (shared caches, memory bandwidth, a host's hyperthreads):
    2 × alone / side by side is the most any split of the work over 2 processes could gain."""
    env = {**os.environ, "HEADPROBE_CACHE": str(cache), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    jobs = [subprocess.Popen([sys.executable, str(job), json.dumps(spec), str(out)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for out in outs]
    for j in jobs:
        _, err = j.communicate(timeout=3600)
        if j.returncode != 0:
            raise RuntimeError(f"a side-by-side run failed:\n{err[-3000:]}")
    return [json.loads((out / "results.json").read_text())["timing"]["probe_s"] for out in outs]


def differences(one: dict, two: dict) -> list[str]:
    """Metrics, interval bounds and verdicts that differ between two runs (beyond 1e-9 relative)."""
    def close(a, b) -> bool:
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
        return a == b

    found = []
    for tap, values in one["taps"].items():
        for metric, value in values["metrics"].items():
            if not close(value, two["taps"][tap]["metrics"].get(metric)):
                found.append(f"{tap} {metric}: {value} vs {two['taps'][tap]['metrics'].get(metric)}")
        for metric, record in values["uncertainty"].items():
            other = two["taps"][tap]["uncertainty"][metric]["ci95"]
            if (record["ci95"] is None) != (other is None) or (
                    record["ci95"] is not None and not all(map(close, record["ci95"], other))):
                found.append(f"{tap} {metric} ci95: {record['ci95']} vs {other}")
    for head, verdict in one["buffer"].items():
        if verdict["verdict"] != two["buffer"][head]["verdict"]:
            found.append(f"{head} verdict: {verdict['verdict']} vs {two['buffer'][head]['verdict']}")
    return found


def main() -> None:
    def workload(parser) -> None:
        parser.add_argument("--workload", choices=("synthetic", "quickstart"), default="synthetic",
                            help="the recipe whose probe stage is timed (default: the small synthetic one)")

    args = parse_args(__doc__.splitlines()[0], extra=workload)
    if shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None:
        raise SystemExit("torchrun is not installed next to this Python; install torch into this environment.")
    quickstart = args.workload == "quickstart"
    spec = quickstart_recipe(args.quick) if quickstart else recipe(args.quick)
    name = "sharded_probes_quickstart" if quickstart else "sharded_probes"
    report = Report(name, args, {"recipe": spec, "workload": args.workload, "probes": list(spec["probes"])})
    configs = {"1 process, 1 thread": (1, 1), "1 process, 2 threads": (1, 2), "2 processes, 1 thread each": (2, 1)}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # Caches are keyed by everything that determines their content, so one kept between runs of this script
        # is safe, and spares the warm-up's extraction (minutes on 2 loaded cores).
        job, cache = tmp / "job.py", Path(tempfile.gettempdir()) / f"headprobe-bench-{name.replace('_', '-')}-cache"
        job.write_text(JOB)
        print("   warm-up run (fills the feature and view caches) ...", flush=True)
        launch(1, 2, job, spec, tmp / "warm-up", cache)
        probe_s: dict[str, list[float]] = {name: [] for name in configs}
        wall_s: dict[str, list[float]] = {name: [] for name in configs}
        results, side_by_side = {}, []
        for repeat in range(args.repeats):
            for name, (processes, threads) in configs.items():
                out = tmp / f"{processes}p{threads}t-{repeat}"
                wall, results[name] = launch(processes, threads, job, spec, out, cache)
                probe_s[name].append(results[name]["timing"]["probe_s"])
                wall_s[name].append(wall)
                print(f"   {name}: probe stage {probe_s[name][-1]:.1f} s (whole run {wall:.1f} s)", flush=True)
            pair = launch_side_by_side(job, spec, [tmp / f"pair-{repeat}-{i}" for i in range(2)], cache)
            side_by_side.append(sum(pair) / 2)
            print(f"   two 1-process runs side by side: probe stage {pair[0]:.1f} s and {pair[1]:.1f} s", flush=True)
    medians = {name: report.timing(f"probe stage, {name}", probe_s[name]) for name in configs}
    report.extra["whole_run_s"] = wall_s
    two = medians["2 processes, 1 thread each"]
    one_name = min(("1 process, 1 thread", "1 process, 2 threads"), key=lambda name: medians[name])
    ratio = medians[one_name] / two
    units = probed_units(results["1 process, 1 thread"])
    report.sizes["units"] = units
    report.check(f"probe stage, {units} (tap, seed) units x ({', '.join(spec['probes'])})",
                 f"the faster one-process run ({one_name})",
                 f">= {TARGET:g}x faster", f"{ratio:.2f}x faster", ratio >= TARGET, ratio=ratio,
                 ratio_vs_1_thread=medians["1 process, 1 thread"] / two,
                 ratio_vs_2_threads=medians["1 process, 2 threads"] / two)
    paired = report.timing("probe stage, each of two 1-process, 1-thread runs side by side", side_by_side)
    ceiling = 2 * medians["1 process, 1 thread"] / paired
    # A perfect split (half the probe work on each process, nothing else) would take paired / 2: each side-by-side
    # run does all the work at the speed a probe has while both cores are busy.
    best = {name: medians[name] / (paired / 2) for name in ("1 process, 1 thread", "1 process, 2 threads")}
    report.check("two independent 1-process runs side by side (the machine's ceiling for 2 processes)",
                 "one such run alone", "— (what two cores give two processes here)",
                 f"{ceiling:.2f}x the throughput of one; a perfect split would be {best[one_name]:.2f}x "
                 f"the {one_name} run", True, ratio=ceiling,
                 sharded_share_of_ceiling=(medians["1 process, 1 thread"] / two) / ceiling,
                 perfect_split_vs_1_thread=best["1 process, 1 thread"],
                 perfect_split_vs_2_threads=best["1 process, 2 threads"])
    found = differences(results["1 process, 1 thread"], results["2 processes, 1 thread each"])
    report.check("results of 2 processes", "1 process", "identical metrics, intervals and verdicts",
                 "identical" if not found else f"{len(found)} differ: {found[:3]}", not found)
    report.note("2 processes: a large bank's k-NN run by both over half the bank each, every other (tap, probe) to "
                "one process, longest first to the least loaded (pipeline.probe_sharing); each run's probe_s is "
                "the main process's wall clock over the probe stage, gathering included. The ratio is bounded by "
                "what two cores give two processes on this machine (the side-by-side check) and by the cores other "
                "jobs leave free (see load_average_start / _end).")
    report.finish()


if __name__ == "__main__":
    main()
