"""Training records claim 4's step-0 collapse criterion in its summary and the split curvature per tracked point."""

import warnings

import pytest
import torch

from headprobe.recipe import GeometrySpec, HeadSpec, TrainSpec
from headprobe.train.cached_views import train_heads

HEADS = [HeadSpec(name="lin", type="linear", width=8, init_scale=0.1),
         HeadSpec(name="swish", act="swish", width=8, bn_hidden=False, init_scale=0.1)]


@pytest.fixture
def views():
    g = torch.Generator().manual_seed(0)
    base = 2.0 + torch.randn(32, 1, 6, generator=g)  # features with a mean direction, as a backbone's have
    return base + 0.3 * torch.randn(32, 3, 6, generator=g)


def _train(views, track):
    return train_heads(HEADS, views, objective_name="vicreg", objective_options={"var_weight": 0.0,
                       "cov_weight": 0.0}, train=TrainSpec(epochs=1, batch_size=16, lr=1e-2, log_every=1),
                       seed=0, track=track)


def test_a_scaled_start_that_is_not_collapsed_is_recorded_false_with_a_warning(views):
    with pytest.warns(UserWarning, match="does not start collapsed"):
        _, summary = _train(views, GeometrySpec(track_every=1, track_rows=4, track_max_iter=8))
    start = summary["collapse_start"]
    assert set(start) == {"lin", "swish"} and start["lin"]["collapsed"] is False
    assert start["lin"]["out_std"] > start["lin"]["threshold"] == pytest.approx(0.1 / 8 ** 0.5)


def test_collapse_offset_starts_every_head_collapsed_and_records_are_split(views):
    log = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a collapsed start warns about nothing
        states, summary = train_heads(
            HEADS, views, objective_name="vicreg", objective_options={"var_weight": 0.0, "cov_weight": 0.0},
            train=TrainSpec(epochs=1, batch_size=16, lr=1e-2, log_every=1), seed=0, log=log.append,
            track=GeometrySpec(track_every=1, track_rows=4, track_max_iter=8, collapse_offset=1.0))
    for name, verdict in summary["collapse_start"].items():
        assert verdict["collapsed"] and verdict["out_std"] <= verdict["threshold"], name
        assert verdict["init"].startswith("collapsed_init") and verdict["requested"]
    points = [r for r in log if r["stage"] == "geometry"]
    assert len(points) == 4 and all({"lambda_min_gterm", "m_norm_ratio", "lambda_min_loss_h",
                                     "curvature_source"} <= set(r) for r in points)
    assert all(r["m_norm_ratio"] == 0.0 and r["curvature_source"] == "none" for r in points if r["head"] == "lin")
