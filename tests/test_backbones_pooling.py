"""Poolings and intermediate layers: hf hidden states through the final norm, SigLIP without a class token."""

import pytest
import torch

from headprobe.backbones import load_backbone
from headprobe.backbones.pooling import FINAL, resolve_layers

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def test_layer_indices_resolve_and_errors_name_the_range():
    assert resolve_layers("m", FINAL, None, 12) == [FINAL]
    assert resolve_layers("m", FINAL, [-4, 0, -1], 12) == [8, 0, FINAL]
    with pytest.raises(ValueError, match="layer 12 is out of range; this model has 12 blocks, so use -12..11"):
        resolve_layers("m", 12, None, 12)
    with pytest.raises(ValueError, match="either layer"):
        resolve_layers("m", 3, [1], 12)
    with pytest.raises(ValueError, match="same block twice"):
        resolve_layers("m", FINAL, [1, -11], 12)


def test_dinov2_intermediate_layers_use_the_final_norm(tiny_dinov2):
    bb = load_backbone(f"hf:{tiny_dinov2}", pooling="cls", layers=[0, -1])
    x = torch.randn(2, 3, 28, 28)
    out = bb.model(pixel_values=x, output_hidden_states=True)
    norm = bb.model.layernorm
    torch.testing.assert_close(bb(x), torch.cat([norm(out.hidden_states[1])[:, 0], out.last_hidden_state[:, 0]], 1))
    assert bb.dim == 64 and bb.options["layers"] == [0, -1]
    # Block 1 of 2 is the last block: same features as layer -1.
    torch.testing.assert_close(load_backbone(f"hf:{tiny_dinov2}", layer=1)(x), out.last_hidden_state[:, 0])
    with pytest.raises(ValueError, match="layer 2 is out of range; this model has 2 blocks"):
        load_backbone(f"hf:{tiny_dinov2}", layer=2)


@pytest.fixture(scope="module")
def tiny_siglip(tmp_path_factory) -> str:
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    path = tmp_path_factory.mktemp("tiny-siglip")
    torch.manual_seed(0)
    SiglipVisionModel(SiglipVisionConfig(**TINY, image_size=32, patch_size=8)).save_pretrained(path)
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    return str(path)


def test_siglip_has_no_class_token_and_a_pooling_head(tiny_siglip):
    with pytest.raises(ValueError, match=r"has no class token: pooling 'cls' is undefined; supported poolings: "
                                         r"mean, pooler\."):
        load_backbone(f"hf:{tiny_siglip}", pooling="cls")
    bb = load_backbone(f"hf:{tiny_siglip}", pooling="mean")
    assert bb.preprocess.resize_mode == "square" and bb.preprocess.mean == (0.5, 0.5, 0.5)
    x = torch.randn(2, 3, 32, 32)
    out = bb.model(pixel_values=x, output_hidden_states=True)
    # last_hidden_state is already post-layernormed: every one of the 16 tokens is a patch, normalised once.
    torch.testing.assert_close(bb(x), out.last_hidden_state.mean(1))
    early = load_backbone(f"hf:{tiny_siglip}", pooling="mean", layer=0)
    torch.testing.assert_close(early(x), bb.model.post_layernorm(out.hidden_states[1]).mean(1))
    pooler = load_backbone(f"hf:{tiny_siglip}", pooling="pooler")
    torch.testing.assert_close(pooler(x), out.pooler_output)
    assert pooler.dim == 32


def test_vit_without_pooling_layer_says_which_poolings_exist(tmp_path):
    from transformers import ViTConfig, ViTModel

    ViTModel(ViTConfig(**TINY, image_size=32, patch_size=8), add_pooling_layer=False).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"no pooled output of its own: .* supported poolings: cls, mean, cls\+mean"):
        load_backbone(f"hf:{tmp_path}", pooling="pooler")
