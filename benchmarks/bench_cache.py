"""Head training on the frozen-backbone view cache against re-forwarding the backbone at every step.

solo-learn and lightly train a head on a frozen backbone by augmenting and forwarding the backbone at every step.
headprobe forwards K augmented views of every image once (`extract_views`, cached on disk) and trains the heads on
the cached features (`train_heads`). Both sides here use the same heads, initialisation, objective, epochs and
batches: step s takes images `batch_for_step(s)` and views v1, v2 of them, made by the same `make_view`, so the
re-forwarded features equal the cached ones (checked). Offline DINOv2 ViT-S/14 at 112 px, sklearn digits.

Measured: the time of one epoch both ways after the cache exists; and the whole first run (extraction with the
cache write, then training) against the backbone forwards it cannot avoid (a bare `model(pixel_values)` loop over
the same N·K view tensors, made beforehand).

    python benchmarks/bench_cache.py [--quick]
"""

from __future__ import annotations

import os
import tempfile

import torch
from _common import Report, interleaved, parse_args, timed

RESOLUTION, VIEWS, BATCH, SEED = 112, 4, 64, 0
EPOCH_TARGET, RUN_TARGET = 50.0, 1.25


def setup(n: int) -> tuple:
    from headprobe.backbones import load_backbone
    from headprobe.data import load_data
    from headprobe.data.augment import augment_spec
    from headprobe.recipe import DataSpec, LimitSpec

    backbone = load_backbone("offline:dinov2-vits14", resolution=RESOLUTION)
    data = load_data(DataSpec(source="sklearn-digits", limit=LimitSpec(train=n)))
    spec = augment_spec("crop-flip", size=backbone.preprocess.crop)
    return backbone, data, spec


def view_pixels(backbone, dataset, spec, items: list[tuple[int, int]]) -> torch.Tensor:
    """(len(items), 3, S, S) normalised pixels of view k of image i for each (i, k), exactly as `extract_views`."""
    from headprobe.backbones import Preprocess
    from headprobe.data.augment import make_view

    pre = backbone.preprocess
    normalise = Preprocess(resize=pre.crop, crop=pre.crop, mean=pre.mean, std=pre.std, interpolation=pre.interpolation)
    out = []
    for i, k in items:
        image = dataset[i]["image"].convert("RGB")
        out.append(normalise(make_view(image, spec, SEED, i, k)[0]))
    return torch.stack(out)


def heads_and_training(epochs: int) -> tuple[list, object]:
    from headprobe.recipe import HeadSpec, TrainSpec

    heads = [HeadSpec(name="relu_bn", act="relu", width=512, out_dim=256),
             HeadSpec(name="swish", act="swish", width=512, out_dim=256, bn_hidden=False)]
    return heads, TrainSpec(epochs=epochs, batch_size=BATCH, lr=1e-3, log_every=10)


def cached_training(views: torch.Tensor, epochs: int) -> tuple[dict, dict]:
    from headprobe.train.cached_views import train_heads

    heads, train = heads_and_training(epochs)
    return train_heads(heads, views, objective_name="vicreg", objective_options={}, train=train, seed=SEED)


@torch.no_grad()
def _forward(backbone, pixels: torch.Tensor) -> torch.Tensor:
    return backbone(pixels)


def reforward_epoch(backbone, dataset, spec, n: int, epoch: int, epochs: int,
                    cached: torch.Tensor | None = None) -> float:
    """One epoch the solo-learn/lightly way: make both views, forward the frozen backbone, step every head.

    Returns the largest |re-forwarded − cached| feature difference seen when `cached` is given, else 0."""
    from headprobe.registry import OBJECTIVES
    from headprobe.train.cached_views import batch_for_step, make_states

    heads, train = heads_and_training(epochs)
    per_epoch = n // BATCH
    states = make_states(heads, backbone.dim, train, train.epochs * per_epoch, SEED)
    objective = OBJECTIVES.get("vicreg")
    largest = 0.0
    for step in range(epoch * per_epoch, (epoch + 1) * per_epoch):
        idx, v1, v2 = batch_for_step(step, n, VIEWS, BATCH, SEED)
        items = list(zip(idx.tolist(), v1.tolist(), strict=True)) + list(zip(idx.tolist(), v2.tolist(), strict=True))
        z = _forward(backbone, view_pixels(backbone, dataset, spec, items))
        z1, z2 = z[: len(idx)], z[len(idx) :]
        if cached is not None:
            largest = max(largest, float((z1 - cached[idx, v1]).abs().max()), float((z2 - cached[idx, v2]).abs().max()))
        for state in states.values():
            state.modules().train()
            loss = objective(state.head(z1), state.head(z2)).loss
            state.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            state.optimizer.step()
            state.scheduler.step()
    return largest


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    quick = args.quick
    n, epochs, big_repeats, reforward_epochs = (64, 5, 1, 1) if quick else (192, 10, 2, 2)
    report = Report("cache", args, {"backbone": "offline:dinov2-vits14", "resolution": RESOLUTION,
                                    "data": "sklearn-digits", "images": n, "views": VIEWS, "batch_size": BATCH,
                                    "epochs": epochs, "heads": 2, "objective": "vicreg",
                                    "extraction_repeats": big_repeats, "reforward_epochs_timed": reforward_epochs})
    from headprobe.features.views import extract_views

    backbone, data, spec = setup(n)
    dataset = data.train
    all_pixels = view_pixels(backbone, dataset, spec, [(i, k) for i in range(n) for k in range(VIEWS)])
    _forward(backbone, all_pixels[:8])  # warm-up

    @torch.inference_mode()
    def bare_forwards() -> None:
        for start in range(0, len(all_pixels), BATCH):
            backbone.model(pixel_values=all_pixels[start : start + BATCH])

    def first_extraction():
        previous = os.environ.get("HEADPROBE_CACHE")
        with tempfile.TemporaryDirectory() as cache:
            os.environ["HEADPROBE_CACHE"] = cache  # an empty cache: the first run pays for the extraction
            try:
                out = extract_views(backbone, dataset, data_info=data.info, augment=spec, views=VIEWS, seed=SEED,
                                    batch_size=BATCH)
                t_hit, _ = timed(lambda: extract_views(backbone, dataset, data_info=data.info, augment=spec,
                                                       views=VIEWS, seed=SEED, batch_size=BATCH))
            finally:
                if previous is None:
                    os.environ.pop("HEADPROBE_CACHE")
                else:
                    os.environ["HEADPROBE_CACHE"] = previous
            return out, t_hit

    times, results = interleaved({"bare": bare_forwards, "extract": first_extraction}, big_repeats)
    t_bare = report.timing(f"bare model(pixel_values) over {n * VIEWS} views", times["bare"])
    t_extract = report.timing("extract_views, first time (augment + forward + cache write)", times["extract"])
    views, t_hit = results["extract"][0].features, results["extract"][1]
    report.timing("extract_views, cache hit (load)", [t_hit])

    train_times, _ = interleaved({"train": lambda: cached_training(views, epochs)}, args.repeats)
    t_train = report.timing(f"train_heads on the cache, {epochs} epochs", train_times["train"])
    epoch_cached = t_train / epochs

    largest = reforward_epoch(backbone, dataset, spec, n, 0, epochs, cached=views)
    seconds = [timed(lambda e=e: reforward_epoch(backbone, dataset, spec, n, e, epochs))[0]
               for e in range(1, 1 + reforward_epochs)]
    epoch_reforward = report.timing("re-forwarding the backbone, one epoch", seconds)

    ratio = epoch_reforward / epoch_cached
    report.check(f"per epoch, cache exists ({n} images x {VIEWS} views, {RESOLUTION} px)",
                 "re-forwarding the backbone every step", f">= {EPOCH_TARGET:g}x faster",
                 f"{ratio:,.0f}x faster ({epoch_cached * 1e3:.0f} ms vs {epoch_reforward:.1f} s)",
                 ratio >= EPOCH_TARGET, ratio=ratio)
    whole = t_extract + t_train
    run_ratio = whole / t_bare
    report.check(f"whole first run ({epochs} epochs)", "the N*K backbone forwards alone (bare loop)",
                 f"<= {RUN_TARGET:g}x their time", f"{run_ratio:.2f}x ({whole:.1f} s vs {t_bare:.1f} s)",
                 run_ratio <= RUN_TARGET, ratio=run_ratio)
    report.extra["derived"] = {
        "epoch_cached_s": epoch_cached, "epoch_reforward_s": epoch_reforward,
        "whole_first_run_s": whole, "run_after_cache_s": t_hit + t_train,
        "reforward_run_projected_s": epochs * epoch_reforward,
        "max_abs_feature_difference_reforward_vs_cache": largest,
        "bare_forward_images_per_s": n * VIEWS / t_bare,
    }
    report.note(f"re-forwarded features equal the cached ones to {largest:.1e} (max abs; batch composition differs); "
                f"the re-forward run for {epochs} epochs would take ~{epochs * epoch_reforward:.0f} s "
                f"against {whole:.1f} s.")
    report.finish()


if __name__ == "__main__":
    main()
