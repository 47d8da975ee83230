"""`headprobe plan RECIPE`: what a run of the recipe will hold, before it runs, without importing torch.

Per tap (the backbone, each head layer, once per training seed) and in total: the images each feature set has
(train, test, augmented views, rotated copies), the tap's width, the bytes the feature cache writes to disk (the
backbone's features only, in `features.store_dtype`; head taps are computed from them in memory, never stored), the
bytes it holds in memory (float32, as the run computes with), the peak resident memory (RSS) of the whole run, and
a rough time for the extraction.

Widths come from what the registry declares (`shape["dim"]` of an `offline:` or `scratch:` model) or, for an
`hf:` folder or a hub id in the local cache, from its config.json (``hidden_size``); any other backbone's width is
"unknown" (it is read from the weights when the model loads), and so are the bytes that depend on it.

The peak-RSS model: the libraries a run imports (measured: `IMPORT_RSS_BYTES`), the backbone once loaded (measured
per declared model, `LOAD_RSS_BYTES`; else its float32 weights twice over plus the model code), the features every
stage keeps until the end (float32), and the largest transient of the probe stage (one head tap's features, and the
linear probe's float64 copies of a tap). At the sizes of the bundled recipes the fixed terms dominate (≥ 80%);
benchmarks/bench_plan_rss.py measures it against real runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from headprobe.recipe import declared_shape, patch_size
from headprobe.recipe.probe_inputs import orbit_request, probe_needs

__all__ = ["IMPORT_RSS_BYTES", "LOAD_RSS_BYTES", "Plan", "add_plan_parser", "backbone_width", "data_sizes",
           "make_plan"]

# ru_maxrss after importing what `headprobe run` imports (torch, transformers, accelerate, datasets, sklearn, the
# pipeline), and the RSS loading each declared backbone adds to it: AMD EPYC, 2 cores, torch 2.14 (CPU), measured
# with a fresh interpreter per number (benchmarks/bench_plan_rss.py repeats the measurement).
IMPORT_RSS_BYTES = 720 * 2**20
LOAD_RSS_BYTES = {"offline:dinov2-vits14": 484 * 2**20, "scratch:vit-tiny": 237 * 2**20}
MODEL_CODE_BYTES = 230 * 2**20  # what building any model adds beyond its weights (vit-tiny: 237 MiB, 5 of weights)
# Seconds per image of a forward pass at a reference crop (ViTs scale with their tokens): offline:dinov2-vits14 at
# 112 px, 41.3 images/s on one thread (benchmarks/results/extract.json).
SECONDS_PER_IMAGE = {"offline:dinov2-vits14": (112, 1 / 41.3)}
N_VIEW_PARAMS = 16  # len(data.augment.PARAM_NAMES): the float32 parameters stored with each view
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
# Sources whose sizes are known without loading them: (train images, test images or None: a split of train).
BUILTIN_SIZES = {"sklearn-digits": (1797, None), "fashion-mnist": (60000, 10000)}
ROTATIONS = 4  # the rotation probe's copies: 0, 90, 180, 270 degrees


@dataclass
class TapPlan:
    name: str
    seed: int | None
    dim: int | None
    rows: dict
    disk_bytes: int | None  # what the feature cache stores for it (the backbone tap only)
    memory_bytes: int | None  # its features in memory, float32


@dataclass
class Plan:
    recipe: str
    backbone: dict
    data: dict
    taps: list[TapPlan] = field(default_factory=list)
    totals: dict = field(default_factory=dict)
    rss: dict = field(default_factory=dict)
    time: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "backbone": self.backbone, "data": self.data,
                "taps": [vars(t) for t in self.taps], "totals": self.totals, "peak_rss": self.rss,
                "time": self.time, "notes": self.notes}


def _hf_config(ref: str) -> dict | None:
    """config.json of an hf: local folder, or of a hub id already in the local Hugging Face cache; None otherwise."""
    path = Path(ref).expanduser() / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        cached = try_to_load_from_cache(ref, "config.json")
        path = Path(cached) if isinstance(cached, str) else None
    try:
        return json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None


def backbone_width(spec) -> tuple[int | None, str]:
    """(the width of one pooled feature of `spec` (a `BackboneSpec`), None where unknown; where it comes from)."""
    prefix, _, ref = spec.id.partition(":")
    base, source = declared_shape(spec.id).get("dim"), "declared in the registry"
    if base is None and prefix == "hf":
        config = _hf_config(ref) or {}
        config = config.get("vision_config", config)
        base, source = config.get("hidden_size"), "config.json hidden_size"
        if base is None:
            return None, f"{spec.id}: no config.json with hidden_size here (a hub id not in the local cache)"
    if base is None:
        return None, f"{spec.id}: its width is read from the weights when the model loads"
    if spec.pooling == "pooler":
        return None, f"{spec.id}: pooling 'pooler' is the model's own output, whose width its weights decide"
    layers = len(spec.layers) if spec.layers else 1
    return base * layers * (2 if spec.pooling == "cls+mean" else 1), source


def data_sizes(data) -> tuple[int | None, int | None, str]:
    """(train images, test images, how they are known) for a `DataSpec`; None where they cannot be known without
    loading the data. data.limit bounds either split of any source."""
    prefix = data.source.partition(":")[0]
    n_train = n_test = None
    how = "the source's declared size"
    if prefix in BUILTIN_SIZES and data.train_split == "train":
        total, test = BUILTIN_SIZES[prefix]
        if test is not None and data.test_split == "test":
            n_train, n_test = total, test
        else:  # load_data holds out a stratified test_fraction of train (sklearn rounds the test part up)
            n_test = math.ceil(data.test_fraction * total)
            n_train = total - n_test
    else:
        how = f"unknown without loading {data.source}; the limits bound it"
    limits = (data.limit.train, data.limit.test)
    n_train = limits[0] if n_train is None else min(n_train, limits[0] or n_train)
    n_test = limits[1] if n_test is None else min(n_test, limits[1] or n_test)
    return n_train, n_test, how


def _head_layer_widths(head, dim: int | None) -> list[int | None] | None:
    """The widths of a head's probed layers (`taps`, else every layer); None for a head with no taps."""
    if head.type == "identity":
        return None
    if head.type == "random":
        return [None if dim is None else max(head.out_dim or head.width, dim)]
    if head.type == "pretrained":
        return [None] * len(head.taps or [1])
    widths = [head.width] * (head.depth - 1) + [head.out_dim or head.width]
    return [widths[i - 1] for i in head.taps] if head.taps else widths


def _mul(*factors) -> int | None:
    return None if any(f is None for f in factors) else math.prod(factors)


def _add(*terms) -> int | None:
    return None if any(t is None for t in terms) else sum(terms)


def make_plan(recipe, name: str = "") -> Plan:
    """The plan of a loaded `Recipe`."""
    dim, dim_source = backbone_width(recipe.backbone)
    n_train, n_test, how = data_sizes(recipe.data)
    params = declared_shape(recipe.backbone.id).get("params")
    plan = Plan(name or recipe.name, {"id": recipe.backbone.id, "dim": dim, "dim_source": dim_source,
                                      "params": params},
                {"source": recipe.data.source, "n_train": n_train, "n_test": n_test, "how": how})
    needs = probe_needs(recipe)
    k = recipe.augment.views
    frozen = recipe.backbone.tune == "frozen"
    heads_views = bool(recipe.heads) and frozen
    probe_test_views = "views" in needs and recipe.augment.probe_views == "test"
    train_views = heads_views or ("views" in needs and not probe_test_views)
    rows = {"train": n_train, "test": n_test,
            "views": _add(_mul(n_train, k) if train_views else 0, _mul(n_test, k) if probe_test_views else 0),
            "rotated": _mul(ROTATIONS, _add(n_train, n_test)) if "rotated" in needs else 0}
    size = ITEMSIZE[recipe.features.store_dtype]
    view_images = rows["views"]
    # On disk: clean train/test (+ int64 labels), 3 rotated copies of each (the unrotated one is the clean file),
    # views (+ float32 parameters); the safetensors headers (a few hundred bytes each) are not counted.
    clean = _add(_mul(n_train, dim, size), _mul(n_train, 8), _mul(n_test, dim, size), _mul(n_test, 8))
    rotated = _mul(3, clean) if rows["rotated"] else 0
    views = _add(_mul(view_images, dim, size), _mul(view_images, N_VIEW_PARAMS, 4))
    disk = _add(clean, rotated, views)
    # In memory (float32): the clean features, the rotated set (its parts and their concatenation), the views.
    mem_clean = _add(_mul(_add(n_train, n_test), dim, 4), _mul(_add(n_train, n_test), 8))
    mem_rot = _mul(2, rows["rotated"], dim, 4) if rows["rotated"] else 0
    mem_views = _add(_mul(view_images, dim, 4), _mul(view_images, N_VIEW_PARAMS, 4))
    backbone_rows = _add(n_train, n_test, view_images, rows["rotated"])
    plan.taps.append(TapPlan("backbone", None, dim, rows, disk, _add(mem_clean, mem_rot, mem_views)))
    if not frozen:
        plan.notes.append(f"backbone.tune = {recipe.backbone.tune}: every feature is extracted again per seed from "
                          "the tuned backbone; the plan counts one extraction and no tuning memory.")
    seeds = recipe.seed_list
    widest = 0
    for seed in seeds:
        for head in recipe.heads:
            widths = _head_layer_widths(head, dim)
            if widths is None:
                continue
            depths = head.taps or list(range(1, len(widths) + 1))
            for depth, width in zip(depths, widths, strict=True):
                tap = head.name if depth == head.depth and head.type != "pretrained" else f"{head.name}@{depth}"
                memory = _mul(backbone_rows, width, 4)
                widest = None if memory is None or widest is None else max(widest, memory)
                plan.taps.append(TapPlan(tap, seed if len(seeds) > 1 else None, width, rows, 0, memory))
            if head.type == "pretrained":
                plan.notes.append(f"head {head.name!r} (pretrained): its widths are read from the checkpoint.")
    plan.totals = {"disk_bytes": disk, "memory_bytes": plan.taps[0].memory_bytes,
                   "images_extracted": _add(n_train, n_test, view_images, _mul(3, _add(n_train, n_test))
                                            if rows["rotated"] else 0)}
    orbits = orbit_request(recipe)
    if orbits is not None:
        plan.notes.append(f"orbits: their frames ({orbits.n_images} images × the steps of {', '.join(orbits.sweeps)})"
                          " are not counted.")
    plan.rss = _peak_rss(recipe, plan, widest, dim)
    plan.time = _time(recipe, plan.totals["images_extracted"])
    return plan


def _peak_rss(recipe, plan: Plan, widest: int | None, dim: int | None) -> dict:
    """{term: bytes} of the peak-RSS model and their sum (`peak_bytes`; None where a term is unknown)."""
    spec = recipe.backbone
    load = LOAD_RSS_BYTES.get(spec.id)
    params = plan.backbone["params"]
    if load is None and params is not None:
        load = 2 * 4 * params + MODEL_CODE_BYTES
    n = _add(plan.data["n_train"], plan.data["n_test"])
    # The linear probe standardises and whitens a tap in float64 (train and test, about 3 copies), and the
    # extraction holds one batch of pixels and the ViT's widest activation (4 × width per token) per image.
    probe = _mul(3, n, dim, 8)
    batch = recipe.features.batch_size
    crop = spec.resolution or 224
    extract = _mul(batch, 3, crop, crop, 4 * 4)
    terms = {"imports": IMPORT_RSS_BYTES, "backbone": load, "features": plan.totals["memory_bytes"],
             "largest_head_tap": widest, "probe_workspace": probe, "extraction_batch": extract}
    peak = _add(*terms.values())
    unknown = [k for k, v in terms.items() if v is None]
    return {"terms": terms, "peak_bytes": peak,
            "why_unknown": f"unknown: {', '.join(unknown)}" if unknown else None}


def _time(recipe, images: int | None) -> dict:
    """The extraction's rough seconds from a measured forward-pass rate; training and probing are timed by the run
    itself (`pipeline.time_estimate`) once it has measured its first tap."""
    known = SECONDS_PER_IMAGE.get(recipe.backbone.id)
    if known is None or images is None:
        return {"extract_s": None, "note": "extraction not estimated: no measured rate for this backbone"}
    crop, per_image = known
    patch = patch_size(recipe.backbone.id) or 1
    res = recipe.backbone.resolution or 224
    tokens = lambda px: (px // patch) ** 2 + 1  # noqa: E731
    seconds = images * per_image * tokens(res) / tokens(crop)
    return {"extract_s": round(seconds, 1),
            "note": "one thread of an AMD EPYC / Xeon core, unloaded; training and probing are estimated by the run "
                    "after its first tap (pipeline.time_estimate)"}


# --- the command ---------------------------------------------------------------------------------------------


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _count(n: int | None) -> str:
    return "unknown" if n is None else f"{n:,}"


def print_plan(plan: Plan, console) -> None:
    """The plan as a rich table per tap, then the totals, the peak-RSS terms and the time."""
    from rich.markup import escape
    from rich.table import Table

    b, d = plan.backbone, plan.data
    console.print(escape(f"plan of {plan.recipe}: {b['id']} ({_count(b['dim'])}-d, {b['dim_source']}) on "
                         f"{d['source']} ({_count(d['n_train'])} train / {_count(d['n_test'])} test images; "
                         f"{d['how']})"), soft_wrap=True)
    table = Table(title_justify="left")
    for column in ("tap", "seed", "dim", "train", "test", "views", "rotated", "cache on disk", "in memory"):
        table.add_column(column, justify="left" if column == "tap" else "right", no_wrap=column == "tap")
    for tap in plan.taps:
        table.add_row(escape(tap.name), "" if tap.seed is None else str(tap.seed), _count(tap.dim),
                      *(_count(tap.rows[k]) for k in ("train", "test", "views", "rotated")),
                      _size(tap.disk_bytes) if tap.disk_bytes else "-", _size(tap.memory_bytes))
    console.print(table)
    rss = plan.rss
    terms = ", ".join(f"{k} {_size(v)}" for k, v in rss["terms"].items())
    console.print(escape(f"total: feature cache {_size(plan.totals['disk_bytes'])} on disk "
                         f"({plan.totals['images_extracted'] or 'unknown'} images extracted); expected peak RSS "
                         f"{_size(rss['peak_bytes'])} ({terms})"), soft_wrap=True)
    t = plan.time
    seconds = f"~{t['extract_s']:.0f} s" if t["extract_s"] is not None else "not estimated"
    console.print(escape(f"time: extraction {seconds} ({t['note']})"), soft_wrap=True)
    for note in plan.notes + ([rss["why_unknown"]] if rss["why_unknown"] else []):
        console.print(escape(f"note: {note}"), soft_wrap=True)


EXIT_OK, EXIT_USAGE = 0, 2  # the CLI's codes (headprobe/cli.py): done; a bad recipe or arguments


def cmd_plan(args) -> int:
    from rich.console import Console
    from rich.markup import escape

    from headprobe.recipe import RecipeError, load_recipe

    try:
        recipe = load_recipe(args.recipe, args.set)
    except RecipeError as err:
        Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {escape(str(err))}", soft_wrap=True)
        return EXIT_USAGE
    plan = make_plan(recipe)
    if args.format == "json":
        print(json.dumps(plan.to_dict(), indent=1))
    else:
        print_plan(plan, Console(highlight=False))
    return EXIT_OK


def add_plan_parser(sub, overrides: dict) -> None:
    """`headprobe plan RECIPE [--set K=V] [--format table|json]` on the CLI's subcommands."""
    p = sub.add_parser("plan", help="what a run of the recipe will extract, store and hold in memory, and the peak "
                                    "RSS to expect, without loading any model")
    p.add_argument("recipe")
    p.add_argument("--set", **overrides)
    p.add_argument("--format", choices=("table", "json"), default="table", help="table (default) or json")
    p.set_defaults(fn=cmd_plan)
