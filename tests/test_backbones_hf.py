"""hf:<dir> backbones through the same code path as hub ids, on tiny checkpoints built from configs."""

import dataclasses

import pytest
import torch
from PIL import Image

from headprobe.backbones import BackboneNotFoundError, Preprocess, load_backbone

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def _image(w=40, h=30, mode="RGB"):
    g = torch.Generator().manual_seed(0)
    arr = (torch.rand(h, w, 3, generator=g) * 255).to(torch.uint8).numpy()
    return Image.fromarray(arr).convert(mode)


def test_dinov2_poolings_match_the_hidden_states(tiny_dinov2):
    bb = load_backbone(f"hf:{tiny_dinov2}", pooling="cls+mean")
    x = torch.stack([bb.preprocess(_image()), bb.preprocess(_image(60, 20, "L"))])
    assert x.shape == (2, 3, 28, 28)
    tokens = bb.model(pixel_values=x).last_hidden_state
    out = bb(x)
    assert bb.dim == 64 and out.shape == (2, 64)
    torch.testing.assert_close(out[:, :32], tokens[:, 0])
    torch.testing.assert_close(out[:, 32:], tokens[:, 1:].mean(1))
    assert not any(p.requires_grad for p in bb.parameters()) and not bb.model.training
    assert len(bb.blocks) == 2 and bb.params == sum(p.numel() for p in bb.model.parameters())


def test_preprocessing_comes_from_the_checkpoint(tiny_dinov2):
    bb = load_backbone(f"hf:{tiny_dinov2}")
    described = {f.name: getattr(bb.preprocess, f.name) for f in dataclasses.fields(Preprocess)}
    assert described == dict(resize=32, crop=28, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                             interpolation="bicubic", resize_mode="shortest")
    d = bb.describe()
    assert d["id"] == f"hf:{tiny_dinov2}" and len(d["fingerprint"]) == 16 and "BitImageProcessor" in d["description"]
    # A constant image normalises to (value - mean) / std exactly.
    pixels = bb.preprocess(Image.new("RGB", (50, 40), (255, 0, 0)))
    torch.testing.assert_close(pixels[:, 5, 5], torch.tensor([(1 - 0.485) / 0.229, -0.456 / 0.224, -0.406 / 0.225]))


def test_resolution_override_keeps_resize_ratio(tiny_dinov2):
    bb = load_backbone(f"hf:{tiny_dinov2}", resolution=56)
    assert (bb.preprocess.resize, bb.preprocess.crop) == (64, 56)
    assert bb(bb.preprocess(_image()).unsqueeze(0)).shape == (1, 32)
    with pytest.raises(ValueError, match="not a multiple of the patch size 14"):
        load_backbone(f"hf:{tiny_dinov2}", resolution=30)


def test_registers_are_excluded_from_the_patch_mean(tmp_path):
    from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

    Dinov2WithRegistersModel(Dinov2WithRegistersConfig(**TINY, image_size=28, patch_size=14, num_register_tokens=4)
                             ).save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="no image-processor config"):  # none saved: says so (test_backbones_processor)
        bb = load_backbone(f"hf:{tmp_path}", pooling="mean")
    assert "default" in bb.description
    x = torch.randn(2, 3, 28, 28)
    tokens = bb.model(pixel_values=x).last_hidden_state
    assert tokens.shape[1] == 1 + 4 + 4
    torch.testing.assert_close(bb(x), tokens[:, 5:].mean(1))


def test_vit_square_resize_and_interpolated_positions(tmp_path):
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    ViTModel(ViTConfig(**TINY, image_size=32, patch_size=8), add_pooling_layer=False).save_pretrained(tmp_path)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    bb = load_backbone(f"hf:{tmp_path}", pooling="mean", resolution=48)
    assert bb.preprocess.resize_mode == "square" and bb.preprocess.interpolation == "bilinear"
    x = bb.preprocess(_image(70, 50)).unsqueeze(0)
    assert x.shape == (1, 3, 48, 48) and bb(x).shape == (1, 32)


def test_clip_checkpoint_gives_the_post_normed_vision_tower(tmp_path):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    config = CLIPConfig(
        text_config={**TINY, "vocab_size": 100, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1},
        vision_config={**TINY, "image_size": 32, "patch_size": 8},
        projection_dim=16,
    )
    clip = CLIPModel(config)
    clip.save_pretrained(tmp_path)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    bb = load_backbone(f"hf:{tmp_path}", pooling="cls")
    assert type(bb.model).__name__ == "CLIPVisionModel"
    x = torch.randn(2, 3, 32, 32)
    # The class-token feature is CLIP's own pooled output (post-layernormed class token).
    torch.testing.assert_close(bb(x), clip.vision_model(pixel_values=x).pooler_output)


@pytest.mark.slow
def test_missing_model_says_where_it_looked_and_what_to_do(tmp_path):
    with pytest.raises(BackboneNotFoundError, match=r"not in the Hugging Face cache.*HF_HUB_OFFLINE=1.*hf download"):
        load_backbone("hf:no-such-org/no-such-model")
    with pytest.raises(ValueError, match="unknown backbone source 'timmy'"):
        load_backbone("timmy:resnet50")


def test_wrap_a_user_module():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 5))
    pre = Preprocess(resize=8, crop=8, mean=(0.5,) * 3, std=(0.5,) * 3)
    bb = load_backbone(module=net, preprocess=pre, dim=5)
    x = pre(_image()).unsqueeze(0)
    torch.testing.assert_close(bb(x), net(x))
    with pytest.raises(ValueError, match="module=, preprocess= and dim="):
        load_backbone(module=net)
    wrong = load_backbone(module=net, preprocess=pre, dim=100)  # the module returns 5 numbers per image
    with pytest.raises(ValueError, match=r"shape \(1, 5\) for 1 images, but declares \(B, 100\).*dim=5"):
        wrong(x)
