"""The pixels of hf:, open_clip: and timm: backbones are the library's own processor's (issue 27), on real photos
of odd sizes and modes, through models each library saves itself; the cache key follows the processor's settings."""

import dataclasses
import json
import pickle
import re

import numpy as np
import pytest
import torch
from PIL import Image

from headprobe.backbones import Preprocess, load_backbone
from headprobe.backbones.processor import LIBRARIES, PROCESSORS, ProcessorPreprocess, processor_preprocess
from headprobe.features.extract import extract, feature_key
from headprobe.features.views import normalise_only

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
# facebook/dinov2-small's preprocessor_config.json
DINOV2_PROCESSOR = dict(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}, do_center_crop=True,
                        resample=3, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])


def photos() -> dict[str, Image.Image]:
    """scikit-learn's two photographs (640x427) made into what datasets hold: landscape, portrait, odd margins,
    smaller than the crop, grey, RGBA with an alpha ramp."""
    from sklearn.datasets import load_sample_image

    china, flower = (Image.fromarray(load_sample_image(f"{n}.jpg")) for n in ("china", "flower"))
    rgba = china.crop((7, 3, 508, 382)).convert("RGBA")
    rgba.putalpha(Image.fromarray(np.linspace(40, 255, rgba.width)[None, :].repeat(rgba.height, 0).astype(np.uint8)))
    return {"landscape": china, "portrait": flower.transpose(Image.Transpose.ROTATE_90),
            "odd": china.crop((101, 57, 434, 308)), "small": flower.crop((250, 160, 400, 257)),
            "grey": flower.crop((11, 21, 412, 320)).convert("L"), "rgba": rgba}


def reimplemented(pre) -> Preprocess:
    """What headprobe computed before issue 27: torchvision from the described fields."""
    return Preprocess(**{f.name: getattr(pre, f.name) for f in dataclasses.fields(Preprocess)})


def assert_own_pixels(backbone, theirs, *, before_at_least: float) -> None:
    """backbone.preprocess == the library's processor on every photo (float rounding), features included; the
    re-implementation differed by `before_at_least` somewhere, so these photos would have caught it."""
    images = photos()
    ours = torch.stack([backbone.preprocess(im) for im in images.values()])
    ref = torch.stack([theirs(im) for im in images.values()])
    assert ours.shape == ref.shape == (len(images), 3, backbone.preprocess.crop, backbone.preprocess.crop)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)
    with torch.inference_mode():
        torch.testing.assert_close(backbone(ours), backbone(ref), atol=1e-6, rtol=0)
    old = torch.stack([reimplemented(backbone.preprocess)(im) for im in images.values()])
    assert (old - ref).abs().max() >= before_at_least
    # Orbit frames are the processor's pixels before normalisation: normalised, they are the clean pixels.
    normalise = normalise_only(backbone.preprocess)
    frames = torch.stack([normalise(backbone.preprocess.frame(im)) for im in images.values()])
    torch.testing.assert_close(frames, ref, atol=1e-5, rtol=0)


def test_hf_dinov2_pixels_are_its_processors(tmp_path):
    from transformers import AutoImageProcessor, BitImageProcessor, Dinov2Config, Dinov2Model

    Dinov2Model(Dinov2Config(**TINY, image_size=224, patch_size=14)).save_pretrained(tmp_path)
    BitImageProcessor(**DINOV2_PROCESSOR).save_pretrained(tmp_path)
    backbone = load_backbone(f"hf:{tmp_path}")
    processor = AutoImageProcessor.from_pretrained(tmp_path)
    # The old centre crop rounded (640 x 427 → 383 x 256: margin 79.5) where transformers floors: 2.96 off.
    assert_own_pixels(backbone, lambda im: processor(im, return_tensors="pt").pixel_values[0], before_at_least=2.5)
    assert isinstance(backbone.preprocess, ProcessorPreprocess) and backbone.preprocess.library == "transformers"
    assert "BitImageProcessor of the checkpoint" in backbone.description


def test_hf_clip_pixels_are_its_processors_transparency_composited_onto_white(tmp_path):
    from transformers import AutoImageProcessor, CLIPConfig, CLIPImageProcessor, CLIPModel

    config = CLIPConfig(text_config={**TINY, "vocab_size": 100, "bos_token_id": 0, "eos_token_id": 1,
                                     "pad_token_id": 1},
                        vision_config={**TINY, "image_size": 224, "patch_size": 32}, projection_dim=16)
    CLIPModel(config).save_pretrained(tmp_path)
    CLIPImageProcessor().save_pretrained(tmp_path)  # its defaults are openai/clip-vit-base-patch32's
    backbone = load_backbone(f"hf:{tmp_path}")
    processor = AutoImageProcessor.from_pretrained(tmp_path)
    assert_own_pixels(backbone, lambda im: processor(im, return_tensors="pt").pixel_values[0], before_at_least=2)
    rgba = photos()["rgba"]
    white = Image.alpha_composite(Image.new("RGBA", rgba.size, (255,) * 4), rgba).convert("RGB")
    torch.testing.assert_close(backbone.preprocess(rgba), backbone.preprocess(white), atol=1e-6, rtol=0)


def test_hf_processor_without_rgb_conversion_gets_rgb(tmp_path):
    """ViTImageProcessor does not convert: a grey image is given to it as RGB, as a user must."""
    from transformers import AutoImageProcessor, ViTConfig, ViTImageProcessor, ViTModel

    ViTModel(ViTConfig(**TINY, image_size=32, patch_size=8), add_pooling_layer=False).save_pretrained(tmp_path)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    backbone = load_backbone(f"hf:{tmp_path}", pooling="mean")
    processor = AutoImageProcessor.from_pretrained(tmp_path)
    grey = photos()["grey"]
    torch.testing.assert_close(backbone.preprocess(grey),
                               processor(grey.convert("RGB"), return_tensors="pt").pixel_values[0], atol=1e-6, rtol=0)


def test_hf_resolution_scales_the_processor(tiny_dinov2):
    from transformers import BitImageProcessor

    backbone = load_backbone(f"hf:{tiny_dinov2}", resolution=56)
    assert (backbone.preprocess.resize, backbone.preprocess.crop) == (64, 56)
    theirs = BitImageProcessor(**{**DINOV2_PROCESSOR, "size": {"shortest_edge": 64},
                                  "crop_size": {"height": 56, "width": 56}})
    for image in photos().values():
        torch.testing.assert_close(backbone.preprocess(image), theirs(image, return_tensors="pt").pixel_values[0],
                                   atol=1e-6, rtol=0)


def test_hf_directory_without_a_processor_config_warns(tmp_path):
    from transformers import CLIPVisionConfig, CLIPVisionModel

    CLIPVisionModel(CLIPVisionConfig(**TINY, image_size=32, patch_size=8)).save_pretrained(tmp_path)
    expected = (rf"hf:{re.escape(str(tmp_path))} has no image-processor config \(preprocessor_config.json\), so "
                r"headprobe resizes images to 32 px and normalises them with ImageNet mean/std, which is wrong .*CLIP"
                rf".*AutoImageProcessor.from_pretrained\(.*\).save_pretrained\(\"{re.escape(str(tmp_path))}\"\)")
    with pytest.warns(UserWarning, match=expected):
        backbone = load_backbone(f"hf:{tmp_path}")
    assert type(backbone.preprocess) is Preprocess and backbone.preprocess.mean == (0.485, 0.456, 0.406)


@pytest.fixture(scope="module")
def open_clip_arch(tmp_path_factory) -> tuple[str, dict]:
    open_clip = pytest.importorskip("open_clip")
    arch = "headprobe-processor-vit"
    config = {"embed_dim": 16, "vision_cfg": {"image_size": 224, "layers": 2, "width": 32, "head_width": 16,
                                              "patch_size": 32},
              "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 16, "heads": 2, "layers": 1}}
    path = tmp_path_factory.mktemp("open-clip-configs")
    (path / f"{arch}.json").write_text(json.dumps(config))
    open_clip.add_model_config(path)
    return arch, config


def test_open_clip_pixels_are_its_transforms(open_clip_arch, tmp_path):
    import open_clip

    arch, config = open_clip_arch
    model, _, transform = open_clip.create_model_and_transforms(arch)
    torch.save(model.state_dict(), tmp_path / "tiny.pt")
    backbone = load_backbone(f"open_clip:{arch}/{tmp_path}/tiny.pt")
    # PIL resizes the RGBA photo with premultiplied alpha; the old tensor path was one level off elsewhere.
    assert_own_pixels(backbone, transform, before_at_least=0.01)
    # The layout of an hf-hub open_clip repository: open_clip_config.json + open_clip_pytorch_model.bin.
    local = tmp_path / "repo"
    local.mkdir()
    torch.save(model.state_dict(), local / "open_clip_pytorch_model.bin")
    (local / "open_clip_config.json").write_text(json.dumps({"model_cfg": config, "preprocess_cfg": {
        "mean": [0.5] * 3, "std": [0.25] * 3, "resize_mode": "squash", "interpolation": "bilinear"}}))
    resized = load_backbone(f"open_clip:{arch}/{tmp_path}/tiny.pt", resolution=64)  # force_image_size=64
    rescaled = backbone.preprocess.with_resolution(64)
    assert (rescaled.resize, rescaled.crop) == (resized.preprocess.resize, resized.preprocess.crop) == (64, 64)
    _, _, theirs = open_clip.create_model_and_transforms(arch, force_image_size=64)
    for image in photos().values():
        for pre in (resized.preprocess, rescaled):
            torch.testing.assert_close(pre(image), theirs(image), atol=1e-6, rtol=0)
    squash = load_backbone(f"open_clip:local-dir:{local}")
    _, _, theirs = open_clip.create_model_and_transforms(f"local-dir:{local}")
    assert_own_pixels(squash, theirs, before_at_least=0.01)


def test_timm_pixels_are_its_transforms(tmp_path):
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    for name in ("test_vit", "test_resnet"):
        model = timm.create_model(name, pretrained=False, num_classes=0)
        save_file(model.state_dict(), tmp_path / f"{name}.safetensors")
        backbone = load_backbone(f"timm:{name}/{tmp_path / name}.safetensors", pooling="mean")
        transform = timm.data.create_transform(**timm.data.resolve_data_config(model=model))
        assert_own_pixels(backbone, lambda im, t=transform: t(im.convert("RGB")), before_at_least=0.005)
    resized = load_backbone("timm:test_vit/random", resolution=96)
    cfg = {**timm.data.resolve_data_config(model=resized.model), "input_size": (3, 96, 96)}
    transform = timm.data.create_transform(**cfg)
    assert (resized.preprocess.resize, resized.preprocess.crop) == (101, 96)  # floor(96 / crop_pct 0.95)
    for image in photos().values():
        torch.testing.assert_close(resized.preprocess(image), transform(image.convert("RGB")), atol=1e-6, rtol=0)


def test_extraction_uses_the_processor_and_survives_workers(tiny_dinov2):
    import datasets
    from transformers import AutoImageProcessor

    images = list(photos().values())
    data = datasets.Dataset.from_dict({"image": images, "label": list(range(len(images)))},
                                      features=datasets.Features({"image": datasets.Image(),
                                                                  "label": datasets.Value("int64")}))
    info = {"source": "photos", "fingerprint": "x", "test_split": None, "limit": None, "split_seed": 0}
    backbone = load_backbone(f"hf:{tiny_dinov2}")
    processor = AutoImageProcessor.from_pretrained(tiny_dinov2)
    # The images as the dataset returns them (RGBA and grey as stored, JPEG-decoded like any user's loader).
    pixels = torch.stack([processor(data[i]["image"], return_tensors="pt").pixel_values[0] for i in range(len(data))])
    with torch.inference_mode():
        expected = backbone(pixels)
    for workers in (0, 1):  # a worker process receives the preprocess pickled
        got = extract(backbone, data, data_info=info, split="test", cache=False, num_workers=workers, batch_size=4)
        torch.testing.assert_close(got.features, expected, atol=1e-6, rtol=0)
    assert pickle.loads(pickle.dumps(backbone.preprocess)) == backbone.preprocess


def test_cache_key_follows_the_processor_settings(tmp_path, tiny_dinov2):
    import shutil

    from transformers import BitImageProcessor

    info = {"source": "s", "fingerprint": "f", "test_split": None, "limit": None, "split_seed": 0}
    base = load_backbone(f"hf:{tiny_dinov2}")
    key = feature_key(base, info, "train", "fp32")[0]
    assert feature_key(load_backbone(f"hf:{tiny_dinov2}"), info, "train", "fp32")[0] == key
    own = {**DINOV2_PROCESSOR, "size": {"shortest_edge": 32}, "crop_size": {"height": 28, "width": 28}}
    for field, value in {"resample": 2, "do_convert_rgb": False, "image_std": [0.2] * 3, "rescale_factor": 1 / 256,
                         "image_mean": [0.5] * 3}.items():
        copy = shutil.copytree(tiny_dinov2, tmp_path / field)
        BitImageProcessor(**{**own, field: value}).save_pretrained(copy)
        other = load_backbone(f"hf:{copy}")
        assert other.fingerprint == base.fingerprint and feature_key(other, info, "train", "fp32")[0] != key, field
    assert base.describe()["preprocess"]["processor"]["settings"]["image_processor_type"] == "BitImageProcessor"


def test_plain_preprocess_and_its_cache_keys_are_unchanged():
    """offline: and ssl: backbones keep their own transform, and the keys of caches written before issue 27."""
    pre = Preprocess(resize=256, crop=224, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    assert pre.to_dict() == {"resize": 256, "crop": 224, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
                             "interpolation": "bicubic", "resize_mode": "shortest"}
    image = photos()["odd"]
    assert pre(image).shape == (3, 224, 224) and type(pre.with_resolution(112)) is Preprocess


@pytest.mark.parametrize(("library", "settings", "expected"), [
    ("transformers", {"size": {"shortest_edge": 256}, "crop_size": {"height": 224, "width": 224}},
     (128, {"crop_size": {"height": 112, "width": 112}, "size": {"shortest_edge": 128}})),
    ("transformers", {"size": {"height": 224, "width": 224}}, (128, {"size": {"height": 128, "width": 128}})),
    ("open_clip", {"size": [224, 224]}, (112, {"size": [112, 112]})),
    ("timm", {"input_size": [3, 224, 224], "crop_pct": 0.875}, (128, {"crop_pct": 0.875, "input_size": [3, 112, 112]})),
])
def test_each_library_declares_how_its_processor_takes_another_crop(library, settings, expected):
    """One declaration per library (`PROCESSORS`), no `library ==` branches: the settings at crop 112 are those each
    library's own processor computes (the values before the processors were declared)."""
    assert LIBRARIES == tuple(PROCESSORS) == ("transformers", "open_clip", "timm")
    described = Preprocess(resize=256, crop=224, mean=(0.5,) * 3, std=(0.5,) * 3)
    scaled = processor_preprocess(described, library, settings).with_resolution(112)
    assert (scaled.resize, json.loads(scaled.settings)) == expected and scaled.crop == 112
    with pytest.raises(ValueError, match="library 'pil' is not supported; use one of transformers, open_clip, timm"):
        ProcessorPreprocess(**{f.name: getattr(described, f.name) for f in dataclasses.fields(Preprocess)},
                            library="pil")
