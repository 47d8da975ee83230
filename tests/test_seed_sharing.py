"""Trained head states survive the trip to another process: the restored heads compute what the trained ones do."""

import torch

from headprobe.pipeline.seed_sharing import portable_states, restore_states
from headprobe.recipe import HeadSpec, TrainSpec
from headprobe.train.cached_views import train_heads


def test_restored_heads_equal_the_trained_ones():
    specs = [HeadSpec(name="relu", width=16, out_dim=8, bn_hidden=True, predictor=8),
             HeadSpec(name="swish", act="swish", width=16, out_dim=8, predictor=8)]
    views = torch.randn(64, 2, 12, generator=torch.Generator().manual_seed(0))
    states, _ = train_heads(specs, views, objective_name="simsiam", objective_options={},
                            train=TrainSpec(epochs=2, batch_size=32), seed=3)
    restored = restore_states(specs, 12, 3, portable_states(states))
    assert set(restored) == set(states)
    z = torch.randn(10, 12)
    for name, state in states.items():
        again = restored[name]
        assert not again.head.training and again.status == state.status and again.last_loss == state.last_loss
        assert again.history == state.history
        with torch.no_grad():
            assert torch.equal(again.head(z), state.head(z))  # BatchNorm's running statistics came along too
            assert torch.equal(again.predictor(z[:, :8]), state.predictor(z[:, :8]))
