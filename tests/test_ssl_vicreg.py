"""headprobe.ssl with the vicreg and barlow formats: tiny checkpoints in main_vicreg.py's / barlowtwins main.py's
layout (DDP 'module.backbone.*', 'module.projector.*'), compared with torchvision and the projector formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchvision.models.resnet import BasicBlock, ResNet

from headprobe.backbones import load_backbone
from headprobe.ssl import SSLCheckpointError, load_pretrained_head

DIMS = [512, 32, 32, 16]


def resnet() -> ResNet:
    torch.manual_seed(0)
    net = ResNet(BasicBlock, [1, 1, 1, 1])
    net.fc = torch.nn.Identity()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return net.eval()


def projector(bias: bool) -> dict:
    g = torch.Generator().manual_seed(1)
    s = {}
    for i, (a, b) in enumerate(zip(DIMS[:-2], DIMS[1:-1], strict=True)):
        s[f"{3 * i}.weight"] = torch.randn(b, a, generator=g) * 0.1
        if bias:
            s[f"{3 * i}.bias"] = torch.randn(b, generator=g)
        s |= {f"{3 * i + 1}.weight": 1 + 0.1 * torch.randn(b, generator=g),
              f"{3 * i + 1}.bias": torch.randn(b, generator=g),
              f"{3 * i + 1}.running_mean": torch.randn(b, generator=g),
              f"{3 * i + 1}.running_var": 0.5 + torch.rand(b, generator=g),
              f"{3 * i + 1}.num_batches_tracked": torch.tensor(7)}
    s[f"{3 * (len(DIMS) - 2)}.weight"] = torch.randn(DIMS[-1], DIMS[-2], generator=g) * 0.1
    return s


def full(net: ResNet, proj: dict, extra: dict | None = None) -> dict:
    model = {f"module.backbone.{k}": v for k, v in net.state_dict().items()}
    model |= {f"module.projector.{k}": v for k, v in proj.items()} | (extra or {})
    return {"epoch": 100, "model": model, "optimizer": {"state": {}, "param_groups": []}}


def reference_projector(s: dict, x: torch.Tensor, bias: bool) -> list[torch.Tensor]:
    outs = []
    for i in range(len(DIMS) - 2):
        x = F.linear(x, s[f"{3 * i}.weight"], s.get(f"{3 * i}.bias") if bias else None)
        b = f"{3 * i + 1}."
        x = F.relu(F.batch_norm(x, s[b + "running_mean"], s[b + "running_var"], s[b + "weight"], s[b + "bias"],
                                eps=1e-5))
        outs.append(x)
    return [*outs, F.linear(x, s[f"{3 * (len(DIMS) - 2)}.weight"])]


@pytest.mark.parametrize("fmt,bias,extra", [
    ("vicreg", True, {}),
    ("barlow", False, {"module.bn.running_mean": torch.zeros(16), "module.bn.running_var": torch.ones(16),
                       "module.bn.num_batches_tracked": torch.tensor(3)}),
])
def test_backbone_and_projector_match_the_reference(tmp_path, fmt, bias, extra):
    net, proj = resnet(), projector(bias)
    path = tmp_path / "model.pth"
    torch.save(full(net, proj, extra), path)
    bb = load_backbone(f"ssl:{fmt}:{path}")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(bb(x), net(x), rtol=1e-5, atol=1e-5)
    assert bb.dim == 512 and bb.describe()["checkpoint"]["matched_tensors"] == {"backbone": len(net.state_dict())}
    head = load_pretrained_head(f"ssl:{fmt}:{path}")
    feats = torch.randn(4, 512, generator=torch.Generator().manual_seed(3))
    taps = head.taps(feats)
    assert head.depth == len(taps) == 3
    for got, want in zip(taps, reference_projector(proj, feats, bias), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert head.record.matched == {"head": len(proj)}
    if extra:
        assert "module.bn.*" in head.record.ignored


def test_backbone_only_file_and_errors(tmp_path):
    net = resnet()
    torch.save(net.state_dict(), tmp_path / "resnet50.pth")
    bb = load_backbone(f"ssl:vicreg:{tmp_path / 'resnet50.pth'}")
    assert bb.describe()["checkpoint"]["layout"] == "vicreg backbone-only"
    with pytest.raises(SSLCheckpointError, match="backbone only"):
        load_pretrained_head(f"ssl:vicreg:{tmp_path / 'resnet50.pth'}")
    bad = full(net, projector(False))  # barlow's bias-free projector read as vicreg: its biases are missing
    torch.save(bad, tmp_path / "bad.pth")
    with pytest.raises(SSLCheckpointError, match=r"missing 2 tensor\(s\) \['module.projector.0.bias'"):
        load_pretrained_head(f"ssl:vicreg:{tmp_path / 'bad.pth'}")
    with pytest.raises(SSLCheckpointError, match="part 'teacher' cannot be chosen"):
        load_backbone(f"ssl:vicreg:{tmp_path / 'bad.pth'}", part="teacher")
