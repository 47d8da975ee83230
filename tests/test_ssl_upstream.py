"""headprobe.ssl on files the upstream repositories' own code wrote (tests/fixtures/upstream/README.md says which
commit and command): DINO's main_dino.py checkpoint (vit_tiny narrowed; with and without batch norm in the head),
VICReg's main_vicreg.py checkpoint (with its LARS optimiser and the exclude_bias_and_norm functions in it) and
backbone file, Barlow Twins' main.py checkpoint. Every tap is compared with the upstream modules' own forward on the
same input, saved beside each file when it was written (<name>.expected.safetensors)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from headprobe.backbones import load_backbone
from headprobe.ssl import load_pretrained_head

pytestmark = pytest.mark.usefixtures("single_thread")

FIXTURES = Path(__file__).parent / "fixtures" / "upstream"
# float32 rounding of the same operations in another order (measured: docs/models.md's "Probing a pretrained model's own
# head" table)
TOLERANCE = 1e-5


def max_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape
    return float((got - want).abs().max())


def head_differences(head, expected: dict, prefix: str) -> list[float]:
    with torch.no_grad():
        taps = head.taps(expected["features"])
    want = [expected[f"{prefix}head.{i}"] for i in range(len(taps))]
    assert f"{prefix}head.{len(taps)}" not in expected  # every upstream tap compared
    return [max_difference(g, w) for g, w in zip(taps, want, strict=True)]


@pytest.mark.parametrize("name", ["dino_vit_tiny", "dino_vit_tiny_bn_head"])
@pytest.mark.parametrize("part", ["teacher", "student"])
def test_dino_main_dino_checkpoint(name, part):
    expected = load_file(FIXTURES / f"{name}.expected.safetensors")
    id = f"ssl:dino:{FIXTURES / name}.pth"
    backbone = load_backbone(id, part=part)  # vit_tiny: 3 heads, read from the checkpoint's args
    with torch.no_grad():
        assert max_difference(backbone(expected["pixels"]), expected[f"{part}.backbone"]) <= TOLERANCE
    head = load_pretrained_head(id, part=part)
    assert head.depth == 4 and head.use_bn == name.endswith("bn_head")
    assert max(head_differences(head, expected, f"{part}.")) <= TOLERANCE
    with torch.no_grad():
        assert max_difference(head(backbone(expected["pixels"])), expected[f"{part}.end_to_end"]) <= TOLERANCE
    record = head.record.to_dict()
    assert record["args"]["arch"] == "vit_tiny" and record["skipped_objects"] == {}
    assert {"optimizer", "dino_loss", "args", "epoch"} <= set(record["ignored_entries"])


def test_vicreg_main_vicreg_checkpoint_with_its_lars_optimiser():
    expected = load_file(FIXTURES / "vicreg_resnet_narrow.expected.safetensors")
    id = f"ssl:vicreg:{FIXTURES / 'vicreg_resnet_narrow.pth'}"
    backbone = load_backbone(id)
    with torch.no_grad():
        assert max_difference(backbone(expected["pixels"]), expected["backbone"]) <= TOLERANCE
    head = load_pretrained_head(id)
    assert max(head_differences(head, expected, "")) <= TOLERANCE
    skipped = head.record.to_dict()["skipped_objects"]
    assert skipped == {"main_vicreg.exclude_bias_and_norm": {
        "count": 2, "at": ["optimizer.param_groups[0].weight_decay_filter",
                           "optimizer.param_groups[0].lars_adaptation_filter"]}}
    assert backbone.describe()["checkpoint"]["skipped_objects"] == skipped
    released = load_backbone(f"ssl:vicreg:{FIXTURES / 'vicreg_resnet_narrow_backbone.pth'}")  # resnet50.pth's layout
    with torch.no_grad():
        assert max_difference(released(expected["pixels"]), expected["backbone"]) <= TOLERANCE


def test_barlowtwins_main_checkpoint():
    expected = load_file(FIXTURES / "barlowtwins_resnet_narrow.expected.safetensors")
    id = f"ssl:barlowtwins:{FIXTURES / 'barlowtwins_resnet_narrow.pth'}"
    backbone = load_backbone(id)
    with torch.no_grad():
        assert max_difference(backbone(expected["pixels"]), expected["backbone"]) <= TOLERANCE
    head = load_pretrained_head(id)
    assert max(head_differences(head, expected, "")) <= TOLERANCE
    record = head.record.to_dict()
    assert record["skipped_objects"] == {} and "module.bn.*" in record["ignored_entries"]


@pytest.mark.parametrize("method,part", [("vicreg", None), ("byol", "student"), ("byol", "teacher"),
                                         ("simclr", None)])
def test_solo_learn_checkpointer_files(method, part):
    """solo-learn's methods (narrowed ResNet-18 with the CIFAR stem for vicreg, the ImageNet stem for byol; vit_tiny
    for simclr) saved by its Checkpointer: the .ckpt and args.json beside it."""
    folder = FIXTURES / f"solo_learn_{method}"
    expected = load_file(folder / "expected.safetensors")
    prefix = "teacher." if part == "teacher" else ""
    id = f"ssl:solo-learn:{folder / method}.ckpt"
    backbone = load_backbone(id, part=part, pooling="cls" if method == "simclr" else None)
    with torch.no_grad():
        assert max_difference(backbone(expected["pixels"]), expected[f"{prefix}backbone"]) <= TOLERANCE
    head = load_pretrained_head(id, part=part)
    assert max(head_differences(head, expected, prefix)) <= TOLERANCE
    record = head.record.to_dict()
    assert record["skipped_objects"] == {} and record["args"]["method"] == method
    assert {"optimizer_states", "lr_schedulers", "callbacks"} <= set(record["ignored_entries"])
