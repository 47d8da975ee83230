"""The spectrum probe: RankMe, α-ReQ, the effective rank and an honest condition number of the covariance of a tap's
clean training features (descriptions: none is evidence for the buffer verdict)."""

from __future__ import annotations

from dataclasses import dataclass, field

from headprobe.registry import at_least

from ..declaration import CHUNKS, Metric, Probe
from ..tap_data import ProbeOutput, TapData


@dataclass
class SpectrumSpec:
    # Condition number on the top-k eigenvalues; null = decided from samples vs dimension.
    top_k: int | None = field(default=None, metadata=at_least(1))


def measure_spectrum(tap: TapData, *, top_k: int | None) -> ProbeOutput:
    """RankMe, α-ReQ and the covariance spectrum of the clean training features (honest conditioning)."""
    from headprobe.checks import check_features
    from headprobe.stats.bootstrap import TRAIN_IMAGES, Linearised

    from ..influence import rankme_per_row
    from ..spectrum import alpha_req, alpha_req_fit_range, covariance_eigenvalues, covariance_spectrum, rankme

    # Collapsed features (the paper's collapse experiments; a dead ReLU head gives all zeros) leave some of these
    # undefined: α-ReQ needs two resolved eigenvalues, the spectrum a non-zero covariance, RankMe a non-zero z.
    # Each is then recorded as undefined with the reason, and the tap keeps the others instead of failing the run.
    undefined: dict[str, str] = {}

    def attempt(name, compute):
        try:
            return compute()
        except ValueError as err:
            undefined[name] = str(err)
            return None

    metrics, protocol, per_unit = {}, {}, {}
    if (value := attempt("rankme", lambda: rankme(tap.train_x))) is not None:
        metrics["rankme"] = value
        # Its linearised bootstrap over the training images (`probes.influence`: recomputing it on resamples drawn
        # with replacement would bias it low).
        per_unit["rankme"] = Linearised(rankme_per_row(tap.train_x, value=value).cpu(), TRAIN_IMAGES)
    # One decomposition for α-ReQ's range and fit and the spectrum (each would otherwise take its own SVD); on
    # features it cannot take, each of them records its own reason below.
    try:
        check_features("z", tap.train_x, min_rows=2)
        eigenvalues = covariance_eigenvalues(tap.train_x)
    except ValueError:
        eigenvalues = None
    fit_range = attempt("alpha_req", lambda: alpha_req_fit_range(tap.train_x, eigenvalues))
    if fit_range is not None:
        if (value := attempt("alpha_req", lambda: alpha_req(tap.train_x, fit_range, eigenvalues))) is not None:
            metrics["alpha_req"] = value
    spec = attempt("cond", lambda: covariance_spectrum(tap.train_x, top_k=top_k, eigenvalues=eigenvalues))
    if spec is not None:
        metrics |= {"cond": spec["condition_number"], "eff_rank": spec["effective_rank"]}
        protocol = {k: spec[k] for k in ("n_samples", "dim", "rank_limit", "numerical_rank", "top_k",
                                         "condition_number_scope", "note")}
        protocol["eigenvalues_top"] = list(spec["eigenvalues"][:64])
    if "alpha_req" in metrics:
        protocol["alpha_req_fit_range"] = list(fit_range)
        protocol["alpha_req_fit"] = "ranks 1..ceil(r/2) of the r resolved covariance eigenvalues"
    if undefined:
        protocol["undefined"] = undefined
    return ProbeOutput(metrics, protocol, per_unit)


SPECTRUM = Probe(
    "spectrum", measure_spectrum, "RankMe, alpha-ReQ, effective rank and an honest covariance condition number",
    options=SpectrumSpec, reads=CHUNKS,
    reads_why="spectrum.CHUNK_ROWS rows at a time, by a stacked QR; holds RankMe's per-row values",
    cost=1.8, cost_source="benchmarks/results/probe_costs.json",
    metrics=(
        Metric("rankme", "RankMe: exp-entropy of the normalised singular values of the features",
               "effective rank (dims)", "higher = more dimensions used (1 = collapse)", shown_with=("Q-class",),
               headline=11),
        Metric("alpha_req", "α-ReQ: power-law exponent of the covariance eigenvalue decay", "exponent",
               "higher = faster decay (fewer effective dimensions); ≈ 1 is typical of good features", headline=12),
        Metric("cond", "condition number of the feature covariance (largest over smallest eigenvalue kept)", "ratio",
               "higher = more anisotropic"),
        Metric("eff_rank", "effective rank of the feature covariance", "effective rank (dims)",
               "higher = more dimensions used"),
    ),
)
