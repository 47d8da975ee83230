"""k-NN probe: headprobe `knn` against faiss-cpu `IndexFlatIP` and scikit-learn's brute-force cosine classifier.

Synthetic clustered features (only the probe is measured): N train, M queries, D dims, 10 classes, k = 20, the
unweighted vote (`weighting="uniform"`), which is what sklearn's classifier computes; the faiss baseline searches
an exact inner-product index of the L2-normalised bank and takes the same vote (ties to the smaller class). Checks:
speed, identical predictions, and peak memory for several chunk sizes (each measured in its own process).

headprobe is timed three ways: its default (`prefilter=None`, which on a CPU with native bfloat16 times one bfloat16
and one float32 product and keeps the prefilter only if bfloat16 is clearly faster; the choice and its reason are
recorded), the float32 product only (`prefilter=False`) and the certified bfloat16 prefilter forced on
(`prefilter=True`); all three must give the same predictions.

faiss-cpu's wheels bundle OpenBLAS 0.3.15, which does not know recent Intel CPUs and falls back to generic kernels
(about 5x slower on this machine's Xeon); as OpenBLAS documents for its dynamic-architecture builds,
OPENBLAS_CORETYPE names the kernels to use instead. It is set (SkylakeX on AVX-512 CPUs, Haswell on AVX2 ones) just
before faiss loads, after NumPy's own OpenBLAS, so that only faiss's is affected; a value already in the
environment is kept. The value is recorded in the results.

    python benchmarks/bench_knn.py [--quick]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from _common import (
    Report,
    device,
    interleaved,
    mib,
    parse_args,
    peak_rss_bytes,
    reset_peak_rss,
    rss_bytes,
    worker_code,
)

K = 20
CLASSES = 10
SPEED_TARGET = 5.0
FAISS_TARGET = 2.0


def make_data(n: int, m: int, d: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Gaussian classes around random centres, noisy enough that about a fifth of the queries are misclassified."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(CLASSES, d, generator=g)
    y = torch.randint(CLASSES, (n,), generator=g)
    yq = torch.randint(CLASSES, (m,), generator=g)
    x = 0.12 * centres[y] + torch.randn(n, d, generator=g)
    q = 0.12 * centres[yq] + torch.randn(m, d, generator=g)
    return x, y, q, yq


def headprobe_knn(x: torch.Tensor, y: torch.Tensor, q: torch.Tensor, yq: torch.Tensor, chunk_size: int = 256,
                  prefilter: bool | None = None):
    from headprobe.probes.knn import knn

    return knn(x, y, q, yq, ks=(K,), weighting="uniform", chunk_size=chunk_size, device=device(),
               prefilter=prefilter)


def bare_product(x: torch.Tensor, q: torch.Tensor, dtype: torch.dtype, chunk: int = 1024) -> None:
    """The similarity product alone, no top-k and no vote: the floor of any exact brute-force k-NN (faiss's flat index
    included). float32, or int8 (`torch._int_mm`, the VNNI path, with a per-row scale: the fastest low-precision
    product this CPU offers torch), each into one reused output block."""
    bank = torch.nn.functional.normalize(x, dim=1)
    if dtype == torch.int8:
        scale = 127 / bank.abs().amax(dim=1, keepdim=True)
        low = (bank * scale).round().to(torch.int8).T.contiguous()
        out = torch.empty(chunk, len(bank), dtype=torch.int32)
    else:
        low, out = bank.T, torch.empty(chunk, len(bank))
    for s in range(0, len(q), chunk):
        block = torch.nn.functional.normalize(q[s : s + chunk], dim=1)
        if dtype == torch.int8:
            block = (block * (127 / block.abs().amax(dim=1, keepdim=True))).round().to(torch.int8)
            torch._int_mm(block, low, out=out[: len(block)])
        else:
            torch.mm(block, low, out=out[: len(block)])


def sklearn_knn(x: torch.Tensor, y: torch.Tensor, q: torch.Tensor):
    from sklearn.neighbors import KNeighborsClassifier

    clf = KNeighborsClassifier(n_neighbors=K, algorithm="brute", metric="cosine")
    return clf.fit(x.numpy(), y.numpy()).predict(q.numpy())


def openblas_coretype() -> str | None:
    """The OPENBLAS_CORETYPE faiss's bundled OpenBLAS should use on this CPU: the environment's, else SkylakeX
    with AVX-512, Haswell with AVX2, else None (its own detection)."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return os.environ["OPENBLAS_CORETYPE"]
    capabilities = getattr(torch.cpu, "get_capabilities", dict)()
    if capabilities.get("avx512_f") and capabilities.get("avx512_bw"):
        return "SkylakeX"
    return "Haswell" if capabilities.get("avx2") else None


def faiss_knn(x: torch.Tensor, y: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What a user writes with faiss: an exact inner-product index of the normalised bank, then the k-NN vote."""
    coretype = openblas_coretype()
    if coretype is not None:
        os.environ["OPENBLAS_CORETYPE"] = coretype  # read once, when faiss's OpenBLAS loads
    import faiss

    bank, queries = x.numpy().astype("float32", copy=True), q.numpy().astype("float32", copy=True)
    faiss.normalize_L2(bank)
    faiss.normalize_L2(queries)
    index = faiss.IndexFlatIP(bank.shape[1])
    index.add(bank)
    _, neighbours = index.search(queries, K)
    votes = torch.zeros(len(queries), CLASSES).scatter_add_(1, y[torch.from_numpy(neighbours)],
                                                             torch.ones(len(queries), K))
    return votes.argmax(dim=1)  # the first of equal maxima: ties to the smaller class, as headprobe's vote


def explain_mismatches(x: torch.Tensor, y: torch.Tensor, q: torch.Tensor, mismatched: torch.Tensor) -> int:
    """How many disagreeing queries sit on a float32 tie: the k-th and (k+1)-th neighbour (float64 cosine) closer
    than float32 resolves, or two classes with the same number of votes among the k nearest."""
    xn = torch.nn.functional.normalize(x.double(), dim=1)
    explained = 0
    for i in mismatched.tolist():
        s = torch.nn.functional.normalize(q[i : i + 1].double(), dim=1) @ xn.T
        top = s.topk(K + 1, dim=1)
        near_tie = float(top.values[0, K - 1] - top.values[0, K]) < 1e-6
        votes = torch.bincount(y[top.indices[0, :K]], minlength=CLASSES)
        vote_tie = int((votes == votes.max()).sum()) > 1
        explained += near_tie or vote_tie
    return explained


def memory_worker(kind: str, chunk: int, n: int, m: int, d: int) -> None:
    """Run one k-NN in this fresh process and print its peak memory above the inputs as JSON."""
    x, y, q, yq = make_data(n, m, d)
    # A tiny run first, so that imports and thread pools are not counted as the probe's memory.
    if kind == "headprobe":
        headprobe_knn(x[:100], y[:100], q[:10], yq[:10])
    else:
        sklearn_knn(x[:100], y[:100], q[:10])
    dev = device()
    if dev.type == "cuda" and kind == "headprobe":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        headprobe_knn(x, y, q, yq, chunk)
        peak, counter = torch.cuda.max_memory_allocated() - base, "torch.cuda.max_memory_allocated"
    else:
        base = rss_bytes()
        counter = "peak RSS (VmHWM after resetting it via /proc/self/clear_refs)"
        if not reset_peak_rss():
            counter = "peak RSS (ru_maxrss; could not be reset, so it includes start-up)"
        if kind == "headprobe":
            headprobe_knn(x, y, q, yq, chunk)
        else:
            sklearn_knn(x, y, q)
        peak = peak_rss_bytes() - base
    print(json.dumps({"peak_bytes": peak, "counter": counter}))


def measure_memory(kind: str, chunk: int, n: int, m: int, d: int) -> dict:
    code = worker_code("bench_knn", f"memory_worker({kind!r}, {chunk}, {n}, {m}, {d})")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    n, m, d = (5_000, 1_000, 384) if args.quick else (50_000, 10_000, 384)
    chunks = [256, 1024, 4096]
    m_memory = max(chunks)
    report = Report("knn", args, {"n_train": n, "n_queries": m, "dim": d, "k": K, "classes": CLASSES,
                                  "weighting": "uniform", "chunk_size": 256, "memory_chunk_sizes": chunks,
                                  "memory_queries": m_memory})
    x, y, q, yq = make_data(n, m, d)
    headprobe_knn(x[:1000], y[:1000], q[:100], yq[:100])  # warm-up: imports, thread pools
    sklearn_knn(x[:1000], y[:1000], q[:100])
    faiss_knn(x[:1000], y[:1000], q[:100])
    times, results = interleaved({"headprobe": lambda: headprobe_knn(x, y, q, yq),
                                  "float32": lambda: headprobe_knn(x, y, q, yq, prefilter=False),
                                  "bf16": lambda: headprobe_knn(x, y, q, yq, prefilter=True),
                                  "faiss": lambda: faiss_knn(x, y, q),
                                  "sklearn": lambda: sklearn_knn(x, y, q),
                                  "product": lambda: bare_product(x, q, torch.float32),
                                  "int8": lambda: bare_product(x, q, torch.int8)}, args.repeats)
    choice = results["headprobe"].protocol["prefilter_choice"]
    t_hp = report.timing("headprobe knn", times["headprobe"], queries_per_s=m / min(times["headprobe"]),
                         prefilter_choice=choice)
    t_32 = report.timing("headprobe knn, float32 product only (prefilter=False)", times["float32"])
    t_16 = report.timing("headprobe knn, bfloat16 prefilter forced (prefilter=True)", times["bf16"])
    t_fa = report.timing("faiss IndexFlatIP + the same vote", times["faiss"])
    t_sk = report.timing("sklearn KNeighborsClassifier brute cosine", times["sklearn"])
    t_mm = report.timing("the float32 similarity product alone (chunks of 1024, no top-k, no vote)", times["product"])
    t_i8 = report.timing("an int8 similarity product alone (torch._int_mm, no top-k, no vote)", times["int8"])
    ratio = t_sk / t_hp
    report.check(f"k-NN (N={n:,}, D={d}, {m:,} queries, k={K})",
                 "sklearn KNeighborsClassifier(brute, cosine)", f">= {SPEED_TARGET:g}x faster",
                 f"{ratio:.2f}x faster", ratio >= SPEED_TARGET, ratio=ratio)
    import faiss

    report.extra["faiss"] = {"version": faiss.__version__, "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
                             "threads": faiss.omp_get_max_threads()}
    ratio = t_fa / t_hp
    report.check(f"k-NN (N={n:,}, D={d}, {m:,} queries, k={K})",
                 f"faiss-cpu {faiss.__version__} IndexFlatIP + the same vote "
                 f"(OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')})",
                 f">= {FAISS_TARGET:g}x faster", f"{ratio:.2f}x faster", ratio >= FAISS_TARGET, ratio=ratio)

    report.check("the floor of an exact brute-force k-NN: the similarity product alone",
                 f"faiss's whole search {t_fa:.2f} s", f"— (a {FAISS_TARGET:g}x target needs a product under "
                 f"{t_fa / FAISS_TARGET:.2f} s)", f"float32 {t_mm:.2f} s, int8 {t_i8:.2f} s ({t_fa / t_mm:.2f}x and "
                 f"{t_fa / t_i8:.2f}x faiss's time)", True, float32_product_s=t_mm, int8_product_s=t_i8)
    ours = results["headprobe"].predictions[K]
    float32_only = results["float32"].predictions[K]
    prefiltered = results["bf16"].predictions[K]
    report.check("k-NN default's choice of the prefilter", f"float32 only {t_32:.2f} s, prefilter {t_16:.2f} s",
                 "the faster of the two, within 15%", f"default {t_hp:.2f} s ({choice})",
                 t_hp <= 1.15 * min(t_32, t_16), float32_s=t_32, prefilter_s=t_16)
    for label, other in (("default", ours), ("bfloat16 prefilter", prefiltered)):
        report.check(f"k-NN predictions, {label}", "float32 product only", "identical",
                     f"{int((other == float32_only).sum()):,}/{m:,} identical", bool((other == float32_only).all()))
    theirs = torch.as_tensor(results["sklearn"])
    mismatched = (ours != theirs).nonzero().flatten()
    explained = explain_mismatches(x, y, q, mismatched) if len(mismatched) else 0
    report.check("k-NN predictions, unweighted vote", "sklearn predictions", "identical",
                 f"{m - len(mismatched):,}/{m:,} identical"
                 + (f" ({explained} of {len(mismatched)} differences at float32 ties)" if len(mismatched) else ""),
                 len(mismatched) == explained, mismatches=len(mismatched), explained_by_ties=explained,
                 accuracy=results["headprobe"].metrics[f"knn.k{K}.acc"])
    theirs = results["faiss"]
    mismatched = (ours != theirs).nonzero().flatten()
    explained = explain_mismatches(x, y, q, mismatched) if len(mismatched) else 0
    report.check("k-NN predictions, unweighted vote", "faiss predictions", "identical",
                 f"{m - len(mismatched):,}/{m:,} identical"
                 + (f" ({explained} of {len(mismatched)} differences at float32 ties)" if len(mismatched) else ""),
                 len(mismatched) == explained, mismatches=len(mismatched), explained_by_ties=explained)
    protocol = results["headprobe"].protocol
    report.extra["similarity"] = protocol["similarity"]
    report.extra["prefilter"] = protocol["prefilter"]
    report.extra["prefilter_choice"] = choice
    report.extra["prefilter_forced"] = stats = results["bf16"].protocol["prefilter"]
    report.note(f"default: {choice}; similarities: {protocol['similarity']}.")
    report.note(f"prefilter forced on: of {stats['queries']:,} queries, {stats['widened']} needed wider candidate "
                f"lists and {stats['full_float32']} a full float32 pass.")

    memory = {}
    for chunk in chunks:
        memory[chunk] = measure_memory("headprobe", chunk, n, m_memory, d)
        print(f"   peak memory, chunk {chunk}: {mib(memory[chunk]['peak_bytes'])} MiB", flush=True)
    sk_memory = measure_memory("sklearn", 0, n, m_memory, d)
    print(f"   peak memory, sklearn: {mib(sk_memory['peak_bytes'])} MiB", flush=True)
    # What the chunked loop must hold: the normalised bank (N x D, float32, plus its bfloat16 copy when the
    # prefilter runs) and one chunk's similarities (chunk x N); the bound allows a second chunk-sized float32
    # temporary and 64 MiB of allocator slack.
    bound = {c: 6 * n * d + 8 * c * n + 64 * 2**20 for c in chunks}
    within = all(memory[c]["peak_bytes"] <= bound[c] for c in chunks)
    report.extra["memory"] = {
        "counter": memory[chunks[0]]["counter"],
        "queries": m_memory,
        "headprobe_peak_mib": {c: mib(memory[c]["peak_bytes"]) for c in chunks},
        "bound_mib": {c: mib(bound[c]) for c in chunks},
        "sklearn_peak_mib": mib(sk_memory["peak_bytes"]),
    }
    measured = ", ".join(f"chunk {c}: {mib(memory[c]['peak_bytes']):.0f} MiB" for c in chunks)
    report.check("k-NN peak memory above the inputs", f"sklearn: {mib(sk_memory['peak_bytes']):.0f} MiB",
                 "bounded by the chunk size: <= (6ND + 8cN) B + 64 MiB", measured, within)
    report.note(f"memory counter: {memory[chunks[0]]['counter']}; each chunk size in its own process, "
                f"{m_memory:,} queries.")
    report.finish()


if __name__ == "__main__":
    main()
