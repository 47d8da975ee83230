"""`headprobe plan RECIPE`: what a run will hold and how long it will take, said before anything loads.

Per stage and tap: the rows (images, or images × views), the feature width, the bytes on disk (the feature cache, in
`features.store_dtype`) and in memory (float32: what a fresh extraction holds and what the probes are handed), the
peak resident memory the run needs, and minutes. Nothing here imports torch: widths come from what the registry
declares of the backbone (`shape["dim"]`), the `config.json` of an `hf:` model found on disk, or an earlier run's
record (`--out`); image counts from the data source's declared sizes and `data.limit`.

The peak is modelled, not measured: the resident size of a process that imported what a run imports
(`benchmarks/results/runtime_rss.json`), plus the backbone's float32 weights, plus every extracted array (a run holds
them all until it ends), plus the largest head tap's arrays (a head tap is computed whole before its probes run).
Minutes come from an earlier run's record where `--out` holds one (its seconds per image, per step and per tap, scaled
by rows), else from the benchmarks' medians (`probe_costs.json`, `extract.json`, `multihead.json`) scaled by rows and
width, else from the probes' declared cost priors (`Probe.cost`, k-NN = 1).

>>> from headprobe.recipe import load_recipe
>>> p = plan_run(load_recipe({"name": "x", "probes": {"knn": {}}, "heads": []}))
>>> [(r.stage, r.what, r.rows, r.width) for r in p.rows if r.stage == "extract"]
[('extract', 'train', 1347, 384), ('extract', 'test', 450, 384)]
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from headprobe.registry import BACKBONES, DATA_SOURCES, OFFLINE_MODELS, ORBIT_SWEEPS, SCRATCH_MODELS

__all__ = ["ITEMSIZE", "Plan", "PlanError", "PlanRow", "backbone_width", "head_widths", "plan_run", "split_sizes"]

# Bytes per stored element of each `features.store_dtype` (tests/test_plan.py checks them against torch's).
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
FLOAT32 = 4
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
# The sizes probe_costs.json was measured at (its recipe, recipes/quickstart.yaml: digits 1,347 train / 450 test;
# its taps: the 384-d backbone and 256-d head layers, so 256 is the width most of its medians were taken at).
BENCH_TRAIN, BENCH_TEST, BENCH_WIDTH = 1347, 450, 256


class PlanError(ValueError):
    """A recipe the plan cannot size; the message says what is missing and how to give it."""


@dataclass
class PlanRow:
    stage: str  # load | extract | train | probe
    what: str  # the array, head or tap
    rows: int = 0
    width: int = 0
    disk_bytes: int = 0
    memory_bytes: int = 0
    seconds: float | None = None


@dataclass
class Plan:
    rows: list[PlanRow]
    peak_bytes: int
    peak_parts: dict[str, int]
    ram_bytes: int | None
    warnings: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float | None:
        timed = [r.seconds for r in self.rows if r.seconds is not None]
        return sum(timed) if timed else None


def split_sizes(data) -> tuple[int, int]:
    """(training images, test images) of `data` (a `DataSpec`) as the loader will make them: the source's declared
    sizes, a stratified `test_fraction` of train where the source has no test split (sklearn rounds the test part
    up), then `data.limit`."""
    prefix = data.source.partition(":")[0]
    declared = dict(DATA_SOURCES.entry(prefix).shape or {}) if prefix in DATA_SOURCES else {}
    train, test = declared.get("train"), declared.get("test")
    if train is not None and test is None:
        test = math.ceil(data.test_fraction * train)
        train -= test
    train = data.limit.train if train is None else min(train, data.limit.train or train)
    test = data.limit.test if test is None else min(test, data.limit.test or test)
    if train is None or test is None:
        raise PlanError(f"data.source {data.source!r} declares no image counts, so the plan cannot size it; set "
                        "data.limit.train and data.limit.test (e.g. --set data.limit.train=50000).")
    return train, test


def _hf_config(spec) -> dict | None:
    """The config.json of an `hf:` backbone found on disk (a local folder, or the Hugging Face cache), else None."""
    ref = spec.id.partition(":")[2]
    path = Path(ref) / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        found = try_to_load_from_cache(ref, "config.json", revision=spec.revision)
        path = Path(found) if isinstance(found, str) else None
    return json.loads(path.read_text()) if path is not None and path.is_file() else None


def backbone_width(spec, earlier: dict | None = None, dim: int | None = None) -> tuple[int, int | None, str]:
    """(feature width, parameters or None, where the width came from) of the backbone `spec` (a `BackboneSpec`):
    `dim` if given, else an earlier run's record, else the registry's declaration or an hf config.json; times 2
    for `cls+mean` pooling and times the number of `backbone.layers` concatenated."""
    params, source = None, "--dim"
    if dim is None and earlier and (earlier.get("backbone") or {}).get("id") == spec.id:
        recorded = earlier["backbone"]
        return int(recorded["dim"]), recorded.get("params"), "the earlier run's record"
    if dim is None:
        prefix, _, rest = spec.id.partition(":")
        models = {"offline": OFFLINE_MODELS, "scratch": SCRATCH_MODELS}.get(prefix)
        shape = dict(models.entry(rest).shape or {}) if models is not None and rest in models else {}
        dim, params, source = shape.get("dim"), shape.get("params"), "the registry's declaration"
        if dim is None and prefix == "hf" and (config := _hf_config(spec)) is not None:
            dim = config.get("hidden_size") or (config.get("hidden_sizes") or [None])[-1]
            layers = config.get("num_hidden_layers")
            # A transformer's parameters, about 12·layers·hidden² (attention 4h², MLP 8h²): only the memory estimate
            # reads it.
            params = 12 * layers * dim * dim if dim and layers else None
            source = "its config.json"
        if dim is None:
            known = ", ".join(f"offline:{n}" for n in OFFLINE_MODELS.names())
            raise PlanError(f"the feature width of backbone {spec.id!r} is not declared (known: {known}, scratch:, "
                            "and hf: models whose config.json is on disk); give it with --dim D, or --out an earlier "
                            "run of this backbone.")
    dim = int(dim) * (2 if spec.pooling == "cls+mean" else 1) * (len(spec.layers) if spec.layers else 1)
    return dim, params, source


def head_widths(head, in_dim: int) -> list[tuple[int, int]] | None:
    """[(layer, width)] of the layers of `head` (a `HeadSpec`) that are probed (`taps`, else every layer); None for a
    head whose widths only its checkpoint knows (`type: pretrained`, a plug-in's)."""
    if head.type == "identity":
        return []
    if head.type == "random":
        widths = [max(head.width, in_dim)]
    elif head.type in ("mlp", "linear"):
        widths = [head.width] * (head.depth - 1) + [head.out_dim or head.width]
    else:
        return None
    layers = head.taps or range(1, len(widths) + 1)
    return [(i, widths[i - 1]) for i in layers if i <= len(widths)]


def _bench(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _ram_bytes() -> int | None:
    """The memory this machine has free for a run now (MemAvailable), else its total."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return int(info.get("MemAvailable", info["MemTotal"]).split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None


def _arrays(recipe, needs: set[str], n_train: int, n_test: int) -> list[tuple[str, int, int]]:
    """(name, rows on disk, rows in memory) of every array the extraction stage makes (`stages.extract_features`):
    the clean splits; rotated copies (3 more rows per image on disk, the 4 angles concatenated in memory); orbit
    frames; the training images' views (heads on a frozen backbone train on them) and the probed views."""
    out = [("train", n_train, n_train), ("test", n_test, n_test)]
    if "rotated" in needs:
        out += [("rotated train", 3 * n_train, 4 * n_train), ("rotated test", 3 * n_test, 4 * n_test)]
    if "orbits" in needs:
        spec = recipe.probes["orbits"]
        images = min(spec.n_images, n_test)
        for sweep in spec.sweeps:
            frames = images * (ORBIT_SWEEPS.entry(sweep).shape or {}).get("steps", 0)
            out.append((f"orbits {sweep}", frames, frames))
    k = recipe.augment.views
    heads_views = bool(recipe.heads) and recipe.backbone.tune == "frozen"
    held_out = recipe.augment.probe_views == "test"
    if heads_views or ("views" in needs and not held_out):
        out.append(("views train", n_train * k, n_train * k))
    if "views" in needs and held_out:
        out.append(("views test", n_test * k, n_test * k))
    return out


def _probe_seconds(names: list[str], width: int, n_train: int, n_test: int, earlier_per_tap: float | None,
                   earlier_images: int | None) -> tuple[float | None, str]:
    """Seconds to probe one tap with `names`, and how it was estimated."""
    if earlier_per_tap is not None and earlier_images:
        return (earlier_per_tap * (n_train + n_test) / earlier_images,
                "the earlier run's seconds per tap, scaled by images")
    costs = _bench("probe_costs")
    medians = {k: v["median_s"] for k, v in (costs or {}).get("timings", {}).items()}
    if not medians:
        return None, "not estimated (benchmarks/results/probe_costs.json is not in this checkout)"
    from headprobe.probes.declaration import declared_probe

    scale = width / BENCH_WIDTH
    total = 0.0
    for name in names:
        seconds = medians.get(name)
        if seconds is None:  # a probe the benchmark did not time: its declared cost, in k-NN units
            seconds = declared_probe(name).cost * medians.get("knn", 0.0)
        if name == "knn":  # every query against the whole bank
            total += seconds * scale * (n_train * n_test) / (BENCH_TRAIN * BENCH_TEST)
        else:
            total += seconds * scale * (n_train + n_test) / (BENCH_TRAIN + BENCH_TEST)
    return total, ("benchmarks/results/probe_costs.json medians (the quickstart's inputs per image) scaled by images "
                   "and width, k-NN by train × test images; declared costs where not timed")


def _runtime_bytes() -> tuple[int, str]:
    bench = _bench("runtime_rss") or {}
    measured = (bench.get("measured") or {}).get("rss_after_imports_bytes")
    if measured:
        return int(measured), "benchmarks/results/runtime_rss.json (a process that imported what a run imports)"
    return 0, "not counted (benchmarks/results/runtime_rss.json is not in this checkout)"


def plan_run(recipe, earlier: dict | None = None, dim: int | None = None, ram_bytes: int | None = None) -> Plan:
    """The plan of `recipe` (a loaded `Recipe`); `earlier`: the results.json of an earlier run (its record's widths
    and seconds are used where it has them); `ram_bytes`: the memory to check the peak against (default: this
    machine's available memory)."""
    n_train, n_test = split_sizes(recipe.data)
    width, params, width_source = backbone_width(recipe.backbone, earlier, dim)
    item = ITEMSIZE[recipe.features.store_dtype]
    needs = _probe_needs(recipe)
    timing = (earlier or {}).get("timing") or {}
    sources = [f"feature width {width}: {width_source}"]
    rows: list[PlanRow] = []

    weights = (params or 0) * FLOAT32
    rows.append(PlanRow("load", recipe.backbone.id, memory_bytes=weights, seconds=timing.get("load_s")))
    arrays = _arrays(recipe, needs, n_train, n_test)
    images = sum(disk for _, disk, _ in arrays)
    rate, rate_source = _extract_rate(earlier, timing)
    sources.append(f"extraction: {rate_source}")
    for name, disk, memory in arrays:
        rows.append(PlanRow("extract", name, disk, width, disk * width * item if recipe.features.cache else 0,
                            memory * width * FLOAT32, disk / rate if rate else None))
    held = sum(r.memory_bytes for r in rows if r.stage == "extract")

    steps = _train_steps(recipe, n_train)
    seeds = len(recipe.seed_list)
    step_s, step_source = _step_seconds(recipe, earlier, timing, steps * seeds, width)
    sources.append(f"training: {step_source}")
    tap_rows = n_train + n_test + sum(memory for name, _, memory in arrays
                                      if name.startswith(("rotated", "orbits"))
                                      or (name == "views test" or (name == "views train"
                                                                   and recipe.augment.probe_views == "train")))
    taps: list[tuple[str, int]] = [("backbone", width)]
    for head in recipe.heads:
        layers = head_widths(head, width)
        if layers is None:
            sources.append(f"head {head.name}: type {head.type!r} (its widths are in its checkpoint; not planned)")
            continue
        trained = head.init_of is None and head.type not in ("random", "pretrained", "identity")
        if trained and steps:
            rows.append(PlanRow("train", head.name, n_train * recipe.augment.views, layers[-1][1] if layers else width,
                                seconds=step_s * steps * seeds if step_s is not None else None))
        depth = len(layers)
        taps += [(head.name if i == depth else f"{head.name}@{i}", w) for i, w in layers]
    per_tap, per_tap_rows = _earlier_per_tap(earlier, timing)
    largest_tap = 0
    for name, w in taps:
        copies = 1 if name == "backbone" else seeds
        seconds, probe_source = _probe_seconds(list(recipe.probes), w, n_train, n_test, per_tap, per_tap_rows)
        memory = tap_rows * w * FLOAT32 if name != "backbone" or recipe.features.store_dtype != "float32" else 0
        largest_tap = max(largest_tap, memory)
        rows.append(PlanRow("probe", name + (f" × {copies} seeds" if copies > 1 else ""), tap_rows, w,
                            memory_bytes=memory, seconds=None if seconds is None else seconds * copies))
    sources.append(f"probing: {probe_source}")
    runtime, runtime_source = _runtime_bytes()
    sources.append(f"runtime: {runtime_source}")
    parts = {"runtime": runtime, "weights": weights, "extracted arrays": held, "largest tap": largest_tap}
    peak = sum(parts.values())
    ram = _ram_bytes() if ram_bytes is None else ram_bytes
    plan = Plan(rows, peak, parts, ram, sources=sources)
    if ram is not None and peak > ram:
        plan.warnings.append(_too_big(recipe, peak, ram, parts))
    return plan


def _too_big(recipe, peak: int, ram: int, parts: dict[str, int]) -> str:
    """The sentence said before a run that will not fit: by how much, and the knobs that shrink it."""
    knobs = []
    if recipe.features.store_dtype == "float32":
        knobs.append("features.store_dtype: float16 (half the cache on disk and in the page cache)")
    if recipe.augment.views > 2:
        knobs.append(f"fewer views (augment.views: {recipe.augment.views} → 2)")
    if any(h.taps is None and h.depth > 1 for h in recipe.heads):
        knobs.append("fewer taps (heads[].taps: [depth], only each head's output)")
    knobs.append("data.limit.train / data.limit.test")
    gib = 2**30
    return (f"this run needs about {peak / gib:.1f} GiB of memory at its peak but {ram / gib:.1f} GiB is free here "
            f"(extracted arrays {parts['extracted arrays'] / gib:.1f} GiB, largest tap "
            f"{parts['largest tap'] / gib:.1f} GiB); reduce it with " + ", ".join(knobs) + ".")


def _extract_rate(earlier: dict | None, timing: dict) -> tuple[float | None, str]:
    """Images per second of the backbone's forward passes: the earlier run's, else extract.json's median."""
    if earlier and timing.get("extract_s"):
        n = (earlier.get("data") or {})
        forwarded = _earlier_images(earlier, n.get("n_train", 0), n.get("n_test", 0))
        seconds = timing["extract_s"] + timing.get("extract_views_s", 0.0)
        if forwarded and seconds > 0:
            return forwarded / seconds, f"the earlier run's {forwarded / seconds:.0f} images/s"
    bench = _bench("extract") or {}
    rates = [v.get("images_per_s") for v in bench.get("timings", {}).values() if v.get("images_per_s")]
    if rates:
        rate = sorted(rates)[len(rates) // 2]
        size = (bench.get("sizes") or {}).get("resolution")
        return rate, (f"benchmarks/results/extract.json, {rate:.0f} images/s ({bench['sizes'].get('backbone')} at "
                      f"{size} px, not scaled to this backbone or resolution)")
    return None, "not estimated (no earlier run, no benchmarks/results/extract.json)"


def _earlier_images(earlier: dict, n_train: int, n_test: int) -> int:
    """The images an earlier run forwarded through its backbone: its cache misses' rows (hits cost no forward)."""
    from headprobe.recipe import load_recipe

    try:
        recipe = load_recipe(earlier["recipe"])
    except (ValueError, KeyError, TypeError):
        return 0
    needs = _probe_needs(recipe)
    cache = ((earlier.get("protocol") or {}).get("features") or {}).get("cache") or {}
    if cache and all(entry.get("hit") for entry in cache.values()):
        return 0
    return sum(disk for _, disk, _ in _arrays(recipe, needs, n_train, n_test))


def _probe_needs(recipe) -> set[str]:
    """The inputs the recipe's probes declare ("views", "rotated", "orbits"), as `stages.probe_needs` reads them."""
    from headprobe.registry import PROBES

    return {need for name in recipe.probes for need in PROBES.entry(name).needs}


def _train_steps(recipe, n_train: int) -> int:
    """The optimisation steps of one seed's heads: `train.steps`, else epochs × batches (the last partial batch
    dropped: each step needs a full batch of pairs)."""
    if not recipe.heads or recipe.backbone.tune != "frozen":
        return 0
    return recipe.train.steps or recipe.train.epochs * max(1, n_train // recipe.train.batch_size)


def _step_seconds(recipe, earlier, timing: dict, steps: int, width: int) -> tuple[float | None, str]:
    """Seconds per training step (all heads together): the earlier run's, else multihead.json's, scaled by batch."""
    if earlier and timing.get("train_s"):
        ran = sum(((h.get("train") or {}).get("steps") or 0) for h in (earlier.get("heads") or {}).values())
        heads = max(1, len(earlier.get("heads") or {}))
        done = ran / heads * max(1, len((earlier.get("recipe") or {}).get("seeds") or [0]))
        if done:
            return timing["train_s"] / done, "the earlier run's seconds per step"
    bench = _bench("multihead") or {}
    sizes, timed = bench.get("sizes") or {}, (bench.get("timings") or {}).get("5 heads in one train_heads loop")
    if not timed or not sizes:
        return None, "not estimated (no earlier run, no benchmarks/results/multihead.json)"
    bench_steps = sizes["epochs"] * (sizes["images"] // sizes["batch_size"])
    per_head_step = timed["median_s"] / bench_steps / sizes["heads"]
    trained = sum(1 for h in recipe.heads if h.init_of is None and h.type in ("mlp", "linear"))
    scale = recipe.train.batch_size / sizes["batch_size"] * width / sizes["dim"]
    return per_head_step * trained * scale, ("benchmarks/results/multihead.json (seconds per head and step, scaled by "
                                             "batch and width)")


def _earlier_per_tap(earlier: dict | None, timing: dict) -> tuple[float | None, int | None]:
    """(seconds per probed tap, the rows each tap had) of an earlier run, or (None, None)."""
    if not earlier or not timing.get("probe_s"):
        return None, None
    taps = earlier.get("taps") or {}
    probed = sum(max(1, len(t.get("seeds") or {})) for t in taps.values() if t.get("metrics"))
    data = earlier.get("data") or {}
    if not probed or not data.get("n_train"):
        return None, None
    return timing["probe_s"] / probed, int(data["n_train"]) + int(data.get("n_test", 0))
