"""Every exported heads file is checked before use (#40): a tampered record (not a mapping, no seeds, in_dim 'abc',
an unknown config key, sizes that do not fit the tensors), tensor keys out of pattern, a file cut short, broken
JSON — each one sentence naming the file, what is wrong and what to do, never "resume the run"; and export-heads
into a folder it cannot write exits 1 with a sentence."""

import json

import pytest
import torch
from safetensors.torch import save_file

from headprobe import load_heads
from headprobe.cli import main
from headprobe.record.saved_heads import SavedHeadsError
from headprobe.train.heads import ProjectionHead

CONFIG = {"type": "mlp", "depth": 2, "width": 12, "out_dim": 6, "act": "relu"}
RECORD = {"format": 1, "heads": {"mlp": CONFIG}, "in_dim": 5, "seeds": [0], "backbone": {}, "tuned": False}
EXPORTED = "export the heads again from their run (`headprobe export-heads RUN_DIR`)"


def _tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    head = ProjectionHead(5, kind="mlp", depth=2, width=12, out_dim=6, act="relu")
    return {f"seed-0/mlp/{k}": v.contiguous() for k, v in head.state_dict().items()}


def _write(tmp_path, record=RECORD, tensors=None, raw=None):
    path = tmp_path / "heads.safetensors"
    text = raw if raw is not None else json.dumps(record)
    save_file(_tensors() if tensors is None else tensors, str(path), metadata={"headprobe": text})
    return path


def _refused(path) -> str:
    with pytest.raises(SavedHeadsError) as caught:
        load_heads(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and "\n" not in message and "resume" not in message
    return message


def test_an_untampered_file_loads(tmp_path):
    heads = load_heads(_write(tmp_path))
    want = _tensors()
    assert all(torch.equal(v, want[f"seed-0/mlp/{k}"]) for k, v in heads["mlp"].state_dict().items())


@pytest.mark.parametrize("change, words", [
    (lambda r: [r], "has a metadata record that is a list, not a mapping"),
    (lambda r: {k: v for k, v in r.items() if k != "seeds"}, "has a metadata record without 'seeds'"),
    (lambda r: r | {"in_dim": "abc"}, "records in_dim = 'abc', not a positive integer"),
    (lambda r: r | {"in_dim": 0}, "records in_dim = 0, not a positive integer"),
    (lambda r: r | {"in_dim": True}, "records in_dim = True, not a positive integer"),
    (lambda r: r | {"seeds": ["x"]}, "records seeds = ['x'], not a non-empty list of distinct integers"),
    (lambda r: r | {"heads": []}, "records heads = [], not a mapping of head names to their configs"),
    (lambda r: r | {"format": 9}, "is in format 9, which this headprobe does not read"),
    (lambda r: r | {"heads": {"mlp": CONFIG | {"colour": "red"}}},
     "records a config that builds no head (unknown key 'heads.mlp.colour'; allowed keys here: name, type"),
    (lambda r: r | {"heads": {"mlp": CONFIG | {"width": "wide"}}}, "heads.mlp.width"),
    (lambda r: r | {"heads": {"mlp": CONFIG | {"act": "nope"}}}, "heads.mlp.act = 'nope': unknown activation"),
])
def test_a_tampered_record_is_refused_with_a_sentence(change, words, tmp_path):
    message = _refused(_write(tmp_path, change(json.loads(json.dumps(RECORD)))))
    assert words in message and message.endswith(f"{EXPORTED}.")


def test_declared_sizes_that_do_not_fit_the_tensors_are_refused(tmp_path):
    message = _refused(_write(tmp_path, RECORD | {"in_dim": 7}))
    assert "holds head 'mlp' of seed 0 with the tensor 'layers.0.0.weight' of shape [12, 5], where its recorded " \
           "config (in_dim, width, out_dim) declares [12, 7]" in message and EXPORTED in message
    message = _refused(_write(tmp_path, RECORD | {"heads": {"mlp": CONFIG | {"depth": 3}}}))
    assert "no tensor" in message and "which its recorded config needs" in message


@pytest.mark.parametrize("key", ["0_lin", "x0", "seed-0/mlp", "seed-1/mlp/layers.0.0.weight",
                                 "seed-0/other/layers.0.0.weight"])
def test_a_tensor_key_out_of_pattern_is_refused(key, tmp_path):
    tensors = _tensors() | {key: torch.zeros(2)}
    message = _refused(_write(tmp_path, tensors=tensors))
    assert f"holds the tensor {key!r}, which is not seed-S/HEAD/<parameter>" in message


def test_broken_json_and_a_missing_record_say_which(tmp_path):
    assert "has a 'headprobe' metadata record that is not JSON" in _refused(_write(tmp_path, raw="{broken"))
    path = tmp_path / "plain.safetensors"
    save_file(_tensors(), str(path))
    assert "has no 'headprobe' metadata record; it was not written by `headprobe export-heads`" in _refused(path)


def test_a_file_cut_short_is_refused(tmp_path):
    path = _write(tmp_path)
    path.write_bytes(path.read_bytes()[:-40])
    assert "is not a readable safetensors file" in _refused(path)


def test_a_tampered_results_json_is_refused_by_export_heads(tmp_path, capsys):
    from report_run import results_dict

    results = results_dict()
    results["recipe"]["seeds"] = ["a"]
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert main(["export-heads", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "results.json records seeds = ['a']" in " ".join(err.split())


def test_export_heads_into_a_read_only_folder_exits_1_with_a_sentence(tmp_path, capsys, monkeypatch):
    from safetensors import SafetensorError

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    head = ProjectionHead(5, kind="mlp", depth=2, width=12, out_dim=6, act="relu")
    torch.save({"step": 1, "heads": {"mlp": {"head": head.state_dict(), "predictor": None}}},
               run / "checkpoints" / "step-1.pt")
    results = {"schema_version": 3,
               "recipe": {"seed": 0}, "backbone": {"dim": 5}, "heads": {"mlp": {"config": {"name": "mlp", **CONFIG}}}}
    (run / "results.json").write_text(json.dumps(results))

    def read_only(tensors, filename, metadata=None):  # what safetensors raises there (chmod binds no root)
        raise SafetensorError('Error while serializing: I/O error: Permission denied (os error 13) at path "x"')

    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", read_only)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["export-heads", str(run), "--out", str(tmp_path / "ro" / "h.safetensors")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"could not write the heads {tmp_path / 'ro' / 'h.safetensors'}: Permission denied; choose a " \
           "writable --out" in " ".join(err.split())
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted([*before, "ro"])
