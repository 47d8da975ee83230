"""Claim 1 as a declared question, answered per linear head with an interval (results.json["claims"]["Q-whiten"]).

**Q-whiten** "Does training make a linear head whiten the effective Hessian on its top-r subspace?" ("With r = rank
of the loss Hessian with respect to the head output, a linear head W can make the effective Hessian isotropic
(vᵀH_eff v = |v|²) on an r-dimensional subspace", PAPER.md claim 1.) Primary: the isotropy error
‖H_i − c·P‖_F/‖H_i‖_F of each sample's effective Hessian H_i = Wᵀ (∂²L/∂h_i²) W on its top-r_i subspace
(`geometry.whiten`, matrix-free), averaged over sampled rows of each evaluation batch, as the change trained − at
initialisation (the same head rebuilt at the weights it started from, the `null_heads: [init]` copy), paired on the
same batches and rows, seed by seed. The claim says a linear head *can* whiten (W = U_r Λ_r^{-1/2} R gives 0); the
question is whether training gets there: "yes" when the 95% interval of the change lies below −margin (training
lowered the error by more than the margin), "no" when it lies above −margin, "undecided" otherwise.

**The premise.** The theorem needs ∇²_h L ⪰ 0. Each evaluated batch (trained and initial state) records λ_min of
the whole batch's ∇²_h L by Lanczos; where it is negative beyond its bound on any of them the answer is withheld
("premise fails: ∇²_h L is indefinite for this loss"), and where it cannot be told (λ_min not converged) withheld
too. Measured on the registered objectives (a two-view batch of 32 × 16 outputs, views 0.3 apart, at output
scales 0.1, 1 and 3; λ_min/λ_max): only **VICReg's invariance term alone** (`vicreg` with `var_weight: 0`,
`cov_weight: 0`, 25·MSE) qualifies, λ_min = 0 exactly; **InfoNCE** (−0.08 to −0.14), **Barlow Twins** (−0.07 to
−0.08), **full VICReg** (−0.10 to −1.6; its variance hinge is concave where active and its covariance term quartic)
and **SimSiam's** negative cosine (−0.11 to −0.26, as PAPER.md says) are indefinite, so for them the measure is a
description and no answer is given.

Interval: with several seeds, the wider of the two-stage cluster bootstrap over seeds and batches
(`stats.clustered`) and the t interval over the per-seed mean changes (Student, S − 1 degrees of freedom: three
seeds are too few for the bootstrap alone); with one seed, the bootstrap over evaluation batches only (said so).

>>> Q_WHITEN.margin, Q_WHITEN.primary
(0.05, 'isotropy_error')
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field

from headprobe.stats.geometry_answers import GeometryAnswers, WhitenAnswer
from headprobe.stats.geometry_claims import GeometryQuestion

Q_WHITEN = GeometryQuestion(
    "Q-whiten", 1, "Does training make a linear head whiten the effective Hessian on its top-r subspace?",
    "isotropy_error", "‖H_i − c·P‖_F/‖H_i‖_F on the top-r_i eigenspace of each sample's effective Hessian, "
    "trained − at initialisation", 0.05,
    "the run's trained linear heads, every seed, against their initial weights, on evaluation batches of its cached "
    "views (geometry.final); answered only where ∇²_h L is PSD")
WITHHELD = "withheld"


@dataclass(frozen=True)
class WhitenMeasure:
    """One linear head's Q-whiten values: {seed: the mean isotropy error per evaluation batch} trained and at
    initialisation (the same batches and rows, in the same order), each batch's premise record (`geometry.whiten.
    loss_hessian_premise` with "seed" and "state": trained / init), the ranks r_i seen, and whether every row's
    block captured H_i (the error is then the dense one)."""

    head: str
    trained: dict[int, list[float]]
    init: dict[int, list[float]]
    premise: list[dict] = field(default_factory=list)
    ranks: tuple[int, ...] = ()
    captured: bool = True


def _interval(clusters: list[list[float]], seed: int) -> tuple[list[float], str]:
    """(95% interval of the pooled mean, how it was made) of per-batch values grouped by seed."""
    import torch

    from headprobe.stats.clustered import cluster_bootstrap
    from headprobe.stats.retraining import t_intervals

    boot = list(cluster_bootstrap(clusters, seed=seed))
    if len(clusters) < 2:
        return boot, "evaluation batches only (one seed: it does not cover retraining)"
    t_ci, se = t_intervals(torch.tensor([statistics.fmean(c) for c in clusters], dtype=torch.float64))
    t_ci = t_ci.tolist()
    if float(se) > 0 and t_ci[1] - t_ci[0] > boot[1] - boot[0]:
        return t_ci, f"t interval over {len(clusters)} seeds' mean changes (wider than the cluster bootstrap)"
    return boot, "cluster bootstrap over seeds and batches (wider than the t interval over seeds)"


def _premise(records: list[dict]) -> dict:
    """The premise over every evaluated batch: "holds" (True / False / None), counts, the most negative λ_min."""
    n_psd = sum(r["psd"] is True for r in records)
    n_indefinite = sum(r["psd"] is False for r in records)
    worst = min(records, key=lambda r: r["lambda_min"] / r["lambda_max"] if r["lambda_max"] > 0 else 0.0)
    holds = False if n_indefinite else True if n_psd == len(records) else None
    return {"holds": holds, "n_batches": len(records), "n_psd": n_psd, "n_indefinite": n_indefinite,
            "lambda_min": worst["lambda_min"], "lambda_max": worst["lambda_max"], "bound": worst["bound"]}


def _answer(ci95: list[float], premise: dict, margin: float) -> str:
    if premise["holds"] is not True:
        return WITHHELD
    low, high = ci95
    return "yes" if high < -margin else "no" if low > -margin else "undecided"


def answer_whiten(measures: list[WhitenMeasure], question: GeometryQuestion = Q_WHITEN,
                  seed: int = 0) -> GeometryAnswers:
    """Q-whiten's answers from each linear head's `WhitenMeasure`."""
    heads = {}
    for m in measures:
        seeds = [s for s in m.trained if m.trained[s] and m.init.get(s)]
        if not seeds:
            continue
        changes = [[t - i for t, i in zip(m.trained[s], m.init[s], strict=True)] for s in seeds]
        change: dict = {"value": statistics.fmean(v for c in changes for v in c)}
        change["ci95"], change["interval"] = _interval(changes, seed)
        states = {}
        for state, values in (("trained", m.trained), ("init", m.init)):
            clusters = [values[s] for s in seeds]
            ci, _ = _interval(clusters, seed)
            states[state] = {"value": statistics.fmean(v for c in clusters for v in c), "ci95": ci}
        premise = _premise(m.premise) if m.premise else {"holds": None, "n_batches": 0}
        answer = WhitenAnswer(
            change, states["trained"], states["init"],
            {str(s): {"trained": statistics.fmean(m.trained[s]), "init": statistics.fmean(m.init[s])} for s in seeds},
            len(seeds), len(changes[0]), "evaluation batches", sorted(set(m.ranks)), m.captured, premise,
            _answer(change["ci95"], premise, question.margin))
        heads[m.head] = dataclasses.replace(answer, line=whiten_line(question, m.head, answer))
    return GeometryAnswers(
        question, "change trained − init per evaluation batch (the same batches and rows), mean over batches and "
                  "seeds; 95%: the wider of the cluster bootstrap over seeds and batches and the t interval over "
                  "the per-seed means (batches only with one seed)",
        f"withheld unless ∇²_h L is PSD on every evaluated batch; yes: the interval lies below "
        f"−{question.margin:g}; no: above −{question.margin:g}; undecided otherwise", heads)


def _number(value: float) -> str:
    return f"{value:.3g}".replace("-", "−")


def whiten_line(question: GeometryQuestion, head: str, answer: WhitenAnswer) -> str:
    """"Q-whiten: linear head isotropy error 0.41 trained vs 0.62 at init, change −0.21 [−0.25, −0.17], 3 seeds × 4
    evaluation batches, r = 64 — yes"; a withheld answer says why."""
    low, high = answer.change["ci95"]
    seeds = f"{answer.n_seeds} seed{'s' if answer.n_seeds != 1 else ''}"
    ranks = "/".join(str(r) for r in answer.rank)
    body = (f"{question.key}: {head} head isotropy error {_number(answer.trained['value'])} trained vs "
            f"{_number(answer.init['value'])} at init, change {_number(answer.change['value'])} [{_number(low)}, "
            f"{_number(high)}], {seeds} × {answer.n_units} {answer.unit}, r = {ranks}")
    premise = answer.premise
    if answer.answer != WITHHELD:
        return f"{body} — {answer.answer}"
    if premise["holds"] is False:
        why = (f"premise fails: ∇²_h L is indefinite for this loss (λ_min {_number(premise['lambda_min'])} against "
               f"λ_max {_number(premise['lambda_max'])} on {premise['n_indefinite']}/{premise['n_batches']} batches)")
    else:
        why = "premise undetermined: λ_min of ∇²_h L did not converge on every batch"
    return f"{body} — {WITHHELD} ({why})"
