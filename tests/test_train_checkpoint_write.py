"""A checkpoint is written whole or not at all: a Ctrl-C or SIGTERM in the middle of `torch.save` leaves the previous
checkpoint as it was and no temporary file (test_faults met `.step-24.pt.tmp` after a Ctrl-C in training)."""

import pytest
import torch

import headprobe.train.checkpoint as checkpoint_module
from headprobe.train.cached_views import load_checkpoint
from headprobe.train.checkpoint import save_checkpoint


def test_an_interrupted_checkpoint_write_leaves_the_last_one_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "step-8.pt"
    save_checkpoint(path, 8, [])
    before = path.read_bytes()
    real = torch.save

    def interrupted(obj, target):
        real(obj, target)  # the bytes are on disk under the temporary name, then the signal arrives
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint_module.torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, 16, [])
    assert path.read_bytes() == before and load_checkpoint(path)["step"] == 8
    assert sorted(p.name for p in path.parent.iterdir()) == ["step-8.pt"]
