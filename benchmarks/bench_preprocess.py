"""Preprocessing of `hf:`, `open_clip:` and `timm:` backbones against each library's own processor.

Agreement, on real photographs of odd sizes and modes (scikit-learn's china.jpg and flower.jpg, 640x427, rotated,
cropped, made grey or given an alpha channel): the largest pixel difference (normalised units) between the
library's own processor and (a) headprobe's re-implementation before issue 27 (torchvision on the uint8 tensor,
centre crop rounded: the described `Preprocess` fields, called as a plain `Preprocess`), (b) `backbone.preprocess`
now. And what that does to features: of the tiny random-weight model each family saves (through
`load_backbone`), and of a real network, DINOv2 ViT-S/14 (`offline:dinov2-vits14`'s weights), fed each family's
pixels at 224 (for timm: its transform for vit_small_patch14_dinov2, the same network; for CLIP's processor and
open_clip a stand-in, as their real weights are not available offline).

Speed: time per image through the processor against the re-implementation, on CIFAR-sized (32x32) images and on
the photos, in one process (`--threads 1` for the numbers in the README), against one DINOv2 ViT-S/14 forward at 224:
the processor's share of CPU extraction. (On a GPU the forward is not the bottleneck: the per-image preprocessing
is, there as before, spread over DataLoader workers.)

    python benchmarks/bench_preprocess.py [--quick]
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from _common import Report, interleaved, parse_args
from PIL import Image

OPENAI_MEAN, OPENAI_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
OPEN_CLIP_ARCH = "headprobe-bench-vit"


def photos() -> dict[str, Image.Image]:
    """Real photographs in the sizes and modes a dataset holds: landscape, portrait, odd, smaller than the crop,
    grey, RGBA (an alpha ramp)."""
    from sklearn.datasets import load_sample_image

    china, flower = (Image.fromarray(load_sample_image(f"{n}.jpg")) for n in ("china", "flower"))
    rgba = china.crop((7, 3, 508, 382)).convert("RGBA")
    ramp = np.linspace(40, 255, rgba.width, dtype=np.float32)[None, :].repeat(rgba.height, 0)
    rgba.putalpha(Image.fromarray(ramp.astype(np.uint8)))
    return {
        "china 640x427": china,
        "flower 640x427": flower,
        "china portrait 427x640": china.transpose(Image.Transpose.ROTATE_90),
        "china odd 333x251": china.crop((101, 57, 434, 308)),
        "flower small 150x97": flower.crop((250, 160, 400, 257)),
        "flower grey 401x299": flower.crop((11, 21, 412, 320)).convert("L"),
        "china RGBA 501x379": rgba,
    }


def families(folder: Path) -> dict[str, dict]:
    """Each family's tiny random model saved by its library, its backbone id, and its own processor (as a user
    calls it)."""
    import open_clip
    import timm
    from transformers import (
        AutoImageProcessor,
        BitImageProcessor,
        CLIPImageProcessor,
        CLIPVisionConfig,
        CLIPVisionModel,
        Dinov2Config,
        Dinov2Model,
    )

    torch.manual_seed(0)
    dinov2 = folder / "dinov2"
    Dinov2Model(Dinov2Config(**TINY, image_size=224, patch_size=14)).save_pretrained(dinov2)
    # facebook/dinov2-small's preprocessor_config.json
    BitImageProcessor(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}, do_center_crop=True,
                      resample=3, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225],
                      ).save_pretrained(dinov2)
    clip = folder / "clip"
    CLIPVisionModel(CLIPVisionConfig(**TINY, image_size=224, patch_size=32)).save_pretrained(clip)
    CLIPImageProcessor().save_pretrained(clip)  # its defaults are openai/clip-vit-base-patch32's
    configs = folder / "open_clip"
    configs.mkdir()
    (configs / f"{OPEN_CLIP_ARCH}.json").write_text(json.dumps({
        "embed_dim": 16, "vision_cfg": {"image_size": 224, "layers": 2, "width": 32, "head_width": 16,
                                        "patch_size": 32},
        "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 16, "heads": 2, "layers": 1}}))
    open_clip.add_model_config(configs)
    model, _, oc_transform = open_clip.create_model_and_transforms(OPEN_CLIP_ARCH)
    torch.save(model.state_dict(), folder / "open_clip.pt")
    vit = timm.create_model("test_vit", pretrained=False, num_classes=0)
    from safetensors.torch import save_file

    save_file(vit.state_dict(), folder / "test_vit.safetensors")
    timm_transform = timm.data.create_transform(**timm.data.resolve_data_config(model=vit))
    return {
        "hf DINOv2 (BitImageProcessor 256/224 bicubic)": {
            "id": f"hf:{dinov2}", "theirs": lambda im, p=AutoImageProcessor.from_pretrained(dinov2):
                p(im, return_tensors="pt").pixel_values[0]},
        "hf CLIP (CLIPImageProcessor 224/224 bicubic)": {
            "id": f"hf:{clip}", "theirs": lambda im, p=AutoImageProcessor.from_pretrained(clip):
                p(im, return_tensors="pt").pixel_values[0]},
        "open_clip (OpenAI 224 bicubic)": {"id": f"open_clip:{OPEN_CLIP_ARCH}/{folder / 'open_clip.pt'}",
                                           "theirs": oc_transform},
        "timm test_vit (168/160 bicubic)": {"id": f"timm:test_vit/{folder / 'test_vit.safetensors'}",
                                            "theirs": lambda im: timm_transform(im.convert("RGB"))},
    }


def reimplemented(pre):
    """headprobe's transform before issue 27: torchvision on the uint8 tensor, from the described fields."""
    from headprobe.backbones import Preprocess

    return Preprocess(**{f.name: getattr(pre, f.name) for f in dataclasses.fields(Preprocess)})


def agreement(report: Report, folder: Path, images: dict[str, Image.Image]) -> dict:
    from headprobe.backbones import load_backbone

    rows = {}
    for name, fam in families(folder).items():
        backbone = load_backbone(fam["id"], pooling="cls")
        old = reimplemented(backbone.preprocess)
        theirs = torch.stack([fam["theirs"](im) for im in images.values()])
        before = torch.stack([old(im) for im in images.values()])
        after = torch.stack([backbone.preprocess(im) for im in images.values()])
        with torch.inference_mode():
            f_theirs, f_before, f_after = backbone(theirs), backbone(before), backbone(after)
        rows[name] = {
            "pixels_before": _per_photo(before, theirs, images), "pixels_after": _per_photo(after, theirs, images),
            "tiny_features_before_per_photo": _per_photo(f_before, f_theirs, images),
            "tiny_features_before": float((f_before - f_theirs).abs().max()),
            "tiny_features_after": float((f_after - f_theirs).abs().max()),
            "tiny_feature_scale": float(f_theirs.abs().max()),
            "pixels": (theirs, before, after),
        }
        print(f"   {name}: pixels max |diff| before {max(rows[name]['pixels_before'].values()):.4g}, after "
              f"{max(rows[name]['pixels_after'].values()):.3g}; tiny-model features before "
              f"{rows[name]['tiny_features_before']:.3g}, after {rows[name]['tiny_features_after']:.3g}", flush=True)
    return rows


def _per_photo(ours: torch.Tensor, theirs: torch.Tensor, images: dict) -> dict[str, float]:
    return {name: float((a - b).abs().max()) for name, a, b in zip(images, ours, theirs, strict=True)}


def timm_dinov2_at_224() -> tuple:
    """timm's own transform for vit_small_patch14_dinov2 (DINOv2 ViT-S/14) at 224, and headprobe's for it."""
    import timm

    from headprobe.backbones.from_timm import preprocess_from_data_config

    model = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0, img_size=224)
    cfg = {**timm.data.resolve_data_config(model=model), "input_size": (3, 224, 224)}
    transform = timm.data.create_transform(**cfg)
    return (lambda im: transform(im.convert("RGB"))), preprocess_from_data_config(cfg)


def real_features(rows: dict, images: dict[str, Image.Image]) -> None:
    """Features of real DINOv2 ViT-S/14 weights on each family's pixels at 224 (processor vs re-implementation);
    for timm, the pixels of timm's own transform for its DINOv2 ViT-S/14 (vit_small_patch14_dinov2) at 224."""
    from headprobe.backbones import load_backbone

    dinov2 = load_backbone("offline:dinov2-vits14", pooling="cls")
    cos = torch.nn.functional.cosine_similarity
    for name, row in rows.items():
        theirs, before, after = row.pop("pixels")
        if name.startswith("timm"):
            own, pre = timm_dinov2_at_224()
            theirs, before, after = (torch.stack([f(im) for im in images.values()])
                                     for f in (own, reimplemented(pre), pre))
            row["real_pixels_before"] = float((before - theirs).abs().max())
            row["real_pixels_after"] = float((after - theirs).abs().max())
        with torch.inference_mode():
            f_theirs, f_before, f_after = dinov2(theirs), dinov2(before), dinov2(after)
        row |= {"real_features_before_per_photo": _per_photo(f_before, f_theirs, images),
                "real_cosine_before_per_photo": {k: float(c) for k, c in zip(images, cos(f_before, f_theirs),
                                                                             strict=True)},
                "real_features_before": float((f_before - f_theirs).abs().max()),
                "real_features_after": float((f_after - f_theirs).abs().max()),
                "real_feature_scale": float(f_theirs.abs().max()),
                "real_cosine_before_min": float(cos(f_before, f_theirs).min()),
                "real_cosine_after_min": float(cos(f_after, f_theirs).min())}
        print(f"   {name}: DINOv2 ViT-S/14 features max |diff| before {row['real_features_before']:.3g}, after "
              f"{row['real_features_after']:.3g} (scale {row['real_feature_scale']:.3g}; min cosine before "
              f"{row['real_cosine_before_min']:.5f})", flush=True)


def speed(report: Report, folder: Path, images: dict[str, Image.Image], quick: bool) -> None:
    """Seconds per image through each processor and through the re-implementation, against one DINOv2 ViT-S/14
    forward at 224 (what extraction does with the pixels): the processor's share of extraction."""
    from headprobe.backbones import load_backbone

    dinov2 = load_backbone("offline:dinov2-vits14")
    x = torch.stack([dinov2.preprocess(im) for im in images.values()])
    with torch.inference_mode():
        times, _ = interleaved({"forward": lambda: dinov2(x)}, report.args.repeats)
    forward = report.timing(f"DINOv2 ViT-S/14 forward, {len(x)} images at 224", times["forward"]) / len(x)
    rng = np.random.default_rng(0)
    small = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(64 if quick else 256)]
    photo_list = list(images.values()) * (2 if quick else 8)
    for name, fam in families(folder).items():
        pre = load_backbone(fam["id"]).preprocess
        old = reimplemented(pre)
        for label, batch in (("32x32", small), ("photos", photo_list)):
            times, _ = interleaved({"processor": lambda b=batch, f=pre: [f(im) for im in b],
                                    "re-implemented": lambda b=batch, f=old: [f(im) for im in b]},
                                   report.args.repeats)
            ours = report.timing(f"{name} {label} processor", times["processor"],
                                 images_per_s=len(batch) / np.median(times["processor"])) / len(batch)
            before = report.timing(f"{name} {label} re-implemented", times["re-implemented"],
                                   images_per_s=len(batch) / np.median(times["re-implemented"])) / len(batch)
            report.check(f"{name}, {label}: processor time per image", "the re-implementation; a ViT-S/14 forward",
                         "<= 5% of the forward", f"{ours * 1e3:.1f} ms ({ours / before:.2f}x the re-implementation's "
                         f"{before * 1e3:.1f} ms); {ours / forward:.1%} of a forward", ours <= 0.05 * forward,
                         ratio=ours / before, share_of_forward=ours / forward)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    images = photos()
    report = Report("preprocess", args, {"photos": {k: list(v.size) + [v.mode] for k, v in images.items()}})
    with tempfile.TemporaryDirectory() as tmp:
        rows = agreement(report, Path(tmp) / "agree", images)
        real_features(rows, images)
        report.extra["agreement"] = rows
        for name, row in rows.items():
            after = max(row["pixels_after"].values())
            report.check(f"{name}: pixels", "the library's own processor", "<= 1e-5",
                         f"{after:.2g} (before {max(row['pixels_before'].values()):.3g})", after <= 1e-5)
        speed(report, Path(tmp) / "speed", images, args.quick)
    report.note("pixels: normalised units, max over the photos; features: max |difference| (scale: max |feature|).")
    report.finish()


if __name__ == "__main__":
    main()
