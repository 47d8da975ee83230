"""One GPU script: extraction from image files, 5-head training, k-NN on a 1M bank, a 100k x 768 linear probe.

Each of headprobe's four heavy stages on one device, next to the plain code a user would otherwise run there:

1. extraction: offline DINOv2 ViT-S/14 in bfloat16 (autocast; fp32 on the CPU, as `features.extract` does) over
   an imagefolder of real PNG files written once (Fashion-MNIST; sklearn digits with --quick), decoded,
   preprocessed and batched by `features.extract` (workers chosen from the machine) -- against the bare backbone
   forward over pixel tensors made beforehand (the limit);
2. head training: `train.train_heads` with the 5 heads of bench_multihead (VICReg) on a cached view set on the
   device -- against a plain torch loop over the same heads, optimisers, objective and batches (no logging, NaN
   guard, schedule or checkpoints);
3. k-NN: `probes.knn` (k = 20, uniform vote) on a 1,000,000 x 384 bank -- against the textbook chunked
   `q @ bank.T`, `topk`, vote (predictions compared);
4. linear probe: `probes.linear_probe` over an 8-value C grid on N = 100,000, D = 768 (validation split,
   refit, test) -- against `torch.optim.LBFGS` (strong Wolfe) fitting the same objective from zero at every C of
   the same grid and protocol, to the same gradient tolerance.

    python benchmarks/bench_gpu.py [--device cuda|cpu] [--quick | --tiny]

Writes results/gpu.json on a GPU, results/gpu_script_cpu.json on the CPU (`.quick.json` with --quick); a CPU file
says in `ran_on_gpu` and its notes that the script has not run on a GPU. The full sizes are meant to finish in under
8 minutes on one GPU (a check row records the wall time); that has not been measured yet, as no GPU was available.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import torch
from _common import RESULTS, Report, interleaved, limit_threads, median, sync

SEED = 0
BACKBONE = "offline:dinov2-vits14"
K = 20
FULL = {"images": 2048, "image_source": "fashion-mnist", "resolution": 224, "extract_batch": 256,
        "view_images": 65536, "views": 4, "view_dim": 384, "head_batch": 1024, "head_epochs": 4,
        "bank": 1_000_000, "queries": 10_000, "knn_dim": 384, "linear_n": 100_000, "linear_test": 10_000,
        "linear_dim": 768}
QUICK = {"images": 48, "image_source": "sklearn-digits", "resolution": 56, "extract_batch": 16,
         "view_images": 1024, "views": 2, "view_dim": 384, "head_batch": 256, "head_epochs": 1,
         "bank": 20_000, "queries": 500, "knn_dim": 384, "linear_n": 2_000, "linear_test": 500, "linear_dim": 64}
# --tiny (tests/test_bench_gpu.py): the smallest sizes that still take every code path.
TINY = {"images": 16, "image_source": "sklearn-digits", "resolution": 28, "extract_batch": 8,
        "view_images": 256, "views": 2, "view_dim": 384, "head_batch": 128, "head_epochs": 1,
        "bank": 4096, "queries": 64, "knn_dim": 384, "linear_n": 400, "linear_test": 100, "linear_dim": 16}
# Targets: headprobe's pipeline costs at most 10% over the bare forward, its training loop at most 10% over a
# plain loop; its k-NN and linear probe are at least as fast as the plain torch code.
EXTRACT_TARGET, HEADS_TARGET, KNN_TARGET, LINEAR_TARGET = 0.9, 0.9, 1.0, 1.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where every stage and its baseline run (default: cuda when there is a GPU)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a check that the script runs")
    parser.add_argument("--tiny", action="store_true",
                        help="the smallest sizes (the test suite's); written like --quick, to <name>.quick.json")
    parser.add_argument("--image-source", default=None,
                        help="the data source whose images are written out as PNG files (default: fashion-mnist, "
                             "sklearn-digits with --quick/--tiny)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per method (median reported)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results JSON")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch and every BLAS/OpenMP pool (default: the libraries' own)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU, and torch.cuda.is_available() is False here; "
                     "run with --device cpu to check the script on the CPU.")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}.")
    args.scale = "tiny" if args.tiny else "quick" if args.quick else "full"
    args.quick = args.quick or args.tiny  # `Report` names the file <name>.quick.json: never the full numbers'
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be at least 1, got {args.threads}.")
        limit_threads(args.threads)
    return args


def process_state(device: torch.device):
    """Accelerate's state for this one process, on the CPU when asked (extraction takes its device from it)."""
    from accelerate import PartialState

    return PartialState(cpu=device.type == "cpu")


def write_imagefolder(root: Path, source: str, n: int) -> Path:
    """n training images of `source` (and a few test ones) as PNG files in root/{train,test}/<label>/."""
    from headprobe.data import load_data
    from headprobe.recipe import DataSpec, LimitSpec

    data = load_data(DataSpec(source=source, limit=LimitSpec(train=n, test=10)))
    for split, dataset in (("train", data.train), ("test", data.test)):
        for i, row in enumerate(dataset):
            folder = root / split / str(row["label"])
            folder.mkdir(parents=True, exist_ok=True)
            row["image"].convert("L").save(folder / f"{i:06d}.png")
    return root


def bench_extraction(report: Report, device: torch.device, sizes: dict, repeats: int) -> dict:
    from headprobe.backbones import load_backbone
    from headprobe.data import load_data
    from headprobe.data.loader import pipeline_record
    from headprobe.features.extract import effective_precision, extract
    from headprobe.recipe import DataSpec

    state = process_state(device)
    precision = effective_precision("bf16", device)
    batch = sizes["extract_batch"]
    with tempfile.TemporaryDirectory() as tmp:
        root = write_imagefolder(Path(tmp), sizes["image_source"], sizes["images"])
        data = load_data(DataSpec(source=f"imagefolder:{root}"))
        backbone = load_backbone(BACKBONE, resolution=sizes["resolution"]).to(device)
        pixels = torch.stack([backbone.preprocess(row["image"]) for row in data.train]).to(device)

        def from_files() -> torch.Tensor:
            return extract(backbone, data.train, data_info=data.info, split="train", batch_size=batch,
                           precision=precision, cache=False, num_workers=None, state=state).features

        @torch.inference_mode()
        def bare_forward() -> torch.Tensor:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                return torch.cat([backbone(pixels[s : s + batch]).float() for s in range(0, len(pixels), batch)])

        from_files()  # warm-up: worker start, kernels, allocator
        bare_forward()
        times, results = interleaved({"files": from_files, "bare": bare_forward}, repeats)
        n = len(pixels)
    t_files, t_bare = report.rate_check(
        f"extraction from files ({n} images, {sizes['resolution']} px, {precision}, {device.type})",
        "bare forward over pre-made tensors", EXTRACT_TARGET, ("extract from PNG files (headprobe)", times["files"]),
        ("bare backbone forward over pre-made tensors", times["bare"]), n, "images")
    difference = float((results["files"].to(device) - results["bare"]).abs().max())
    ratio = t_bare / t_files
    return {"extract_images_per_s": n / t_files, "bare_forward_images_per_s": n / t_bare, "extract_ratio": ratio,
            "extract_precision": precision, "extract_loader": pipeline_record(None, device),
            "extract_max_abs_difference": difference}


def bench_heads(report: Report, device: torch.device, sizes: dict, repeats: int) -> dict:
    from bench_multihead import head_specs, make_views

    from headprobe.recipe import TrainSpec
    from headprobe.registry import OBJECTIVES
    from headprobe.train.cached_views import batch_for_step, make_states, train_heads

    n, k, d, batch = sizes["view_images"], sizes["views"], sizes["view_dim"], sizes["head_batch"]
    views = make_views(n, k, d).to(device)
    train = TrainSpec(epochs=sizes["head_epochs"], batch_size=batch, lr=1e-3, log_every=50)
    steps = sizes["head_epochs"] * (n // batch)
    specs = head_specs()
    objective = OBJECTIVES.get("vicreg")

    def headprobe_loop() -> dict:
        return train_heads(specs, views, objective_name="vicreg", objective_options={}, train=train, seed=SEED,
                           device=device)[1]

    def plain_loop() -> None:
        states = make_states(specs, d, train, steps, SEED)
        modules = list(states.values())
        for state in modules:
            state.modules().to(device).train()
        for step in range(steps):
            idx, v1, v2 = batch_for_step(step, n, k, batch, SEED)
            z1, z2 = views[idx, v1], views[idx, v2]  # the same batches as train_heads (`batch_for_step`)
            for state in modules:
                loss = objective(state.head(z1), state.head(z2)).loss
                state.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                state.optimizer.step()
        sync()

    headprobe_loop()  # warm-up
    plain_loop()
    times, results = interleaved({"headprobe": headprobe_loop, "plain": plain_loop}, repeats)
    t_hp, t_plain = report.rate_check(
        f"{len(specs)}-head training on cached views ({n} x {k} x {d}, batch {batch}, {device.type})",
        "plain torch loop over the same heads and batches", HEADS_TARGET,
        (f"train_heads, {len(specs)} heads, {steps} steps", times["headprobe"]),
        (f"plain torch loop, {len(specs)} heads, {steps} steps", times["plain"]), steps, "steps")
    ratio = t_plain / t_hp
    return {"head_steps_per_s": steps / t_hp, "plain_head_steps_per_s": steps / t_plain, "heads_ratio": ratio,
            "head_steps": steps, "heads": len(specs), "head_names": [s.name for s in specs]}


def plain_knn(bank: torch.Tensor, labels: torch.Tensor, queries: torch.Tensor, classes: int,
              chunk: int = 256) -> torch.Tensor:
    """The textbook k-NN (DINO's `eval_knn`, uniform vote): normalise, chunked product, `topk`, vote."""
    bank = torch.nn.functional.normalize(bank, dim=1)
    out = []
    for s in range(0, len(queries), chunk):
        q = torch.nn.functional.normalize(queries[s : s + chunk], dim=1)
        neighbours = (q @ bank.T).topk(K, dim=1).indices
        votes = torch.zeros(len(q), classes, device=q.device).scatter_add_(
            1, labels[neighbours], torch.ones(len(q), K, device=q.device))
        out.append(votes.argmax(dim=1))
    return torch.cat(out).cpu()


def bench_knn(report: Report, device: torch.device, sizes: dict, repeats: int) -> dict:
    from bench_knn import CLASSES, make_data

    from headprobe.probes.knn import knn

    x, y, q, yq = (t.to(device) for t in make_data(sizes["bank"], sizes["queries"], sizes["knn_dim"]))
    m = len(q)

    def headprobe_knn():
        return knn(x, y, q, yq, ks=(K,), weighting="uniform", num_classes=CLASSES, device=device)

    def plain():
        return plain_knn(x, y, q, CLASSES)

    headprobe_knn()
    plain()
    times, results = interleaved({"headprobe": headprobe_knn, "plain": plain}, repeats)
    t_hp = report.timing(f"probes.knn, {sizes['bank']:,} x {sizes['knn_dim']} bank, {m:,} queries",
                         times["headprobe"], queries_per_s=m / median(times["headprobe"]))
    t_plain = report.timing("plain torch q @ bank.T, topk, vote", times["plain"],
                            queries_per_s=m / median(times["plain"]))
    agree = float((results["headprobe"].predictions[K] == results["plain"]).double().mean())
    ratio = t_plain / t_hp
    report.check(f"k-NN (k = {K}) on a {sizes['bank']:,} x {sizes['knn_dim']} bank ({device.type})",
                 "plain torch chunked product + topk + vote", f">= {KNN_TARGET:g}x",
                 f"{ratio:.2f}x ({m / t_hp:,.0f} vs {m / t_plain:,.0f} queries/s; predictions agree on "
                 f"{agree:.4f})", ratio >= KNN_TARGET, ratio=ratio)
    return {"knn_queries_per_s": m / t_hp, "plain_knn_queries_per_s": m / t_plain, "knn_ratio": ratio,
            "knn_prediction_agreement": agree, "knn_prefilter": results["headprobe"].protocol["prefilter"]}


def plain_lbfgs_probe(x: torch.Tensor, y: torch.Tensor, q: torch.Tensor, yq: torch.Tensor, grid, tol: float,
                      max_iter: int, val_fraction: float) -> dict:
    """The same protocol with `torch.optim.LBFGS` restarted from zero at every C: sklearn's objective (mean cross
    entropy + ||W||^2 / (2 C N)), stopping when the largest gradient entry is at most `tol`."""
    import numpy as np
    from sklearn.model_selection import train_test_split

    classes = int(y.max()) + 1
    fit_idx, val_idx = (torch.from_numpy(i).to(x.device) for i in train_test_split(
        np.arange(len(y)), test_size=val_fraction, stratify=y.cpu().numpy(), random_state=SEED))

    def fit(features, labels, c):
        W = torch.zeros(features.shape[1], classes, device=x.device, requires_grad=True)
        b = torch.zeros(classes, device=x.device, requires_grad=True)
        opt = torch.optim.LBFGS([W, b], max_iter=max_iter, tolerance_grad=tol, tolerance_change=0.0,
                                history_size=10, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(features @ W + b, labels) + W.square().sum() / (
                2 * c * len(labels))
            loss.backward()
            return loss

        opt.step(closure)
        return W.detach(), b.detach()

    def standardise(fitted, *others):
        std, mean = torch.std_mean(fitted, dim=0, correction=0)
        std = std.clamp_min(1e-12)
        return [(t - mean) / std for t in (fitted, *others)]

    x_fit, x_val = standardise(x[fit_idx], x[val_idx])
    val = []
    for c in grid:
        W, b = fit(x_fit, y[fit_idx], c)
        val.append(float(((x_val @ W + b).argmax(1) == y[val_idx]).double().mean()))
    best = grid[int(np.argmax(val))]  # the first maximum: ties to the smaller C
    x_all, x_test = standardise(x, q)
    W, b = fit(x_all, y, best)
    return {"acc": float(((x_test @ W + b).argmax(1) == yq).double().mean()), "C": best}


def bench_linear(report: Report, device: torch.device, sizes: dict, repeats: int) -> dict:
    from bench_linear import C_GRID, MAX_ITER, TOL, VAL_FRACTION, make_data

    from headprobe.probes.linear import linear_probe

    n, d = sizes["linear_n"], sizes["linear_dim"]
    x, y, q, yq = (t.to(device) for t in make_data(n, sizes["linear_test"], d))

    def headprobe_probe():
        out = linear_probe(x, y, q, yq, C_grid=C_GRID, val_fraction=VAL_FRACTION, seed=SEED, max_iter=MAX_ITER,
                           tol=TOL, device=device, whiten=False)  # the standardised protocol of the baseline
        return {"acc": out.metrics["linear.acc"], "C": out.metrics["linear.C"]}

    def plain():
        return plain_lbfgs_probe(x, y, q, yq, C_GRID, TOL, MAX_ITER, VAL_FRACTION)

    times, results = interleaved({"headprobe": headprobe_probe, "plain": plain}, repeats)
    t_hp = report.timing(f"probes.linear_probe, N = {n:,}, D = {d}, {len(C_GRID)} C values", times["headprobe"])
    t_plain = report.timing("torch.optim.LBFGS from zero at every C, same protocol", times["plain"])
    ratio = t_plain / t_hp
    hp, base = results["headprobe"], results["plain"]
    report.check(f"linear probe, N = {n:,}, D = {d}, {len(C_GRID)} C values ({device.type})",
                 "torch.optim.LBFGS (strong Wolfe) from zero at every C", f">= {LINEAR_TARGET:g}x",
                 f"{ratio:.2f}x ({t_hp:.2f} vs {t_plain:.2f} s; test accuracy {hp['acc']:.4f} vs {base['acc']:.4f}, "
                 f"C {hp['C']:g} vs {base['C']:g})", ratio >= LINEAR_TARGET, ratio=ratio)
    return {"linear_probe_s": t_hp, "plain_lbfgs_s": t_plain, "linear_ratio": ratio,
            "linear_test_accuracy": hp["acc"], "plain_lbfgs_test_accuracy": base["acc"],
            "linear_C": hp["C"], "plain_lbfgs_C": base["C"]}


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    sizes = dict({"full": FULL, "quick": QUICK, "tiny": TINY}[args.scale])
    if args.image_source is not None:
        sizes["image_source"] = args.image_source
    on_gpu = device.type == "cuda"
    report = Report("gpu" if on_gpu else "gpu_script_cpu", args,
                    sizes | {"scale": args.scale, "backbone": BACKBONE, "k": K, "device": str(device)})
    report.machine["device"] = str(device)  # the device asked for, not the default one
    derived = {}
    for stage in (bench_extraction, bench_heads, bench_knn, bench_linear):
        derived |= stage(report, device, sizes, args.repeats)
    report.extra["derived"] = {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v)
                               for k, v in derived.items()}
    report.extra["ran_on_gpu"] = on_gpu
    if args.scale == "full":
        wall = time.perf_counter() - report.started
        report.check(f"the whole script at full sizes ({device.type})", "the issue's budget", "< 480 s",
                     f"{wall:.0f} s", wall < 480, seconds=wall)
    if not on_gpu:
        report.note("NOT RUN ON A GPU: this file comes from `--device cpu` on a machine without one; it shows that "
                    "the script runs and what it records, not GPU numbers. Run `python benchmarks/bench_gpu.py` "
                    "on a GPU for results/gpu.json.")
    report.note("Baselines run on the same device as headprobe; the k-NN and linear data are synthetic (bench_knn "
                "and bench_linear's make_data), the views bench_multihead's.")
    report.finish()


if __name__ == "__main__":
    main()
