"""The spectrum probe reads a long tap in row blocks (`spectrum.singular_values`' stacked QR, `rankme_per_row`'s
quadratic forms): the same numbers as the whole-array decomposition, to float64 round-off, at a block of 7 rows."""

import pytest
import torch

from headprobe.probes import spectrum
from headprobe.probes.builtin.spectrum import SPECTRUM
from headprobe.probes.influence import rankme_per_row
from headprobe.probes.spectrum import (
    alpha_req,
    covariance_eigenvalues,
    covariance_spectrum,
    rankme,
    singular_values,
)
from headprobe.probes.tap_data import TapData

pytestmark = pytest.mark.usefixtures("single_thread")


def rows(n, d, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, -3, d, dtype=torch.float64)  # a decaying spectrum, so every eigenvalue matters
    return (3.0 + torch.randn(n, d, generator=g, dtype=torch.float64) * scales).to(dtype)


@pytest.mark.parametrize(("n", "d"), [(60, 5), (61, 12), (20, 30)])
@pytest.mark.parametrize("centre", [False, True])
def test_blocked_singular_values_equal_the_whole_decomposition(n, d, centre):
    z = rows(n, d)
    whole = torch.linalg.svdvals(z - z.mean(dim=0) if centre else z)
    blocked = singular_values(z, centre=centre, chunk_rows=7)
    assert blocked.shape == whole.shape == (min(n, d),)
    assert torch.allclose(blocked, whole, rtol=1e-10, atol=1e-13 * float(whole[0]))
    assert torch.equal(singular_values(z, centre=centre, chunk_rows=n), whole)  # one block: the old path, unchanged


def test_blocked_covariance_eigenvalues_are_the_exact_ones():
    # Centred scores with orthonormal columns, scaled: the unbiased sample covariance has exactly these eigenvalues.
    n, truth = 50, torch.tensor([4.0, 1.0, 0.25, 1e-3, 1e-6], dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(n, len(truth), generator=g, dtype=torch.float64)
    scores, _ = torch.linalg.qr(noise - noise.mean(dim=0))
    basis, _ = torch.linalg.qr(torch.randn(len(truth), len(truth), generator=g, dtype=torch.float64))
    z = 7.0 + scores * (truth * (n - 1)).sqrt() @ basis.T
    assert torch.allclose(covariance_eigenvalues(z, chunk_rows=7), truth, rtol=1e-10)


def test_spectrum_measures_do_not_depend_on_the_block(monkeypatch):
    z = rows(90, 8, seed=2)
    whole = covariance_eigenvalues(z, chunk_rows=len(z))
    blocked = covariance_eigenvalues(z, chunk_rows=7)
    assert rankme(z, chunk_rows=7) == pytest.approx(rankme(z), rel=1e-10)
    assert alpha_req(z, eigenvalues=blocked) == pytest.approx(alpha_req(z, eigenvalues=whole), rel=1e-10)
    a, b = covariance_spectrum(z, eigenvalues=blocked), covariance_spectrum(z, eigenvalues=whole)
    assert a.keys() == b.keys()
    for key in ("condition_number", "effective_rank", "participation_ratio", "numerical_rank", "top_k"):
        assert a[key] == pytest.approx(b[key], rel=1e-10), key
    monkeypatch.setattr(spectrum, "CHUNK_ROWS", 7)  # the default read at the call, as the probe uses it
    assert torch.allclose(covariance_eigenvalues(z), whole, rtol=1e-10)


def test_rankme_per_row_blocked_equals_whole():
    # The decaying spectrum without the offset of 3: a float32 Gram matrix of offset rows (what one block computes)
    # resolves its smallest eigenvalue to 10% only, while the blocks' float64 products resolve it exactly, so
    # there the two differ by the whole product's error (7e-4 relative), not the blocks'.
    z = rows(100, 6, seed=3, dtype=torch.float32) - 3.0
    whole, blocked = rankme_per_row(z, chunk_rows=len(z)), rankme_per_row(z, chunk_rows=7)
    assert float(blocked.mean()) == pytest.approx(rankme(z), rel=1e-10)
    assert torch.allclose(blocked, whole, rtol=1e-6, atol=1e-6 * float(whole.abs().max()))


def test_the_spectrum_probe_gives_the_same_output_in_blocks(monkeypatch):
    z = rows(120, 10, seed=4, dtype=torch.float32)
    y = torch.arange(120) % 3
    tap = TapData("t", z, y, z[:30], y[:30], 3)
    whole = SPECTRUM(tap)
    monkeypatch.setattr(spectrum, "CHUNK_ROWS", 7)
    blocked = SPECTRUM(tap)
    assert blocked.metrics.keys() == whole.metrics.keys() == {"rankme", "alpha_req", "cond", "eff_rank"}
    assert blocked.protocol.keys() == whole.protocol.keys()
    for name, value in whole.metrics.items():
        assert blocked.metrics[name] == pytest.approx(value, rel=1e-9), name
    assert blocked.protocol["eigenvalues_top"] == pytest.approx(whole.protocol["eigenvalues_top"], rel=1e-9)


def test_chunk_rows_must_be_positive():
    with pytest.raises(ValueError, match="chunk_rows must be positive"):
        singular_values(rows(10, 2), chunk_rows=0)


def _rankme_values_float64(z, eps=1e-7):
    """rankme_per_row's formula (its docstring) written out in float64 from an SVD of z: the reference."""
    z = z.double()
    _, s, vh = torch.linalg.svd(z, full_matrices=False)
    q, value = s / s.sum(), rankme(z, eps)
    p, keep = q + eps, s > s[0] * 1e-6
    c = value * ((q * p.log()).sum() - p.log())[keep] / s.sum() / (2 * s[keep])
    influence = len(z) * ((z @ vh[keep].T) ** 2 * c).sum(1)
    return value + influence - influence.mean()


def test_rankme_per_row_in_blocks_is_closer_to_float64_than_one_float32_product():
    """Offset rows (mean 3, spectrum down to 1e-3): the blocks' float64 Gram matrix gives the values to the float32
    quadratic forms' round-off (4.7e-5 of the largest), where one float32 Gram product of the whole tap is off by
    7e-4; so the blocks are checked against the float64 formula, not against the one product."""
    z = rows(100, 6, seed=3, dtype=torch.float32)
    exact = _rankme_values_float64(z)
    blocked = rankme_per_row(z, chunk_rows=7)
    assert float((blocked - exact).abs().max()) < 2e-4 * float(exact.abs().max())
    assert float(blocked.mean()) == pytest.approx(rankme(z), rel=1e-10)
