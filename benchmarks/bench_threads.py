"""Intra-op threads: headprobe's default (`headprobe.parallel.threads`) against 1 thread and every usable CPU,
on the machine as it is and under an artificial load (busy processes, one per CPU and as many again).

The work, timed in a fresh process per setting (OpenMP reads its wait policy when torch loads): 10 training steps of
a 512-wide MLP head on cached views (VICReg, batch 256) and one linear probe (2 values of C) on 1,000 × 384
features. Settings: "1 thread" and "N threads" (N = the usable CPUs) with the libraries' own OpenMP wait policy,
as a plain `python -m headprobe` run had them before; "default" is what `headprobe run` now does: the count from
`choose_threads` (the usable CPUs shared among the node's local processes; the load of the moment does not change it,
so the same seed gives the same numbers however busy the machine is) with ``OMP_WAIT_POLICY=PASSIVE``.
Targets: the default within 10% of the best setting on the quiet machine; not slower than 1 thread (10% noise)
under load.

    python benchmarks/bench_threads.py [--quick]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from _common import BENCHMARKS, Report, parse_args

STEPS, N_VIEWS, DIM, WIDTH = 10, 1_000, 384, 512
# Each setting chooses its own threads: --threads (and `make bench`'s) is taken out of the workers' environment.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY",
                    "HEADPROBE_THREADS")


def work() -> None:
    """The timed piece (in a worker process): 10 training steps + one linear probe; prints the seconds as JSON."""
    import torch

    from headprobe.probes.linear import linear_probe
    from headprobe.recipe import HeadSpec, TrainSpec
    from headprobe.train.cached_views import train_heads

    g = torch.Generator().manual_seed(0)
    views = torch.randn(N_VIEWS, 1, DIM, generator=g) + 0.3 * torch.randn(N_VIEWS, 4, DIM, generator=g)
    labels = torch.randint(10, (N_VIEWS,), generator=g)
    x = views[:, 0] + labels[:, None].float()
    spec = HeadSpec(name="mlp", act="relu", width=WIDTH, out_dim=256)
    start = time.perf_counter()
    train_heads([spec], views, objective_name="vicreg", objective_options={},
                train=TrainSpec(steps=STEPS, batch_size=256, lr=1e-3, log_every=5), seed=0)
    trained = time.perf_counter()
    linear_probe(x[:750], labels[:750], x[750:], labels[750:], C_grid=[0.1, 1.0])
    done = time.perf_counter()
    print(json.dumps({"train_s": trained - start, "probe_s": done - trained, "threads": torch.get_num_threads()}))


def setting_env(name: str, cpus: int) -> dict:
    """The environment of one setting's worker. The default picks its own count (`choose_threads`)."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    if name == "default":
        return env | {"BENCH_THREADS_DEFAULT": "1"}
    return env | {"OMP_NUM_THREADS": "1" if name == "1 thread" else str(cpus)}


WORKER = f"""
import os, sys
sys.path.insert(0, {str(BENCHMARKS)!r})
if os.environ.pop("BENCH_THREADS_DEFAULT", None):
    from headprobe.parallel.threads import apply_threads, choose_threads, prefer_passive_waiting
    prefer_passive_waiting()
    apply_threads(choose_threads(None))
import bench_threads
bench_threads.work()
"""


def run_setting(name: str, cpus: int) -> dict:
    done = subprocess.run([sys.executable, "-c", WORKER], env=setting_env(name, cpus), capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {name!r} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(report: Report, condition: str, cpus: int, repeats: int) -> dict[str, float]:
    """Every setting `repeats` times, alternating; records train + probe seconds per setting."""
    settings = ["1 thread", f"{cpus} threads", "default"]
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    load = os.getloadavg()[0]
    for _ in range(repeats):
        for name in settings:
            runs[name].append(run_setting(name, cpus))
    medians = {}
    for name in settings:
        totals = [r["train_s"] + r["probe_s"] for r in runs[name]]
        medians[name] = report.timing(f"{condition}: {name}", totals, threads=runs[name][-1]["threads"],
                                      train_s=[round(r["train_s"], 3) for r in runs[name]],
                                      probe_s=[round(r["probe_s"], 3) for r in runs[name]],
                                      load_1min_before=round(load, 2))
    return medians


def busy_processes(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def wait_for_load(target: float, limit_s: float) -> float:
    """Wait until the 1-minute load average reaches `target` (it follows a new load over about a minute)."""
    deadline = time.monotonic() + limit_s
    while os.getloadavg()[0] < target and time.monotonic() < deadline:
        time.sleep(2)
    return os.getloadavg()[0]


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], repeats=3, quick_repeats=1)
    from headprobe.parallel.threads import usable_cpus

    cpus, where = usable_cpus()
    report = Report("threads", args, {"steps": STEPS, "views": [N_VIEWS, 4, DIM], "head_width": WIDTH,
                                      "linear_probe": [750, 250, DIM], "usable_cpus": cpus, "found": where})
    quiet = measure(report, "as is", cpus, args.repeats)
    n_busy = 2 * cpus
    busy = busy_processes(n_busy)
    try:
        reached = wait_for_load(n_busy * 0.8, 20 if args.quick else 120)
        report.note(f"under load: {n_busy} busy processes on {cpus} CPUs; 1-minute load {reached:.1f} when timing "
                    "began")
        loaded = measure(report, "loaded", cpus, args.repeats)
    finally:
        for job in busy:
            job.kill()
            job.wait()
    best = min(quiet.values())
    report.check("default threads, machine as is", "the best setting", "<= 1.10x",
                 f"{quiet['default'] / best:.2f}x ({quiet['default']:.2f} s vs {best:.2f} s)",
                 quiet["default"] <= 1.10 * best, ratio=quiet["default"] / best)
    report.check("default threads, under load", "1 thread", "<= 1.10x",
                 f"{loaded['default'] / loaded['1 thread']:.2f}x ({loaded['default']:.2f} s vs "
                 f"{loaded['1 thread']:.2f} s)", loaded["default"] <= 1.10 * loaded["1 thread"],
                 ratio=loaded["default"] / loaded["1 thread"])
    report.extra["medians_s"] = {"as is": quiet, "loaded": loaded}
    report.finish()


if __name__ == "__main__":
    main()
