"""Heads that self-supervised pretraining ended with, rebuilt from its checkpoint, with headprobe's tap interface.

Like `headprobe.train.heads.ProjectionHead`, each has `depth`, `in_dim`, `out_dim`, `taps(x)` (every layer's output,
in order: tap ``HEAD@i`` is ``taps(x)[i-1]`` and tap ``HEAD`` the last) and `forward(x) = taps(x)[-1]`.
`tap_labels` names each tap in the paper's words, and `expects` says which backbone features the head was
trained on (the pipeline should refuse any other pooling or layer).
"""

from __future__ import annotations

import torch
from torch import nn


class WeightNormLinear(nn.Module):
    """``nn.utils.weight_norm(nn.Linear(d, k, bias=False))`` as DINO saves it: ``weight_g`` (k, 1), ``weight_v``
    (k, d); the weight is ``g · v / ‖v‖`` with the norm of each output row."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.weight_g = nn.Parameter(torch.ones(out_dim, 1))
        self.weight_v = nn.Parameter(torch.empty(out_dim, in_dim))
        nn.init.normal_(self.weight_v, std=in_dim ** -0.5)

    @property
    def weight(self) -> torch.Tensor:
        return self.weight_g * self.weight_v / self.weight_v.norm(dim=1, keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, d) → (B, k)."""
        return x @ self.weight.T


class DINOProjectionHead(nn.Module):
    """DINO's head (``vision_transformer.DINOHead``): an MLP ``Linear → [BN] → GELU → … → Linear`` to the
    bottleneck, L2 normalisation, then a weight-normalised bias-free linear layer onto the prototypes.

    "The projection head consists of a 3-layer multi-layer perceptron (MLP) with hidden dimension 2048 followed
    by ℓ2 normalization and a weight normalized fully connected layer with K dimensions" (Caron et al., 2021).

    Module names are DINO's (``mlp.0``, ``mlp.2``, ``mlp.4``, ``last_layer.weight_g``, ``last_layer.weight_v``;
    with BN ``mlp.0, mlp.1 (BN), mlp.3, …``; one layer: ``mlp`` is the Linear itself). Taps: each hidden layer
    after its GELU, the L2-normalised bottleneck, the prototype logits; `depth` = MLP layers + 1.

    >>> head = DINOProjectionHead(384, hidden_dim=2048, bottleneck_dim=256, out_dim=65536, nlayers=3)
    >>> [t.shape[-1] for t in head.taps(torch.zeros(2, 384))]
    [2048, 2048, 256, 65536]
    """

    def __init__(self, in_dim: int, *, hidden_dim: int, bottleneck_dim: int, out_dim: int, nlayers: int = 3,
                 use_bn: bool = False) -> None:
        super().__init__()
        if nlayers < 1:
            raise ValueError(f"a DINO head has at least one MLP layer, got nlayers={nlayers}.")
        self.in_dim, self.out_dim, self.nlayers, self.use_bn = in_dim, out_dim, nlayers, use_bn
        if nlayers == 1:
            self.mlp: nn.Module = nn.Linear(in_dim, bottleneck_dim)
        else:
            dims = [in_dim] + [hidden_dim] * (nlayers - 1)
            layers: list[nn.Module] = []
            for a, b in zip(dims[:-1], dims[1:], strict=True):
                layers += [nn.Linear(a, b), *([nn.BatchNorm1d(b)] if use_bn else []), nn.GELU()]
            self.mlp = nn.Sequential(*layers, nn.Linear(hidden_dim, bottleneck_dim))
        self.last_layer = WeightNormLinear(bottleneck_dim, out_dim)
        self.tap_labels = [f"mlp{i}" for i in range(1, nlayers)] + ["bottleneck (l2-normalised)", "prototypes"]
        self.expects = {"pooling": "cls", "layer": -1}
        self.activation = "gelu"

    @property
    def depth(self) -> int:
        return self.nlayers + 1

    def taps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x: (B, in_dim) → [hidden_1, …, hidden_{nlayers-1}, z (B, bottleneck) with ‖z‖ = 1, logits (B, K)]."""
        outs = []
        if isinstance(self.mlp, nn.Sequential):
            for layer in self.mlp:
                x = layer(x)
                if isinstance(layer, nn.GELU):
                    outs.append(x)
        else:
            x = self.mlp(x)
        z = nn.functional.normalize(x, dim=-1, p=2)
        return [*outs, z, self.last_layer(z)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.taps(x)[-1]


class SequentialProjector(nn.Sequential):
    """A projector that is an ``nn.Sequential`` of ``Linear``, ``BatchNorm1d`` / ``LayerNorm`` and activations, as
    solo-learn's methods build theirs (``self.projector = nn.Sequential(...)``) and lightly's ``ProjectionHead``
    holds its ``layers``; the indices of the modules are those of the checkpoint's keys.

    Taps: the output of each activation, then the last module's output; `depth` = activations + 1.

    >>> proj = SequentialProjector([nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 16)])
    >>> proj.depth, [t.shape[-1] for t in proj.taps(torch.zeros(2, 512))]
    (2, [64, 16])
    """

    # The activations a projector may hold, by the names `headprobe.train.heads.ACTIVATIONS` gives them.
    NAMES = {nn.ReLU: "relu", nn.GELU: "gelu", nn.SiLU: "swish", nn.Tanh: "tanh"}
    ACTIVATIONS = tuple(NAMES)

    def __init__(self, layers: list[nn.Module]) -> None:
        linears = [m for m in layers if isinstance(m, nn.Linear)]
        if not linears:
            raise ValueError("a projector needs at least one Linear layer.")
        if isinstance(layers[-1], self.ACTIVATIONS):
            raise ValueError("a projector ends with a Linear or a norm layer, not an activation.")
        super().__init__(*layers)
        self.in_dim, self.out_dim = linears[0].in_features, linears[-1].out_features
        n_hidden = sum(isinstance(m, self.ACTIVATIONS) for m in layers)
        self.tap_labels = [f"hidden{i}" for i in range(1, n_hidden + 1)] + ["output"]
        self.expects = {"pooling": "mean", "layer": -1}
        # The activation's name ("relu"), "+"-joined where they differ, "none" without one.
        self.activation = "+".join(dict.fromkeys(self.NAMES[type(m)] for m in layers
                                                 if isinstance(m, self.ACTIVATIONS))) or "none"

    @property
    def depth(self) -> int:
        return len(self.tap_labels)

    def taps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x: (B, in_dim) → [hidden_1 (after its activation), …, output (B, out_dim)]."""
        outs = []
        for layer in self:
            x = layer(x)
            if isinstance(layer, self.ACTIVATIONS):
                outs.append(x)
        return [*outs, x]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.taps(x)[-1]


class BNReLUProjector(SequentialProjector):
    """The VICReg / Barlow Twins projector: ``Linear → BatchNorm1d → ReLU`` per hidden layer, a bias-free last
    ``Linear`` (an ``nn.Sequential`` as theirs, so keys are ``0.weight, 1.running_mean, …``; Barlow's hidden
    Linears have no bias).

    "The projector network … consists of two fully-connected layers of size 8192, each followed by batch
    normalization and ReLU, and a third linear layer of size 8192" (Bardes et al., 2022).
    Taps: each hidden layer after its ReLU, then the output; `depth` = number of Linear layers.

    >>> proj = BNReLUProjector([2048, 8192, 8192, 8192])
    >>> proj.depth, proj.eval().taps(torch.zeros(2, 2048))[-1].shape
    (3, torch.Size([2, 8192]))
    """

    def __init__(self, dims: list[int], *, hidden_bias: bool = True) -> None:
        if len(dims) < 2:
            raise ValueError(f"a projector needs an input and an output width, got {dims}.")
        layers: list[nn.Module] = []
        for a, b in zip(dims[:-2], dims[1:-1], strict=True):
            layers += [nn.Linear(a, b, bias=hidden_bias), nn.BatchNorm1d(b), nn.ReLU()]
        super().__init__([*layers, nn.Linear(dims[-2], dims[-1], bias=False)])
