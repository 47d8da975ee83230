"""open_clip:<arch>[/<tag or file>] through open_clip.create_model_and_transforms, visual tower only."""

import json
from pathlib import Path

import matplotlib
import pytest
import torch
from PIL import Image

from headprobe.backbones import BackboneNotFoundError, load_backbone
from headprobe.backbones.base import weights_fingerprint

open_clip = pytest.importorskip("open_clip")

ARCH = "headprobe-test-vit"
TINY = {"embed_dim": 16, "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 16, "heads": 2, "layers": 1}}


@pytest.fixture(scope="module")
def arch(tmp_path_factory) -> str:
    """A 2-block, 32-wide ViT-B-32-shaped architecture registered with open_clip (its config registry is global)."""
    path = tmp_path_factory.mktemp("open-clip-configs")
    (path / f"{ARCH}.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(path)
    return ARCH


def sample_photo() -> Image.Image:
    return Image.open(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg")


def test_arch_without_tag_is_random_from_the_seed_and_pools_its_tokens(arch):
    bb = load_backbone(f"open_clip:{arch}", pooling="cls")
    visual = bb.model
    x = torch.randn(2, 3, 32, 32)
    # The tower's own embedding is its post-normed class token times `proj`.
    torch.testing.assert_close(bb(x) @ visual.proj, visual(x))
    visual.output_tokens = True
    _, patches = visual(x)
    visual.output_tokens = False
    mean = load_backbone(f"open_clip:{arch}", pooling="mean", layers=[0, -1])
    assert mean.dim == 64 and len(mean.blocks) == 2
    torch.testing.assert_close(mean(x)[:, 32:], patches.mean(1))
    pooler = load_backbone(f"open_clip:{arch}", pooling="pooler")
    assert pooler.dim == 16 and "randomly initialised (seed 0)" in pooler.description
    assert bb.fingerprint == pooler.fingerprint != load_backbone(f"open_clip:{arch}", seed=1).fingerprint

    _, _, theirs = open_clip.create_model_and_transforms(arch)
    ours, ref = bb.preprocess(sample_photo()), theirs(sample_photo())
    assert ours.shape == ref.shape == (3, 32, 32)
    # PIL and torchvision resample to uint8 with at most one level of difference on a pixel.
    assert (ours - ref).abs().max() <= 1 / 255 / min(bb.preprocess.std) + 1e-6


def test_weights_file_loads_exactly(arch, tmp_path):
    torch.manual_seed(3)
    model = open_clip.create_model(arch)
    torch.save(model.state_dict(), tmp_path / "tiny.pt")
    bb = load_backbone(f"open_clip:{arch}/{tmp_path}/tiny.pt", pooling="pooler")
    assert weights_fingerprint(bb.model) == weights_fingerprint(model.visual)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(bb(x), model.visual.eval()(x))
    assert f"weights file {tmp_path}/tiny.pt" in bb.description


def test_local_dir_carries_its_preprocessing(arch, tmp_path):
    model = open_clip.create_model(arch)
    torch.save(model.state_dict(), tmp_path / "open_clip_pytorch_model.bin")
    cfg = {"model_cfg": TINY, "preprocess_cfg": {"mean": [0.5] * 3, "std": [0.25] * 3, "resize_mode": "squash",
                                                 "interpolation": "bilinear"}}
    (tmp_path / "open_clip_config.json").write_text(json.dumps(cfg))
    bb = load_backbone(f"open_clip:local-dir:{tmp_path}", pooling="pooler")
    pre = bb.preprocess
    assert (pre.mean, pre.std, pre.resize_mode, pre.interpolation) == ((0.5,) * 3, (0.25,) * 3, "square", "bilinear")
    assert weights_fingerprint(bb.model) == weights_fingerprint(model.visual)


def test_errors_name_the_known_architectures_and_tags(arch, tmp_path):
    with pytest.raises(ValueError, match=f"no architecture 'headprobe-test-vt'.*Did you mean '{arch}'"):
        load_backbone("open_clip:headprobe-test-vt")
    with pytest.raises(ValueError, match=r"'opena' is neither a weights file nor a pretrained tag of ViT-B-32; "
                                         r"tags: openai, .*Did you mean 'openai'"):
        load_backbone("open_clip:ViT-B-32/opena")
    with pytest.raises(BackboneNotFoundError, match="weights file 'missing.pt' does not exist"):
        load_backbone(f"open_clip:{arch}/missing.pt")
    with pytest.raises(ValueError, match=r"pooling 'pooler' .* cannot be combined with layer/layers"):
        load_backbone(f"open_clip:{arch}", pooling="pooler", layer=0)
