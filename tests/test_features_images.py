"""A file that cannot be decoded is named in the error, in clean and augmented extraction alike (#18)."""

import numpy as np
import pytest
from PIL import Image

from headprobe import run
from headprobe.pipeline.stages import RunError


def _folder_with_a_truncated_png(root):
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (root / "train" / label).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(root / "train" / label / f"{i}.png")
    bad = root / "train" / "b" / "3.png"
    bad.write_bytes(bad.read_bytes()[:60])  # the header survives, the pixel data does not
    return bad


@pytest.mark.slow
def test_a_truncated_image_is_named(tiny_recipe, tmp_path):
    bad = _folder_with_a_truncated_png(tmp_path / "images")
    # No test split: the truncated file may land in either; both the colour check and extraction name it.
    recipe = {**tiny_recipe, "data": {"source": f"imagefolder:{tmp_path / 'images'}", "test_fraction": 0.25},
              "probes": {"linear": {"C_grid": [1.0]}}, "report": False}
    with pytest.raises(RunError, match=r"cannot be decoded.*replace or remove that file") as err:
        run(recipe, out=tmp_path / "r", quiet=True)
    assert "3.png" in str(err.value) and str(bad.parent.name) in str(err.value)


def test_a_truncated_image_is_named_alike_with_or_without_workers(tmp_path):
    """In a DataLoader worker the error comes back wrapped in torch's traceback text; the user sees the sentence."""
    import datasets
    import torch
    from torch import nn

    from headprobe.backbones.base import IMAGENET_MEAN, IMAGENET_STD, Backbone, Preprocess
    from headprobe.data import load_data
    from headprobe.data.loader import ImageDecodeError
    from headprobe.features.extract import extract
    from headprobe.recipe import DataSpec

    bad = _folder_with_a_truncated_png(tmp_path / "images")
    data = load_data(DataSpec(source=f"imagefolder:{tmp_path / 'images'}", test_fraction=0.25))
    images = datasets.concatenate_datasets([data.train, data.test])  # the bad file is in one of them
    backbone = Backbone(nn.Linear(3, 4), lambda model, pixels: model(pixels.mean(dim=(2, 3))), id="test:mean",
                        dim=4, preprocess=Preprocess(resize=16, crop=16, mean=IMAGENET_MEAN, std=IMAGENET_STD))
    messages = []
    for workers in (0, 1):
        with pytest.raises(ImageDecodeError) as err, torch.no_grad():
            extract(backbone, images, data_info=data.info, split="train", cache=False, num_workers=workers)
        messages.append(str(err.value))
    assert messages[0] == messages[1] and str(bad) in messages[0]
    assert messages[0].endswith("cannot be decoded (OSError: image file is truncated); replace or remove that file.")
