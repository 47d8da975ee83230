"""The tuned path's input pipeline: views made in persistent worker processes train exactly as views made in the main
process (step s's views are f(seed, s), whatever process makes them)."""

import pytest
import torch

from headprobe.backbones import apply_tuning, load_backbone
from headprobe.data import load_data
from headprobe.data.augment import augment_spec
from headprobe.recipe import DataSpec, HeadSpec, LimitSpec, TrainSpec
from headprobe.train.tuned import train_tuned, trainable_state


@pytest.mark.slow  # worker processes start twice per run (tiny DINOv2): ~50 s on the shared 2-core machine
def test_two_workers_train_the_tuned_backbone_bitwise_like_none(tiny_dinov2):
    digits = load_data(DataSpec(source="sklearn-digits", limit=LimitSpec(train=40, test=40)))
    out = {}
    for workers in (0, 2):
        backbone = load_backbone(f"hf:{tiny_dinov2}")
        apply_tuning(backbone, "last:1")
        states, _ = train_tuned(backbone, [HeadSpec(name="lin", type="linear", width=16)], digits.train,
                                augment=augment_spec("dino"), views=2, objective_name="vicreg", objective_options={},
                                train=TrainSpec(steps=3, batch_size=20, lr=1e-2, log_every=1), seed=0,
                                num_workers=workers)
        out[workers] = (trainable_state(backbone), states["lin"].head.state_dict(),
                        [r["loss"] for r in states["lin"].history])
    (tuned0, head0, losses0), (tuned2, head2, losses2) = out[0], out[2]
    assert losses0 == losses2 and len(losses0) == 3 and losses0[0] != losses0[-1]
    assert all(torch.equal(tuned2[name], value) for name, value in tuned0.items())
    assert all(torch.equal(head2[name], value) for name, value in head0.items())
