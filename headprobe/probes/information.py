"""Mutual-information estimates between paired views: variational lower bounds, a Gaussian closed form, and a
label bound from a probe's probabilities.

The variational bounds follow Poole et al., "On Variational Bounds of Mutual Information" (ICML 2019), and
Song & Ermon, "Understanding the Limitations of Variational Mutual Information Estimators" (ICLR 2020). Each
reads a B×B critic matrix `scores[i, j] = f(x_i, y_j)` whose diagonal holds the B positive (jointly drawn)
pairs and whose off-diagonal entries stand in for samples of the product of marginals. All values are in nats.

Which bound answers which question:
- InfoNCE has low variance but can never exceed log B, so it saturates once the true MI nears log B.
- NWJ is unbiased for a fixed critic but its variance grows like e^I.
- DV (MINE) is tighter than NWJ for the same critic (log u ≤ u/e), but the log of a minibatch mean biases it
  upwards: it is not a lower bound on finite batches.
- SMILE is DV with the negatives' scores clipped to [-clip, clip], trading bias for bounded variance. It is
  not a bound either: with a critic whose scores exceed the clip (e.g. an untrained cosine critic at τ = 0.1)
  it can report several times the true MI.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "InfoNCEBound",
    "SeparableCritic",
    "cosine_critic",
    "dv_bound",
    "gaussian_mi",
    "infonce_bound",
    "label_mi_lower_bound",
    "mutual_information",
    "nwj_bound",
    "smile_bound",
    "train_critic",
]

BOUNDS = ("infonce", "nwj", "dv", "smile")
METHODS = (*BOUNDS, "gaussian")
CRITICS = ("cosine", "separable")
# Below this many samples per dimension the plug-in canonical correlations are noticeably biased upwards.
_SAMPLES_PER_DIM = 10
# An InfoNCE value this close (in nats) to log B is dominated by the ceiling rather than by the data.
_SATURATION_MARGIN = 1.0


class InfoNCEBound(NamedTuple):
    """What `infonce_bound` returns: the bound in nats and its ceiling log B."""

    value: float
    ceiling: float


def _check_scores(scores: torch.Tensor) -> None:
    if scores.ndim != 2 or scores.shape[0] != scores.shape[1]:
        raise ValueError(
            f"scores must be a square (B, B) critic matrix with the positive pairs on its diagonal, "
            f"but has shape {tuple(scores.shape)}."
        )
    if scores.shape[0] < 2:
        raise ValueError(
            f"scores is {scores.shape[0]}×{scores.shape[0]}; a bound needs B ≥ 2 so that off-diagonal "
            "(negative) pairs exist."
        )
    if not torch.is_floating_point(scores):
        raise ValueError(f"scores has dtype {scores.dtype}; pass floating-point critic values.")
    if not torch.isfinite(scores).all():
        raise ValueError("scores contains NaN or infinite values; check the critic and its temperature.")


def _check_pairs(x: torch.Tensor, y: torch.Tensor, *, min_rows: int = 2) -> None:
    for name, t in (("x", x), ("y", y)):
        if t.ndim != 2:
            raise ValueError(f"{name} must be 2-D (N, D) but has shape {tuple(t.shape)}.")
        if not torch.is_floating_point(t):
            raise ValueError(f"{name} has dtype {t.dtype}; pass floating-point features.")
        if not torch.isfinite(t).all():
            raise ValueError(f"{name} contains NaN or infinite values; check the features (e.g. fp16 overflow).")
    if x.shape[0] != y.shape[0]:
        raise ValueError(
            f"x has {x.shape[0]} rows but y has {y.shape[0]}; row i of x and row i of y must be one pair."
        )
    if x.shape[0] < min_rows:
        raise ValueError(f"only {x.shape[0]} pairs given; this estimate needs at least {min_rows}.")


def _offdiag_logmeanexp(scores: torch.Tensor) -> torch.Tensor:
    """log of the mean of exp(scores) over the B(B-1) off-diagonal entries."""
    b = scores.shape[0]
    diagonal = torch.eye(b, dtype=torch.bool, device=scores.device)
    return scores.masked_fill(diagonal, -math.inf).logsumexp(dim=(0, 1)) - math.log(b * (b - 1))


def _infonce(scores: torch.Tensor) -> torch.Tensor:
    # Poole et al. eq. 12: the sum over j includes the positive, which is what caps the bound at log B.
    return (scores.diagonal() - scores.logsumexp(dim=1)).mean() + math.log(scores.shape[0])


def _nwj(scores: torch.Tensor) -> torch.Tensor:
    return scores.diagonal().mean() - (_offdiag_logmeanexp(scores) - 1).exp()


def _dv(scores: torch.Tensor) -> torch.Tensor:
    return scores.diagonal().mean() - _offdiag_logmeanexp(scores)


def _smile(scores: torch.Tensor, clip: float) -> torch.Tensor:
    # Song & Ermon clip only the partition-function term; the positives enter unclipped.
    return scores.diagonal().mean() - _offdiag_logmeanexp(scores.clamp(-clip, clip))


def _js(scores: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon (f-GAN) objective; SMILE trains the critic with its gradient (Song & Ermon, sec. 5)."""
    b = scores.shape[0]
    positive = -F.softplus(-scores.diagonal()).mean()
    negative = (F.softplus(scores).sum() - F.softplus(scores.diagonal()).sum()) / (b * (b - 1))
    return positive - negative


def _check_clip(clip: float) -> None:
    if not clip > 0:
        raise ValueError(f"clip must be positive but got {clip}; Song & Ermon use 5.")


def infonce_bound(scores: torch.Tensor) -> InfoNCEBound:
    """InfoNCE lower bound and its ceiling; scores: (B, B), positives on the diagonal.

    "I(X;Y) ≥ E[1/K Σ_i log (e^{f(x_i,y_i)} / (1/K Σ_j e^{f(x_i,y_j)}))] ≜ I_NCE" (Poole et al., eq. 12), and
    I_NCE ≤ log K: the bound can never report more than log B nats, whatever the true MI.

    >>> infonce_bound(torch.eye(4) * 100).ceiling == math.log(4)
    True
    """
    _check_scores(scores)
    with torch.no_grad():
        value = _infonce(scores.detach().double()).item()
    return InfoNCEBound(value=value, ceiling=math.log(scores.shape[0]))


def nwj_bound(scores: torch.Tensor) -> float:
    """NWJ (f-divergence, "TUBA with a = e") lower bound in nats; scores: (B, B), positives on the diagonal.

    I_NWJ = E_p[f(x, y)] − e^{−1} E_{p(x)p(y)}[e^{f(x, y)}] (Poole et al., eq. 9), with the B(B−1) off-diagonal
    pairs as samples of p(x)p(y). Its optimal critic is 1 + log p(y|x)/p(y).

    >>> round(nwj_bound(torch.zeros(3, 3)), 4) == round(-math.exp(-1), 4)
    True
    """
    _check_scores(scores)
    with torch.no_grad():
        return _nwj(scores.detach().double()).item()


def dv_bound(scores: torch.Tensor) -> float:
    """Donsker–Varadhan (MINE) estimate in nats; scores: (B, B), positives on the diagonal.

    I_DV = E_p[f] − log E_{p(x)p(y)}[e^f] over the off-diagonal pairs. For any one score matrix
    dv_bound ≥ nwj_bound (log u ≤ u/e). On a finite batch the log of the sample mean makes it biased upwards,
    so it is not a guaranteed lower bound; `train_critic(bound="dv")` uses MINE's moving-average denominator.

    >>> dv_bound(torch.zeros(3, 3))
    0.0
    """
    _check_scores(scores)
    with torch.no_grad():
        return _dv(scores.detach().double()).item()


def smile_bound(scores: torch.Tensor, clip: float = 5.0) -> float:
    """SMILE estimate in nats: DV with exp(f) of the negatives clipped to [e^−clip, e^clip]; scores: (B, B).

    "We clip the value of r_θ(x) to [e^−τ, e^τ]" (Song & Ermon 2020, eq. 19); they use τ = 5. As clip → ∞ it
    equals `dv_bound`.

    >>> smile_bound(torch.full((3, 3), 9.0), clip=5.0)
    4.0
    """
    _check_scores(scores)
    _check_clip(clip)
    with torch.no_grad():
        return _smile(scores.detach().double(), clip).item()


def cosine_critic(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
    """Fixed critic f(x_i, y_j) = cos(z1_i, z2_j) / temperature; z1: (B, D), z2: (B, D) -> scores (B, B).

    This is the SimCLR similarity, so `infonce_bound(cosine_critic(z1, z2, τ))` is log B minus the one-sided
    NT-Xent loss (without excluding same-view negatives). Being untrained, it gives a valid but usually loose
    bound; NWJ and DV in particular need a critic on the scale of log p(y|x)/p(y).

    >>> cosine_critic(torch.eye(2), torch.eye(2), temperature=0.5)
    tensor([[2., 0.],
            [0., 2.]])
    """
    _check_pairs(z1, z2)
    if z1.shape[1] != z2.shape[1]:
        raise ValueError(
            f"z1 has dimension {z1.shape[1]} but z2 has {z2.shape[1]}; a cosine critic compares vectors in one "
            "space. Use critic='separable' for views of different dimension."
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be positive but got {temperature}; SimCLR uses 0.1.")
    return F.normalize(z1, dim=1) @ F.normalize(z2, dim=1).T / temperature


def _mlp(dim: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out)
    )


class SeparableCritic(nn.Module):
    """Separable critic f(x, y) = g(x)ᵀ h(y) with a two-hidden-layer ReLU MLP per side (Poole et al., sec. 4).

    Inputs are standardised with per-feature statistics stored as buffers (set by `train_critic` from the
    training pairs), so features of any scale train with one learning rate.

    >>> SeparableCritic(3, 5, hidden=8, out=4)(torch.zeros(6, 3), torch.zeros(6, 5)).shape
    torch.Size([6, 6])
    """

    def __init__(self, dim1: int, dim2: int, hidden: int = 64, out: int = 32) -> None:
        super().__init__()
        for name, value in (("dim1", dim1), ("dim2", dim2), ("hidden", hidden), ("out", out)):
            if value < 1:
                raise ValueError(f"SeparableCritic needs {name} ≥ 1 but got {value}.")
        self.g = _mlp(dim1, hidden, out)
        self.h = _mlp(dim2, hidden, out)
        self.register_buffer("x_mean", torch.zeros(dim1))
        self.register_buffer("x_scale", torch.ones(dim1))
        self.register_buffer("y_mean", torch.zeros(dim2))
        self.register_buffer("y_scale", torch.ones(dim2))

    def set_input_scaling(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Store the per-feature mean and std of x: (N, dim1) and y: (N, dim2); constant features keep scale 1."""
        for t, mean, scale in ((x, self.x_mean, self.x_scale), (y, self.y_mean, self.y_scale)):
            std, mu = torch.std_mean(t.to(mean), dim=0)
            mean.copy_(mu)
            scale.copy_(torch.where(std > 0, std, torch.ones_like(std)))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x: (B, dim1), y: (B, dim2) -> scores (B, B) with scores[i, j] = f(x_i, y_j)."""
        gx = self.g((x.to(self.x_mean) - self.x_mean) / self.x_scale)
        hy = self.h((y.to(self.y_mean) - self.y_mean) / self.y_scale)
        return gx @ hy.T


def _mine_loss(scores: torch.Tensor, log_ema: torch.Tensor | None, rate: float) -> tuple[torch.Tensor, torch.Tensor]:
    """MINE's bias-corrected DV objective (Belghazi et al. 2018, sec. 3.2): the minibatch E[e^f] in the
    gradient's denominator is replaced by its exponential moving average. Returns (loss, new log-average)."""
    log_mean = _offdiag_logmeanexp(scores)
    current = log_mean.detach()
    if log_ema is None:
        log_ema = current
    else:
        log_ema = torch.logaddexp(log_ema + math.log1p(-rate), current + math.log(rate))
    # The value of exp(log_mean - log_ema) is ~1; what matters is its gradient, ∇E[e^f] / EMA(E[e^f]).
    return -(scores.diagonal().mean() - (log_mean - log_ema).exp()), log_ema


def train_critic(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    bound: str = "infonce",
    *,
    steps: int = 400,
    batch_size: int = 128,
    lr: float = 3e-3,
    seed: int = 0,
    hidden: int = 64,
    out: int = 32,
    ema_rate: float = 0.01,
) -> SeparableCritic:
    """Fit a `SeparableCritic` by maximising a bound on random batches of the training pairs.

    x_train: (N, D1), y_train: (N, D2), row i of each is one positive pair. Each of `steps` Adam steps draws
    `batch_size` distinct pairs (a seeded permutation) and ascends the bound: "infonce", "nwj", "dv" (MINE:
    moving-average denominator with rate `ema_rate`) or "smile" (trained with the Jensen–Shannon objective,
    as Song & Ermon do, and read out with the clipped DV). Initialisation and batches depend only on `seed`;
    the global RNG is left untouched. Evaluate the returned critic on pairs it was not trained on.
    """
    _check_pairs(x_train, y_train)
    if bound not in BOUNDS:
        raise ValueError(f"bound {bound!r} is not one of {BOUNDS}.")
    n = x_train.shape[0]
    if not 2 <= batch_size <= n:
        raise ValueError(f"batch_size must lie in 2..{n} (the number of training pairs) but got {batch_size}.")
    if steps < 1 or not lr > 0:
        raise ValueError(f"steps must be ≥ 1 and lr positive but got steps={steps}, lr={lr}.")
    if not 0 < ema_rate < 1:
        raise ValueError(f"ema_rate must lie strictly between 0 and 1 but got {ema_rate}.")
    device = x_train.device
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        critic = SeparableCritic(x_train.shape[1], y_train.shape[1], hidden=hidden, out=out).to(device)
    x_train, y_train = x_train.to(device, torch.float32), y_train.to(device, torch.float32)
    critic.set_input_scaling(x_train, y_train)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(critic.parameters(), lr=lr)
    objectives: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"infonce": _infonce, "nwj": _nwj, "smile": _js}
    log_ema = None
    critic.train()
    for _ in range(steps):
        idx = torch.randperm(n, generator=generator)[:batch_size].to(device)
        scores = critic(x_train[idx], y_train[idx])
        if bound == "dv":
            loss, log_ema = _mine_loss(scores, log_ema, ema_rate)
        else:
            loss = -objectives[bound](scores)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return critic.eval()


def _ledoit_wolf(joint: torch.Tensor) -> float:
    from sklearn.covariance import ledoit_wolf_shrinkage

    return float(ledoit_wolf_shrinkage(joint.cpu().numpy(), assume_centered=True))


def _inverse_sqrt(matrix: torch.Tensor, name: str) -> torch.Tensor:
    eigenvalues, vectors = torch.linalg.eigh(matrix)
    if eigenvalues.min() <= 1e-12 * eigenvalues.max():
        raise ValueError(
            f"the correlation matrix of {name} is singular (too few samples for its dimension, or collinear "
            "features); pass shrinkage='auto' or a shrinkage in (0, 1]."
        )
    return (vectors * eigenvalues.rsqrt()) @ vectors.T


def gaussian_mi(x: torch.Tensor, y: torch.Tensor, shrinkage: float | str | None = "auto") -> dict:
    """Mutual information of the Gaussian with the data's covariance, from canonical correlations (nats).

    x: (N, Dx), y: (N, Dy). "I(X;Y) = −½ Σ_i log(1 − ρ_i²)" with ρ_i the canonical correlations, the singular
    values of R_xx^{−1/2} R_xy R_yy^{−1/2} on the standardised features. Exact for jointly Gaussian data, and
    the MI of a Gaussian with the same second moments otherwise.

    Shrinkage replaces the joint correlation matrix R by (1−δ)R + δI. shrinkage="auto" uses the Ledoit–Wolf
    δ (sklearn's `ledoit_wolf_shrinkage` on the standardised joint features) when there are fewer than 10
    samples per dimension, N < 10·(Dx+Dy), and no shrinkage otherwise: even a small δ biases the MI down
    noticeably once ρ → 1. A float fixes δ ∈ [0, 1]; None means none, and fails if R_xx or R_yy is singular.
    With few samples the plug-in correlations are biased upwards and the returned "warning" says so.
    Constant features carry no information and are dropped (counted in "constant_dims_dropped").

    >>> g = torch.Generator().manual_seed(0); x = torch.randn(4000, 1, generator=g)
    >>> round(gaussian_mi(x, x + torch.randn(4000, 1, generator=g))["mi"], 1)  # true: ½ log 2 ≈ 0.35
    0.3
    """
    _check_pairs(x, y, min_rows=3)
    n = x.shape[0]
    standardised, dropped = [], {}
    for name, t in (("x", x), ("y", y)):
        t = t.detach().double().cpu()
        std, mean = torch.std_mean(t, dim=0, correction=0)
        keep = std > 1e-12 * mean.abs().clamp_min(1.0)
        dropped[name] = int((~keep).sum())
        if not keep.any():
            raise ValueError(f"every feature of {name} is constant; it carries no information.")
        standardised.append((t[:, keep] - mean[keep]) / std[keep])
    xs, ys = standardised
    dx, dy = xs.shape[1], ys.shape[1]
    joint = torch.cat([xs, ys], dim=1)

    few_samples = n < _SAMPLES_PER_DIM * (dx + dy)
    if shrinkage == "auto":
        # Even a small δ costs a lot when ρ → 1 (it adds ≈ 2δρ² to 1 − ρ²), so with enough samples none is used.
        delta, source = (_ledoit_wolf(joint), "ledoit-wolf") if few_samples else (0.0, "none (enough samples)")
    elif shrinkage is None:
        delta, source = 0.0, "none"
    elif isinstance(shrinkage, int | float) and not isinstance(shrinkage, bool) and 0 <= shrinkage <= 1:
        delta, source = float(shrinkage), "fixed"
    else:
        raise ValueError(f"shrinkage must be 'auto', None or a number in [0, 1] but got {shrinkage!r}.")

    correlation = (1 - delta) * (joint.T @ joint / n) + delta * torch.eye(dx + dy, dtype=torch.float64)
    whitened_cross = (
        _inverse_sqrt(correlation[:dx, :dx], "x")
        @ correlation[:dx, dx:]
        @ _inverse_sqrt(correlation[dx:, dx:], "y")
    )
    rho = torch.linalg.svdvals(whitened_cross)
    mi = math.inf if rho.max() >= 1 else float(-0.5 * torch.log1p(-rho.square()).sum())

    warning = None
    if few_samples:
        warning = (
            f"only {n} samples for {dx} + {dy} dimensions (fewer than {_SAMPLES_PER_DIM} per dimension): sample "
            f"canonical correlations are biased upwards, so the plug-in MI overestimates; shrinkage δ={delta:.3g} "
            f"({source}) was applied. Treat the value as rough or use more samples."
        )
    return {
        "method": "gaussian",
        "mi": mi,
        "units": "nats",
        "canonical_correlations": rho.tolist(),
        "n_samples": n,
        "dims": [x.shape[1], y.shape[1]],
        "constant_dims_dropped": dropped,
        "shrinkage": delta,
        "shrinkage_source": source,
        "warning": warning,
    }


def _batched_bound(
    critic: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    method: str,
    batch_size: int,
    clip: float,
    generator: torch.Generator,
) -> list[float]:
    order = torch.randperm(x.shape[0], generator=generator).to(x.device)
    values = []
    with torch.no_grad():
        for start in range(0, x.shape[0] - batch_size + 1, batch_size):
            idx = order[start : start + batch_size]
            scores = critic(x[idx], y[idx]).double()
            if method == "infonce":
                values.append(infonce_bound(scores).value)
            elif method == "smile":
                values.append(smile_bound(scores, clip))
            else:
                values.append({"nwj": nwj_bound, "dv": dv_bound}[method](scores))
    return values


def mutual_information(
    x: torch.Tensor,
    y: torch.Tensor,
    method: str = "infonce",
    critic: str = "cosine",
    *,
    batch_size: int = 128,
    eval_fraction: float = 0.5,
    temperature: float = 0.1,
    clip: float = 5.0,
    train_bound: str | None = None,
    steps: int = 400,
    lr: float = 3e-3,
    hidden: int = 64,
    out: int = 32,
    ema_rate: float = 0.01,
    shrinkage: float | str | None = "auto",
    seed: int = 0,
) -> dict:
    """Estimate I(x; y) in nats from N paired rows; x: (N, Dx), y: (N, Dy).

    method "gaussian" is the closed form `gaussian_mi` on all pairs (critic, batch and training knobs unused).
    Otherwise the bound `method` is averaged over disjoint batches of `batch_size` pairs, each scored as a
    B×B critic matrix:
    - critic "cosine": the fixed `cosine_critic` at `temperature`; nothing is fitted, so all N pairs are
      evaluated (n_train = 0).
    - critic "separable": a seeded `eval_fraction` of the pairs is held out; `train_critic` fits on the rest
      with `train_bound` (default: the bound being evaluated) and the bound is read out on the held-out pairs.
    Pairs left over after the last full batch are unused (reported as n_unused).

    Returns every knob next to the number, ready for results.json: "mi", "stderr" (std over batches / √n_batches,
    None for one batch), "ceiling" (log B for InfoNCE, else None), the split sizes, and "warning" when InfoNCE
    lies within 1 nat of log B (the true MI may be far larger; raise batch_size) or when SMILE is read out
    with the untrained cosine critic (whose scores the clip was not designed for).
    """
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {METHODS}.")
    _check_pairs(x, y)
    n = x.shape[0]
    if method == "gaussian":
        return {**gaussian_mi(x, y, shrinkage=shrinkage), "critic": None, "seed": seed}
    if critic not in CRITICS:
        raise ValueError(f"critic {critic!r} is not one of {CRITICS}.")
    if batch_size < 2:
        raise ValueError(f"batch_size must be at least 2 so that negative pairs exist, but got {batch_size}.")
    if method == "smile":
        _check_clip(clip)
    generator = torch.Generator().manual_seed(seed)
    train_knobs = None
    if critic == "cosine":
        if not temperature > 0:
            raise ValueError(f"temperature must be positive but got {temperature}; SimCLR uses 0.1.")
        x_eval, y_eval, n_train = x, y, 0
        score = functools.partial(cosine_critic, temperature=temperature)
    else:
        if not 0 < eval_fraction < 1:
            raise ValueError(f"eval_fraction must lie strictly between 0 and 1 but got {eval_fraction}.")
        train_bound = method if train_bound is None else train_bound
        order = torch.randperm(n, generator=generator).to(x.device)
        n_eval = round(n * eval_fraction)
        eval_idx, train_idx = order[:n_eval], order[n_eval:]
        if len(train_idx) < batch_size:
            raise ValueError(
                f"only {len(train_idx)} training pairs for batch_size {batch_size}; pass more pairs, a smaller "
                "batch_size or a smaller eval_fraction."
            )
        score = train_critic(
            x[train_idx], y[train_idx], train_bound, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
            hidden=hidden, out=out, ema_rate=ema_rate,
        )
        x_eval, y_eval, n_train = x[eval_idx], y[eval_idx], len(train_idx)
        train_knobs = {"bound": train_bound, "steps": steps, "lr": lr, "hidden": hidden, "out": out,
                       "batch_size": batch_size, "optimizer": "adam",
                       "ema_rate": ema_rate if train_bound == "dv" else None}
    n_eval = x_eval.shape[0]
    if n_eval < batch_size:
        raise ValueError(
            f"only {n_eval} evaluation pairs for batch_size {batch_size}; pass more pairs or a smaller batch_size."
        )
    values = _batched_bound(score, x_eval, y_eval, method, batch_size, clip, generator)
    mi = sum(values) / len(values)
    stderr = None
    if len(values) > 1:
        stderr = float(torch.tensor(values, dtype=torch.float64).std() / math.sqrt(len(values)))
    ceiling = math.log(batch_size) if method == "infonce" else None
    warning = None
    if method == "smile" and critic == "cosine":
        warning = (
            "SMILE with the fixed cosine critic: its clip acts on scores of arbitrary scale (±1/temperature), so "
            "the value can exceed the true MI; use critic='separable' or method='infonce'."
        )
    if ceiling is not None and mi > ceiling - _SATURATION_MARGIN:
        warning = (
            f"InfoNCE gave {mi:.3f} nats, within {_SATURATION_MARGIN:g} nat of its ceiling log B = {ceiling:.3f}: "
            "the bound is saturating and the true MI may be much larger. Raise batch_size or compare with "
            "method='smile'."
        )
    return {
        "method": method,
        "critic": critic,
        "mi": mi,
        "stderr": stderr,
        "units": "nats",
        "ceiling": ceiling,
        "batch_size": batch_size,
        "n_batches": len(values),
        "n_samples": n,
        "n_train": n_train,
        "n_eval": n_eval,
        "n_unused": n_eval - len(values) * batch_size,
        "eval_fraction": eval_fraction if critic == "separable" else None,
        "temperature": temperature if critic == "cosine" else None,
        "clip": clip if method == "smile" else None,
        "train": train_knobs,
        "seed": seed,
        "warning": warning,
    }


def label_mi_lower_bound(
    probabilities: torch.Tensor,
    labels: torch.Tensor,
    class_prior: torch.Tensor | None = None,
    eps: float = 1e-12,
) -> dict:
    """Lower bound I(Z; Y) ≥ H(Y) − CE in nats from a probe's class probabilities.

    probabilities: (N, C) rows summing to 1 (softmax outputs, not logits), labels: (N,) class indices,
    class_prior: optional (C,) p(y); by default H(Y) uses the label frequencies. Since the cross-entropy
    CE = −mean log q(y_i | z_i) of any probe q upper-bounds H(Y | Z), H(Y) − CE ≤ I(Z; Y) (Barber & Agakov).
    Probabilities are floored at `eps` inside the log. A negative value (a probe worse than the prior) is
    reported as is, not clamped, so miscalibration stays visible.

    >>> label_mi_lower_bound(torch.eye(2), torch.tensor([0, 1]))["mi_lower_bound"] == math.log(2)
    True
    """
    if probabilities.ndim != 2 or labels.ndim != 1 or probabilities.shape[0] != labels.shape[0]:
        raise ValueError(
            f"label_mi_lower_bound needs probabilities (N, C) and labels (N,) for the same N, but got "
            f"{tuple(probabilities.shape)} and {tuple(labels.shape)}."
        )
    if probabilities.shape[0] == 0:
        raise ValueError("probabilities is empty; the bound needs at least one sample.")
    if not torch.is_floating_point(probabilities) or not torch.isfinite(probabilities).all():
        raise ValueError("probabilities must be finite floating-point values.")
    if torch.is_floating_point(labels) or labels.dtype == torch.bool:
        raise ValueError(f"labels has dtype {labels.dtype}; pass integer class indices.")
    n, c = probabilities.shape
    p = probabilities.detach().double().cpu()
    labels = labels.cpu().long()
    if p.min() < 0 or (p.sum(dim=1) - 1).abs().max() > 1e-4:
        raise ValueError(
            "each row of probabilities must be non-negative and sum to 1; pass softmax(logits), not logits."
        )
    if labels.min() < 0 or labels.max() >= c:
        raise ValueError(f"labels must lie in 0..{c - 1} (the columns of probabilities).")
    if class_prior is None:
        prior, prior_source = torch.bincount(labels, minlength=c).double() / n, "label frequencies"
    else:
        prior, prior_source = class_prior.detach().double().cpu(), "given"
        if prior.shape != (c,) or prior.min() < 0 or abs(prior.sum().item() - 1) > 1e-6:
            raise ValueError(f"class_prior must be a ({c},) probability vector (non-negative, summing to 1).")
    entropy = float(-torch.special.xlogy(prior, prior).sum())
    cross_entropy = float(-p[torch.arange(n), labels].clamp_min(eps).log().mean())
    return {
        "mi_lower_bound": entropy - cross_entropy,
        "entropy_y": entropy,
        "cross_entropy": cross_entropy,
        "units": "nats",
        "n_samples": n,
        "n_classes": c,
        "prior": prior_source,
        "eps": eps,
    }
