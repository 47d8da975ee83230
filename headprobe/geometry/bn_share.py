"""The head's BatchNorm as its own share of the M-term: vᵀMv split exactly into the activation's part and BatchNorm's.

A head with BatchNorm on batch statistics is h(z) = W₂ σ(γ ⊙ (W₁z − m(Z)) / s(Z) + β) (+ b₂), the mean m and the
spread s = √(var + ε) those of the whole batch Z the sample belongs to. Its M-term at g = ∇_h L,
M = ∇²_z (gᵀ h(z)), has two sources: σ'' (the activation's curvature) and the second derivatives of m(Z) and s(Z)
(BatchNorm's: 1/s is smooth in every sample of the batch, so even a ReLU head has M ≠ 0). `head_bn_split` uses the
decomposition

    M = M_act + M_bn,   M_act = ∇²_z (gᵀ h_frozen(z)),   M_bn = M − M_act,

where h_frozen is the head with every BatchNorm in eval mode and its running statistics set to the statistics it
normalises with at this batch (per view: each view goes through the head on its own), so h_frozen = h and
∇_z h_frozen = J_h − (the part through m, s) at this point, and h_frozen's curvature is the activation's seen
through fixed affine maps. M_act is exactly 0 for a piecewise-linear activation; M_bn collects every term with a
derivative of the batch statistics, the cross terms with σ'' included. BatchNorm already in eval mode
(running statistics) freezes nothing: M_bn = 0. The split is exact, vᵀMv = vᵀM_act v + vᵀM_bn v, up to round-off.

>>> from torch import nn
>>> head = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2)).double()
>>> z = torch.randn(8, 2, dtype=torch.float64)
>>> out = head_bn_split(head, lambda h: (h ** 2).sum() + h.sum(), z, torch.ones(16, dtype=torch.float64) / 4)
>>> out["rayleigh_head_act"] == 0.0 and out["rayleigh_head_bn"] != 0.0
True
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from headprobe.geometry.hessian import hvp_fn
from headprobe.geometry.pullback import BATCHNORMS


def _uses_batch_statistics(bn: nn.Module) -> bool:
    return bn.training or getattr(bn, "running_mean", None) is None


def frozen_statistics(head: nn.Module, x: torch.Tensor) -> nn.Module:
    """A copy of `head` whose every BatchNorm normalises with fixed statistics: those it normalises `x`: (B, D)
    with now (the batch's mean and biased variance where it uses batch statistics, its running ones otherwise), in
    eval mode. The copy equals the head at x, with the statistics held fixed."""
    frozen = copy.deepcopy(head)
    seen: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}

    def capture(module, inputs, _output):
        if _uses_batch_statistics(module):
            a = inputs[0].detach()
            seen[module] = (a.mean(dim=0), a.var(dim=0, unbiased=False))

    norms = [m for m in frozen.modules() if isinstance(m, BATCHNORMS)]
    hooks = [m.register_forward_hook(capture) for m in norms]
    try:
        with torch.no_grad():
            frozen(x.detach())
    finally:
        for hook in hooks:
            hook.remove()
    for m in norms:
        if m in seen:
            mean, var = seen[m]
            m.track_running_stats = True
            m.running_mean, m.running_var = mean.clone(), var.clone()
            m.momentum = 0.0
    return frozen.eval()


def head_bn_split(head: nn.Module, loss_of_h, z: torch.Tensor, v: torch.Tensor) -> dict:
    """vᵀM_act v ("rayleigh_head_act") and vᵀM_bn v ("rayleigh_head_bn") of the M-term of
    loss_of_h([head(z1); head(z2)]) at the unit vector v: (2B·D,); z = [z1; z2]: (2B, D), the head in the mode it
    is measured in. Their sum is vᵀMv (`gm_split.curvature_shares`' "rayleigh_head"); "frozen_gap" is
    max |h_frozen − h| at z (round-off: the frozen head is the head at this batch)."""
    z = z.detach()
    n = z.shape[0] // 2
    frozen = [frozen_statistics(head, z[:n]), frozen_statistics(head, z[n:])]

    def pair(x: torch.Tensor, first: nn.Module, second: nn.Module) -> torch.Tensor:
        return torch.cat([first(x[:n]), second(x[n:])])

    h = pair(z, head, head).detach()
    h_leaf = h.clone().requires_grad_(True)
    g = torch.autograd.grad(loss_of_h(h_leaf), h_leaf)[0]
    full = hvp_fn(lambda x: (g * pair(x, head, head)).sum(), z)
    act = hvp_fn(lambda x: (g * pair(x, *frozen)).sum(), z)
    v = v.to(device=z.device, dtype=z.dtype)
    whole, own = float(v @ full(v)), float(v @ act(v))
    with torch.no_grad():
        gap = float((pair(z, *frozen) - h).abs().max())
    return {"rayleigh_head_act": own, "rayleigh_head_bn": whole - own, "frozen_gap": gap}
