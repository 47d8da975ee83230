"""H = 5 heads trained in one `train_heads` loop against 5 separate single-head runs on the same cached views.

Synthetic cached views (N images x K views x D; only head training is measured, and its cost does not depend on
the feature values). Two comparisons:

1. in one process: `train_heads` with all 5 heads against `train_heads` called 5 times with one head each;
2. as a user really runs them: `headprobe run` on a recipe with all 5 heads against `headprobe run` on 5 recipes
   with one head each (offline DINOv2 ViT-S/14 on sklearn digits, the same probes, the view cache already
   warm, so no run extracts). Each separate run pays again what one run shares: start-up, loading the
   backbone, reading the cache, probing the backbone's tap, and writing results and the report;
3. the same with a bare worker per run instead of the CLI (start-up, backbone load, cache read and training
   only), to show how much of the saving is the per-run fixed cost.

Also recorded: the per-step cost of `batch_for_step` for large N, next to a 5-head training step.

    python benchmarks/bench_multihead.py [--quick]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from _common import Report, interleaved, parse_args, timed, worker_code

TARGET = 3.0
HEADS = 5
SEED = 0


def head_specs() -> list:
    from headprobe.recipe import HeadSpec

    return [HeadSpec(name="relu_bn", act="relu", width=512, out_dim=256),
            HeadSpec(name="swish", act="swish", width=512, out_dim=256, bn_hidden=False),
            HeadSpec(name="gelu_bn", act="gelu", width=512, out_dim=256),
            HeadSpec(name="tanh", act="tanh", width=512, out_dim=256, bn_hidden=False),
            HeadSpec(name="linear", type="linear", width=512, out_dim=256)]


def training(epochs: int) -> object:
    from headprobe.recipe import TrainSpec

    return TrainSpec(epochs=epochs, batch_size=256, lr=1e-3, log_every=10)


def make_views(n: int, k: int, d: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED)
    return torch.randn(n, 1, d, generator=g) + 0.3 * torch.randn(n, k, d, generator=g)


def train(views: torch.Tensor, names: list[str], epochs: int) -> tuple[dict, dict]:
    from headprobe.train.cached_views import train_heads

    specs = [s for s in head_specs() if s.name in names]
    return train_heads(specs, views, objective_name="vicreg", objective_options={}, train=training(epochs),
                       seed=SEED)


def run_worker(views_path: str, names: list[str], epochs: int) -> None:
    """One separate run: what a `headprobe run` with a warm view cache does before and while training."""
    from safetensors.torch import load_file

    from headprobe.backbones import load_backbone

    load_backbone("offline:dinov2-vits14", resolution=112)
    train(load_file(views_path)["features"], names, epochs)


def separate_process(views_path: Path, names: list[str], epochs: int) -> float:
    code = worker_code("bench_multihead", f"run_worker({str(views_path)!r}, {names!r}, {epochs})")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - start


def run_recipe(heads: list, epochs: int, quick: bool) -> dict:
    """A `headprobe run` recipe: offline DINOv2 on digits, 4 cached views, VICReg, the given heads."""
    fields = ("name", "type", "act", "width", "out_dim", "bn_hidden")
    return {
        "name": "bench-multihead",
        "seed": SEED,
        "backbone": {"id": "offline:dinov2-vits14", "pooling": "cls", "resolution": 56},
        "data": {"source": "sklearn-digits", "test_fraction": 0.25, "val_fraction": 0.2,
                 **({"limit": {"train": 400, "test": 100}} if quick else {})},
        "features": {"batch_size": 64},
        "probes": {"linear": {"C_grid": [0.001, 0.01, 0.1, 1.0]}, "knn": {"ks": [10, 20]}, "spectrum": {},
                   "invariance": {}},
        "heads": [{f: getattr(h, f) for f in fields} for h in heads],
        "objective": {"name": "vicreg"},
        "augment": {"preset": "simclr", "views": 4},
        "train": {"epochs": epochs, "batch_size": 256, "lr": 1e-3, "log_every": 10},
    }


def cli_run(recipe: Path, out: Path, env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "headprobe", "run", str(recipe), "--out", str(out)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"headprobe run {recipe} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def compare_runs(report: Report, epochs: int, repeats: int, quick: bool) -> None:
    """One 5-head `headprobe run` against 5 single-head runs, on a shared warm view cache."""
    heads = head_specs()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        env = {**os.environ, "HEADPROBE_CACHE": str(root / "cache")}
        recipes = {}
        for name, subset in [("all", heads)] + [(h.name, [h]) for h in heads]:
            recipes[name] = root / f"{name}.yaml"
            recipes[name].write_text(yaml.safe_dump(run_recipe(subset, epochs, quick), sort_keys=False))
        started = time.perf_counter()
        cli_run(recipes["all"], root / "warm", env)  # fills the view cache; not timed
        report.extra["cache_warm_up_s"] = round(time.perf_counter() - started, 1)
        counter = iter(range(10**6))

        def together() -> None:
            cli_run(recipes["all"], root / f"run{next(counter)}", env)

        def apart() -> None:
            for h in heads:
                cli_run(recipes[h.name], root / f"run{next(counter)}", env)

        times, _ = interleaved({"together": together, "apart": apart}, repeats)
        for name, run in (("five_head_run_stage_seconds", 0), ("single_head_run_stage_seconds", 1)):
            stages = json.loads((root / f"run{run}" / "results.json").read_text()).get("timing", {})
            report.extra[name] = {stage: round(seconds, 2) for stage, seconds in stages.items()}
    t_together = report.timing(f"headprobe run, one recipe with {HEADS} heads", times["together"])
    t_apart = report.timing(f"headprobe run x {HEADS}, one head each", times["apart"])
    ratio = t_apart / t_together
    report.check(f"{HEADS} heads in one `headprobe run` (warm view cache)", f"{HEADS} single-head `headprobe run`s",
                 f">= {TARGET:g}x faster in total", f"{ratio:.2f}x faster ({t_together:.1f} s vs {t_apart:.1f} s)",
                 ratio >= TARGET, ratio=ratio)


def step_overheads(views: torch.Tensor) -> dict:
    """ms per call of batch_for_step for growing N, and of one 5-head training step, for scale."""
    from headprobe.train.cached_views import batch_for_step

    out = {}
    for n in (10_000, 100_000, 1_000_000):
        seconds = [timed(lambda n=n, s=s: batch_for_step(s, n, 4, 256, SEED))[0] for s in range(5)]
        out[f"batch_for_step_ms_n{n}"] = round(1e3 * sorted(seconds)[2], 2)
    steps = len(views) // 256
    t, _ = timed(lambda: train(views, [s.name for s in head_specs()], 1))
    out["five_head_step_ms"] = round(1e3 * t / steps, 2)
    return out


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    n, k, d, epochs = (1_024, 4, 384, 2) if args.quick else (4_096, 4, 384, 5)
    report = Report("multihead", args, {"images": n, "views": k, "dim": d, "heads": HEADS, "epochs": epochs,
                                        "batch_size": 256, "objective": "vicreg", "head_width": 512, "out_dim": 256})
    views = make_views(n, k, d)
    names = [s.name for s in head_specs()]
    train(views[:512], names, 1)  # warm-up

    def separately() -> None:
        for name in names:
            train(views, [name], epochs)

    times, results = interleaved({"together": lambda: train(views, names, epochs), "separately": separately},
                                 args.repeats)
    t_together = report.timing(f"{HEADS} heads in one train_heads loop", times["together"])
    t_separate = report.timing(f"{HEADS} single-head train_heads calls", times["separately"])
    ratio = t_separate / t_together
    # Not the comparison (that is between runs, below): each head's forward and backward are its own
    # work, so in one process the shared loop can only be as fast as separate loops -- and must not be slower.
    report.check(f"{HEADS} heads in one loop, same cached views (in one process, training only)",
                 f"{HEADS} single-head train_heads calls", ">= 0.9x (no cost for sharing the loop)",
                 f"{ratio:.2f}x ({t_together:.1f} s vs {t_separate:.1f} s)", ratio >= 0.9, ratio=ratio)

    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "views.safetensors"
        save_file({"features": views.contiguous()}, str(path))
        together = [separate_process(path, names, epochs)]
        apart = [sum(separate_process(path, [name], epochs) for name in names)]
    t_proc_together = report.timing(f"one process training {HEADS} heads", together)
    t_proc_apart = report.timing(f"{HEADS} processes training one head each", apart)
    proc_ratio = t_proc_apart / t_proc_together
    # Diagnostic, not the comparison (that is the `headprobe run` one below): a worker that only starts,
    # loads the backbone, reads the cache and trains shows how much of a run's saving those alone make.
    report.extra["bare_worker_ratio"] = round(proc_ratio, 3)
    report.note(f"diagnostic: {HEADS} heads in one bare worker process (start-up + backbone load + cache read + "
                f"training, no probes or report) against {HEADS} such single-head processes: {proc_ratio:.2f}x "
                f"({t_proc_together:.1f} s vs {t_proc_apart:.1f} s).")
    compare_runs(report, epochs, 1 if args.quick else 2, args.quick)
    report.extra["loop_overheads"] = step_overheads(views)
    report.note("in one process the loop shares only the batch indexing between heads (each head still runs its own "
                "forward/backward), so the in-process ratio is near 1; the saving of one run is the per-run fixed "
                "cost, which separate processes pay 5 times.")
    report.note("the bare-worker rows are measured once (1 repeat); the `headprobe run` rows twice (once in --quick).")
    report.finish()


if __name__ == "__main__":
    main()
