"""Projection heads and predictors, with every layer's output exposed as a tap.

The paper's heads: ``Linear(d→w, no bias) → [BN] → act → Linear(w→w) → [BN]``; the "linear"
head is bias-free linear layers with nothing in between; ``depth`` counts linear layers.
A bias directly before a BatchNorm is redundant (BN subtracts the mean), so it is dropped.
Why not lightly's head classes (`ProjectionHead` and its subclasses): they return only the last layer's output,
where the probes need every layer's.

>>> head = ProjectionHead(384, depth=2, width=64, out_dim=32, act="swish")
>>> [t.shape[-1] for t in head.taps(torch.randn(4, 384))]
[64, 32]
"""

from __future__ import annotations

import torch
from torch import nn

from headprobe.registry import ACTIVATIONS, HEADS


def built_in_kinds() -> list[str]:
    """The head types `ProjectionHead` builds: those the HEADS registry (their one declaration) maps to
    `projection_head`."""
    return [name for name in HEADS.names() if HEADS.entry(name).target == f"{__name__}:projection_head"]


def projection_head(in_dim: int, spec) -> ProjectionHead:
    """The built-in head types (`identity`, `linear`, `mlp`) from a recipe's head spec: what the HEADS registry
    builds for them. A plug-in head type registers its own function with this signature, returning a module with
    ``taps(x)`` (every layer's output, the last the head's), ``depth`` (how many taps) and ``out_dim``."""
    return ProjectionHead(
        in_dim, kind=spec.type, depth=spec.depth, width=spec.width, out_dim=spec.out_dim, act=spec.act,
        bn_hidden=spec.bn_hidden, bn_out=spec.bn_out, l2_out=spec.l2_out, init_scale=spec.init_scale,
    )


class ProjectionHead(nn.Module):
    """``depth`` linear layers; hidden layers are ``Linear → [BN] → act``, the last ``Linear → [BN]``.

    x: (B, in_dim) → (B, out_dim). `taps(x)` returns the output of every layer (hidden layers after
    their activation), so tap ``HEAD@i`` is hidden layer i and tap ``HEAD`` the output.
    `kind="linear"` means bias-free linear layers only (no BN, no activation), as in the paper.
    `kind="identity"` has no layers: its output is its input.
    `init_scale` multiplies every initial weight (0.1 starts near the paper's collapsed state).
    """

    def __init__(
        self,
        in_dim: int,
        *,
        kind: str = "mlp",
        depth: int = 2,
        width: int = 2048,
        out_dim: int | None = None,
        act: str = "relu",
        bn_hidden: bool = True,
        bn_out: bool = False,
        l2_out: bool = False,
        init_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if kind not in (kinds := built_in_kinds()):
            raise ValueError(f"head type {kind!r} is unknown; use one of {', '.join(kinds)}.")
        if act not in ACTIVATIONS:
            raise ValueError(f"activation {act!r} is unknown; use one of {', '.join(ACTIVATIONS.names())}.")
        if kind != "identity" and depth < 1:
            raise ValueError(f"depth must be at least 1 linear layer, got {depth}.")
        if in_dim < 1 or width < 1 or (out_dim is not None and out_dim < 1):
            raise ValueError(f"dimensions must be positive (in_dim={in_dim}, width={width}, out_dim={out_dim}).")
        self.kind, self.in_dim, self.l2_out = kind, in_dim, l2_out
        out_dim = out_dim or width
        self.layers = nn.ModuleList()
        if kind == "identity":
            self.out_dim = in_dim
            return
        dims = [in_dim] + [width] * (depth - 1) + [out_dim]
        for i in range(depth):
            last = i == depth - 1
            if kind == "linear":
                block = [nn.Linear(dims[i], dims[i + 1], bias=False)]
            else:
                bn = bn_out if last else bn_hidden
                block = [nn.Linear(dims[i], dims[i + 1], bias=not bn)]
                if bn:
                    block.append(nn.BatchNorm1d(dims[i + 1]))
                if not last:
                    block.append(ACTIVATIONS.get(act)())
            self.layers.append(nn.Sequential(*block))
        self.out_dim = out_dim
        if init_scale != 1.0:
            with torch.no_grad():
                for m in self.modules():
                    if isinstance(m, nn.Linear):
                        m.weight.mul_(init_scale)

    @property
    def depth(self) -> int:
        return len(self.layers)

    def taps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x: (B, in_dim) → [hidden_1, ..., hidden_{depth-1}, output]; empty for the identity head."""
        outs = []
        for layer in self.layers:
            x = layer(x)
            outs.append(x)
        if outs and self.l2_out:
            outs[-1] = nn.functional.normalize(outs[-1], dim=-1)
        return outs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = self.taps(x)
        return outs[-1] if outs else x


class Predictor(nn.Module):
    """SimSiam/BYOL bottleneck predictor: ``Linear(d→w) → BN → ReLU → Linear(w→d)``; (B, d) → (B, d)."""

    def __init__(self, dim: int, width: int = 512) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, width, bias=False), nn.BatchNorm1d(width), nn.ReLU(),
                                 nn.Linear(width, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def freeze_unidentified_bias(head: nn.Module, objective) -> bool:
    """Under an objective that does not change when every output is shifted by one vector (`shift_invariant` on its
    function: VICReg, Barlow Twins), the last layer's bias has zero gradient but for rounding noise; Adam scales that
    noise to steps of the learning rate's size, so the bias would drift with the order of float reductions (1 thread
    against 2: 1.3% apart after 6 steps), and with it every measure that is not translation-invariant (k-NN, align,
    uniform). That bias keeps its initial value instead (`requires_grad` off; the optimiser skips it), the same
    value the head's untrained copy has; the official VICReg and Barlow Twins projectors have no last-layer bias at
    all. Returns whether a bias was frozen (a `ProjectionHead` whose output layer has one)."""
    if not getattr(objective, "shift_invariant", False) or not isinstance(head, ProjectionHead) or not head.layers:
        return False
    bias = head.layers[-1][0].bias
    if bias is None:
        return False
    bias.requires_grad_(False)
    return True


def registered_head(spec, in_dim: int) -> nn.Module:
    """A head of the type `spec.type` from the HEADS registry, built-in (`projection_head`) or registered by a
    plug-in (`headprobe.plugins`): ``factory(in_dim, spec)``, checked to be a module with ``taps(x)`` (every layer's
    output), ``depth`` and ``out_dim``, as `ProjectionHead` has."""

    head = HEADS.get(spec.type)(in_dim, spec)
    lacking = [a for a in ("taps", "depth", "out_dim") if not hasattr(head, a)]
    if not isinstance(head, nn.Module) or lacking:
        raise TypeError(f"head type {spec.type!r} (a plug-in) built {type(head).__name__}, which lacks "
                        f"{', '.join(lacking) or 'torch.nn.Module'}; its factory must return a torch.nn.Module with "
                        "taps(x) (every layer's output), depth and out_dim, as headprobe.ProjectionHead has.")
    return head
