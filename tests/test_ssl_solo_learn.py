"""headprobe.ssl with the solo-learn format: tiny Lightning checkpoints in solo-learn's layout (state_dict with
backbone.* / projector.* / classifier.*, args.json beside), compared with torchvision and the projector formulas
written out here."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torchvision.models.resnet import BasicBlock, ResNet

from headprobe.backbones import load_backbone
from headprobe.ssl import SSLCheckpointError, load_pretrained_head

pytestmark = pytest.mark.usefixtures("single_thread")

HIDDEN, OUT = 24, 8


def resnet(cifar: bool, seed: int = 0) -> ResNet:
    """A one-block-per-stage torchvision ResNet as solo-learn's base.py changes it (fc removed, CIFAR stem)."""
    torch.manual_seed(seed)
    net = ResNet(BasicBlock, [1, 1, 1, 1])
    net.fc = torch.nn.Identity()
    if cifar:
        net.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=2, bias=False)
        net.maxpool = torch.nn.Identity()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return net.eval()


def linear(g, a: int, b: int, name: str) -> dict:
    return {f"{name}.weight": torch.randn(b, a, generator=g) * 0.1, f"{name}.bias": torch.randn(b, generator=g)}


def batch_norm(g, n: int, name: str) -> dict:
    return {f"{name}.weight": 1 + 0.1 * torch.randn(n, generator=g), f"{name}.bias": torch.randn(n, generator=g),
            f"{name}.running_mean": torch.randn(n, generator=g),
            f"{name}.running_var": 0.5 + torch.rand(n, generator=g),
            f"{name}.num_batches_tracked": torch.tensor(11)}


def projector(method: str, seed: int = 1) -> dict:
    """The state dict of solo/methods/<method>.py's self.projector (nn.Sequential indices)."""
    g = torch.Generator().manual_seed(seed)
    if method in ("vicreg", "barlow_twins"):
        return (linear(g, 512, HIDDEN, "0") | batch_norm(g, HIDDEN, "1") | linear(g, HIDDEN, HIDDEN, "3")
                | batch_norm(g, HIDDEN, "4") | linear(g, HIDDEN, OUT, "6"))
    if method == "simclr":
        return linear(g, 512, HIDDEN, "0") | linear(g, HIDDEN, OUT, "2")
    return linear(g, 512, HIDDEN, "0") | batch_norm(g, HIDDEN, "1") | linear(g, HIDDEN, OUT, "3")  # byol


def reference_projector(s: dict, x: torch.Tensor) -> list[torch.Tensor]:
    """Linear → [BN (eval)] → ReLU per hidden block, then the last Linear, read off the keys' indices."""
    indices = sorted({int(k.split(".")[0]) for k in s})
    outs = []
    for i in indices:
        w = s[f"{i}.weight"]
        if w.ndim == 2:
            x = F.linear(x, w, s[f"{i}.bias"])
            if i + 1 not in indices and i != indices[-1]:  # no BN follows: the ReLU is at i + 1
                x = F.relu(x)
                outs.append(x)
        else:
            x = F.relu(F.batch_norm(x, s[f"{i}.running_mean"], s[f"{i}.running_var"], w, s[f"{i}.bias"], eps=1e-5))
            outs.append(x)
    return [*outs, x]


def args(method: str, dataset: str = "cifar10", backbone: str = "resnet18") -> dict:
    """OmegaConf.to_container(cfg) as Checkpointer.save_args writes it (the parts headprobe reads, and others)."""
    return {"name": f"{method}-{dataset}", "method": method, "backbone": {"name": backbone, "kwargs": {}},
            "method_kwargs": {"proj_hidden_dim": HIDDEN, "proj_output_dim": OUT, "pred_hidden_dim": 16},
            "data": {"dataset": dataset, "num_classes": 10, "format": "image_folder"},
            "optimizer": {"name": "lars", "batch_size": 256, "lr": 0.3}, "max_epochs": 1000,
            "wandb_run_id": None}


def lightning_checkpoint(state_dict: dict) -> dict:
    """trainer.save_checkpoint's dict (Lightning 2.x, no save_hyperparameters: solo-learn never calls it)."""
    return {"epoch": 999, "global_step": 195000, "pytorch-lightning_version": "2.0.2", "state_dict": state_dict,
            "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 1000}}}},
            "callbacks": {}, "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.0, "params": [0]}]}],
            "lr_schedulers": [{"last_epoch": 1000, "base_lrs": [0.3]}]}


def save_run(tmp_path, method: str, dataset: str = "cifar10", *, net: ResNet | None = None,
             extra: dict | None = None, backbone: str = "resnet18"):
    """The files of a solo-learn run: trained_models/<version>/<name>-<version>-ep=<epoch>.ckpt and args.json."""
    folder = tmp_path / "trained_models" / "abcd1234"
    folder.mkdir(parents=True, exist_ok=True)
    net = net if net is not None else resnet(dataset.startswith("cifar"))
    g = torch.Generator().manual_seed(3)
    state = {f"backbone.{k}": v for k, v in net.state_dict().items()}
    state |= {f"projector.{k}": v for k, v in projector(method).items()}
    state |= {"classifier.weight": torch.randn(10, 512, generator=g), "classifier.bias": torch.zeros(10)}
    if method == "byol":
        state |= {f"momentum_backbone.{k}": v for k, v in resnet(dataset.startswith("cifar"), 5).state_dict().items()}
        state |= {f"momentum_projector.{k}": v for k, v in projector(method, seed=6).items()}
        state |= {f"predictor.{k}": v for k, v in (linear(g, OUT, 16, "0") | linear(g, 16, OUT, "3")).items()}
    state |= extra or {}
    path = folder / f"{method}-{dataset}-abcd1234-ep=999.ckpt"
    torch.save(lightning_checkpoint(state), path)
    (folder / "args.json").write_text(json.dumps(args(method, dataset, backbone)))
    return path


@pytest.mark.parametrize("method", ["vicreg", "barlow_twins", "simclr", "byol"])
def test_backbone_and_projector_match_the_reference(tmp_path, method):
    path = save_run(tmp_path, method)
    net = resnet(cifar=True)
    bb = load_backbone(f"ssl:solo-learn:{path}")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(bb(x), net(x), rtol=1e-5, atol=1e-5)
    rec = bb.describe()["checkpoint"]
    assert (rec["format"], rec["part"]) == ("solo-learn", "student" if method == "byol" else "model")
    assert rec["matched_tensors"] == {"backbone": len(net.state_dict())}
    assert rec["args"] == {"method": method, "backbone": "resnet18", "dataset": "cifar10", "proj_hidden_dim": HIDDEN,
                           "proj_output_dim": OUT}
    assert "classifier.*" in rec["ignored_entries"] and "optimizer_states" in rec["ignored_entries"]
    # cifar10 runs are evaluated at 32×32 with CIFAR's statistics (solo's cifar_pipeline T_val)
    assert (bb.preprocess.resize, bb.preprocess.crop, bb.preprocess.mean) == (32, 32, (0.4914, 0.4822, 0.4465))
    head = load_pretrained_head(f"ssl:solo-learn:{path}")
    feats = torch.randn(4, 512, generator=torch.Generator().manual_seed(3))
    expected = reference_projector(projector(method), feats)
    taps = head.taps(feats)
    assert head.depth == len(taps) == {"vicreg": 3, "barlow_twins": 3, "simclr": 2, "byol": 2}[method]
    for got, want in zip(taps, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert head.record.matched == {"head": len(projector(method))} and head.expects["pooling"] == "mean"


def test_byol_teacher_is_the_momentum_network(tmp_path):
    path = save_run(tmp_path, "byol")
    teacher = load_backbone(f"ssl:solo-learn:{path}", part="teacher")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(teacher(x), resnet(True, seed=5)(x), rtol=1e-5, atol=1e-5)
    head = load_pretrained_head(f"ssl:solo-learn:{path}", part="teacher")
    feats = torch.randn(3, 512, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(head(feats), reference_projector(projector("byol", seed=6), feats)[-1])
    assert head.record.part == "teacher" and "predictor.*" in head.record.ignored
    with pytest.raises(SSLCheckpointError, match="part 'ema' is not one of solo-learn byol's networks"):
        load_backbone(f"ssl:solo-learn:{path}", part="ema")


def test_imagenet_run_has_the_imagenet_stem_and_transform(tmp_path):
    path = save_run(tmp_path, "simclr", dataset="imagenet100")
    bb = load_backbone(f"ssl:solo-learn:{path}")
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(bb(x), resnet(cifar=False)(x), rtol=1e-5, atol=1e-5)
    assert (bb.preprocess.resize, bb.preprocess.crop, bb.preprocess.mean) == (256, 224, (0.485, 0.456, 0.406))
    stl = load_backbone(f"ssl:solo-learn:{save_run(tmp_path / 'stl', 'simclr', dataset='stl10')}")
    assert (stl.preprocess.resize, stl.preprocess.crop, stl.preprocess.resize_mode) == (96, 96, "square")


def test_missing_args_json_and_unsupported_method_or_backbone(tmp_path):
    path = save_run(tmp_path, "vicreg")
    (path.parent / "args.json").write_text(json.dumps(args("swav")))
    with pytest.raises(SSLCheckpointError, match="method 'swav'.*supported: vicreg, barlow_twins, simclr, byol"):
        load_backbone(f"ssl:solo-learn:{path}")
    (path.parent / "args.json").write_text(json.dumps(args("vicreg", backbone="swin_tiny")))
    with pytest.raises(SSLCheckpointError, match="backbone 'swin_tiny'.*supported: resnet18, resnet50, vit_tiny, "
                                                 "vit_small, vit_base, vit_large"):
        load_backbone(f"ssl:solo-learn:{path}")
    (path.parent / "args.json").unlink()
    with pytest.raises(SSLCheckpointError, match="args.json beside its checkpoints.*does not exist"):
        load_pretrained_head(f"ssl:solo-learn:{path}")


def test_unexpected_key_and_shape_mismatch_are_named(tmp_path):
    path = save_run(tmp_path, "vicreg", extra={"queue": torch.zeros(3)})
    with pytest.raises(SSLCheckpointError, match=r"unexpected 1 key\(s\) \['queue'\].*Expected a solo-learn"):
        load_backbone(f"ssl:solo-learn:{path}")
    path = save_run(tmp_path, "vicreg", extra={"projector.6.weight": torch.zeros(OUT + 1, HIDDEN)})
    with pytest.raises(SSLCheckpointError, match=r"'projector.6.weight' has shape \(9, 24\).*needs \(8, 24\)"):
        load_pretrained_head(f"ssl:solo-learn:{path}")
    path = save_run(tmp_path, "vicreg", net=resnet(cifar=False))  # an ImageNet stem in a cifar10 run
    with pytest.raises(SSLCheckpointError, match=r"'backbone.conv1.weight' has shape \(64, 3, 7, 7\).*CIFAR stem"):
        load_backbone(f"ssl:solo-learn:{path}")


def test_vit_backbone_is_the_class_token_after_the_final_norm(tmp_path):
    """solo-learn's timm ViT (num_classes=0, global_pool='token'): DINO's ViT keys; its projector on the class
    token."""
    from test_ssl_dino import reference_vit_cls, vit_state

    vit = vit_state(torch.Generator().manual_seed(7), dim=48)  # vit_tiny's 3 heads, a small width
    folder = tmp_path / "run"
    folder.mkdir()
    g = torch.Generator().manual_seed(8)
    proj = linear(g, 48, HIDDEN, "0") | batch_norm(g, HIDDEN, "1") | linear(g, HIDDEN, OUT, "3")
    state = {f"backbone.{k}": v for k, v in vit.items()} | {f"projector.{k}": v for k, v in proj.items()}
    state |= {"classifier.weight": torch.zeros(10, 48), "classifier.bias": torch.zeros(10)}
    state |= {f"momentum_backbone.{k}": v for k, v in vit.items()} | {f"momentum_projector.{k}": v
                                                                       for k, v in proj.items()}
    torch.save(lightning_checkpoint(state), folder / "byol.ckpt")
    (folder / "args.json").write_text(json.dumps(args("byol", backbone="vit_tiny")))
    bb = load_backbone(f"ssl:solo-learn:{folder / 'byol.ckpt'}")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(bb(x), reference_vit_cls(vit, x, heads=3), rtol=1e-5, atol=1e-5)
    assert bb.model.blocks[0].attn.num_heads == 3 and bb.options["pooling"] == "cls"
    head = load_pretrained_head(f"ssl:solo-learn:{folder / 'byol.ckpt'}")
    feats = torch.randn(3, 48, generator=torch.Generator().manual_seed(10))
    torch.testing.assert_close(head(feats), reference_projector(proj, feats)[-1], rtol=1e-5, atol=1e-5)
    assert head.expects["pooling"] == "cls"
