"""A CLIP model's own image projection as a `type: pretrained` head (issue #36): its output equals the library's own
image embedding on the features headprobe taps, for tiny models saved by transformers and by open_clip."""

import json

import pytest
import torch
from PIL import Image

from headprobe import load_backbone, run
from headprobe.backbones.projection import load_image_projection
from headprobe.recipe import RecipeError, load_recipe

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def _image(seed: int = 0) -> Image.Image:
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray((torch.rand(40, 52, 3, generator=g) * 255).to(torch.uint8).numpy())


def _save_clip(path, with_projection_class: bool = False):
    """A tiny CLIP saved by transformers itself: the full CLIPModel (the hub's layout for openai/clip-*), or a
    CLIPVisionModelWithProjection; with CLIP's image processor beside it."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.manual_seed(0)
    vision = {**TINY, "image_size": 32, "patch_size": 8}
    if with_projection_class:
        model = CLIPVisionModelWithProjection(CLIPVisionConfig(**vision, projection_dim=16))
    else:
        model = CLIPModel(CLIPConfig(text_config={**TINY, "vocab_size": 100, "bos_token_id": 0, "eos_token_id": 1,
                                                  "pad_token_id": 1}, vision_config=vision, projection_dim=16))
    model.save_pretrained(path)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(path)
    return model.eval()


def _their_embedding(model, pixels: torch.Tensor) -> torch.Tensor:
    """The image embedding as transformers computes it: visual_projection(pooler_output)."""
    vision = model.vision_model
    with torch.no_grad():
        return model.visual_projection(vision(pixel_values=pixels).pooler_output)


@pytest.mark.parametrize("with_projection_class", [False, True], ids=["CLIPModel", "CLIPVisionModelWithProjection"])
@pytest.mark.parametrize("pooling", ["cls", "pooler"])
def test_the_hf_projection_on_the_tapped_features_is_clips_image_embedding(tmp_path, with_projection_class, pooling):
    model = _save_clip(tmp_path, with_projection_class)
    backbone = load_backbone(f"hf:{tmp_path}", pooling=pooling)
    head = load_image_projection(f"hf:{tmp_path}")
    pixels = torch.stack([backbone.preprocess(_image(s)) for s in range(3)])
    with torch.no_grad():
        ours = head(backbone(pixels))
    torch.testing.assert_close(ours, _their_embedding(model, pixels), atol=1e-5, rtol=1e-5)
    assert head.depth == 1 and [t.shape for t in head.taps(backbone(pixels))] == [(3, 16)]
    assert not any(p.requires_grad for p in head.parameters()) and not head.training
    record = head.record.to_dict()
    assert record["library"] == "transformers" and record["shape"] == [16, 32] and len(record["sha256"]) == 64
    assert pooling in head.expects["pooling"]


def test_a_checkpoint_without_a_projection_is_refused_by_name(tmp_path):
    from transformers import CLIPVisionConfig, CLIPVisionModel, Dinov2Config, Dinov2Model

    CLIPVisionModel(CLIPVisionConfig(**TINY, image_size=32, patch_size=8)).save_pretrained(tmp_path / "bare")
    with pytest.raises(ValueError, match="holds no visual_projection weights .*CLIPVisionModelWithProjection"):
        load_image_projection(f"hf:{tmp_path / 'bare'}")
    Dinov2Model(Dinov2Config(**TINY, image_size=28, patch_size=14)).save_pretrained(tmp_path / "dinov2")
    with pytest.raises(ValueError, match="is a 'dinov2' model, which has no image projection"):
        load_image_projection(f"hf:{tmp_path / 'dinov2'}")
    with pytest.raises(ValueError, match="only hf: \\(CLIP\\) and open_clip: backbones"):
        load_image_projection("offline:dinov2-vits14")


@pytest.fixture(scope="module")
def open_clip_arch(tmp_path_factory):
    open_clip = pytest.importorskip("open_clip")
    arch = "headprobe-projection-vit"
    config = {"embed_dim": 16, "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16,
                                              "patch_size": 8},
              "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 16, "heads": 2, "layers": 1}}
    path = tmp_path_factory.mktemp("open-clip-projection")
    (path / f"{arch}.json").write_text(json.dumps(config))
    open_clip.add_model_config(path)
    return arch


def test_the_open_clip_projection_on_the_tapped_features_is_its_image_embedding(open_clip_arch, tmp_path):
    import open_clip

    torch.manual_seed(1)
    model = open_clip.create_model_and_transforms(open_clip_arch)[0].eval()
    torch.save(model.state_dict(), tmp_path / "tiny.pt")
    id = f"open_clip:{open_clip_arch}/{tmp_path}/tiny.pt"
    backbone = load_backbone(id, pooling="cls")
    head = load_image_projection(id)
    pixels = torch.stack([backbone.preprocess(_image(s)) for s in range(3)])
    with torch.no_grad():
        torch.testing.assert_close(head(backbone(pixels)), model.encode_image(pixels), atol=1e-5, rtol=1e-5)
    assert head.expects["pooling"] == ["cls"] and head.record.to_dict()["library"] == "open_clip"
    # An untagged architecture is random from the seed: the head is the projection of the backbone of that seed.
    random_backbone, random_head = load_backbone(f"open_clip:{open_clip_arch}", seed=3), None
    random_head = load_image_projection(f"open_clip:{open_clip_arch}", seed=3)
    torch.testing.assert_close(random_head.linear.weight, random_backbone.model.proj.detach().t())
    assert not torch.allclose(random_head.linear.weight, head.linear.weight)


def _clip_recipe(path, **backbone) -> dict:
    return {"name": "clip_projection", "backbone": {"id": f"hf:{path}", "pooling": "cls", **backbone},
            "data": {"source": "sklearn-digits", "limit": {"train": 120, "test": 60}},
            "heads": [{"name": "clip", "type": "pretrained"}, {"name": "mlp", "act": "relu", "width": 16}],
            "objective": {"name": "info_nce"}, "augment": {"preset": "rotation", "views": 2},
            "train": {"epochs": 1, "batch_size": 40},
            "probes": {"linear": {"C_grid": [1.0]}, "rotation": {}, "invariance": {}}, "report": False}


@pytest.mark.slow
def test_probe_before_or_after_clips_projection_is_one_run(tmp_path):
    _save_clip(tmp_path / "clip")
    results = run(_clip_recipe(tmp_path / "clip"), out=tmp_path / "r", quiet=True)
    assert {"backbone", "clip", "mlp@1", "mlp"} <= set(results["taps"])
    head = results["heads"]["clip"]
    assert head["train"]["status"] == "pretrained (not trained)" and head["train"]["steps"] == 0
    assert head["checkpoint"]["source"] == "CLIPVisionModelWithProjection.visual_projection"
    for question in ("Q-aug", "Q-inv", "Q-class"):  # answered for the projection like for any head
        assert "clip" in results["claims"][question]["heads"]


def test_a_pretrained_head_on_a_backbone_without_one_is_refused(tmp_path):
    data = _clip_recipe(tmp_path) | {"backbone": {"id": "offline:dinov2-vits14"}}
    with pytest.raises(RecipeError, match="type: pretrained.*CLIP model's image projection"):
        load_recipe(data)


def test_a_head_on_other_features_than_it_was_trained_on_is_refused_naming_the_setting():
    from types import SimpleNamespace

    from headprobe.train.pretrained_heads import check_expected_features

    spec = SimpleNamespace(id="open_clip:x", pooling="mean", layer=-1, layers=None)
    check_expected_features("clip", spec, {"pooling": ["mean"], "layer": -1})
    with pytest.raises(RecipeError, match="trained on 'cls' features, but backbone.pooling = 'mean'; set "
                                          "backbone.pooling: cls"):
        check_expected_features("clip", spec, {"pooling": ["cls"], "layer": -1})
    with pytest.raises(RecipeError, match="final features, but backbone.layer = 1; remove it"):
        check_expected_features("clip", SimpleNamespace(id="x", pooling="mean", layer=1, layers=None),
                                {"pooling": "mean", "layer": -1})


def test_validate_refuses_a_projection_on_a_model_without_one_and_the_wrong_pooling(tmp_path):
    from transformers import Dinov2Config, Dinov2Model

    from headprobe.backbones.hf import PROJECTION_MODEL_TYPES
    from headprobe.recipe.pretrained_heads import PROJECTION_MODEL_TYPES as CHECKED

    assert CHECKED == PROJECTION_MODEL_TYPES  # validate's copy (no model library imported) is the loader's
    Dinov2Model(Dinov2Config(**TINY, image_size=28, patch_size=14)).save_pretrained(tmp_path / "dinov2")
    with pytest.raises(RecipeError, match="a 'dinov2' model, which has no image projection"):
        load_recipe(_clip_recipe(tmp_path / "dinov2"))
    _save_clip(tmp_path / "clip")
    load_recipe(_clip_recipe(tmp_path / "clip"))  # accepted
    with pytest.raises(RecipeError, match="takes the post-layernormed class token, but backbone.pooling = 'mean'"):
        load_recipe(_clip_recipe(tmp_path / "clip", pooling="mean"))
