"""Files replaced whole or not at all (`headprobe.parallel.atomic`): the writers of per-unit values, exported heads,
checkpoints and the run record all go through it."""

import pytest

from headprobe.parallel.atomic import replace_atomically


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, OSError])
def test_a_write_cut_short_leaves_the_old_file_and_no_temporary(tmp_path, interruption):
    target = tmp_path / "unit.safetensors"
    target.write_text("old")

    def write(tmp):
        tmp.write_text("half of the n")
        raise interruption("cut short")

    with pytest.raises(interruption):
        replace_atomically(target, write)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["unit.safetensors"]


def test_per_unit_values_interrupted_mid_write_leave_nothing_behind(tmp_path, monkeypatch):
    import safetensors.torch
    import torch

    from headprobe.stats.bootstrap import TEST_IMAGES, PerUnit, load_per_unit, save_per_unit

    path = tmp_path / "per_unit" / "tap.safetensors"
    save_per_unit(path, {"linear.acc": PerUnit(torch.tensor([1.0, 0.0, 1.0]), TEST_IMAGES)})

    def interrupted(tensors, filename, metadata=None):
        open(filename, "wb").write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_per_unit(path, {"linear.acc": PerUnit(torch.tensor([0.0, 0.0, 0.0]), TEST_IMAGES)})
    assert [p.name for p in path.parent.iterdir()] == ["tap.safetensors"]
    assert load_per_unit(path)["linear.acc"].values.tolist() == [1.0, 0.0, 1.0]
