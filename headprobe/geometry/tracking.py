"""Curvature and collapse statistics of one training batch, cheap enough to take every N steps.

The paper tracks "λ_min of the loss Hessian w.r.t. the backbone output batch, by power iteration (20 steps for
λ_max, 20 on H − λ_max I)" and finds λ_min < 0 in 72/100 epochs for a Swish head started collapsed, 1/100 for a
ReLU head: "collapse is unstable only for smooth heads" (PAPER.md claim 4). `curvature_snapshot` measures the same
λ_min and λ_max by Lanczos (`hessian.lanczos`), with residuals, error bounds and the number of Hessian-vector
products, together with the collapse statistics of the head outputs.

A negative λ_min alone says nothing about the head: SimSiam's ∇²_h L is indefinite, so the G-term J_hᵀ ∇²_h L J_h
has negative curvature for every head, linear included. With `split=True` the snapshot also measures, by Lanczos
on Hessian-vector products (no dense matrix), λ_min of the G-term, the size of the M-term Σ_i [∇_h L]_i ∇²_z h_i
(zero for linear and ReLU heads without BatchNorm) and λ_min of ∇²_h L, so each negative λ_min is attributed to
the loss (the G-term alone is negative) or to the head (it is not: the M-term made it). `collapse_criterion` and
`collapsed_init` make "started collapsed" a measured statement rather than an assumption.

BatchNorm is in "batch" mode by default: it normalises with the statistics of the batch, as in the training step
whose curvature is measured, and leaves its running statistics alone. The snapshot takes gradients with
`torch.autograd.grad` only, so parameters' .grad, optimiser state, BatchNorm buffers, modes and the global random
state are as they were: it can be taken inside a training loop without changing the run.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

from headprobe.geometry.effective import scalar_loss
from headprobe.geometry.hessian import HessianVectorProduct, hvp_fn, lanczos
from headprobe.geometry.pullback import BATCHNORMS, batchnorm_mode

ObjectiveFn = Callable[[torch.Tensor, torch.Tensor], object]
WRT = ("representation", "head")
_TOP_EIGENVALUES = 5
COLLAPSE_THRESHOLD = 0.1


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


def _out_std(h: torch.Tensor) -> float | None:
    """Mean over dimensions of the std over samples of the L2-normalised rows of h: (B, out); None if undefined."""
    h = h.detach().double()
    norms = h.norm(dim=1, keepdim=True)
    if not torch.isfinite(h).all() or not bool((norms > 0).all()):
        return None
    return float((h / norms).std(dim=0).mean())


def _output_stats(h: torch.Tensor) -> dict:
    """Collapse statistics of head outputs h: (B, out); None where a statistic is undefined (e.g. all rows equal)."""
    from headprobe.probes.spectrum import covariance_spectrum, rankme

    h = h.detach().double()
    stats: dict = {"out_std": _out_std(h), "out_std_uniform": 1 / math.sqrt(h.shape[1]), "rankme": None,
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
                 cov_top_eigenvalues=cov["eigenvalues"][:_TOP_EIGENVALUES])
    return stats


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
    set, every head first gets `collapsed_init(head, mean_feature, collapse_offset, collapse_scale)`. Then
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
        if spec.collapse_offset is not None:
            collapsed_init(head, mean_feature, spec.collapse_offset, spec.collapse_scale)
            init = f"collapsed_init(offset={spec.collapse_offset}, scale={spec.collapse_scale})"
        else:
            init = f"as built (init_scale={init_scales.get(name, 1.0)})"
        weight = next(head.parameters())
        with batchnorm_mode(head, "batch"), torch.no_grad():
            h = head(z.to(device=weight.device, dtype=weight.dtype))
        verdict = collapse_criterion(_out_std(h), h.shape[1], spec.collapse_threshold)
        requested = spec.collapse_offset is not None or init_scales.get(name, 1.0) != 1.0
        if requested and not verdict["collapsed"]:
            shown = "undefined" if verdict["out_std"] is None else f"{verdict['out_std']:.4f}"
            warnings.warn(f"head {name!r} does not start collapsed: out_std = {shown} at step 0 > "
                          f"{spec.collapse_threshold}/√{h.shape[1]} = {verdict['threshold']:.4f} ({init}); its "
                          "curvature is not that of a collapsed state. Set geometry.collapse_offset (e.g. 1.0) to "
                          "start it collapsed, or train the backbone from scratch.", stacklevel=2)
        out[name] = {**verdict, "init": init, "requested": requested, "n_samples": len(z)}
    return out


def _extremes(op, dim: int, dtype: torch.dtype, device, k: int, tol: float, max_iter: int, seed: int) -> dict:
    """k eigenvalues from each end of the symmetric operator op: (dim,) → (dim,), by Lanczos relative to its scale.

    The scale s = ‖op u‖ for a random unit u (one product; the RMS eigenvalue in expectation, 1 when op = 0) makes
    tol relative: on op/s a floor of 1 is s, every eigenvalue to tol·max(s, |λ|), finer than lanczos's tol·‖H‖."""
    u = torch.randn(dim, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    scale = float(op((u / u.norm()).to(device=device, dtype=dtype)).norm()) or 1.0
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="lanczos stopped")
        res = lanczos(lambda v: op(v) / scale, dim, k=k, which="both", max_iter=min(max_iter, dim), tol=tol,
                      seed=seed, dtype=torch.float64, device=device, scale=1.0)
    values = res.eigenvalues * scale
    return {"values": values, "residuals": res.residuals * scale, "error_bounds": res.error_bounds * scale,
            "converged": bool(res.converged.all()), "n_iter": res.n_iter, "scale": scale,
            "residual_kind": res.residual_kind,
            "roundoff": math.sqrt(dim) * torch.finfo(dtype).eps * float(values.abs().max())}


def _negative(ext: dict) -> bool:
    """λ_min below −max(its Lanczos error bound, round-off): negative curvature beyond what the estimate can err."""
    return float(ext["values"][0]) < -max(float(ext["error_bounds"][0]), ext["roundoff"])


class _SplitOperators:
    """Products with the pieces of H = G + M of L(h(z)) w.r.t. the stacked batch z = [z1; z2]: (2B, D).

    h = [head(z1); head(z2)] (each view through the head on its own, as in the training step); A = ∇²_h L, with
    whatever L contains (the predictor and a stop-gradient included) held as part of the loss. G v = Jᵀ A J v,
    M v = ∇²_z (gᵀ h(z)) v with g = ∇_h L fixed. J v comes from the transpose trick J v = ∂(Jᵀu · v)/∂u and Jᵀ w
    from one backward pass, reverse mode only (like `hvp_fn`: forward-mode formulas are missing for SiLU's
    backward): the head runs once per graph, so BatchNorm sees the same batch statistics in every product."""

    def __init__(self, head: nn.Module, loss_of_h: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor) -> None:
        n = z.shape[0] // 2

        def pair(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([head(x[:n]), head(x[n:])])

        self.z = z.detach().requires_grad_(True)
        self.h = pair(self.z)
        h0 = self.h.detach()
        h_leaf = h0.clone().requires_grad_(True)
        grad_h = torch.autograd.grad(loss_of_h(h_leaf), h_leaf)[0]
        self.loss_h: HessianVectorProduct = hvp_fn(loss_of_h, h0)
        # A head linear in z leaves gᵀh(z) without second derivatives: hvp_fn's products are then exact zeros.
        self.m_term = hvp_fn(lambda x: (grad_h * pair(x)).sum(), self.z)
        self.u = torch.zeros_like(h0, requires_grad=True)
        self.jt_u = torch.autograd.grad(self.h, self.z, self.u, create_graph=True)[0]
        self.dim, self.dtype, self.device = self.z.numel(), self.z.dtype, self.z.device
        self.g_calls = 0

    def jacobian(self, v: torch.Tensor) -> torch.Tensor:
        """J v: (2B·out,) for v: (2B·D,)."""
        if not self.jt_u.requires_grad:  # Jᵀu does not depend on u: J = 0
            return torch.zeros(self.h.numel(), dtype=self.dtype, device=self.device)
        jv = torch.autograd.grad(self.jt_u, self.u, v.reshape(self.z.shape), retain_graph=True, allow_unused=True)[0]
        return (jv if jv is not None else torch.zeros_like(self.h)).reshape(-1)

    def jacobian_t(self, w: torch.Tensor) -> torch.Tensor:
        """Jᵀ w: (2B·D,) for w: (2B·out,)."""
        return torch.autograd.grad(self.h, self.z, w.reshape(self.h.shape), retain_graph=True)[0].reshape(-1)

    def g_term(self, v: torch.Tensor) -> torch.Tensor:
        self.g_calls += 1
        jv = self.jacobian(v.to(self.dtype))
        return self.jacobian_t(self.loss_h(jv.to(self.loss_h.dtype)).to(self.dtype)).to(v.dtype)

    def m_product(self, v: torch.Tensor) -> torch.Tensor:
        return self.m_term(v)


def _split(head: nn.Module, loss_of_h, z: torch.Tensor, full_hvp, full: dict, k: int, tol: float, max_iter: int,
           seed: int, predictor: nn.Module | None) -> dict:
    """λ_min of the G-term, size of the M-term, λ_min of ∇²_h L, and where a negative λ_min of H comes from."""
    ops = _SplitOperators(head, loss_of_h, z)
    g = _extremes(ops.g_term, ops.dim, ops.dtype, ops.device, k, tol, max_iter, seed)
    m = _extremes(ops.m_product, ops.dim, ops.dtype, ops.device, k, tol, max_iter, seed)
    a = _extremes(ops.loss_h, ops.loss_h.dim, ops.loss_h.dtype, ops.device, k, tol, max_iter, seed)
    u = torch.randn(ops.dim, generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float64)
    u = (u / u.norm()).to(device=ops.device, dtype=ops.dtype)
    hu = full_hvp(u)
    consistency = float((ops.g_term(u) + ops.m_product(u) - hu).norm() / hu.norm()) if hu.norm() > 0 else 0.0
    h_norm = float(full["values"].abs().max())
    m_norm = float(m["values"].abs().max())
    source = "none"
    if _negative(full):
        source = "loss" if _negative(g) else "head"
    return {
        "lambda_min_gterm": float(g["values"][0]),
        "lambda_max_gterm": float(g["values"][-1]),
        "error_bound_min_gterm": float(g["error_bounds"][0]),
        "lambda_min_mterm": float(m["values"][0]),
        "lambda_max_mterm": float(m["values"][-1]),
        "m_norm_ratio": m_norm / h_norm if h_norm > 0 else (0.0 if m_norm == 0 else math.inf),
        "lambda_min_loss_h": float(a["values"][0]),
        "lambda_max_loss_h": float(a["values"][-1]),
        "error_bound_min_loss_h": float(a["error_bounds"][0]),
        "dim_loss_h": ops.loss_h.dim,
        "negative_beyond_bound": _negative(full),
        "negative_gterm": _negative(g),
        "negative_loss_h": _negative(a),
        "curvature_source": source,
        "split_consistency": consistency,
        "split_converged": g["converged"] and m["converged"] and a["converged"],
        "gterm_predictor": "in the loss" if predictor is not None else "none",
        "n_hvp_split": 2 * g["n_iter"] + m["n_iter"] + a["n_iter"] + 6,
    }


def curvature_snapshot(head: nn.Module, z1: torch.Tensor, z2: torch.Tensor, objective_fn: ObjectiveFn, k: int = 1,
                       tol: float = 1e-3, max_iter: int = 40, wrt: str = "representation",
                       predictor: nn.Module | None = None, batchnorm: str = "batch", seed: int = 0,
                       split: bool = False) -> dict:
    """λ_min, λ_max of the loss Hessian on one batch, by Lanczos, and collapse statistics of the head outputs.

    z1, z2: (B, D) backbone representations of two views. The loss is objective_fn(head(z1), head(z2)) (a tensor
    or a LossTerms), as in the training step; for SimSiam pass a closure that applies the predictor, and the
    predictor as `predictor` so its BatchNorm is in the same mode. wrt: "representation" (the Hessian w.r.t. the
    stacked batch [z1; z2], dim 2·B·D, as in the paper) or "head" (w.r.t. the head's parameters that require grad).
    Lanczos runs to residual ≤ tol·max(s, |λ|) or max_iter products (40 by default, the budget of the paper's two
    20-step power iterations), k eigenvalues from each end; the scale s = ‖Hu‖ for a random unit u (one product)
    makes tol relative, since loss Hessians w.r.t. a batch are often far below 1, where an absolute tolerance
    would accept anything. Ritz values never lie below λ_min, so a negative "lambda_min" shows negative curvature
    whatever its residual, up to the products' round-off (they run in the head's dtype: float32 round-off is
    ~1e-7·λ_max). Cost: "n_hvp" products, each about one training step of the head (a double backward), plus
    max_iter × dim float64 numbers of memory; a sub-batch (z1[:m], z2[:m]) makes it cheaper.

    A stop-gradient (SimSiam's) cuts the dependence of the targets on z, so the operator is the Hessian of the loss
    with the targets frozen at their current values: the blocks coupling the two views vanish. Pass the loss
    without it, `symmetric_simsiam(predictor)`, to measure the Hessian of the loss function itself.

    split=True (wrt="representation" only) adds the split H = G + M (PAPER.md claim 3), each piece by Lanczos on
    its own products at the same tol and max_iter: the loss L(h) is objective_fn with the predictor inside it
    ("gterm_predictor": "in the loss"), so the M-term is the head's curvature alone. Adds "lambda_min_gterm",
    "lambda_max_gterm", "error_bound_min_gterm" (G = J_hᵀ ∇²_h L J_h); "lambda_min_mterm", "lambda_max_mterm",
    "m_norm_ratio" (‖M‖₂/‖H‖₂ from the Ritz extremes; 0 for linear and ReLU heads without BatchNorm);
    "lambda_min_loss_h", "lambda_max_loss_h", "error_bound_min_loss_h", "dim_loss_h" (∇²_h L itself); booleans
    "negative_beyond_bound" (λ_min < −max(error bound, round-off)), "negative_gterm", "negative_loss_h" (the same
    test on each piece); "curvature_source": "none" (H not negative), "loss" (the G-term alone is negative: the
    loss's indefinite ∇²_h L seen through J_h, any head) or "head" (H is negative and the G-term is not: the
    M-term made it); "split_consistency" ‖(G + M − H)u‖/‖Hu‖ for a random unit u; "split_converged"; "n_hvp_split"
    (a G product is a Jacobian round trip plus one ∇²_h L product, counted as two). It costs about 4× the snapshot.

    Returns a flat, JSON-ready dict: "wrt", "dim", "loss", "lambda_min", "lambda_max", "eigenvalues" (2k,
    ascending), "residual_min", "residual_max", "error_bound_min", "error_bound_max", "converged", "n_hvp",
    "n_iter", "residual_kind", "scale" (s), "negative_curvature" (λ_min below −√dim·eps·max|λ|, the products'
    round-off in the head's dtype), the output statistics of head(z1) ("out_std": mean std of L2-normalised
    outputs, ≈ 1/√out for spread outputs, → 0 at collapse; "out_std_uniform"; "rankme"; "cov_effective_rank",
    "cov_condition_number" with its "cov_condition_scope", "cov_numerical_rank", "cov_top_eigenvalues"),
    "batchnorm", "time_s", and with split the keys above.
    """
    start = time.perf_counter()
    if wrt not in WRT:
        raise ValueError(f"wrt={wrt!r} is unknown; use 'representation' (the batch z) or 'head' (its parameters).")
    if split and wrt != "representation":
        raise ValueError("split=True splits the Hessian w.r.t. the representation (G- and M-terms); use "
                         "wrt='representation' or split=False.")
    for name, z in (("z1", z1), ("z2", z2)):
        if not isinstance(z, torch.Tensor) or z.ndim != 2 or not torch.is_floating_point(z):
            raise ValueError(f"{name} must be a floating-point batch (B, D), got "
                             f"{tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__}.")
    if z1.shape != z2.shape:
        raise ValueError(f"z1 {tuple(z1.shape)} and z2 {tuple(z2.shape)} must be two views of the same samples.")
    n = z1.shape[0]
    z1, z2 = z1.detach(), z2.detach()

    def loss_of_h(h: torch.Tensor) -> torch.Tensor:
        return scalar_loss(objective_fn(h[:n], h[n:]))

    extra: dict = {}
    with batchnorm_mode([head, predictor], batchnorm):
        if wrt == "representation":
            hvp = hvp_fn(lambda z: scalar_loss(objective_fn(head(z[:n]), head(z[n:]))), torch.cat([z1, z2]))
        else:
            hvp = hvp_fn(lambda m: scalar_loss(objective_fn(m(z1), m(z2))), head)
        full = _extremes(hvp, hvp.dim, hvp.dtype, hvp.device, k, tol, max_iter, seed)
        n_hvp = hvp.calls
        if split:
            extra = _split(head, loss_of_h, torch.cat([z1, z2]), hvp, full, k, tol, max_iter, seed, predictor)
        with torch.no_grad():
            h1 = head(z1)
    values = full["values"]
    lambda_min = float(values[0])
    return {
        "wrt": wrt,
        "dim": hvp.dim,
        "loss": float(hvp.loss),
        "lambda_min": lambda_min,
        "lambda_max": float(values[-1]),
        "eigenvalues": values.tolist(),
        "residual_min": float(full["residuals"][0]),
        "residual_max": float(full["residuals"][-1]),
        "error_bound_min": float(full["error_bounds"][0]),
        "error_bound_max": float(full["error_bounds"][-1]),
        "converged": full["converged"],
        "n_hvp": n_hvp,
        "n_iter": full["n_iter"],
        "residual_kind": full["residual_kind"],
        "scale": full["scale"],
        "negative_curvature": lambda_min < -full["roundoff"],
        **_output_stats(h1),
        **extra,
        "batchnorm": batchnorm,
        "time_s": time.perf_counter() - start,
    }


def symmetric_simsiam(predictor: nn.Module) -> ObjectiveFn:
    """SimSiam's loss as a function of (h1, h2), without the stop-gradient: objective_fn for `curvature_snapshot`.

    L = −½ [cos(p(h1), h2) + cos(p(h2), h1)] has the value of `objectives.simsiam`; the stop-gradient changes the
    update, not the loss. With it, second derivatives treat the targets as constants and lose the blocks coupling
    the two views; without it they are the Hessian of the loss function.

    >>> loss = symmetric_simsiam(nn.Identity())(torch.ones(2, 3), torch.ones(2, 3))
    >>> round(loss.item(), 6)
    -1.0
    """
    cosine = nn.functional.cosine_similarity

    def objective(h1: torch.Tensor, h2: torch.Tensor) -> torch.Tensor:
        return -0.5 * (cosine(predictor(h1), h2, dim=1).mean() + cosine(predictor(h2), h1, dim=1).mean())

    return objective
