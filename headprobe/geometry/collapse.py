"""Collapse of a head's outputs: the statistics that say it (out_std, RankMe, the covariance spectrum), the
criterion that makes "started collapsed" a measured statement, and the starts that produce it.

The paper's claim 4 is about heads "started collapsed". A frozen, pretrained backbone's features are diverse, and
scaling a bias-free head's weights (×0.1, `collapse_start`) leaves its output directions as they were, so a run
starts the heads with `collapsed_init` and checks at step 0 (`check_collapsed_start`, by `collapse_criterion`)
whether each is collapsed. During training, curvature tracking (`geometry.tracking`) records `output_statistics`
of the head on a fixed set of cached view rows (`fixed_stat_rows`), the same rows at every tracked step, so that
out_std and RankMe of successive points compare the same images and are not capped by a small batch.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from headprobe.geometry.pullback import BATCHNORMS, batchnorm_mode

COLLAPSE_THRESHOLD = 0.1
TOP_EIGENVALUES = 5


def collapse_start(module: nn.Module, scale: float = 0.1) -> nn.Module:
    """Multiply every Linear weight of `module` by `scale` in place and return it: the paper's pseudo-collapsed start
    ("projector weights ×0.1"), for a head that was built or trained already. `ProjectionHead(init_scale=0.1)` does
    the same at construction.

    >>> collapse_start(nn.Linear(2, 2, bias=False), 0.0).weight.abs().sum().item()
    0.0
    """
    if not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale}.")
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Linear):
                m.weight.mul_(scale)
    return module


def out_std(h: torch.Tensor) -> float | None:
    """Mean over dimensions of the std over samples of the L2-normalised rows of h: (B, out); None if undefined
    (a non-finite or a zero row).

    >>> out_std(torch.eye(2)) == 0.5 ** 0.5
    True
    """
    h = h.detach().double()
    norms = h.norm(dim=1, keepdim=True)
    if not torch.isfinite(h).all() or not bool((norms > 0).all()):
        return None
    return float((h / norms).std(dim=0).mean())


def output_statistics(h: torch.Tensor) -> dict:
    """Collapse statistics of head outputs h: (B, out); None where a statistic is undefined (e.g. all rows equal).

    "out_std" (`out_std`), "out_std_uniform" (1/√out, its value for outputs spread on the sphere), "rankme"
    (`probes.spectrum.rankme`, at most min(B, out)), "cov_effective_rank", "cov_condition_number" with its
    "cov_condition_scope", "cov_numerical_rank", "cov_top_eigenvalues" (`probes.spectrum.covariance_spectrum`).
    """
    from headprobe.probes.spectrum import covariance_spectrum, rankme

    h = h.detach().double()
    stats: dict = {"out_std": out_std(h), "out_std_uniform": 1 / math.sqrt(h.shape[1]), "rankme": None,
                   "cov_effective_rank": None, "cov_condition_number": None, "cov_condition_scope": None,
                   "cov_numerical_rank": None, "cov_top_eigenvalues": None}
    if not torch.isfinite(h).all():
        return stats
    try:
        stats["rankme"] = rankme(h)
        cov = covariance_spectrum(h)
    except ValueError:
        return stats
    stats.update(cov_effective_rank=cov["effective_rank"], cov_condition_number=cov["condition_number"],
                 cov_condition_scope=cov["condition_number_scope"], cov_numerical_rank=cov["numerical_rank"],
                 cov_top_eigenvalues=cov["eigenvalues"][:TOP_EIGENVALUES])
    return stats


def fixed_stat_rows(views: torch.Tensor, n_rows: int, seed: int) -> torch.Tensor:
    """n_rows cached view rows (all N·K when fewer) for the collapse statistics of every tracked step.

    views: (N, K, D) cached view features → (min(n_rows, N·K), D): the rows of a permutation of the N·K flat rows
    seeded by `seed` alone, kept in flat order (image-major), so every tracked step, a resumed run and every
    process take the same rows.

    >>> fixed_stat_rows(torch.arange(12.0).reshape(3, 2, 2), 10, seed=0).shape
    torch.Size([6, 2])
    """
    if views.ndim != 3:
        raise ValueError(f"views must be cached view features (N, K, D), got shape {tuple(views.shape)}.")
    if n_rows < 1:
        raise ValueError(f"the collapse statistics need at least one row, got n_rows={n_rows}.")
    flat = views.reshape(-1, views.shape[-1])
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(flat), generator=gen)[: min(n_rows, len(flat))].sort().values
    return flat[chosen.to(flat.device)]


def collapse_criterion(out_std: float | None, out_dim: int, threshold: float = COLLAPSE_THRESHOLD) -> dict:
    """Is a head's output collapsed? Yes iff out_std ≤ threshold/√out_dim, out_std the mean std of L2-normalised
    outputs (uniform on the sphere ≈ 1/√out_dim, 0 when every output points the same way).

    The paper's collapsed start is a randomly initialised backbone whose features are nearly collapsed; a frozen,
    pretrained backbone's are not, and scaling a bias-free head's weights (×0.1) leaves its output directions as
    they were. So a run records this criterion at step 0 instead of assuming it. Returns {"collapsed", "out_std",
    "threshold" (the bound threshold/√out_dim), "threshold_rel", "out_std_uniform"}; undefined out_std (None or
    NaN, e.g. a zero output) is not collapsed: there is no direction to agree on.

    >>> collapse_criterion(0.005, 256)["collapsed"], collapse_criterion(0.03, 256)["collapsed"]
    (True, False)
    """
    if not threshold > 0:
        raise ValueError(f"the collapse threshold must be positive (a fraction of 1/√d), got {threshold}.")
    uniform = 1 / math.sqrt(out_dim)
    defined = out_std is not None and math.isfinite(out_std)
    return {"collapsed": bool(defined and out_std <= threshold * uniform), "out_std": out_std if defined else None,
            "threshold": threshold * uniform, "threshold_rel": threshold, "out_std_uniform": uniform}


def collapsed_init(head: nn.Module, mean_feature: torch.Tensor, offset: float = 1.0, scale: float = 0.01) -> nn.Module:
    """Start `head` (a `ProjectionHead`) collapsed, in place: every first-layer unit gets the same pre-activation.

    The first Linear's weight becomes scale·W, plus a shared offset: its bias ← offset (every unit) where it has
    one; where a BatchNorm follows it (which would subtract any shared part), the BatchNorm's affine map γ ←
    scale·γ, β ← offset; where it has neither (the bias-free linear head) the offset rides on the mean feature μ
    = mean_feature (D,): W ← scale·W + offset·1 μᵀ/‖μ‖², so a unit computes offset·μᵀz/‖μ‖² -- ≈ offset for
    z near μ, and a linear head's output direction does not depend on that factor. Later layers are left as
    built: every output is ≈ h at the offset, one direction plus a spread of relative size ~scale. offset > 0 keeps
    every ReLU unit active (a negative one would start the head dead). Whether the state is collapsed is for
    `collapse_criterion` to say, on the run's features.

    >>> head = nn.Sequential(nn.Sequential(nn.Linear(3, 4, bias=False)), nn.Sequential(nn.Linear(4, 2)))
    >>> out = collapsed_init(head, torch.ones(3), offset=1.0, scale=0.0)(torch.ones(5, 3))
    >>> bool((out == out[0]).all())
    True
    """
    if not (math.isfinite(offset) and offset > 0 and math.isfinite(scale) and scale >= 0):
        raise ValueError(f"collapsed_init needs offset > 0 and scale ≥ 0, finite, got offset={offset}, scale={scale}.")
    linears = [m for m in head.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("the head has no Linear layer to start collapsed (an identity head cannot collapse).")
    first = linears[0]
    mu = mean_feature.detach().to(device=first.weight.device, dtype=first.weight.dtype).reshape(-1)
    if mu.numel() != first.in_features or not float(mu.norm()) > 0:
        raise ValueError(f"mean_feature must be a nonzero ({first.in_features},) vector, got {tuple(mu.shape)}.")
    modules = list(head.modules())
    after = modules[modules.index(first) + 1] if modules.index(first) + 1 < len(modules) else None
    with torch.no_grad():
        first.weight.mul_(scale)
        if isinstance(after, BATCHNORMS) and after.affine:
            after.weight.mul_(scale)
            after.bias.fill_(offset)
        elif first.bias is not None:
            first.bias.fill_(offset)
        else:
            first.weight.add_(offset * mu / mu.dot(mu))  # the row μᵀ/‖μ‖², broadcast over every unit
    return head


def check_collapsed_start(states: dict, specs, z: torch.Tensor, mean_feature: torch.Tensor, spec) -> dict:
    """Apply the recipe's collapsed start to the fresh heads and measure, at step 0, whether each is collapsed.

    states: {name: HeadState}; specs: the recipe's HeadSpecs; z: (B, D) the first views of step 0's batch;
    mean_feature: (D,) the mean cached view feature; spec: the recipe's GeometrySpec. With spec.collapse_offset
    set, every head (or those of spec.collapse_heads) first gets `collapsed_init(head, mean_feature,
    collapse_offset, collapse_scale)`. Then
    `collapse_criterion` on head(z), BatchNorm on batch statistics as in the first training step (running
    statistics untouched). A head whose recipe asks for a collapsed start (collapse_offset, or init_scale ≠ 1)
    and fails the criterion gets a warning: its λ_min says nothing about a collapsed state. Returns {name:
    {"collapsed", "out_std", "threshold", "threshold_rel", "out_std_uniform", "init", "requested",
    "n_samples"}}, JSON-ready, for the run's protocol ("protocol.train.collapse_start").
    """
    init_scales = {s.name: s.init_scale for s in specs}
    out = {}
    for name, state in states.items():
        head = state.head
        chosen = getattr(spec, "collapse_heads", None)
        offset = spec.collapse_offset if chosen is None or name in chosen else None
        if offset is not None:
            collapsed_init(head, mean_feature, offset, spec.collapse_scale)
            init = f"collapsed_init(offset={spec.collapse_offset}, scale={spec.collapse_scale})"
        else:
            init = f"as built (init_scale={init_scales.get(name, 1.0)})"
        weight = next(head.parameters())
        with batchnorm_mode(head, "batch"), torch.no_grad():
            h = head(z.to(device=weight.device, dtype=weight.dtype))
        verdict = collapse_criterion(out_std(h), h.shape[1], spec.collapse_threshold)
        requested = offset is not None or init_scales.get(name, 1.0) != 1.0
        if requested and not verdict["collapsed"]:
            shown = "undefined" if verdict["out_std"] is None else f"{verdict['out_std']:.4f}"
            warnings.warn(f"head {name!r} does not start collapsed: out_std = {shown} at step 0 > "
                          f"{spec.collapse_threshold}/√{h.shape[1]} = {verdict['threshold']:.4f} ({init}); its "
                          "curvature is not that of a collapsed state. Set geometry.collapse_offset (e.g. 1.0) to "
                          "start it collapsed, or train the backbone from scratch.", stacklevel=2)
        out[name] = {**verdict, "init": init, "requested": requested, "n_samples": len(z)}
    return out
