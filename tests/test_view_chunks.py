"""The view probes read their (N, K, D) views a block of images at a time (`spectrum.image_blocks`): invariance's
per-image values bit for bit and LiDAR to float64 round-off (its covariances summed over the blocks), view_mi's
InfoNCE bit for bit (it reads a batch at a time) and its Gaussian MI to round-off (`spectrum.principal_axes`'
stacked QR); each at blocks of 7 view rows against the whole computation."""

import pytest
import torch

from headprobe.probes.builtin.invariance import INVARIANCE
from headprobe.probes.builtin.view_mi import VIEW_MI
from headprobe.probes.information import mutual_information
from headprobe.probes.lidar_influence import lidar_pseudo_values
from headprobe.probes.spectrum import image_blocks, principal_axes
from headprobe.probes.tap_data import TapData

pytestmark = pytest.mark.usefixtures("single_thread")

# Relative tolerance where blocks change the order of a float64 sum (LiDAR's Σ_w, the stacked QR).
ROUND_OFF = 1e-10


def make_views(n=61, k=3, d=6, seed=0) -> torch.Tensor:
    """float32 views, as a tap's are: an image component and a smaller view component, a decaying spectrum."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, -1.5, d)
    return ((torch.randn(n, 1, d, generator=g) + 0.5 * torch.randn(n, k, d, generator=g)) * scales + 2.0).float()


def view_tap(views: torch.Tensor) -> TapData:
    empty, labels = torch.zeros(2, views.shape[-1]), torch.zeros(2, dtype=torch.long)
    return TapData("backbone", empty, labels, empty, labels, 2, views=views)


def test_image_blocks_cover_every_image_once_with_at_least_two_per_block():
    for n, k, rows in [(61, 3, 7), (8, 3, 7), (9, 3, 7), (5, 2, 100), (2, 4, 1)]:
        blocks = image_blocks(n, k, rows)
        assert [i for b in blocks for i in range(n)[b]] == list(range(n))
        assert all(b.stop - b.start >= 2 for b in blocks)
    assert image_blocks(61, 3, 183) == [slice(0, 61)]  # all views fit: one block, the whole computation
    assert len(image_blocks(61, 3, 7)) == 30


def test_invariance_at_blocks_of_7_rows_equals_the_whole_computation():
    views = make_views()
    tap = view_tap(views)
    whole, blocked = INVARIANCE(tap), INVARIANCE(tap, chunk_rows=7)
    # Per-image values come from their own block: exactly equal.
    for name in ("align", "view_cos", "view_spread_rel", "uniform"):
        assert blocked.metrics[name] == whole.metrics[name], name
    for name in ("align", "view_cos"):
        assert torch.equal(blocked.per_unit[name].values, whole.per_unit[name].values)
    assert torch.equal(blocked.per_unit["uniform"].points, whole.per_unit["uniform"].points)
    assert torch.equal(blocked.per_unit["view_spread_rel"].centroids, whole.per_unit["view_spread_rel"].centroids)
    # LiDAR's Σ_w summed over 30 blocks instead of one product: float64 round-off.
    assert blocked.metrics["lidar"] == pytest.approx(whole.metrics["lidar"], rel=ROUND_OFF)
    torch.testing.assert_close(blocked.per_unit["lidar"].values, whole.per_unit["lidar"].values,
                               rtol=ROUND_OFF, atol=0)
    assert blocked.protocol == whole.protocol


def test_lidar_pseudo_values_in_blocks_and_whole_agree():
    views = make_views(n=40, k=4, d=5, seed=3).double()
    whole = lidar_pseudo_values(views)
    torch.testing.assert_close(lidar_pseudo_values(views, chunk_rows=7), whole, rtol=ROUND_OFF, atol=0)
    assert torch.equal(lidar_pseudo_values(views, chunk_rows=160), whole)  # one block: the old path


def test_principal_axes_in_blocks_span_the_same_axes():
    views = make_views(n=50, d=6, seed=1)
    parts = [views[:, 0], views[:, 1]]
    mean, vh = principal_axes(parts, chunk_rows=7)
    pooled = torch.cat([p.double() for p in parts])
    whole_mean, whole_vh = principal_axes(parts)
    assert torch.equal(whole_mean, pooled.mean(0))
    assert torch.equal(whole_vh, torch.linalg.svd(pooled - pooled.mean(0), full_matrices=False).Vh)
    torch.testing.assert_close(mean, whole_mean, rtol=ROUND_OFF, atol=0)
    # The same axes up to each one's sign.
    torch.testing.assert_close((vh * whole_vh).sum(1).abs(), torch.ones(6, dtype=torch.float64),
                               rtol=0, atol=ROUND_OFF)


@pytest.mark.parametrize("critic", ["cosine", "separable"])
def test_view_mi_at_blocks_of_7_rows_equals_the_whole_computation(critic):
    views = make_views(n=160, k=2, d=6, seed=2)
    tap = view_tap(views)
    options = {"pca_dims": 3, "batch_size": 16, "critic": critic, "critic_steps": 20}
    whole, blocked = VIEW_MI(tap, **options), VIEW_MI(tap, chunk_rows=7, **options)
    # InfoNCE reads a batch at a time whatever the block, converted to float64 as before: exactly equal.
    assert blocked.metrics["mi.infonce"] == whole.metrics["mi.infonce"]
    z1, z2 = views[:, 0].double(), views[:, 1].double()
    extra = {"temperature": 0.1} if critic == "cosine" else {"steps": 20}
    before = mutual_information(z1, z2, method="infonce", critic=critic, batch_size=16, seed=0, **extra)
    assert whole.metrics["mi.infonce"] == before["mi"]
    # The Gaussian MI on principal axes from the stacked QR: float64 round-off.
    assert blocked.metrics["mi.gaussian"] == pytest.approx(whole.metrics["mi.gaussian"], rel=ROUND_OFF)
    torch.testing.assert_close(blocked.per_unit["mi.gaussian"].values, whole.per_unit["mi.gaussian"].values,
                               rtol=ROUND_OFF, atol=ROUND_OFF)
