"""`headprobe validate` inspects an ssl:<format>:<path> checkpoint without loading a model: a missing file, missing or
unexpected keys, or a shape visible in the state dict alone exit 2 with one sentence; the shipped own-head
recipes validate against stand-in files in the official layout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_ssl_dino import checkpoint as dino_checkpoint
from test_ssl_dino import dino_args, head_state, vit_state, wrapped
from test_ssl_lightly import save as save_lightly
from test_ssl_solo_learn import save_run as save_solo_learn
from test_ssl_vicreg import full, projector, resnet
from timeouts import HANG_TIMEOUT_S

from headprobe.cli import main

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def recipe(tmp_path, backbone: dict, heads: list | None = None) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "name": "own_head", "backbone": backbone, "data": {"source": "sklearn-digits"},
        "heads": heads if heads is not None else [{"name": "own", "type": "pretrained"}],
        "augment": {"preset": "crop-flip", "views": 2}, "probes": {"linear": {}}}))
    return path


def validate(path: Path, capsys) -> tuple[int, str]:
    code = main(["validate", str(path)])
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err  # one line, no traceback
    return code, err


@pytest.mark.slow  # a subprocess
def test_missing_checkpoint_says_where_to_get_it_through_the_cli(tmp_path):
    """The real command line, from a folder without the file: exit 2 and the official download URL."""
    done = subprocess.run([sys.executable, "-m", "headprobe", "validate", str(RECIPES / "dino_own_head.yaml")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    err = " ".join(done.stderr.split())  # the terminal may wrap the one sentence
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "dino_deitsmall16_pretrain_full_checkpoint.pth: no such file" in err
    assert ("https://dl.fbaipublicfiles.com/dino/dino_deitsmall16_pretrain/"
            "dino_deitsmall16_pretrain_full_checkpoint.pth") in err
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("name, url", [
    ("dino_own_head", "https://dl.fbaipublicfiles.com/dino/dino_deitsmall16_pretrain/"
                      "dino_deitsmall16_pretrain_full_checkpoint.pth"),
    ("vicreg_own_head", "https://dl.fbaipublicfiles.com/vicreg/resnet50_fullckpt.pth"),
])
def test_shipped_recipes_without_their_file_exit_2_with_the_url(tmp_path, capsys, monkeypatch, name, url):
    monkeypatch.chdir(tmp_path)
    code, err = validate(RECIPES / f"{name}.yaml", capsys)
    assert code == 2 and f"no such file (relative to {tmp_path})" in err and url in err


def test_shipped_recipes_validate_against_stand_in_files_without_loading(tmp_path, capsys, monkeypatch):
    """dino_own_head and vicreg_own_head with tiny files in the official layouts, under the official names;
    nothing is loaded into a module (load_state_dict would raise)."""
    g = torch.Generator().manual_seed(0)
    vit = vit_state(g, dim=48, depth=1)  # vit_small's 6 heads need a width divisible by 6
    head = {**head_state(g), "mlp.0.weight": torch.randn(64, 48, generator=g)}
    torch.save({"teacher": wrapped("", vit, head), "student": wrapped("module.", vit, head),
                "args": dino_args(arch="vit_small")}, tmp_path / "dino_deitsmall16_pretrain_full_checkpoint.pth")
    torch.save(full(resnet(), projector(True)), tmp_path / "resnet50_fullckpt.pth")
    monkeypatch.chdir(tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("validate loaded weights into a module")

    monkeypatch.setattr(torch.nn.Module, "load_state_dict", refuse)
    for name in ("dino_own_head", "vicreg_own_head"):
        assert main(["validate", str(RECIPES / f"{name}.yaml")]) == 0
        assert "ok" in capsys.readouterr().out


def test_dino_missing_key_and_shape_are_named(tmp_path, capsys):
    ckpt = dino_checkpoint()
    del ckpt["teacher"]["backbone.blocks.1.mlp.fc2.bias"]
    torch.save(ckpt, tmp_path / "dino.pth")
    code, err = validate(recipe(tmp_path, {"id": f"ssl:dino:{tmp_path / 'dino.pth'}", "num_heads": 2}), capsys)
    assert code == 2
    assert "backbone.id = 'ssl:dino:" in err and "missing 1 tensor(s) ['backbone.blocks.1.mlp.fc2.bias']" in err
    assert "Expected: a DINO checkpoint as main_dino.py saves it" in err
    ckpt = dino_checkpoint()
    ckpt["teacher"]["head.last_layer.weight_v"] = torch.zeros(128, 18)
    torch.save(ckpt, tmp_path / "dino.pth")
    code, err = validate(recipe(tmp_path, {"id": f"ssl:dino:{tmp_path / 'dino.pth'}", "num_heads": 2}), capsys)
    assert code == 2 and "'head.last_layer.weight_v' has shape (128, 18)" in err and "needs (128, 16)" in err
    # the head is inspected only when a recipe probes it
    no_head = recipe(tmp_path, {"id": f"ssl:dino:{tmp_path / 'dino.pth'}", "num_heads": 2}, heads=[])
    assert validate(no_head, capsys)[0] == 0


def test_vicreg_and_barlowtwins_keys_are_checked(tmp_path, capsys):
    torch.save(full(resnet(), projector(False)), tmp_path / "barlow.pth")  # bias-free hidden Linears
    assert validate(recipe(tmp_path, {"id": f"ssl:barlowtwins:{tmp_path / 'barlow.pth'}", "pooling": "mean"}),
                    capsys)[0] == 0
    code, err = validate(recipe(tmp_path, {"id": f"ssl:vicreg:{tmp_path / 'barlow.pth'}", "pooling": "mean"}), capsys)
    assert code == 2 and "missing 2 tensor(s) ['module.projector.0.bias', 'module.projector.3.bias']" in err
    assert "Expected: a vicreg checkpoint" in err


def test_solo_learn_and_lightly_keys_are_checked(tmp_path, capsys):
    path = save_solo_learn(tmp_path, "vicreg", extra={"queue": torch.zeros(3)})
    code, err = validate(recipe(tmp_path, {"id": f"ssl:solo-learn:{path}", "pooling": "mean"}), capsys)
    assert code == 2 and "unexpected 1 key(s) ['queue']" in err and "Expected a solo-learn checkpoint" in err
    path = save_solo_learn(tmp_path, "simclr")
    assert validate(recipe(tmp_path, {"id": f"ssl:solo-learn:{path}", "pooling": "mean"}), capsys)[0] == 0
    path = save_lightly(tmp_path, "moco", extra={"projection_head.layers.2.weight": torch.zeros(8, 25)})
    code, err = validate(recipe(tmp_path, {"id": f"ssl:lightly:{path}", "pooling": "mean"}), capsys)
    assert code == 2 and "'projection_head.layers.2.weight' has shape (8, 25)" in err
    path = save_lightly(tmp_path, "moco", extra={"backbone.4.0.bn3.weight": torch.zeros(64)})
    code, err = validate(recipe(tmp_path, {"id": f"ssl:lightly:{path}", "pooling": "mean"}), capsys)
    assert code == 2 and "missing 0 tensor(s) [], unexpected 1 ['backbone.4.0.bn3.weight']" in err


@pytest.mark.parametrize("id, words", [
    ("ssl:dinov9:x.pth", "unknown checkpoint format 'dinov9'"),
    ("ssl:lightly:absent.ckpt", "absent.ckpt: no such file"),
])
def test_unknown_format_and_missing_file(tmp_path, capsys, id, words):
    code, err = validate(recipe(tmp_path, {"id": id, "pooling": "mean"}), capsys)
    assert code == 2 and words in err


def test_pretrained_head_needs_the_pooling_and_layer_it_was_trained_on(tmp_path, capsys):
    torch.save(full(resnet(), projector(True)), tmp_path / "vicreg.pth")
    id = f"ssl:vicreg:{tmp_path / 'vicreg.pth'}"
    code, err = validate(recipe(tmp_path, {"id": id, "pooling": "cls"}), capsys)
    assert code == 2 and "trained on 'mean' features, but backbone.pooling = 'cls'; set backbone.pooling: mean" in err
    code, err = validate(recipe(tmp_path, {"id": id, "pooling": "mean", "layer": 2}), capsys)
    assert code == 2 and "final features, but backbone.layer = 2; remove it" in err
    assert validate(recipe(tmp_path, {"id": id, "pooling": "mean", "layer": 2}, heads=[]), capsys)[0] == 0


def test_a_lightly_head_whose_activation_the_file_cannot_show_needs_act(tmp_path, capsys):
    path = save_lightly(tmp_path, "moco")  # MoCo v2's layout, Linear → (ReLU) → Linear, is LeWM's (GELU) too
    backbone = {"id": f"ssl:lightly:{path}", "pooling": "mean"}
    code, err = validate(recipe(tmp_path, backbone), capsys)
    assert code == 2 and "MoCoProjectionHead" in err and "LeWMProjectionHead (gelu)" in err
    assert "act: relu or act: gelu" in err and "does not guess" in err
    assert validate(recipe(tmp_path, backbone, heads=[{"name": "own", "type": "pretrained", "act": "relu"}]),
                    capsys)[0] == 0
    ckpt = dino_checkpoint()
    torch.save(ckpt, tmp_path / "dino.pth")
    code, err = validate(recipe(tmp_path, {"id": f"ssl:dino:{tmp_path / 'dino.pth'}", "num_heads": 2},
                                heads=[{"name": "own", "type": "pretrained", "act": "relu"}]), capsys)
    assert code == 2 and "act 'relu' was given, but this head computes gelu" in err
