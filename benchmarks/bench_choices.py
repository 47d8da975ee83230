"""The measurements behind implementation choices that headprobe's code names in its comments and docstrings.

A comment says why the code is written as it is and points here ("`benchmarks/results/choices.json`, `NAME`");
the numbers live in the result file, each under its name, with the machine and its load. Every choice is timed
alternately against the alternative the code turned down (the millisecond kernels 5 × `--repeats` times), in one
thread unless `--threads` says otherwise:

- `logistic_layout` (`probes/logistic.py`): the linear probe's two products per evaluation in the solver's layout,
  logits Wᵀxᵀ and weight gradient gᵀx, against x W and xᵀg.
- `logistic_one_hot` (`probes/logistic.py`): the log-likelihood and the gradient p − target from one-hot targets
  (element-wise) against indexing the probabilities by (label, row).
- `logistic_blocks` (`probes/logistic.py`): both products over row blocks of 1, 4 (the code's) and 64 MiB.
- `logistic_eigh` (`probes/logistic.py`): the dense eigendecomposition `feature_moments` does once per probe, at
  D = 1024 (its `max_dim`).
- `lbfgs_two_loop` (`probes/lbfgs.py`): one direction by the two-loop recursion over 100 curvature pairs (torch's
  `LBFGS`), against one evaluation of the linear probe's loss (the two products).
- `knn_calibration` (`probes/knn.py`): `product_seconds`, the one-time bfloat16-vs-float32 timing behind the k-NN
  prefilter's default.
- `knn_int16_bits` (`probes/knn_prefilter.py`): block maxima, and a top-k over them, of bfloat16 scores read as
  int16 bits, against the same over the bfloat16 values.
- `knn_blocked_topk` (`probes/knn_prefilter.py`): `topk` over long float32 rows against a contiguous
  max-reduction of the same rows, and against `blocked_topk`.
- `knn_candidates` (`probes/knn_prefilter.py`): the exact float32 search (`Float32TopK`) with k + k/4 candidates
  (its default) against 2k, and how many queries widened.
- `mapped_rows` (`features/tensor_file.py`): resident memory after reading random rows of a mapped file by
  indexing the mapping, against `gather_rows` (one `pread` per row).
- `offline_conversion` (`backbones/offline.py`): rebuilding DINOv2 ViT-S/14's state dict from the ONNX file.

    python benchmarks/bench_choices.py [--quick] [--threads N]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from _common import Report, interleaved, median, mib, parse_args, timed, worker_code


def logistic_products(report: Report, n: int, d: int, f: int, repeats: int) -> None:
    """Logits and weight gradient in the solver's layout (Wᵀ: (F, D)) against the textbook one (W: (D, F))."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    wt, grad = torch.randn(f, d, generator=g), torch.randn(f, n, generator=g)
    w, grad_t = wt.T.contiguous(), grad.T.contiguous()
    times, _ = interleaved({"Wt xt": lambda: wt @ x.T, "x W": lambda: x @ w,
                            "gt x": lambda: grad @ x, "xt g": lambda: x.T @ grad_t}, repeats)
    ours = [report.timing(f"logistic_layout: {name}", times[name]) for name in ("Wt xt", "gt x")]
    theirs = [report.timing(f"logistic_layout: {name}", times[name]) for name in ("x W", "xt g")]
    report.check(f"logistic_layout ({n} x {d} x {f})", "x W and xᵀg", "faster", f"{sum(ours) * 1e3:.1f} ms vs "
                 f"{sum(theirs) * 1e3:.1f} ms for both products", sum(ours) < sum(theirs))

    labels = torch.randint(0, f, (n,), generator=g)
    log_p = torch.randn(f, n, generator=g, dtype=torch.float64).log_softmax(dim=0)
    one_hot = torch.nn.functional.one_hot(labels, f).T.to(torch.float64)
    rows = torch.arange(n)

    def by_one_hot() -> torch.Tensor:  # the log-likelihood and the gradient p − target, as the evaluation forms them
        likelihood = (log_p * one_hot).sum()
        return likelihood, log_p.exp().sub_(one_hot)

    def by_index() -> torch.Tensor:
        likelihood = log_p[labels, rows].sum()
        return likelihood, log_p.exp().index_put_((labels, rows), torch.tensor(-1.0, dtype=torch.float64),
                                                  accumulate=True)

    times, results = interleaved({"one-hot": by_one_hot, "index": by_index}, repeats)
    a, b = report.timing("logistic_one_hot: one-hot", times["one-hot"]), report.timing(
        "logistic_one_hot: index", times["index"])
    report.check(f"logistic_one_hot ({n} x {f})", "indexing by (label, row)", "faster",
                 f"{a * 1e3:.2f} ms vs {b * 1e3:.2f} ms for the log-likelihood and p − target (same values: "
                 f"{all(torch.allclose(x, y) for x, y in zip(*results.values(), strict=True))})", a < b)


def logistic_blocks(report: Report, n: int, d: int, f: int, repeats: int) -> None:
    """Both products of one evaluation (logits, then gᵀx) over row blocks of 1, 4 and 64 MiB."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, d, generator=g)
    wt, bias = torch.randn(f, d, generator=g) * 0.01, torch.zeros(f)

    def evaluation(block_bytes: int) -> torch.Tensor:
        step = max(256, block_bytes // (d * x.element_size()))
        grad_w = torch.zeros(f, d)
        for start in range(0, n, step):
            block = x[start : start + step]
            p = torch.addmm(bias[:, None], wt, block.T).softmax(dim=0)
            grad_w.addmm_(p, block, alpha=1 / n)
        return grad_w

    sizes = {"1 MiB": 2**20, "4 MiB": 2**22, "64 MiB": 2**26}
    times, _ = interleaved({name: lambda size=size: evaluation(size) for name, size in sizes.items()}, repeats)
    medians = {name: report.timing(f"logistic_blocks: {name}", times[name]) for name in sizes}
    report.check(f"logistic_blocks ({n} x {d} x {f})", "1 and 64 MiB blocks", "4 MiB fastest",
                 ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in medians.items()),
                 medians["4 MiB"] <= min(medians.values()))
    report.extra.setdefault("choices", {})["evaluation_s"] = medians["4 MiB"]

    a = torch.randn(4 * 1024, 1024, generator=g)
    moments = a.T @ a / a.shape[0]
    seconds = report.timing("logistic_eigh: D = 1024", interleaved({"eigh": lambda: torch.linalg.eigh(moments)},
                                                                   repeats)[0]["eigh"])
    report.check("logistic_eigh (D = 1024)", "—", "recorded", f"{seconds:.3f} s", True)


def two_loop(report: Report, d: int, f: int, repeats: int, memory: int = 100) -> None:
    """One L-BFGS direction by torch's two-loop recursion over `memory` pairs of the probe's size."""
    size = (f - 1) * d + (f - 1)
    g = torch.Generator().manual_seed(2)
    s, y = torch.randn(memory, size, generator=g), torch.randn(memory, size, generator=g)
    y += s  # sᵀy > 0, as stored pairs have
    grad = torch.randn(size, generator=g)
    rho = 1 / (y * s).sum(dim=1)

    def direction() -> torch.Tensor:
        q, alphas = grad.neg(), []
        for i in range(memory - 1, -1, -1):
            alphas.append(float(s[i].dot(q)) * float(rho[i]))
            q.add_(y[i], alpha=-alphas[-1])
        r = q * float(s[-1].dot(y[-1]) / y[-1].dot(y[-1]))
        for i, alpha in zip(range(memory), reversed(alphas), strict=True):
            r.add_(s[i], alpha=alpha - float(y[i].dot(r)) * float(rho[i]))
        return r

    seconds = report.timing(f"lbfgs_two_loop: {memory} pairs", interleaved({"two loop": direction}, repeats)[0][
        "two loop"])
    evaluation = report.extra["choices"]["evaluation_s"]
    report.check(f"lbfgs_two_loop ({memory} pairs of {size})", "one loss evaluation (the two products)", "recorded",
                 f"{seconds * 1e3:.2f} ms per direction, {seconds / evaluation:.2f} of an evaluation "
                 f"({evaluation * 1e3:.1f} ms)", True, fraction=seconds / evaluation)


def knn_kernels(report: Report, queries: int, n: int, k: int, repeats: int) -> None:
    from headprobe.probes.knn import product_seconds
    from headprobe.probes.knn_prefilter import TOPK_BLOCK, blocked_topk

    seconds, _ = timed(lambda: product_seconds.__wrapped__(384, torch.get_num_threads()))
    report.timing("knn_calibration: product_seconds(384)", [seconds])
    report.check("knn_calibration (D = 384)", "—", "recorded", f"{seconds:.3f} s once per process", True)

    g = torch.Generator().manual_seed(3)
    scores = torch.rand(queries, n, generator=g).bfloat16()
    bits = scores.view(torch.int16)
    full = n // TOPK_BLOCK * TOPK_BLOCK
    maxima = scores[:, :full].view(queries, -1, TOPK_BLOCK).amax(dim=2)
    maxima_bits = maxima.view(torch.int16)
    times, _ = interleaved({  # what `blocked_topk` does with them: block maxima, then a top-k over the maxima
        "max bf16": lambda: scores[:, :full].view(queries, -1, TOPK_BLOCK).amax(dim=2),
        "max int16": lambda: bits[:, :full].view(queries, -1, TOPK_BLOCK).amax(dim=2),
        "topk of maxima bf16": lambda: maxima.topk(k, dim=1),
        "topk of maxima int16": lambda: maxima_bits.topk(k, dim=1)}, repeats)
    med = {name: report.timing(f"knn_int16_bits: {name}", t) for name, t in times.items()}
    report.check(f"knn_int16_bits ({queries} x {n})", "the same over bfloat16 values", "block maxima faster",
                 f"block maxima {med['max bf16'] / med['max int16']:.1f}x, top-k of the maxima "
                 f"{med['topk of maxima bf16'] / med['topk of maxima int16']:.1f}x",
                 med["max int16"] < med["max bf16"])

    floats = torch.rand(queries, n, generator=g)
    times, _ = interleaved({"topk": lambda: floats.topk(k, dim=1),
                            "max": lambda: floats[:, :full].view(queries, -1, TOPK_BLOCK).amax(dim=2),
                            "blocked_topk": lambda: blocked_topk(floats, k)}, repeats)
    med = {name: report.timing(f"knn_blocked_topk: {name}", t) for name, t in times.items()}
    report.check(f"knn_blocked_topk ({queries} x {n}, k = {k})", "torch.topk", "faster",
                 f"topk {med['topk'] * 1e3:.1f} ms = {med['topk'] / med['max']:.1f}x a max-reduction "
                 f"({med['max'] * 1e3:.1f} ms); blocked_topk {med['blocked_topk'] * 1e3:.1f} ms",
                 med["blocked_topk"] < med["topk"])


def knn_candidates(report: Report, n: int, queries: int, k: int, repeats: int) -> None:
    from headprobe.probes.knn_prefilter import Float32TopK, canonical_normalize

    g = torch.Generator().manual_seed(4)
    centres = torch.randn(10, 384, generator=g)
    bank = canonical_normalize(centres[torch.arange(n) % 10] + 2 * torch.randn(n, 384, generator=g))
    q = canonical_normalize(centres[torch.arange(queries) % 10] + 2 * torch.randn(queries, 384, generator=g))
    searches = {f"{c} candidates": Float32TopK(bank, k, candidates=c)
                for c in (Float32TopK.default_candidates(k), 2 * k)}
    times, results = interleaved({name: lambda s=s: s.topk(q) for name, s in searches.items()}, repeats)
    med = {name: report.timing(f"knn_candidates: {name}", t, widened=searches[name].stats["widened"])
           for name, t in times.items()}
    (ours, a), (theirs, b) = med.items()
    same = all(torch.equal(x, y) for x, y in zip(*results.values(), strict=True))
    report.check(f"knn_candidates (N = {n}, {queries} queries, k = {k})", theirs, "faster, same neighbours",
                 f"{a:.2f} s vs {b:.2f} s ({b / a:.2f}x; queries widened over all repeats: "
                 f"{searches[ours].stats['widened']} of {searches[ours].stats['queries']}; same: {same})",
                 a < b and same)


def mapped_rows_worker(path: str, rows: int, use_gather: bool) -> None:
    """In a fresh process: map the file, read `rows` random rows one way, print the bytes of the file's own
    mappings that are resident (`/proc/self/smaps`)."""
    from headprobe.features.tensor_file import gather_rows, map_tensors, read_header

    entries, _ = read_header(path)
    views = map_tensors(path, entries)["features"]
    idx = torch.randint(0, views.shape[0], (rows,), generator=torch.Generator().manual_seed(5))
    out = gather_rows(views, idx) if use_gather else views[idx]
    resident, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isalnum() and "-" in line.split()[0]:  # a mapping's header line: address range, ..., path
            inside = line.endswith(path)
        elif inside and line.startswith("Rss:"):
            resident += int(line.split()[1]) * 1024
    print(f"{resident} {float(out.sum())}")


def mapped_rows(report: Report, n: int, rows: int) -> None:
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "rows.safetensors")
        save_file({"features": torch.randn(n, 384, generator=torch.Generator().manual_seed(6))}, path)
        size = Path(path).stat().st_size
        resident = {}
        for name, flag in (("indexing the mapping", False), ("gather_rows", True)):
            code = worker_code("bench_choices", f"mapped_rows_worker({path!r}, {rows}, {flag})")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                 cwd=Path(__file__).parent).stdout.split()
            resident[name] = int(out[0])
    report.extra.setdefault("choices", {})["mapped_rows"] = {"file_bytes": size, "rows": rows,
                                                             "resident_file_bytes": resident}
    report.check(f"mapped_rows ({rows} random 1.5 KiB rows of a {mib(size):.0f} MiB file)", "indexing the mapping",
                 "fewer resident pages", f"gather_rows {mib(resident['gather_rows'])} MiB vs indexing "
                 f"{mib(resident['indexing the mapping'])} MiB of the file's mapping resident",
                 resident["gather_rows"] < resident["indexing the mapping"])


def offline_conversion(report: Report, repeats: int) -> None:
    from headprobe.backbones.offline import dinov2_vits14_state_dict, find_onnx

    try:
        path = find_onnx()
    except Exception as missing:  # noqa: BLE001 - the weights are an optional install
        report.note(f"offline_conversion skipped: {missing}")
        return
    seconds = [timed(lambda: dinov2_vits14_state_dict(path))[0] for _ in range(repeats + 1)]
    report.timing("offline_conversion: dinov2_vits14_state_dict, first call", seconds[:1])
    report.timing("offline_conversion: dinov2_vits14_state_dict", seconds[1:])
    report.check("offline_conversion (the 97 MB ONNX file)", "—", "recorded", f"{median(seconds[1:]):.2f} s "
                 f"({seconds[0]:.2f} s the first time in a process: importing onnx, reading the file)", True)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], repeats=5, quick_repeats=3)
    n, d, f = (2000, 256, 10) if args.quick else (8000, 768, 10)
    queries, bank, k = (64, 20_000, 20) if args.quick else (256, 50_000, 20)
    knn_n, knn_queries = (5_000, 500) if args.quick else (50_000, 2_000)
    map_rows, map_n = (1_024, 50_000) if args.quick else (5_120, 200_000)
    report = Report("choices", args, {"logistic": [n, d, f], "knn_scores": [queries, bank, k],
                                      "knn_search": [knn_n, knn_queries, k], "mapped_rows": [map_rows, map_n]})
    micro = 5 * args.repeats  # millisecond kernels: more repeats, so a busy core's stalls fall out of the median
    logistic_products(report, n, d, f, micro)
    logistic_blocks(report, n, d, f, micro)
    two_loop(report, d, f, micro)
    knn_kernels(report, queries, bank, k, micro)
    knn_candidates(report, knn_n, knn_queries, k, args.repeats)
    mapped_rows(report, map_n, map_rows)
    offline_conversion(report, args.repeats)
    report.note("Each comment in headprobe/ that gives one of these numbers names its entry here; the numbers move "
                "with the CPU and its load (machine.load_average_*), the choices rarely do.")
    report.finish()


if __name__ == "__main__":
    main()
