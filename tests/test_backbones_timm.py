"""timm:<name>[/<file> or /random] through timm.create_model, with timm's own data config and transform."""

from pathlib import Path

import matplotlib
import pytest
import torch
from PIL import Image

from headprobe.backbones import BackboneNotFoundError, load_backbone
from headprobe.backbones.base import weights_fingerprint

timm = pytest.importorskip("timm")


def sample_photo() -> Image.Image:
    """A real photograph that ships with matplotlib (Grace Hopper, 512x600)."""
    return Image.open(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg")


def assert_same_transform(ours: torch.Tensor, theirs: torch.Tensor, std: tuple) -> None:
    # PIL and torchvision resample to uint8 with at most one level of difference on a pixel.
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max() <= 1 / 255 / min(std) + 1e-6
    assert (ours - theirs).abs().mean() < 1e-3


def test_vit_from_a_weights_file_equals_timm(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ref = timm.create_model("test_vit", pretrained=False).eval()  # with its 1000-class head: dropped on load
    save_file(ref.state_dict(), tmp_path / "w.safetensors")
    bb = load_backbone(f"timm:test_vit/{tmp_path}/w.safetensors", pooling="cls")
    assert weights_fingerprint(bb.model) != weights_fingerprint(ref)  # the classifier is gone ...
    ref.reset_classifier(0)
    assert weights_fingerprint(bb.model) == weights_fingerprint(ref)  # ... and everything else is equal
    x = torch.randn(2, 3, 160, 160)
    tokens = ref.forward_features(x)
    torch.testing.assert_close(bb(x), tokens[:, 0])
    mean = load_backbone(f"timm:test_vit/{tmp_path}/w.safetensors", pooling="mean")
    torch.testing.assert_close(mean(x), tokens[:, ref.num_prefix_tokens:].mean(1))
    assert len(bb.blocks) == len(ref.blocks) and bb.dim == ref.num_features

    theirs = timm.data.create_transform(**timm.data.resolve_model_data_config(ref))
    assert_same_transform(bb.preprocess(sample_photo()), theirs(sample_photo()), bb.preprocess.std)
    assert bb.preprocess.resize == 168 and bb.preprocess.crop == 160  # floor(160 / crop_pct 0.95)


def test_cnn_features_are_feature_maps_pooled_by_mean():
    bb = load_backbone("timm:test_resnet/random", pooling="mean", layers=[0, -1])
    x = torch.randn(2, 3, 160, 160)
    fmap = bb.model.forward_features(x)
    first = bb.blocks[0](bb.model.maxpool(bb.model.act1(bb.model.bn1(bb.model.conv1(x)))))
    torch.testing.assert_close(bb(x), torch.cat([first.mean((2, 3)), fmap.mean((2, 3))], 1))
    assert bb.dim == first.shape[1] + bb.model.num_features
    pooled = load_backbone("timm:test_resnet/random", pooling="pooler")
    torch.testing.assert_close(pooled(x), pooled.model(x))
    with pytest.raises(ValueError, match=r"is a CNN.*pooling 'cls' is undefined; supported poolings: mean, pooler"):
        load_backbone("timm:test_resnet/random", pooling="cls")
    theirs = timm.data.create_transform(**timm.data.resolve_model_data_config(bb.model))
    assert bb.preprocess.interpolation == "bilinear"
    assert_same_transform(bb.preprocess(sample_photo()), theirs(sample_photo()), bb.preprocess.std)


def test_random_weights_come_from_the_seed():
    a, b = load_backbone("timm:test_vit/random"), load_backbone("timm:test_vit/random")
    assert a.fingerprint == b.fingerprint != load_backbone("timm:test_vit/random", seed=1).fingerprint
    assert "seed 0" in a.description


def test_errors_say_what_to_do(tmp_path, monkeypatch):
    import huggingface_hub.constants

    # The hub reads HF_HUB_OFFLINE when imported; force it so no download is even attempted.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(BackboneNotFoundError, match=r"not in the Hugging Face cache.*timm.create_model\('test_vit'"):
        load_backbone("timm:test_vit")  # HF_HUB_OFFLINE=1 in tests, nothing cached
    with pytest.raises(ValueError, match="no architecture 'test_vitt'.*Did you mean 'test_vit'"):
        load_backbone("timm:test_vitt/random")
    with pytest.raises(BackboneNotFoundError, match="weights file .* does not exist"):
        load_backbone(f"timm:test_vit/{tmp_path}/none.safetensors")
    torch.save(timm.create_model("test_resnet", num_classes=0).state_dict(), tmp_path / "resnet.pth")
    with pytest.raises(ValueError, match="does not match the architecture: missing"):
        load_backbone(f"timm:test_vit/{tmp_path}/resnet.pth")
    with pytest.raises(ValueError, match="does not take option.*revision"):
        load_backbone("timm:test_vit/random", revision="main")
