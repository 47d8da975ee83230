import math

import pytest
import torch
from torch import nn

# geometry.analyse binds curvature_snapshot by name when first imported: imported here, it binds the real one, not
# the spy a test below installs (which, imported during that test, it kept: later runs' geometry then failed).
import headprobe.geometry.analyse  # noqa: F401
import headprobe.geometry.tracking as tracking
import headprobe.train.curvature as train_curvature
from headprobe.geometry import batchnorm_mode, collapse_start
from headprobe.geometry.collapse import collapse_criterion, collapsed_init, fixed_stat_rows
from headprobe.recipe import GeometrySpec, HeadSpec, TrainSpec
from headprobe.train.cached_views import train_heads
from headprobe.train.engine import seed_of
from headprobe.train.heads import ProjectionHead

F64 = torch.float64
D = 8

pytestmark = pytest.mark.usefixtures("single_thread")


def test_collapse_start_scales_weights_like_init_scale():
    torch.manual_seed(3)
    scaled = ProjectionHead(D, depth=2, width=16, act="swish", init_scale=0.1)
    torch.manual_seed(3)
    plain = collapse_start(ProjectionHead(D, depth=2, width=16, act="swish"), 0.1)
    for (name, a), b in zip(scaled.state_dict().items(), plain.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="finite"):
        collapse_start(plain, float("nan"))


def test_collapse_criterion_and_collapsed_init_start_every_head_collapsed():
    g = torch.Generator().manual_seed(7)
    z = 1.0 + torch.randn(64, D, generator=g, dtype=F64)  # a mean direction, as backbone features have
    for kind, act, bn in (("linear", "relu", False), ("mlp", "relu", False), ("mlp", "swish", False),
                          ("mlp", "gelu", True)):
        torch.manual_seed(8)
        head = ProjectionHead(D, kind=kind, depth=2, width=16, out_dim=8, act=act, bn_hidden=bn).to(F64)
        with batchnorm_mode(head, "batch"), torch.no_grad():
            before = nn.functional.normalize(head(z), dim=1).std(0).mean().item()
            collapsed_init(head, z.mean(0), offset=1.0, scale=0.01)
            after = nn.functional.normalize(head(z), dim=1).std(0).mean().item()
        assert not collapse_criterion(before, 8)["collapsed"], kind
        verdict = collapse_criterion(after, 8)
        assert verdict["collapsed"] and verdict["out_std"] < 0.1 / math.sqrt(8), (kind, act, bn, after)
        assert verdict["threshold"] == pytest.approx(0.1 / math.sqrt(8))
    assert not collapse_criterion(None, 8)["collapsed"] and not collapse_criterion(float("nan"), 8)["collapsed"]
    with pytest.raises(ValueError, match="offset > 0"):
        collapsed_init(head, z.mean(0), offset=-1.0)
    with pytest.raises(ValueError, match="nonzero"):
        collapsed_init(head, torch.zeros(D, dtype=F64))


def test_fixed_stat_rows_are_distinct_cached_rows_chosen_by_the_seed_alone():
    views = torch.randn(30, 4, D, generator=torch.Generator().manual_seed(0))
    rows = fixed_stat_rows(views, 50, seed=3)
    flat = views.reshape(-1, D)
    index = [int(torch.nonzero((flat == r).all(1))[0]) for r in rows]
    assert rows.shape == (50, D) and len(set(index)) == 50 and index == sorted(index)
    assert torch.equal(rows, fixed_stat_rows(views, 50, seed=3))
    assert not torch.equal(rows, fixed_stat_rows(views, 50, seed=4))
    assert torch.equal(fixed_stat_rows(views, 1000, seed=3), flat)  # fewer rows than asked: all of them
    with pytest.raises(ValueError, match=r"\(N, K, D\)"):
        fixed_stat_rows(flat, 10, seed=0)


def test_tracked_collapse_statistics_are_those_of_the_same_fixed_rows_at_every_step(monkeypatch):
    """Every tracked record's out_std and RankMe equal a direct computation (L2-normalised std; exp-entropy of
    the singular values) on head(rows) at that step, the rows being the same `fixed_stat_rows` every time."""
    g = torch.Generator().manual_seed(0)
    views = torch.randn(24, 1, D, generator=g) + 0.3 * torch.randn(24, 4, D, generator=g)
    expected_rows = fixed_stat_rows(views, 40, seed_of(0, "collapse rows"))
    real, direct = tracking.curvature_snapshot, []

    def spy(head, z1, z2, objective_fn, **kw):
        rows = kw["stat_rows"]
        with batchnorm_mode(head, "batch"), torch.no_grad():
            h = head(rows).double()
        s = torch.linalg.svdvals(h)
        p = s / s.sum() + 1e-7
        direct.append((torch.equal(rows, expected_rows), float((h / h.norm(dim=1, keepdim=True)).std(0).mean()),
                       math.exp(float(-(p * p.log()).sum()))))
        return real(head, z1, z2, objective_fn, **kw)

    monkeypatch.setattr(train_curvature, "curvature_snapshot", spy)  # the name the training loop calls
    track = GeometrySpec(track_every=1, track_rows=4, track_max_iter=8, track_split=False, track_stat_rows=40)
    states, _ = train_heads([HeadSpec(name="bn", act="gelu", width=16, out_dim=8)], views, objective_name="vicreg",
                            objective_options={}, train=TrainSpec(epochs=2, batch_size=8, lr=0.05), seed=0,
                            track=track)
    records = [r for r in states["bn"].history if r["stage"] == "geometry"]
    assert len(records) == len(direct) == 6
    for record, (same_rows, out_std, rankme) in zip(records, direct, strict=True):
        assert same_rows and record["stats_rows"] == 40 and record["stats_rows_fixed"]
        assert record["out_std"] == pytest.approx(out_std, rel=1e-6)
        assert record["rankme"] == pytest.approx(rankme, rel=1e-6)
    assert len({round(r["out_std"], 9) for r in records}) > 1  # the head trained: the statistics moved
