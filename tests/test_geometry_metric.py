"""Q-metric (claim 2): geometry.local_metric against dense float64 computations (torch.func), heads whose answer
is known (one that equals the metric the loss asks for, linear heads), the answer rules of stats.metric_claim, and
the geometry stage answering it on a tiny recipe."""

import pytest
import torch
from torch import nn
from torch.func import hessian, jacrev

from headprobe.geometry.effective import isotropy
from headprobe.geometry.local_metric import batch_local_metric, metric_distance, metric_spectrum
from headprobe.pipeline.compose import run
from headprobe.pipeline.metric_claim import constant_jacobian, metric_batches
from headprobe.stats.metric_claim import Q_METRIC, MetricMeasure, answer_metric, change_answer
from headprobe.train.heads import ProjectionHead
from headprobe.train.objectives import info_nce

F64 = torch.float64


class LogHead(nn.Module):
    """h(z) = 2 log(z/2 + 1) coordinatewise: under L = Σ exp(h) its local metric is the identity at every z."""

    def forward(self, z):
        return 2 * torch.log(z / 2 + 1)


def _exp_loss(h):
    return h.exp().sum()


def _batch(n=5, d=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=gen, dtype=F64), 3 * torch.rand(n, d, generator=gen, dtype=F64)


def _dense_distances(head, loss_of_h, z1, z2, rows):
    """Each row's (own, swapped) distance from dense J (jacrev) and the dense Hessian of the whole batch loss."""
    z = torch.cat([z1, z2])
    n = len(z1)
    h = torch.cat([head(z[:n]), head(z[n:])]).detach()
    full = hessian(lambda y: loss_of_h(y))(h)  # (2n, out, 2n, out)
    jacs = [jacrev(lambda x: head(x[None])[0])(z[i]).detach() for i in rows]
    out = []
    for k, i in enumerate(rows):
        a = full[i, :, i, :]
        values = torch.linalg.eigvalsh(a)
        r = min(int((values.abs() > 1e-9 * values.abs().max()).sum()), *jacs[k].shape)
        dist = []
        for jac in (jacs[k], jacs[(k + 1) % len(rows)]):
            g = jac.T @ a @ jac
            dist.append(isotropy(torch.linalg.eigvalsh((g + g.T) / 2).abs(), r, 1e-9)["isotropy_error"])
        out.append(dist)
    return out


@pytest.mark.parametrize("out_dim", [4, 12])  # out < D (the S A S side) and out > D (the D × D side)
def test_matrix_free_distances_equal_dense_torch_func_under_infonce(out_dim):
    torch.manual_seed(0)
    head = ProjectionHead(6, depth=2, width=9, out_dim=out_dim, act="swish", bn_hidden=False).double().eval()
    z1, z2 = torch.randn(5, 6, dtype=F64), torch.randn(5, 6, dtype=F64)
    rows = torch.tensor([0, 7, 3, 9])

    def loss(h):
        return info_nce(h[:5], h[5:], temperature=0.5).loss

    rec = batch_local_metric(head, loss, z1, z2, rows)
    dense = _dense_distances(head, loss, z1, z2, rows.tolist())
    for row, (own, swapped) in zip(rec["rows"], dense, strict=True):
        assert abs(row["distance"] - own) < 1e-10 and abs(row["distance_swapped"] - swapped) < 1e-10
    assert rec["n_rows"] == 4 and rec["adaptation"] != 0.0


def test_the_spectrum_of_either_side_is_the_metric_s_nonzero_spectrum():
    gen = torch.Generator().manual_seed(1)
    jac, a = torch.randn(3, 7, generator=gen, dtype=F64), torch.randn(3, 3, generator=gen, dtype=F64)
    a = a + a.T  # indefinite
    dense = torch.linalg.eigvalsh(jac.T @ a @ jac)
    nonzero = dense[dense.abs() > 1e-10]
    assert torch.allclose(metric_spectrum(jac, a).sort().values, nonzero.sort().values, atol=1e-12)


def test_a_head_equal_to_the_metric_the_loss_asks_for_has_distance_zero_and_adapts():
    z1, z2 = _batch()
    rec = batch_local_metric(LogHead(), _exp_loss, z1, z2, torch.tensor([0, 6, 2, 8]))
    assert rec["distance"] < 1e-12  # Jᵀ diag(e^h) J = I at every z
    assert rec["adaptation"] > 0.1 and rec["loss_metric_change"] > 0  # another image's Jacobian does not fit


def test_a_linear_head_has_one_metric_everywhere_so_its_adaptation_is_exactly_zero():
    torch.manual_seed(0)
    z1, z2 = _batch()
    for head in (nn.Linear(3, 4).double(), ProjectionHead(3, kind="linear", depth=2, width=5).double().eval(),
                 ProjectionHead(3, depth=1, width=4).double().eval()):
        rec = batch_local_metric(head, _exp_loss, z1, z2, torch.tensor([0, 6, 2, 8]))
        assert rec["adaptation"] == 0.0 and rec["distance"] > 0.05  # e^h varies with z: W cannot whiten it
        assert constant_jacobian(head) or isinstance(head, nn.Linear)
    assert not constant_jacobian(ProjectionHead(3, depth=2, width=4, act="relu"))


def test_the_distance_is_scale_free_and_zero_for_the_whitening_map():
    a = torch.diag(torch.tensor([4.0, 1.0, 0.25], dtype=F64))
    w = torch.diag(a.diagonal().rsqrt())
    assert metric_distance(w, a, 3) < 1e-14 and metric_distance(7 * w, a, 3) < 1e-14
    assert metric_distance(torch.eye(3, dtype=F64), a, 3) > 0.3


def test_evaluation_batches_are_disjoint_with_rows_of_different_images():
    batches = metric_batches(50, 16, 3, 4, seed=0)
    assert len(batches) == 3 and all(len(idx) == 16 and len(rows) == 4 for idx, rows in batches)
    images = torch.cat([idx for idx, _ in batches])
    assert len(set(images.tolist())) == 48
    assert all(len(set((rows % 16).tolist())) == 4 for _, rows in batches)
    assert len(metric_batches(6, 64, 4, 4, seed=0)) == 3  # few images: smaller batches, never an empty one


def _measure(name, adaptation, distance, init, arch, constant=False):
    return MetricMeasure(name, {s: list(v) for s, v in adaptation.items()}, {s: list(v) for s, v in distance.items()},
                         {s: [0.0] * len(v) for s, v in adaptation.items()}, {s: list(v) for s, v in init.items()},
                         arch=arch, constant=constant)


def test_answers_per_head_and_the_depth_trend():
    arch = {"kind": "mlp", "act": "swish", "width": 64, "out_dim": 64, "bn_hidden": False}
    seeds = (0, 1, 2)
    measures = [
        _measure("d1", {s: [0.0] * 4 for s in seeds}, {s: [0.5 + 0.01 * s] * 4 for s in seeds},
                 {s: [0.5] * 4 for s in seeds}, arch | {"depth": 1}, constant=True),
        _measure("d2", {s: [0.2 + 0.01 * j + 0.01 * s for j in range(4)] for s in seeds},
                 {s: [0.3 + 0.01 * s] * 4 for s in seeds}, {s: [0.5] * 4 for s in seeds}, arch | {"depth": 2}),
        _measure("d3", {s: [0.3 + 0.01 * j for j in range(4)] for s in seeds},
                 {s: [0.1 + 0.01 * s] * 4 for s in seeds}, {s: [0.5] * 4 for s in seeds}, arch | {"depth": 3}),
    ]
    claim = answer_metric(measures).to_record()
    heads = claim["heads"]
    assert heads["d1"]["answer"] == "does not adapt" and heads["d1"]["ci95"] == [0.0, 0.0]
    assert heads["d2"]["answer"] == heads["d3"]["answer"] == "adapts"
    assert heads["d3"]["secondary"]["metric_distance"]["change"]["answer"] == "closer"
    trend = heads[claim["trends"][0]]
    assert claim["trends"] == ["depth slope (swish, width 64, out 64)"]
    assert trend["value"] == pytest.approx(-0.2) and trend["answer"] == "closer"
    assert "— closer" in trend["line"] and "— adapts" in heads["d2"]["line"] and "null" in heads["d1"]["line"]
    assert change_answer([-0.01, 0.02], 0.05) == "unchanged" and change_answer([-0.1, 0.02], 0.05) == "undecided"


def test_a_margin_override_changes_the_answer():
    import dataclasses

    m = _measure("h", {0: [0.03, 0.04], 1: [0.03, 0.04]}, {0: [0.3, 0.3], 1: [0.3, 0.3]},
                 {0: [0.3, 0.3], 1: [0.3, 0.3]}, {})
    assert answer_metric([m]).heads["h"].answer == "does not adapt"
    small = dataclasses.replace(Q_METRIC, margin=0.01)
    assert answer_metric([m], small).heads["h"].answer == "adapts"


def test_the_geometry_stage_answers_q_metric_on_a_tiny_recipe(tiny_recipe, tmp_path):
    recipe = {**tiny_recipe, "probes": {"knn": {"ks": [5]}}, "seeds": [0, 1],
              "heads": [{"name": "lin", "type": "linear", "depth": 1, "width": 8},
                        {"name": "s1", "act": "swish", "depth": 1, "width": 8, "bn_hidden": False},
                        {"name": "s2", "act": "swish", "depth": 2, "width": 8, "bn_hidden": False}],
              "objective": {"name": "info_nce"}, "augment": {"preset": "crop-flip", "views": 2},
              "train": {"epochs": 1, "batch_size": 50},
              "geometry": {"final": True, "rows": 8, "saddle_states": 0, "metric_batches": 2, "metric_rows": 3},
              "claims": {"Q-metric": {"margin": 0.01}}}
    results = run(recipe, out=tmp_path / "m", quiet=True)
    claim = results["claims"]["Q-metric"]
    assert claim["override"] == {"margin": 0.01} and claim["margin"] == 0.01
    assert claim["time_s"] > 0 and "2 evaluation batches" in claim["sizes"]  # 0.7 s on a quiet 2-core CPU
    heads = claim["heads"]
    assert heads["lin"]["value"] == 0.0 and heads["s1"]["value"] == 0.0  # one Jacobian everywhere
    assert heads["lin"]["constant_jacobian"] and not heads["s2"]["constant_jacobian"]
    assert heads["s2"]["n_seeds"] == 2 and heads["s2"]["n_units"] == 2
    assert claim["trends"] == ["depth slope (swish, width 8, out 8)"]
    assert all(r["line"].startswith("Q-metric: ") for r in heads.values())
