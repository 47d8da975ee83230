"""What a shared run directory or recipe must not be able to do: run code from a checkpoint, or hang on YAML
aliases that expand to billions of values."""

import json
import os
import shlex
import tracemalloc

import pytest
import torch
import yaml

from headprobe.checkpoint import restore_checkpoint
from headprobe.cli import main
from headprobe.recipe import RecipeError, apply_override, load_recipe
from headprobe.train import CheckpointError, load_checkpoint


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
