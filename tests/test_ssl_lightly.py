"""headprobe.ssl with the lightly format: tiny Lightning checkpoints of models written as lightly's examples write
them (backbone = nn.Sequential of a torchvision ResNet's children, projection_head = a ProjectionHead with its
`layers` Sequential), compared with torchvision and lightly's head formulas written out here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchvision.models.resnet import BasicBlock, ResNet

from headprobe.backbones import load_backbone
from headprobe.ssl import SSLCheckpointError, load_pretrained_head

pytestmark = pytest.mark.usefixtures("single_thread")

HIDDEN, OUT = 24, 8


def resnet(seed: int = 0) -> ResNet:
    torch.manual_seed(seed)
    net = ResNet(BasicBlock, [1, 1, 1, 1])
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return net.eval()


def children_state(net: ResNet) -> dict:
    """nn.Sequential(*list(resnet.children())[:-1]).state_dict(): conv1 → 0, bn1 → 1, layer1..4 → 4..7."""
    return torch.nn.Sequential(*list(net.children())[:-1]).state_dict()


def reference_features(net: ResNet, x: torch.Tensor) -> torch.Tensor:
    """lightly's examples: self.backbone(x).flatten(start_dim=1) — torchvision's forward without fc."""
    return torch.nn.Sequential(*list(net.children())[:-1])(x).flatten(1)


def block(g, i: int, a: int, b: int, bn: str | None) -> dict:
    """One ProjectionHead block's tensors at layers.i: Linear (bias only without BN), then its norm at i + 1."""
    s = {f"layers.{i}.weight": torch.randn(b, a, generator=g) * 0.1}
    if bn is None:
        s[f"layers.{i}.bias"] = torch.randn(b, generator=g)
        return s
    j = i + 1
    s |= {f"layers.{j}.running_mean": torch.randn(b, generator=g),
          f"layers.{j}.running_var": 0.5 + torch.rand(b, generator=g),
          f"layers.{j}.num_batches_tracked": torch.tensor(4)}
    if bn == "affine":
        s |= {f"layers.{j}.weight": 1 + 0.1 * torch.randn(b, generator=g),
              f"layers.{j}.bias": torch.randn(b, generator=g)}
    return s


# Each head's `layers` tensors as lightly's constructors lay them out (heads.py), and the formula per block:
# (input, output, norm: "affine" | "plain" (affine=False) | None, ReLU after it?)
HEADS = {
    # BarlowTwinsProjectionHead(512, HIDDEN, OUT) = VICRegProjectionHead(512, HIDDEN, OUT, num_layers=3)
    "barlowtwins": [(512, HIDDEN, "affine", True), (HIDDEN, HIDDEN, "affine", True), (HIDDEN, OUT, None, False)],
    # SimCLRProjectionHead(512, HIDDEN, OUT) (num_layers=2, batch_norm=True): BN on the output too
    "simclr": [(512, HIDDEN, "affine", True), (HIDDEN, OUT, "affine", False)],
    # MoCoProjectionHead(512, HIDDEN, OUT) (v2: no batch norm)
    "moco": [(512, HIDDEN, None, True), (HIDDEN, OUT, None, False)],
    # SimSiamProjectionHead: the output BN has affine=False
    "simsiam": [(512, HIDDEN, "affine", True), (HIDDEN, HIDDEN, "affine", True), (HIDDEN, OUT, "plain", False)],
}


def head_state(name: str, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    s, i = {}, 0
    for a, b, bn, relu in HEADS[name]:
        s |= block(g, i, a, b, bn)
        i += 1 + (bn is not None) + relu
    return s


def reference_head(name: str, s: dict, x: torch.Tensor) -> list[torch.Tensor]:
    outs, i = [], 0
    for _, _, bn, relu in HEADS[name]:
        x = F.linear(x, s[f"layers.{i}.weight"], s.get(f"layers.{i}.bias"))
        if bn is not None:
            j = f"layers.{i + 1}."
            x = F.batch_norm(x, s[j + "running_mean"], s[j + "running_var"], s.get(j + "weight"), s.get(j + "bias"),
                             eps=1e-5)
        if relu:
            x = F.relu(x)
            outs.append(x)
        i += 1 + (bn is not None) + relu
    return [*outs, x]


def lightning_checkpoint(state_dict: dict) -> dict:
    return {"epoch": 9, "global_step": 1000, "pytorch-lightning_version": "2.1.0", "state_dict": state_dict,
            "loops": {}, "callbacks": {}, "optimizer_states": [{"state": {}, "param_groups": []}],
            "lr_schedulers": []}


def save(tmp_path, head: str, *, momentum: bool = False, torchvision_names: bool = False, extra: dict | None = None):
    net = resnet()
    bb = net.state_dict() if torchvision_names else children_state(net)
    bb = {k: v for k, v in bb.items() if not k.startswith("fc.")}
    state = {f"backbone.{k}": v for k, v in bb.items()}
    state |= {f"projection_head.{k}": v for k, v in head_state(head).items()}
    if momentum:
        state |= {f"backbone_momentum.{k}": v for k, v in children_state(resnet(seed=7)).items()}
        state |= {f"projection_head_momentum.{k}": v for k, v in head_state(head, seed=8).items()}
        state |= {"prediction_head.layers.0.weight": torch.zeros(4, OUT)}
    state |= {"criterion.memory_bank.bank": torch.zeros(OUT, 16)} | (extra or {})
    path = tmp_path / f"{head}.ckpt"
    torch.save(lightning_checkpoint(state), path)
    return path


@pytest.mark.parametrize("head", list(HEADS))
def test_backbone_and_projection_head_match_the_reference(tmp_path, head):
    path = save(tmp_path, head)
    bb = load_backbone(f"ssl:lightly:{path}")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(bb(x), reference_features(resnet(), x), rtol=1e-5, atol=1e-5)
    rec = bb.describe()["checkpoint"]
    assert (rec["format"], rec["part"], rec["layout"]) == ("lightly", "student", "lightly Lightning checkpoint")
    assert rec["matched_tensors"] == {"backbone": len(children_state(resnet()))}
    assert "criterion.*" in rec["ignored_entries"]
    # Barlow Twins' layout is MSN's and MoCo v2's is LeWM's (GELU): their activation has to be said.
    act = "relu" if head in ("barlowtwins", "moco") else None
    proj = load_pretrained_head(f"ssl:lightly:{path}", act=act)
    feats = torch.randn(4, 512, generator=torch.Generator().manual_seed(3))
    expected = reference_head(head, head_state(head), feats)
    taps = proj.taps(feats)
    assert proj.depth == len(taps) == len(HEADS[head])
    for got, want in zip(taps, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert proj.record.matched == {"head": len(head_state(head))}
    assert proj.record.head_rebuilt["activation"] == "relu"


def test_torchvision_names_and_momentum_teacher(tmp_path):
    path = save(tmp_path, "barlowtwins", torchvision_names=True)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(load_backbone(f"ssl:lightly:{path}")(x), reference_features(resnet(), x),
                                   rtol=1e-5, atol=1e-5)
    path = save(tmp_path, "moco", momentum=True)
    teacher = load_backbone(f"ssl:lightly:{path}", part="teacher")
    with torch.no_grad():
        torch.testing.assert_close(teacher(x), reference_features(resnet(seed=7), x), rtol=1e-5, atol=1e-5)
    head = load_pretrained_head(f"ssl:lightly:{path}", part="teacher", act="relu")
    feats = torch.randn(3, 512, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(head(feats), reference_head("moco", head_state("moco", seed=8), feats)[-1])
    assert "prediction_head.*" in head.record.ignored


def test_unsupported_heads_and_unknown_modules_are_named(tmp_path):
    dino = {"projection_head.last_layer.weight_g": torch.ones(OUT, 1),
            "projection_head.last_layer.weight_v": torch.zeros(OUT, OUT)}
    with pytest.raises(SSLCheckpointError, match=r"outside a lightly ProjectionHead's layers \['projection_head.last_"
                                                 r"layer.*DINOProjectionHead.*Supported heads: BarlowTwinsProjection"):
        load_pretrained_head(f"ssl:lightly:{save(tmp_path, 'moco', extra=dino)}")
    with pytest.raises(SSLCheckpointError, match=r"unexpected 1 key\(s\) \['encoder.weight'\]"):
        load_backbone(f"ssl:lightly:{save(tmp_path, 'moco', extra={'encoder.weight': torch.zeros(2)})}")
    with pytest.raises(SSLCheckpointError, match=r"missing \['backbone_momentum.\*', 'projection_head_momentum.\*'\]"):
        load_backbone(f"ssl:lightly:{save(tmp_path, 'moco')}", part="teacher")
    bad = {"projection_head.layers.2.weight": torch.zeros(OUT, HIDDEN + 1)}  # MoCo's last Linear, wrong input
    with pytest.raises(SSLCheckpointError, match=r"'projection_head.layers.2.weight' has shape \(8, 25\).*"
                                                 r"follows a layer of width 24"):
        load_pretrained_head(f"ssl:lightly:{save(tmp_path, 'moco', extra=bad)}", act="relu")
