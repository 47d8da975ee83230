"""What a shared run directory or recipe must not be able to do: run code from a checkpoint, or hang on YAML
aliases that expand to billions of values."""

import json
import os
import shlex
import tracemalloc

import pytest
import torch
import yaml

from headprobe.cli import main
from headprobe.recipe import RecipeError, apply_override, load_recipe
from headprobe.train.cached_views import CheckpointError, load_checkpoint
from headprobe.train.checkpoint import restore_checkpoint


class _Payload:
    """Unpickling this runs a shell command: what a crafted step-*.pt in someone else's run directory can hold."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def _crafted_checkpoint(path, marker):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"step": 99, "heads": {"relu": {"head": _Payload(marker)}}}, path)
    return path


def test_a_checkpoint_carrying_code_is_refused_not_run(tmp_path):
    marker = tmp_path / "pwned"
    path = _crafted_checkpoint(tmp_path / "step-99.pt", marker)
    torch.load(path, weights_only=False)  # the payload is real: an unrestricted load runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(CheckpointError, match="holds Python objects other than tensors.*not loaded"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="holds Python objects"):
        restore_checkpoint(path, [], object())  # the tuned path's restore: refused before anything is touched
    assert not marker.exists()


def test_unreadable_or_foreign_checkpoints_stop_with_a_sentence(tmp_path):
    (tmp_path / "cut.pt").write_bytes(b"PK\x03\x04 not a whole zip")
    with pytest.raises(CheckpointError, match="is not a readable checkpoint"):
        load_checkpoint(tmp_path / "cut.pt")
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="is not a headprobe checkpoint"):
        load_checkpoint(tmp_path / "list.pt")


@pytest.mark.slow
def test_geometry_and_resume_refuse_a_crafted_checkpoint_with_exit_1(tiny_recipe, tmp_path, capsys):
    recipe = {**tiny_recipe, "probes": {"knn": {"ks": [5]}}, "heads": [{"name": "relu", "width": 16}],
              "augment": {"preset": "crop-flip", "views": 2}, "train": {"epochs": 1, "batch_size": 50}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    run = tmp_path / "r"
    assert main(["run", str(path), "--out", str(run)]) == 0
    saved = load_checkpoint(run / "checkpoints" / "step-4.pt")  # what headprobe writes loads with weights_only
    assert saved["step"] == 4 and set(saved["heads"]) == {"relu"}
    marker = tmp_path / "pwned"
    _crafted_checkpoint(run / "checkpoints" / "step-99.pt", marker)  # the latest, so the one both commands read
    capsys.readouterr()

    assert main(["geometry", str(run)]) == 1
    err = capsys.readouterr().err.strip()
    assert "step-99.pt holds Python objects other than tensors" in err and "Traceback" not in err
    assert not marker.exists()

    results = json.loads((run / "results.json").read_text())
    results["status"] = "failed"  # a run that stopped part-way, so --resume goes on to train the heads
    (run / "results.json").write_text(json.dumps(results))
    assert main(["run", str(path), "--out", str(run), "--resume"]) == 1
    err = capsys.readouterr().err.strip()
    assert "while training heads" in err and "step-99.pt holds Python objects" in err and "Traceback" not in err
    assert not marker.exists()


def _alias_bomb(depth: int = 7) -> str:
    """A recipe whose objective.options hold 9**depth strings written as a few hundred bytes of nested aliases."""
    lines = ["name: bomb", "backbone: {id: 'scratch:vit-tiny'}", "data: {source: sklearn-digits}",
             "heads: [{name: relu}]", "objective:", "  name: vicreg", "  options:", "    sim_weight:",
             "      a0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"      a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, depth + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("command", ["validate", "run"])
def test_an_alias_bomb_stops_at_load_time_with_exit_2(tmp_path, capsys, command):
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    out = tmp_path / "never"
    argv = [command, str(path)] + (["--out", str(out)] if command == "run" else [])
    main(argv)  # once for the imports, so that what is traced next is the loading alone
    capsys.readouterr()
    tracemalloc.start()
    try:
        code = main(argv)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err.strip()
    # Stopped while loading, not after expanding: 9**7 strings would take 38 MB for the list pointers alone.
    assert code == 2 and peak < 5 * 2**20, peak
    assert err.startswith("error: recipe ") and "alias bomb" in err and "line 13" in err
    assert "\n" not in err and err.endswith(".")  # one sentence, no traceback
    assert not out.exists()


def test_an_alias_bomb_in_an_override_is_refused():
    bomb = "[" + ", ".join(["&a [x, x, x, x, x, x, x, x, x, x]"] + ["*a"] * 1200) + "]"
    with pytest.raises(RecipeError, match=r"override 'objective\.options\.sim_weight=.*alias bomb"):
        apply_override({}, f"objective.options.sim_weight={bomb}")


def test_a_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("name: loop\nbackbone: {id: 'scratch:vit-tiny'}\nsweep: &s {a: *s}\n")
    with pytest.raises(RecipeError, match=r"alias \*s at line 3 refers to the node it is part of"):
        load_recipe(path)


def test_recipes_with_a_few_anchors_and_aliases_still_load(tmp_path, capsys):
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "backbone: {id: 'scratch:vit-tiny'}\n"
        "data: {source: sklearn-digits}\n"
        "heads:\n"
        "  - &head {name: relu, act: relu, width: 16, depth: 2}\n"
        "  - {<<: *head, name: swish, act: swish}\n"
        "  - {<<: *head, name: deep, depth: 3}\n"
    )
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.startswith("ok ")
    heads = [(h.name, h.act, h.width, h.depth) for h in load_recipe(path).heads]
    assert heads == [("relu", "relu", 16, 2), ("swish", "swish", 16, 2), ("deep", "relu", 16, 3)]


class _Writes:
    """Unpickling this writes `marker` through builtins.exec: a global torch's unpickler does not block, so headprobe's
    inert placeholders are what keep it from running."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def _resnet_state(prefix: str) -> dict:
    from torchvision.models.resnet import BasicBlock, ResNet

    net = ResNet(BasicBlock, [1, 1, 1, 1])
    net.fc = torch.nn.Identity()
    return {f"{prefix}{k}": v for k, v in net.state_dict().items()}


def _vicreg_checkpoint(optimizer: dict, **top) -> dict:
    proj = {"0.weight": torch.zeros(8, 512), "0.bias": torch.zeros(8), "1.weight": torch.ones(8),
            "1.bias": torch.zeros(8), "1.running_mean": torch.zeros(8), "1.running_var": torch.ones(8),
            "1.num_batches_tracked": torch.tensor(1), "3.weight": torch.zeros(4, 8)}
    model = _resnet_state("module.backbone.") | {f"module.projector.{k}": v for k, v in proj.items()}
    return {"epoch": 3, "model": model, "optimizer": optimizer, **top}


@pytest.fixture
def trainer_module(tmp_path, monkeypatch):
    """A module `main_vicreg` whose import writes a marker; the checkpoints below name its function, as the official
    VICReg checkpoints name main_vicreg.exclude_bias_and_norm. Saved, then made unimportable again."""
    import importlib
    import sys

    src = tmp_path / "src"
    src.mkdir()
    imported = tmp_path / "imported"
    (src / "main_vicreg.py").write_text(f"open({str(imported)!r}, 'w').write('imported')\n\n"
                                        "def exclude_bias_and_norm(p):\n    return p.ndim == 1\n")
    monkeypatch.syspath_prepend(str(src))
    module = importlib.import_module("main_vicreg")
    imported.unlink()
    yield module, imported
    sys.modules.pop("main_vicreg", None)


@pytest.mark.parametrize("where", ["optimizer state", "param_groups", "top level"])
def test_ssl_checkpoint_payloads_stay_inert_and_are_recorded(tmp_path, trainer_module, where):
    import sys

    from headprobe.ssl import load_pretrained_head

    module, imported = trainer_module
    marker = tmp_path / "pwned"
    group = {"lr": 0.1, "weight_decay_filter": module.exclude_bias_and_norm,
             "lars_adaptation_filter": module.exclude_bias_and_norm, "params": [0, 1]}
    optimizer = {"state": {0: {"mu": torch.zeros(2)}}, "param_groups": [group]}
    top = {}
    if where == "optimizer state":
        optimizer["state"][1] = {"mu": torch.zeros(2), "hook": _Writes(marker)}
    elif where == "param_groups":
        group["hook"] = _Writes(marker)
    else:
        top["stats"] = _Writes(marker)
    path = tmp_path / "model.pth"
    torch.save(_vicreg_checkpoint(optimizer, **top), path)
    sys.modules.pop("main_vicreg")
    torch.load(path, weights_only=False)  # the payload is real: a full unpickle runs it (and imports main_vicreg)
    assert marker.exists() and imported.exists()
    marker.unlink()
    imported.unlink()
    sys.modules.pop("main_vicreg")

    head = load_pretrained_head(f"ssl:vicreg:{path}")
    assert not marker.exists() and not imported.exists() and "main_vicreg" not in sys.modules
    skipped = head.record.to_dict()["skipped_objects"]
    assert skipped["main_vicreg.exclude_bias_and_norm"] == {
        "count": 2, "at": ["optimizer.param_groups[0].weight_decay_filter",
                           "optimizer.param_groups[0].lars_adaptation_filter"]}
    at = {"optimizer state": "optimizer.state[1].hook", "param_groups": "optimizer.param_groups[0].hook",
          "top level": "stats"}[where]
    assert skipped["builtins.exec"] == {"count": 1, "at": [at]}
    assert head.depth == 2


def test_ssl_checkpoint_payload_in_dino_args_or_blocked_module_is_refused(tmp_path):
    from headprobe.backbones import load_backbone
    from headprobe.ssl import SSLCheckpointError

    marker = tmp_path / "pwned"
    vit = {"cls_token": torch.zeros(1, 1, 8), "pos_embed": torch.zeros(1, 2, 8)}
    path = tmp_path / "dino.pth"
    teacher = {f"backbone.{k}": v for k, v in vit.items()} | {"head.last_layer.weight_g": torch.ones(2, 1)}
    torch.save({"teacher": teacher, "student": {}, "args": _Writes(marker)}, path)
    with pytest.raises(SSLCheckpointError, match=r"'args' is an object built by builtins.exec, which headprobe does "
                                                 r"not run, not the argparse.Namespace"):
        load_backbone(f"ssl:dino:{path}", num_heads=2)
    assert not marker.exists()
    torch.save(_vicreg_checkpoint({"state": {}, "param_groups": []}, stats=_Payload(marker)), path)  # os.system
    with pytest.raises(SSLCheckpointError, match=r"not loaded.*GLOBAL posix.system whose module posix is blocked.*"
                                                 r"could run code"):
        load_backbone(f"ssl:vicreg:{path}")
    assert not marker.exists()
