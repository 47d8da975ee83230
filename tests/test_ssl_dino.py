"""headprobe.ssl with the DINO format: a tiny checkpoint in main_dino.py's exact layout, loaded through
`load_backbone("ssl:dino:<path>")` and `load_pretrained_head`, compared with DINO's formulas written out here."""

from __future__ import annotations

import argparse
import hashlib
import math
import os

import pytest
import torch
import torch.nn.functional as F

from headprobe.backbones import load_backbone
from headprobe.ssl import SSLCheckpointError, load_pretrained_head
from headprobe.ssl.vit import vit_from_keys

DIM, DEPTH, HEADS, PATCH, HIDDEN, BOTTLENECK, OUT = 32, 2, 2, 16, 64, 16, 128
IMG = 32  # 2×2 patches


def vit_state(gen: torch.Generator, dim: int = DIM, depth: int = DEPTH, img: int = IMG) -> dict:
    """The state dict of DINO's VisionTransformer (qkv_bias=True, mlp_ratio 4), random values."""
    n = (img // PATCH) ** 2

    def r(*shape):
        return torch.randn(*shape, generator=gen) * 0.2

    s = {"cls_token": r(1, 1, dim), "pos_embed": r(1, n + 1, dim),
         "patch_embed.proj.weight": r(dim, 3, PATCH, PATCH) * 0.1, "patch_embed.proj.bias": r(dim)}
    for i in range(depth):
        b = f"blocks.{i}."
        s |= {b + "norm1.weight": 1 + r(dim), b + "norm1.bias": r(dim),
              b + "attn.qkv.weight": r(3 * dim, dim), b + "attn.qkv.bias": r(3 * dim),
              b + "attn.proj.weight": r(dim, dim), b + "attn.proj.bias": r(dim),
              b + "norm2.weight": 1 + r(dim), b + "norm2.bias": r(dim),
              b + "mlp.fc1.weight": r(4 * dim, dim), b + "mlp.fc1.bias": r(4 * dim),
              b + "mlp.fc2.weight": r(dim, 4 * dim), b + "mlp.fc2.bias": r(dim)}
    return s | {"norm.weight": 1 + r(dim), "norm.bias": r(dim)}


def head_state(gen: torch.Generator) -> dict:
    """The state dict of DINOHead(DIM, OUT, hidden_dim=HIDDEN, bottleneck_dim=BOTTLENECK): mlp.0/2/4 Linear, GELU
    at 1 and 3, last_layer = weight_norm(Linear(bottleneck, out, bias=False))."""
    def r(*shape):
        return torch.randn(*shape, generator=gen) * 0.3

    return {"mlp.0.weight": r(HIDDEN, DIM), "mlp.0.bias": r(HIDDEN), "mlp.2.weight": r(HIDDEN, HIDDEN),
            "mlp.2.bias": r(HIDDEN), "mlp.4.weight": r(BOTTLENECK, HIDDEN), "mlp.4.bias": r(BOTTLENECK),
            "last_layer.weight_g": 0.5 + torch.rand(OUT, 1, generator=gen),
            "last_layer.weight_v": r(OUT, BOTTLENECK)}


def wrapped(prefix: str, vit: dict, head: dict) -> dict:
    """MultiCropWrapper's state dict: backbone.* and head.*, under `prefix` ("module." for DDP)."""
    return {f"{prefix}backbone.{k}": v for k, v in vit.items()} | {f"{prefix}head.{k}": v for k, v in head.items()}


def dino_args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"arch": "vit_custom", "patch_size": PATCH, "out_dim": OUT, "norm_last_layer": True,
                                 "use_bn_in_head": False, "momentum_teacher": 0.996, "output_dir": ".", **kw})


def checkpoint(seed: int = 0, **args) -> dict:
    g = torch.Generator().manual_seed(seed)
    teacher_vit, teacher_head = vit_state(g), head_state(g)
    student_vit, student_head = vit_state(g), head_state(g)
    return {"student": wrapped("module.", student_vit, student_head), "teacher": wrapped("", teacher_vit, teacher_head),
            "optimizer": {"state": {}, "param_groups": [{"lr": 0.0, "params": [0, 1]}]}, "epoch": 100,
            "args": dino_args(**args), "dino_loss": {"center": torch.zeros(1, OUT)}}


@pytest.fixture
def ckpt_path(tmp_path):
    path = tmp_path / "checkpoint.pth"
    torch.save(checkpoint(), path)
    return path


def save(tmp_path, ckpt, name="bad.pth"):
    path = tmp_path / name
    torch.save(ckpt, path)
    return path


def reference_vit_cls(s: dict, x: torch.Tensor, heads: int = HEADS) -> torch.Tensor:
    """DINO's VisionTransformer.forward written out: patch conv, [cls] + pos, pre-norm blocks, final norm, token 0."""
    t = F.conv2d(x, s["patch_embed.proj.weight"], s["patch_embed.proj.bias"], stride=PATCH).flatten(2).transpose(1, 2)
    t = torch.cat([s["cls_token"].expand(len(x), -1, -1), t], 1) + s["pos_embed"]
    b, n, d = t.shape
    for i in range(DEPTH):
        p = f"blocks.{i}."
        h = F.layer_norm(t, (d,), s[p + "norm1.weight"], s[p + "norm1.bias"], eps=1e-6)
        q, k, v = F.linear(h, s[p + "attn.qkv.weight"], s[p + "attn.qkv.bias"]).reshape(
            b, n, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // heads), -1)
        t = t + F.linear((a @ v).transpose(1, 2).reshape(b, n, d), s[p + "attn.proj.weight"], s[p + "attn.proj.bias"])
        h = F.layer_norm(t, (d,), s[p + "norm2.weight"], s[p + "norm2.bias"], eps=1e-6)
        t = t + F.linear(F.gelu(F.linear(h, s[p + "mlp.fc1.weight"], s[p + "mlp.fc1.bias"])),
                         s[p + "mlp.fc2.weight"], s[p + "mlp.fc2.bias"])
    return F.layer_norm(t, (d,), s["norm.weight"], s["norm.bias"], eps=1e-6)[:, 0]


def reference_dino_head(s: dict, x: torch.Tensor) -> list[torch.Tensor]:
    """DINOHead.forward: mlp → F.normalize → last layer with weight = g · v / ‖v‖ (per output row)."""
    h1 = F.gelu(F.linear(x, s["mlp.0.weight"], s["mlp.0.bias"]))
    h2 = F.gelu(F.linear(h1, s["mlp.2.weight"], s["mlp.2.bias"]))
    z = F.normalize(F.linear(h2, s["mlp.4.weight"], s["mlp.4.bias"]), dim=-1, p=2)
    v, g = s["last_layer.weight_v"], s["last_layer.weight_g"]
    return [h1, h2, z, z @ (g * v / v.norm(dim=1, keepdim=True)).T]


def part_of(ckpt: dict, part: str, prefix: str) -> dict:
    state = ckpt[part]
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def test_backbone_cls_equals_dino_forward_and_records_the_file(ckpt_path):
    bb = load_backbone(f"ssl:dino:{ckpt_path}", num_heads=HEADS)
    x = torch.randn(3, 3, IMG, IMG, generator=torch.Generator().manual_seed(1))
    expected = reference_vit_cls(part_of(checkpoint(), "teacher", "backbone."), x)
    torch.testing.assert_close(bb(x), expected, rtol=1e-5, atol=1e-5)
    assert bb.dim == DIM and len(bb.blocks) == DEPTH
    rec = bb.describe()["checkpoint"]
    assert rec["sha256"] == hashlib.sha256(ckpt_path.read_bytes()).hexdigest()
    assert (rec["format"], rec["part"]) == ("dino", "teacher")
    assert rec["matched_tensors"] == {"backbone": len(vit_state(torch.Generator()))}
    assert rec["args"]["out_dim"] == OUT and "optimizer" in rec["ignored_entries"]
    assert (bb.preprocess.resize, bb.preprocess.crop) == (256, 224)
    assert bb.preprocess.mean == (0.485, 0.456, 0.406) and bb.preprocess.std == (0.229, 0.224, 0.225)


def test_student_part_strips_the_ddp_prefix_and_differs_from_teacher(ckpt_path):
    x = torch.randn(2, 3, IMG, IMG, generator=torch.Generator().manual_seed(2))
    student = load_backbone(f"ssl:dino:{ckpt_path}", num_heads=HEADS, part="student")
    expected = reference_vit_cls(part_of(checkpoint(), "student", "module.backbone."), x)
    torch.testing.assert_close(student(x), expected, rtol=1e-5, atol=1e-5)
    teacher = load_backbone(f"ssl:dino:{ckpt_path}", num_heads=HEADS, part="teacher")
    assert not torch.allclose(student(x), teacher(x))
    assert student.describe()["checkpoint"]["part"] == "student"


@pytest.mark.parametrize("part,prefix", [("teacher", "head."), ("student", "module.head.")])
def test_head_taps_equal_dino_head_formula(ckpt_path, part, prefix):
    head = load_pretrained_head(f"ssl:dino:{ckpt_path}", part=part)
    x = torch.randn(5, DIM, generator=torch.Generator().manual_seed(3))
    expected = reference_dino_head(part_of(checkpoint(), part, prefix), x)
    taps = head.taps(x)
    assert head.depth == len(taps) == 4
    for got, want in zip(taps, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head(x), expected[-1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(taps[2].norm(dim=-1), torch.ones(5))
    assert head.record.matched == {"head": 8} and head.record.part == part
    assert not any(p.requires_grad for p in head.parameters())
    assert head.tap_labels[-2:] == ["bottleneck (l2-normalised)", "prototypes"]


def test_backbone_feeds_the_head_end_to_end(ckpt_path):
    bb = load_backbone(f"ssl:dino:{ckpt_path}", num_heads=HEADS)
    head = load_pretrained_head(f"ssl:dino:{ckpt_path}")
    x = torch.randn(2, 3, IMG, IMG, generator=torch.Generator().manual_seed(4))
    ref = checkpoint()
    expected = reference_dino_head(part_of(ref, "teacher", "head."),
                                   reference_vit_cls(part_of(ref, "teacher", "backbone."), x))[-1]
    torch.testing.assert_close(head(bb(x)), expected, rtol=1e-4, atol=1e-5)


def test_named_arch_gives_num_heads_and_backbone_only_file_loads(tmp_path):
    g = torch.Generator().manual_seed(5)
    vit = vit_state(g, dim=192, depth=1)  # vit_tiny's width (3 heads), one block to stay small
    ckpt = {"teacher": wrapped("", vit, {**head_state(g), "mlp.0.weight": torch.randn(HIDDEN, 192)}),
            "student": {}, "args": dino_args(arch="vit_tiny")}
    bb = load_backbone(f"ssl:dino:{save(tmp_path, ckpt)}")
    x = torch.randn(2, 3, IMG, IMG, generator=g)
    assert bb.model.blocks[0].attn.num_heads == 3
    released = load_backbone(f"ssl:dino:{save(tmp_path, vit, 'dino_pretrain.pth')}", num_heads=3)
    torch.testing.assert_close(released(x), bb(x))
    assert released.describe()["checkpoint"]["layout"] == "dino backbone-only"
    with pytest.raises(SSLCheckpointError, match="backbone only.*full checkpoint"):
        load_pretrained_head(f"ssl:dino:{tmp_path / 'dino_pretrain.pth'}")


def test_missing_key_is_named(tmp_path):
    ckpt = checkpoint()
    del ckpt["teacher"]["backbone.blocks.1.mlp.fc2.bias"]
    with pytest.raises(SSLCheckpointError, match=r"missing 1 tensor\(s\) \['backbone.blocks.1.mlp.fc2.bias'\].*"
                                                 r"Expected: a DINO checkpoint"):
        load_backbone(f"ssl:dino:{save(tmp_path, ckpt)}", num_heads=HEADS)


def test_unexpected_key_is_named(tmp_path):
    ckpt = checkpoint()
    ckpt["student"]["module.head.mlp.6.weight"] = torch.zeros(3, 3)
    with pytest.raises(SSLCheckpointError, match=r"unexpected 1 \['module.head.mlp.6.weight'\]"):
        load_pretrained_head(f"ssl:dino:{save(tmp_path, ckpt)}", part="student")
    ckpt = checkpoint()
    ckpt["teacher"]["projector.0.weight"] = torch.zeros(3, 3)
    with pytest.raises(SSLCheckpointError, match=r"unexpected 1 key\(s\) \['projector.0.weight'\]"):
        load_backbone(f"ssl:dino:{save(tmp_path, ckpt)}", num_heads=HEADS)


def test_shape_mismatch_names_tensor_and_both_shapes(tmp_path):
    ckpt = checkpoint()
    ckpt["teacher"]["backbone.blocks.1.attn.proj.weight"] = torch.zeros(DIM, DIM + 1)
    with pytest.raises(SSLCheckpointError, match=r"'backbone.blocks.1.attn.proj.weight' has shape \(32, 33\).*"
                                                 r"needs \(32, 32\)"):
        load_backbone(f"ssl:dino:{save(tmp_path, ckpt)}", num_heads=HEADS)
    ckpt = checkpoint()
    ckpt["teacher"]["head.last_layer.weight_v"] = torch.zeros(OUT, BOTTLENECK + 2)
    with pytest.raises(SSLCheckpointError,
                       match=r"'head.last_layer.weight_v' has shape \(128, 18\).*needs \(128, 16\)"):
        load_pretrained_head(f"ssl:dino:{save(tmp_path, ckpt)}")


def test_unknown_format_lists_the_supported(ckpt_path):
    with pytest.raises(ValueError, match=r"unknown checkpoint format 'dinov9'; allowed: dino.*Did you mean 'dino'"):
        load_backbone(f"ssl:dinov9:{ckpt_path}")


def test_unknown_part_and_unrecorded_arch_are_sentences(ckpt_path):
    with pytest.raises(SSLCheckpointError, match="part 'ema' is not one of teacher, student"):
        load_backbone(f"ssl:dino:{ckpt_path}", num_heads=HEADS, part="ema")
    with pytest.raises(SSLCheckpointError, match="give the backbone option num_heads"):
        load_backbone(f"ssl:dino:{ckpt_path}")


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_pickle_payload_is_refused(tmp_path):
    ckpt = checkpoint()
    ckpt["args"] = Payload()
    with pytest.raises(SSLCheckpointError, match="not loaded.*could run code"):
        load_backbone(f"ssl:dino:{save(tmp_path, ckpt)}", num_heads=HEADS)


def test_missing_file_is_a_not_found_error(tmp_path):
    from headprobe.backbones import BackboneNotFoundError

    with pytest.raises(BackboneNotFoundError, match="no such file"):
        load_backbone(f"ssl:dino:{tmp_path / 'absent.pth'}")


def test_any_mlp_width_builds_on_timm_blocks_and_gives_dino_forward():
    """The blocks are timm's, sized by a ratio: an MLP width that is no multiple of the embedding width (97 of 32)
    builds exactly, loads strictly and gives DINO's forward pass."""
    g = torch.Generator().manual_seed(9)
    state = vit_state(g)
    for i in range(DEPTH):
        b = f"blocks.{i}.mlp."
        fc1 = torch.randn(97, DIM, generator=g) * 0.2
        state |= {b + "fc1.weight": fc1, b + "fc1.bias": torch.randn(97, generator=g),
                  b + "fc2.weight": torch.randn(DIM, 97, generator=g) * 0.2}
    model = vit_from_keys(state, num_heads=HEADS, what="test", layout="DINO's")
    model.load_state_dict(state, strict=True)
    x = torch.randn(2, 3, IMG, IMG, generator=g)
    with torch.no_grad():
        got = model.norm(model(x))[:, 0]
    torch.testing.assert_close(got, reference_vit_cls(state, x), rtol=1e-5, atol=1e-5)
