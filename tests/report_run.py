"""Run directories for the report tests: a REAL small run (`real_run`: `pipeline.compose.run` on a scratch ViT,
two heads, curvature tracked) and a synthetic one (`results_dict`, `write_run`) for the fields a tiny run cannot
afford (final geometry, orbits, Hessian density), shaped like `headprobe run` output.

The synthetic training records hold what the engine writes: "train" records (loss, terms, collapse statistics,
optimisation) and separate "geometry" records (λ_min, λ_max, convergence) every few steps.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np

TAPS = ["backbone", "mlp@1", "mlp", "lin"]
HEADS = ["mlp", "lin"]


def _metrics(acc: float, rankme: float, align: float) -> dict:
    return {"linear.acc": acc, "linear.val_acc": acc - 0.01, "linear.C": 1.0, "knn.k20.acc": acc - 0.05,
            "rankme": rankme, "mi.infonce": 3.1 * acc, "mi.infonce.ceiling": math.log(256), "align": align}


def results_dict(rng: np.random.Generator | None = None) -> dict:
    rng = rng or np.random.default_rng(0)
    spectrum = (1.0 / np.arange(1, 65) ** 1.2).tolist()
    grid = np.linspace(-0.5, 4.0, 60)
    density = (np.exp(-((grid - 0.2) ** 2) / 0.02) + 0.05 * np.exp(-((grid - 3.0) ** 2) / 0.1) + 1e-6).tolist()
    points = {tap: (rng.normal(size=(5, 1, 8)) * 3 + rng.normal(size=(5, 6, 8)) * scale).reshape(30, 8).tolist()
              for tap, scale in (("backbone", 1.0), ("mlp", 0.3), ("lin", 0.6))}
    orbit_ids = np.repeat(np.arange(5), 6).tolist()
    metrics = {"backbone": _metrics(0.95, 180.0, 0.40), "mlp@1": _metrics(0.93, 120.0, 0.30),
               "mlp": _metrics(0.81, 40.0, 0.12), "lin": _metrics(0.94, 150.0, 0.33)}
    owner = {"backbone": (None, 0), "mlp@1": ("mlp", 1), "mlp": ("mlp", 2), "lin": ("lin", 1)}
    taps = {
        tap: {"head": owner[tap][0], "depth": owner[tap][1], "metrics": metrics[tap],
              "protocol": {"linear": {"C_grid": [0.1, 1.0, 10.0], "chosen_C": 1.0, "val_fraction": 0.2},
                           "spectrum": {"n_samples": 1000, "eigenvalues_top": [v * (1 + i) for v in spectrum]}}}
        for i, tap in enumerate(TAPS)
    }
    head_config = {"type": "mlp", "depth": 2, "width": 512, "out_dim": 128, "act": "swish"}
    return {
        "headprobe_version": "0.1.0",
        "schema_version": 3,
        "status": "complete",
        "recipe": {"name": "synthetic", "seed": 0, "backbone": {"id": "offline:dinov2-vits14", "pooling": "cls"},
                   "data": {"source": "sklearn-digits"}, "objective": {"name": "vicreg", "options": {}},
                   "heads": [{"name": "mlp", **head_config}, {"name": "lin", "type": "linear", "depth": 1}]},
        "backbone": {"id": "offline:dinov2-vits14", "dim": 384, "params": 22056192,
                     "preprocess": {"resize": 128, "crop": 112, "mean": [0.485, 0.456, 0.406]}},
        "data": {"source": "sklearn-digits", "n_train": 1347, "n_test": 450, "n_classes": 10,
                 "class_names": [str(i) for i in range(10)]},
        "taps": taps,
        "heads": {
            "mlp": {"config": {"name": "mlp", **head_config},
                    "train": {"steps": 40, "status": "complete", "final_loss": 21.5, "message": ""},
                    "geometry": {"lambda_min": -1.2e-7, "lambda_max": 3.4,
                                 "estimator": {"method": "lanczos", "residual": 2e-9, "k": 6},
                                 "hessian_density": {"grid": grid.tolist(), "density": density},
                                 "pullback_spectrum": (np.geomspace(10, 1e-4, 40)).tolist()}},
            "lin": {"config": {"name": "lin", "type": "linear", "depth": 1, "width": 256, "out_dim": None},
                    "train": {"steps": 40, "status": "complete", "final_loss": 24.0, "message": ""},
                    "geometry": {"lambda_max": 1.1, "pullback_spectrum": np.geomspace(2, 0.5, 40).tolist()}},
        },
        "buffer": {
            "mlp": {"verdict": "buffer", "tolerance": 0.01, "support": 2, "against": 0,
                    "evidence": {"linear.acc": {"backbone": 0.95, "head": 0.81, "margin": 0.14,
                                                "claim": "backbone keeps more"},
                                 "align": {"backbone": 0.40, "head": 0.12, "margin": 0.28,
                                           "claim": "head more invariant"}}},
            "lin": {"verdict": "mixed", "tolerance": 0.01, "support": 1, "against": 1,
                    "evidence": {"linear.acc": {"backbone": 0.95, "head": 0.94, "margin": 0.01,
                                                "claim": "backbone keeps more"},
                                 "align": {"backbone": 0.40, "head": 0.43, "margin": -0.03,
                                           "claim": "head more invariant"}}},
        },
        "protocol": {"features": {"pooling": "cls", "precision": "fp32"},
                     "train": {"epochs": 2, "batch_size": 64, "lr": 0.001, "objective": "vicreg"}},
        "orbits": {tap: {"points": pts, "orbit": orbit_ids} for tap, pts in points.items()},
        "timing": {"load_s": 7.4, "extract_s": 100.9, "train_s": 30.2, "probe_s": 12.5},
        "environment": {"python": "3.11.7", "torch": "2.5.0", "device": "cpu", "num_processes": 1},
    }


def train_records(steps: int = 40, every: int = 4) -> list[dict]:
    records = []
    for step in range(every, steps + 1, every):
        for k, head in enumerate(HEADS):
            loss = 24.0 * (1 + k * 0.1) * math.exp(-step / 80)
            record = {"time": 1.0e9 + step, "stage": "train", "head": head, "step": step, "epoch": step // 20,
                      "loss": loss, "vicreg": loss, "vicreg.sim": 0.3 / step, "vicreg.var": 0.9 - step / 100,
                      "vicreg.cov": 0.01 * step, "out_std": 0.08 - 0.01 * k, "rankme": 60.0 - step * (1 + k) / 2,
                      "grad_norm": 5.0 / step ** 0.5, "lr": 1e-3 * math.cos(step / steps), "rel_update": 1e-3}
            records.append(record)
            if step % 8 == 0:  # what `engine.track_curvature` logs: its own record, stage "geometry"
                records.append({"time": 1.0e9 + step, "stage": "geometry", "head": head, "step": step,
                                "epoch": step // 20, "lambda_min": -1e-6 / step, "lambda_max": 3.0 + step / 40,
                                "converged": step != 16, "lambda_min_converged": step != 16,
                                "lambda_max_converged": True, "out_std": 0.08, "rankme": 50.0})
    return records


# A real run small enough for a test: a scratch ViT on 120/60 digits, an MLP head and a linear head, two epochs,
# curvature tracked every 2 steps, the probes that need no rotated copies or orbit sweeps (those take seconds more).
REAL_RECIPE = {
    "name": "report-real", "backbone": {"id": "scratch:vit-tiny", "pooling": "cls"},
    "data": {"source": "sklearn-digits", "limit": {"train": 120, "test": 60}},
    "features": {"batch_size": 60},
    "probes": {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5]}, "spectrum": {}, "invariance": {},
               "view_mi": {}},
    "heads": [{"name": "mlp", "width": 16, "depth": 2}, {"name": "lin", "type": "linear", "depth": 1, "width": 16}],
    "augment": {"preset": "crop-flip", "views": 2},
    "train": {"epochs": 2, "batch_size": 40, "log_every": 1},
    "geometry": {"track_every": 2, "track_rows": 8, "track_max_iter": 6, "track_stat_rows": 32, "track_split": False},
    "report": False,
}


def real_run(path: Path, **overrides) -> tuple[Path, str]:
    """Run REAL_RECIPE into `path` with `pipeline.compose.run`, as `headprobe run` does (not quiet); returns the
    run directory and what the run printed (stdout and stderr)."""
    import contextlib
    import io

    from headprobe.pipeline.compose import run

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        out = run(REAL_RECIPE, out=path, quiet=False, **overrides).path
    return out, printed.getvalue()


def write_run(path: Path, results: dict | None = None, records: list[dict] | None = None,
              torn_line: bool = False) -> Path:
    """Write results.json and metrics.jsonl (probe records first, then training) into `path`."""
    path.mkdir(parents=True, exist_ok=True)
    results = copy.deepcopy(results) if results is not None else results_dict()
    (path / "results.json").write_text(json.dumps(results, indent=2))
    probe = [{"stage": "probe", "tap": t, "probe": "linear", **{k: v for k, v in tap["metrics"].items()
                                                                 if k.startswith("linear")}}
             for t, tap in results.get("taps", {}).items()]
    lines = [json.dumps(r) for r in probe + (train_records() if records is None else records)]
    text = "\n".join(lines) + "\n" + ('{"stage": "train", "head": "mlp", "st' if torn_line else "")
    (path / "metrics.jsonl").write_text(text)
    return path
