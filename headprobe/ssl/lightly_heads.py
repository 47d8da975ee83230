"""Which of lightly's head classes a ``ProjectionHead.layers`` state dict can be, and so which activation it computes.

lightly's ``ProjectionHead`` (``lightly/models/modules/heads.py``) is an ``nn.Sequential`` of blocks ``Linear`` (bias
only where no norm follows, unless the class says otherwise) → norm → activation. Linears and norms leave tensors;
the activation leaves none, so a checkpoint shows where each activation is but not which it is. MSN's head (BN,
GELU) has Barlow Twins' and VICReg's layout (BN, ReLU); LeWM's has BYOL's, TiCo's and SwaV's. The layout is written
as one token per block — ``L`` (Linear), ``b`` (with bias), ``+BN`` / ``+BNp`` (BatchNorm1d, affine=False) /
``+LN``, ``+A`` (an activation) — and matched against each class's constructor, read from lightly 1.6's heads.py.
Where every class with the layout computes the same activation, the layout says which; otherwise it must be said
(the Lightning checkpoint's ``hyper_parameters`` naming the class, or the recipe's ``heads[i].act``).

>>> candidates("L+BN+A L+BN+A Lb")
['BarlowTwinsProjectionHead', 'LeJEPAProjectionHead', 'MSNProjectionHead', 'VICRegProjectionHead']
>>> sorted({ACTIVATION[c] for c in candidates("L+BN+A L+BN+A Lb")})
['gelu', 'relu']
"""

from __future__ import annotations

import re

__all__ = ["ACTIVATION", "LAYOUTS", "NOT_PROJECTION_HEADS", "candidates"]

# class → (activation, the layouts its constructor can build). MoCo/SimCLR: num_layers >= 2, batch_norm on every
# layer or none; VICReg/LeJEPA: num_layers >= 2; MMCR: num_layers hidden blocks, use_bias and batch_norm throughout.
CLASSES: dict[str, tuple[str, str]] = {
    "BarlowTwinsProjectionHead": ("relu", r"L\+BN\+A L\+BN\+A Lb"),
    "BYOLProjectionHead": ("relu", r"L\+BN\+A Lb"),
    "BYOLPredictionHead": ("relu", r"L\+BN\+A Lb"),
    "DenseCLProjectionHead": ("relu", r"Lb\+A Lb"),
    "LeJEPAProjectionHead": ("relu", r"(L\+BN\+A )+Lb"),
    "LeWMProjectionHead": ("gelu", r"L\+BN\+A Lb|Lb\+A Lb"),
    "MMCRProjectionHead": ("relu", r"(L\+BN\+A )+L|(Lb\+BN\+A )+Lb|(L\+A )+L|(Lb\+A )+Lb"),
    "MoCoProjectionHead": ("relu", r"(L\+BN\+A )+L\+BN|(Lb\+A )+Lb"),
    "MSNProjectionHead": ("gelu", r"L\+BN\+A L\+BN\+A Lb"),
    "NNCLRPredictionHead": ("relu", r"L\+BN\+A Lb"),
    "NNCLRProjectionHead": ("relu", r"L\+BN\+A L\+BN\+A L\+BN"),
    "SimCLRProjectionHead": ("relu", r"(L\+BN\+A )+L\+BN|(Lb\+A )+Lb"),
    "SimSiamPredictionHead": ("relu", r"L\+BN\+A Lb"),
    "SimSiamProjectionHead": ("relu", r"L\+BN\+A L\+BN\+A L\+BNp"),
    "SMoGPredictionHead": ("relu", r"L\+BN\+A Lb"),
    "SMoGProjectionHead": ("relu", r"L\+BN\+A L\+BNp"),
    "SwaVProjectionHead": ("relu", r"L\+BN\+A Lb"),
    "TiCoProjectionHead": ("relu", r"L\+BN\+A Lb"),
    "VICRegProjectionHead": ("relu", r"(L\+BN\+A )+Lb"),
    "VicRegLLocalProjectionHead": ("relu", r"L\+LN\+A L\+LN\+A Lb"),
}
ACTIVATION = {name: act for name, (act, _) in CLASSES.items()}
LAYOUTS = {name: re.compile(layout) for name, (_, layout) in CLASSES.items()}

# lightly's heads that are not a ProjectionHead's `layers` and are refused: their tensors lie outside `layers`.
NOT_PROJECTION_HEADS = {
    "DINOProjectionHead": "a weight-normed last_layer after the layers (DINO's own format, ssl:dino, reads DINO's)",
    "DINOv2ProjectionHead": "a weight-normed last_layer after the layers",
    "CAPIProjectionHead": "one Linear of cluster prototypes, 'layer'",
    "SwaVPrototypes": "prototype Linears, 'heads'",
    "SMoGPrototypes": "group features, 'group_features'",
}


def candidates(layout: str) -> list[str]:
    """lightly's head classes whose constructor can build `layout` (block tokens, e.g. ``"L+BN+A Lb"``)."""
    return sorted((name for name, pattern in LAYOUTS.items() if pattern.fullmatch(layout)), key=str.lower)
