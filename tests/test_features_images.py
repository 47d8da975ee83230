"""A file that cannot be decoded is named in the error, in clean and augmented extraction alike (#18)."""

import numpy as np
import pytest
from PIL import Image

from headprobe import run
from headprobe.stages import RunError


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
