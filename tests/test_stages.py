"""The stages a run is composed of (headprobe/pipeline/stages.py)."""

import datasets
import numpy as np
from PIL import Image

from headprobe.pipeline.stages import grey_params


def test_colour_augmentations_are_inert_on_grey_images_only():
    grey = np.random.default_rng(0).integers(0, 255, (4, 8, 8), dtype=np.uint8)
    images = [Image.fromarray(g) for g in grey]  # mode "L", as sklearn-digits and Fashion-MNIST load
    inert = grey_params(datasets.Dataset.from_dict({"image": images, "label": [0, 1, 0, 1]}))
    assert set(inert) == {"saturation", "hue", "grayscale"} and "grey" in inert["hue"]
    colour = [Image.fromarray(np.stack([g, g, 255 - g], axis=-1)) for g in grey]
    assert grey_params(datasets.Dataset.from_dict({"image": colour, "label": [0, 1, 0, 1]})) is None
