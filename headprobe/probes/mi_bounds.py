"""Variational bounds on the mutual information between paired views, and the critics they read.

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

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from headprobe.checks import check_features, check_finite, check_floating

BOUNDS = ("infonce", "nwj", "dv", "smile")


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
    check_floating("scores", scores, "critic values")
    check_finite("scores", scores, "check the critic and its temperature")


def check_pairs(x: torch.Tensor, y: torch.Tensor, *, min_rows: int = 2) -> None:
    """Raise ValueError unless x: (N, Dx), y: (N, Dy) are finite floats, row i of each one pair, N ≥ min_rows."""
    check_features("x", x)
    check_features("y", y)
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


def check_clip(clip: float) -> None:
    """Raise ValueError unless SMILE's clip is positive."""
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
    check_clip(clip)
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
    check_pairs(z1, z2)
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
    """Separable critic f(x, y) = g(x)ᵀ h(y) (Poole et al., sec. 4), each side a linear map plus a two-hidden-layer
    ReLU MLP: g(x) = W_g x + MLP_g(x), likewise h.

    The linear path makes the bilinear critic xᵀ W_gᵀ W_h y, the optimal one for Gaussian views up to a norm
    term, reachable without the MLP; the MLP then only has to learn what is non-linear, which is what lets a
    critic fitted on a few thousand pairs match the fixed cosine critic. Inputs are standardised with
    per-feature statistics stored as buffers (set by `train_critic` from the fitting pairs), so features of any
    scale train with one learning rate.

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
        self.g_linear = nn.Linear(dim1, out, bias=False)
        self.h_linear = nn.Linear(dim2, out, bias=False)
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
        x = (x.to(self.x_mean) - self.x_mean) / self.x_scale
        y = (y.to(self.y_mean) - self.y_mean) / self.y_scale
        return (self.g_linear(x) + self.g(x)) @ (self.h_linear(y) + self.h(y)).T


class CriticFit(NamedTuple):
    """What `train_critic` returns: the critic holding its best-validation weights, and how it was fitted
    (split sizes, the step early stopping chose, the validation curve and every setting) for results.json."""

    critic: SeparableCritic
    protocol: dict


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


def _validation_objective(
    critic: SeparableCritic, x: torch.Tensor, y: torch.Tensor, objective: Callable[[torch.Tensor], torch.Tensor],
    batch_size: int,
) -> float:
    """Mean of `objective` over the disjoint batches of the validation pairs, in their (already shuffled) order."""
    with torch.no_grad():
        values = [objective(critic(x[i : i + batch_size], y[i : i + batch_size]).double()).item()
                  for i in range(0, x.shape[0] - batch_size + 1, batch_size)]
    return sum(values) / len(values)


def train_critic(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    bound: str = "infonce",
    *,
    steps: int = 1000,
    batch_size: int = 128,
    lr: float = 2e-3,
    weight_decay: float = 1.0,
    seed: int = 0,
    hidden: int = 64,
    out: int = 32,
    ema_rate: float = 0.01,
    validation_fraction: float = 0.25,
    eval_every: int = 50,
    patience: int = 10,
) -> CriticFit:
    """Fit a `SeparableCritic` by maximising a bound on random batches, early-stopped on held-out pairs.

    x_train: (N, D1), y_train: (N, D2), row i of each is one positive pair. A seeded `validation_fraction` of
    the pairs is set aside for validation; the rest (the fitting pairs) set the input scaling and the batches.
    Each of at most `steps` AdamW steps (decoupled `weight_decay`, learning rate `lr` annealed to 0 on a cosine
    over `steps`) draws `batch_size` distinct fitting pairs and ascends the bound: "infonce", "nwj", "dv" (MINE:
    moving-average denominator with rate `ema_rate`) or "smile" (trained with the Jensen–Shannon objective, as
    Song & Ermon do). Every `eval_every` steps the same objective is averaged over disjoint batches of the
    validation pairs; training stops once it has not improved for `patience` evaluations, and the critic is
    returned with the weights of its best evaluation. Run to its last step without weight decay, an MLP critic
    fitted on 10k pairs of 20-d Gaussians (I = 2 nats) read 2.08 nats on its own pairs and 1.28 on new ones,
    below the fixed cosine critic's 1.81 (issue #13). The validation pairs choose the step, so the value they
    give is optimistic: read the bound out on pairs passed to neither (`mutual_information` does).
    Initialisation, split and batches depend only on `seed`; the global RNG is left untouched.

    >>> x = torch.randn(600, 2); fit = train_critic(x, x + torch.randn(600, 2), steps=20, batch_size=64)
    >>> fit.protocol["n_fit"], fit.protocol["n_val"], fit.protocol["best_step"] <= 20
    (450, 150, True)
    """
    check_pairs(x_train, y_train)
    if bound not in BOUNDS:
        raise ValueError(f"bound {bound!r} is not one of {BOUNDS}.")
    if steps < 1 or not lr > 0 or weight_decay < 0:
        raise ValueError(
            f"steps must be ≥ 1, lr positive and weight_decay ≥ 0 but got steps={steps}, lr={lr}, "
            f"weight_decay={weight_decay}."
        )
    if not 0 < ema_rate < 1:
        raise ValueError(f"ema_rate must lie strictly between 0 and 1 but got {ema_rate}.")
    if not 0 < validation_fraction < 1:
        raise ValueError(
            f"validation_fraction must lie strictly between 0 and 1 but got {validation_fraction}; the critic is "
            "early-stopped on those pairs."
        )
    if eval_every < 1 or patience < 1:
        raise ValueError(f"eval_every and patience must be ≥ 1 but got {eval_every} and {patience}.")
    n = x_train.shape[0]
    n_val = round(n * validation_fraction)
    if batch_size < 2 or min(n_val, n - n_val) < batch_size:
        raise ValueError(
            f"{n} training pairs split into {n - n_val} fitting and {n_val} validation pairs, but both need at "
            f"least batch_size = {batch_size} (≥ 2); pass more pairs or a smaller batch_size."
        )
    device = x_train.device
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=generator).to(device)
    x_train, y_train = x_train.to(device, torch.float32), y_train.to(device, torch.float32)
    x_val, y_val = x_train[order[:n_val]], y_train[order[:n_val]]
    x_fit, y_fit = x_train[order[n_val:]], y_train[order[n_val:]]
    n_fit = n - n_val
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        critic = SeparableCritic(x_fit.shape[1], y_fit.shape[1], hidden=hidden, out=out).to(device)
    critic.set_input_scaling(x_fit, y_fit)
    optimizer = torch.optim.AdamW(critic.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    objectives: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "infonce": _infonce, "nwj": _nwj, "dv": _dv, "smile": _js,
    }
    log_ema = None
    best_value, best_step, best_state, curve = -math.inf, 0, None, []
    step = 0
    while step < steps and step - best_step < patience * eval_every:
        critic.train()
        step += 1
        idx = torch.randperm(n_fit, generator=generator)[:batch_size].to(device)
        scores = critic(x_fit[idx], y_fit[idx])
        if bound == "dv":
            loss, log_ema = _mine_loss(scores, log_ema, ema_rate)
        else:
            loss = -objectives[bound](scores)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % eval_every == 0 or step == steps:
            critic.eval()
            value = _validation_objective(critic, x_val, y_val, objectives[bound], batch_size)
            curve.append([step, value])
            if value > best_value:
                best_value, best_step = value, step
                best_state = {k: v.detach().clone() for k, v in critic.state_dict().items()}
    if best_state is not None:
        critic.load_state_dict(best_state)
    protocol = {
        "bound": bound,
        "validated_on": {"infonce": "InfoNCE", "nwj": "NWJ", "dv": "DV", "smile": "Jensen–Shannon"}[bound]
        + " objective over disjoint batches of the validation pairs",
        "n_fit": n_fit,
        "n_val": n_val,
        "validation_fraction": validation_fraction,
        "best_step": best_step,
        "best_validation": best_value,
        "stopped_at": step,
        "stopped_early": step < steps,
        "validation_curve": curve,
        "max_steps": steps,
        "eval_every": eval_every,
        "patience": patience,
        "batch_size": batch_size,
        "optimizer": "adamw",
        "lr": lr,
        "lr_schedule": "cosine to 0 over max_steps",
        "weight_decay": weight_decay,
        "hidden": hidden,
        "out": out,
        "ema_rate": ema_rate if bound == "dv" else None,
        "seed": seed,
    }
    return CriticFit(critic.eval(), protocol)
