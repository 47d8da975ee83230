"""The shared training engine: strict checkpoints, snapshots, and the tuned backbone's weights."""

import dataclasses

import pytest
import torch
from torch import nn

from headprobe.recipe import HeadSpec, TrainSpec
from headprobe.train.cached_views import train_heads
from headprobe.train.checkpoint import CheckpointError, load_trainable_state, trainable_state

HEADS = [HeadSpec(name="relu", act="relu", width=16, out_dim=8), HeadSpec(name="lin", type="linear", width=8)]
TRAIN = TrainSpec(steps=4, batch_size=16, lr=1e-2, log_every=2, checkpoint_every=2)


@pytest.fixture
def views():
    g = torch.Generator().manual_seed(0)
    return torch.randn(48, 1, 12, generator=g) + 0.3 * torch.randn(48, 4, 12, generator=g)


def _train(views, heads=HEADS, **kw):
    return train_heads(heads, views, objective_name="vicreg", objective_options={}, train=TRAIN, seed=0, **kw)


@pytest.fixture
def checkpoint(views, tmp_path):
    _train(views, checkpoint_dir=tmp_path)
    return tmp_path / "step-2.pt"


def test_a_checkpoint_of_other_heads_is_refused_with_a_sentence(views, checkpoint):
    with pytest.raises(CheckpointError, match=r"holds the heads \['lin', 'relu'\], this run has \['relu'\]"):
        _train(views, heads=HEADS[:1], resume_from=checkpoint)


def test_a_head_of_another_shape_is_refused_not_partly_loaded(views, checkpoint):
    wider = [dataclasses.replace(HEADS[0], width=32), HEADS[1]]
    with pytest.raises(CheckpointError, match="holds a head 'relu' of another shape or layout"):
        _train(views, heads=wider, resume_from=checkpoint)


def test_a_frozen_checkpoint_is_not_a_tuned_one(checkpoint):
    from headprobe.train.checkpoint import restore_checkpoint

    with pytest.raises(CheckpointError, match="checkpoint of frozen-backbone head training, not of a tuned"):
        restore_checkpoint(checkpoint, [], object())


def test_the_checkpoint_holds_one_optimiser_per_head(checkpoint):
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["kind"] == "frozen" and saved["step"] == 2 and set(saved["optimisers"]) == {"relu", "lin"}
    assert set(saved["heads"]["relu"]) == {"head", "predictor", "status", "message", "last_loss"}


def test_a_nan_before_the_first_log_goes_back_to_the_start(views, monkeypatch):
    import headprobe.train.cached_views as train_module

    real = train_module.objective_loss

    def poisoned(objective, options, state, z1, z2, *, gather_distributed):
        terms, h1 = real(objective, options, state, z1, z2, gather_distributed=gather_distributed)
        terms.loss = terms.loss * float("nan")
        return terms, h1

    monkeypatch.setattr(train_module, "objective_loss", poisoned)
    states, summary = _train(views, heads=HEADS[1:])
    assert summary["stopped_at"] == 1 and "became nan at step 1" in states["lin"].message
    assert "from step 0" in states["lin"].message


class _Tuned(nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(3, 3)
        self.tuned = nn.BatchNorm1d(3)
        self.tuned.register_buffer("scratch", torch.ones(1), persistent=False)
        self.frozen.requires_grad_(False)


def test_trainable_state_is_the_tuned_weights_and_loads_strictly():
    backbone = type("B", (), {"model": _Tuned(), "tuning": {"policy": "last:1"}})()
    state = trainable_state(backbone)
    assert set(state) == {"tuned.weight", "tuned.bias", "tuned.running_mean", "tuned.running_var",
                          "tuned.num_batches_tracked"}  # not the non-persistent buffer, not the frozen layer
    state["tuned.weight"] = torch.full((3,), 2.0)
    load_trainable_state(backbone, state, "the test")
    assert torch.equal(backbone.model.tuned.weight.detach(), torch.full((3,), 2.0))
    with pytest.raises(CheckpointError, match=r"missing \['tuned.bias'\].*'last:1'"):
        load_trainable_state(backbone, {k: v for k, v in state.items() if k != "tuned.bias"}, "the test")


def test_a_step_that_does_not_log_reads_one_number(views, monkeypatch):
    """Outside the optimiser and the logging steps, the only value a step brings back from the device is the
    non-finite-loss check of every head at once: the losses and the objectives' terms stay tensors until logged
    (each `.item()` makes the host wait for a GPU). The terms still read as the floats they always were."""
    import traceback

    calls = []

    def counted(real):
        def read(self):
            if "torch/optim" not in traceback.extract_stack(limit=2)[0].filename:
                calls.append(1)
            return real(self)
        return read

    for name in ("item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))
    counts = {}
    for steps in (6, 12):  # the same logging at the last step: the difference is what the steps add
        calls.clear()
        train = dataclasses.replace(TRAIN, steps=steps, log_every=1000, checkpoint_every=0)
        states, _ = train_heads(HEADS, views, objective_name="vicreg", objective_options={}, train=train, seed=0)
        counts[steps] = len(calls)
    monkeypatch.undo()
    assert counts[12] - counts[6] == 6, counts  # one per step, for both heads
    assert all(isinstance(s.last_loss, float) and s.last_loss == s.last_loss for s in states.values())

    from headprobe.train.objectives import vicreg

    out = vicreg(views[:, 0], views[:, 1])
    assert all(isinstance(v, float) for v in out.terms.values()) and out.terms["vicreg"] == out.loss.item()
