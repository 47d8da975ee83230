import dataclasses

import pytest
import torch

import headprobe.train.cached_views as train_module
from headprobe.recipe import HeadSpec, TrainSpec
from headprobe.train.cached_views import batch_for_step, latest_checkpoint, train_heads


@pytest.fixture
def views():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(48, 1, 12, generator=g)
    return base + 0.3 * torch.randn(48, 4, 12, generator=g)  # 48 images, 4 views each, 12-d


HEADS = [HeadSpec(name="relu", act="relu", width=16, out_dim=8), HeadSpec(name="swish", act="swish", width=16),
         HeadSpec(name="lin", type="linear", width=8)]
TRAIN = TrainSpec(epochs=2, batch_size=16, lr=1e-2, log_every=2)


def _train(specs, views, train=TRAIN, **kw):
    return train_heads(specs, views, objective_name="vicreg", objective_options={}, train=train, seed=0, **kw)


def test_batches_are_a_function_of_the_step():
    a = batch_for_step(5, n=48, views=4, batch_size=16, seed=0)
    b = batch_for_step(5, n=48, views=4, batch_size=16, seed=0)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    idx, v1, v2 = a
    assert len(set(idx.tolist())) == 16 and (v1 != v2).all() and v1.max() < 4 and v2.max() < 4
    epoch = torch.cat([batch_for_step(s, 48, 4, 16, 0)[0] for s in range(3)])
    assert sorted(epoch.tolist()) == list(range(48))  # one epoch visits every image once


def test_heads_learn_and_log(views):
    states, summary = _train(HEADS, views)
    assert summary["steps"] == 6 and set(states) == {"relu", "swish", "lin"}
    for state in states.values():
        assert state.status == "complete" and not state.head.training
        first, last = state.history[0], state.history[-1]
        assert {"loss", "vicreg.sim", "out_std", "rankme", "grad_norm", "rel_update"} <= set(first)
        assert last["loss"] < first["loss"]


def test_each_head_trains_as_if_alone(views):
    together, _ = _train(HEADS, views)
    alone, _ = _train([HEADS[1]], views)
    for key, value in alone["swish"].head.state_dict().items():
        assert torch.equal(value, together["swish"].head.state_dict()[key]), key


def test_resume_from_a_checkpoint_gives_the_same_weights(views, tmp_path):
    train = dataclasses.replace(TRAIN, checkpoint_every=2)
    full, _ = _train(HEADS[:2], views, train=train, checkpoint_dir=tmp_path / "a")
    assert latest_checkpoint(tmp_path / "a").name == "step-6.pt"
    resumed, summary = _train(HEADS[:2], views, train=train, resume_from=tmp_path / "a" / "step-2.pt")
    assert summary["start_step"] == 2
    for name in ("relu", "swish"):
        for key, value in full[name].head.state_dict().items():
            torch.testing.assert_close(resumed[name].head.state_dict()[key], value, rtol=0, atol=0)


def test_a_nan_loss_stops_only_that_head(views, monkeypatch):
    real = train_module.objective_loss

    def poisoned(objective, options, state, z1, z2, *, gather_distributed):
        terms, h1 = real(objective, options, state, z1, z2, gather_distributed=gather_distributed)
        if state.name == "swish" and state.history:
            terms.loss = terms.loss * float("nan")
        return terms, h1

    monkeypatch.setattr(train_module, "objective_loss", poisoned)
    states, _ = _train(HEADS[:2], views)
    assert states["relu"].status == "complete"
    swish = states["swish"]
    assert swish.status == "stopped" and "became nan at step 3" in swish.message
    assert all(torch.isfinite(p).all() for p in swish.head.parameters())
    weight = "layers.0.0.weight"
    torch.testing.assert_close(swish.head.state_dict()[weight], swish.last_good["head"][weight])


def test_batch_larger_than_data_is_explained(views):
    with pytest.raises(ValueError, match="train.batch_size = 64 is larger than the 48 training images"):
        _train(HEADS, views, train=dataclasses.replace(TRAIN, batch_size=64))


def test_gradient_accumulation_equals_the_summed_gradient(views):
    """Two accumulated batches give one update with the mean of their gradients (linear head: no batch statistics
    inside the head; VICReg's statistics stay per batch)."""
    spec = [HeadSpec(name="lin", type="linear", width=8)]
    train = dataclasses.replace(TRAIN, steps=2, grad_accum=2, optimizer="sgd", momentum=0.0, weight_decay=0.0,
                                schedule="constant", lr=0.1)
    accumulated, _ = _train(spec, views, train=train)
    head, _ = train_module.build_head(spec[0], 12, seed=0)
    grads = []
    for step in range(2):
        idx, v1, v2 = batch_for_step(step, 48, 4, 16, 0)
        head.zero_grad()
        from headprobe.train.objectives import vicreg

        vicreg(head(views[idx, v1]), head(views[idx, v2])).loss.backward()
        grads.append([p.grad.clone() for p in head.parameters()])
    with torch.no_grad():
        for p, g1, g2 in zip(head.parameters(), *grads, strict=True):
            p -= 0.1 * (g1 + g2) / 2
    for ours, ref in zip(accumulated["lin"].head.parameters(), head.parameters(), strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)


def test_rankme_is_one_definition_in_the_training_log_the_geometry_record_and_the_probe():
    from headprobe.geometry.tracking import curvature_snapshot
    from headprobe.probes.builtin.spectrum import SPECTRUM as spectrum
    from headprobe.probes.spectrum import rankme
    from headprobe.probes.tap_data import TapData
    from headprobe.train.heads import ProjectionHead
    from headprobe.train.objectives import vicreg

    g = torch.Generator().manual_seed(1)
    # Outputs with a large common offset: centring before the SVD (the old training log) changed RankMe a lot.
    z1 = torch.randn(32, 12, generator=g, dtype=torch.float64) + 3.0
    z2 = z1 + 0.1 * torch.randn(32, 12, generator=g, dtype=torch.float64)
    with torch.random.fork_rng():  # the head's weights fixed whatever ran before: the centred variant differs by 1.2
        torch.manual_seed(0)
        head = ProjectionHead(12, depth=2, width=16, out_dim=8, act="gelu", bn_hidden=False).double()
    h = head(z1).detach()
    logged = train_module.collapse_stats(h)["rankme"]
    geometry = curvature_snapshot(head, z1, z2, vicreg)["rankme"]
    y = torch.arange(32) % 2
    probe = spectrum(TapData(name="h", train_x=h, train_y=y, test_x=h, test_y=y, n_classes=2)).metrics["rankme"]
    assert logged == pytest.approx(rankme(h), rel=1e-12)
    assert geometry == pytest.approx(logged, rel=1e-12) and probe == pytest.approx(logged, rel=1e-12)
    centred = torch.linalg.svdvals(h - h.mean(0))
    p = centred / centred.sum() + 1e-7
    assert abs(float(torch.exp(-(p * p.log()).sum())) - logged) > 0.5  # the centred variant really differs
    assert train_module.collapse_stats(torch.zeros(4, 3))["rankme"] != train_module.collapse_stats(
        torch.zeros(4, 3))["rankme"]  # NaN (logged as null) where RankMe is undefined


@pytest.mark.parametrize("name", ["vicreg", "barlow_twins", "info_nce", "simsiam"])
def test_the_objectives_declared_shift_invariant_are_and_the_others_are_not(name):
    """h -> h + c for one vector c leaves VICReg's and Barlow Twins' losses unchanged (to float64 round-off) and
    changes InfoNCE's and SimSiam's: the declaration `freeze_unidentified_bias` reads is true."""
    from headprobe.registry import OBJECTIVES

    objective = OBJECTIVES.get(name)
    g = torch.Generator().manual_seed(1)
    z1, z2 = (torch.randn(32, 8, generator=g, dtype=torch.float64) for _ in range(2))
    c = 3.0 * torch.randn(8, generator=g, dtype=torch.float64)
    args = (lambda a, b: (a, b, a, b)) if name == "simsiam" else (lambda a, b: (a, b))
    before, after = float(objective(*args(z1, z2)).loss), float(objective(*args(z1 + c, z2 + c)).loss)
    shift_invariant = getattr(objective, "shift_invariant", False)
    assert shift_invariant == (name in ("vicreg", "barlow_twins"))
    assert (abs(after - before) <= 1e-10 * abs(before)) == shift_invariant, (before, after)


def test_under_a_shift_invariant_loss_the_last_bias_keeps_its_initial_value(views):
    """Under VICReg the MLP heads' last-layer bias is not trained (its gradient is rounding noise that Adam would
    scale to lr-sized steps); every other parameter trains; under InfoNCE the bias trains."""
    from headprobe.train.engine import build_head

    specs = HEADS[:2]
    states, summary = _train(specs, views)
    assert summary["output_bias_kept"] == ["relu", "swish"]  # the linear head has no bias
    for spec in specs:
        initial, _ = build_head(spec, views.shape[-1], 0)
        trained = states[spec.name].head
        assert torch.equal(trained.layers[-1][0].bias, initial.layers[-1][0].bias)
        assert not torch.equal(trained.layers[-1][0].weight, initial.layers[-1][0].weight)
        assert not torch.equal(trained.layers[0][1].bias, initial.layers[0][1].bias)  # the hidden BatchNorm
    nce, summary = train_heads(specs[:1], views, objective_name="info_nce", objective_options={}, train=TRAIN, seed=0)
    assert "output_bias_kept" not in summary
    initial, _ = build_head(specs[0], views.shape[-1], 0)
    assert not torch.equal(nce["relu"].head.layers[-1][0].bias, initial.layers[-1][0].bias)
