"""Your own network in a headprobe run, and the run's trained heads back in your code; offline, about a minute on
2 CPU cores (`python examples/own_model.py`; the test suite runs it too).

A bare `torch.nn.Module` gets headprobe's contract: pixels (B, 3, H, W) centre-cropped to `backbone.resolution` px
(default 224) and normalised with the ImageNet mean and std in, one feature vector per image (B, D) out. To choose
the preprocessing, wrap it: `headprobe.load_backbone(module=net, preprocess=headprobe.Preprocess(...), dim=D)`.
The same network can be a plug-in that `headprobe run` finds by name: examples/plugin/.
"""

import torch
from torch import nn

import headprobe

net = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
                    nn.AdaptiveAvgPool2d(1), nn.Flatten())  # (B, 3, 32, 32) -> (B, 32)
recipe = {
    "name": "own_model",
    "backbone": {"resolution": 32},  # the crop the bare module gets
    "data": {"source": "sklearn-digits", "limit": {"train": 300, "test": 150}},
    "heads": [{"name": "mlp", "type": "mlp", "depth": 2, "width": 64, "act": "swish"}],
    "augment": {"preset": "crop-flip", "views": 2},
    "train": {"epochs": 3, "batch_size": 64},
    "probes": {"linear": {}, "knn": {"ks": [5, 20]}},
    "report": False,
}
results = headprobe.run(recipe, backbone=net, out="runs/own_model", quiet=True)
print("backbone", results["backbone"]["id"], results["backbone"]["dim"])
for tap in ("backbone", "mlp@1", "mlp"):
    print(tap, "linear.acc", round(results.metrics(tap)["linear.acc"], 3), "knn.k20.acc",
          round(results.metrics(tap)["knn.k20.acc"], 3))

# The trained head, as a torch module for your own pipeline: backbone features (N, 32) -> head output (N, 64).
heads = headprobe.load_heads("runs/own_model")
backbone = headprobe.load_backbone(module=net, dim=32, preprocess=headprobe.Preprocess(
    resize=37, crop=32, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)))
with torch.no_grad():
    features = backbone(torch.randn(4, 3, 32, 32))
    print("head output", tuple(heads["mlp"](features).shape))
