"""Files replaced whole or not at all (`headprobe.parallel.atomic`): the writers of per-unit values, exported heads,
checkpoints and the run record all go through it."""

import os

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


def test_two_threads_replacing_one_file_at_once_always_leave_it_whole(tmp_path):
    """The run's heartbeat thread (`parallel.liveness`) may write results.json while the main thread does: each
    thread has its own temporary, so every read sees one writer's whole text and no temporary is left."""
    import json
    import threading

    from headprobe.parallel.atomic import replace_atomically

    target = tmp_path / "results.json"
    replace_atomically(target, lambda tmp: tmp.write_text(json.dumps({"writer": -1})))
    bad, start = [], threading.Barrier(2)

    def writer(k: int) -> None:
        start.wait()
        for i in range(200):
            text = json.dumps({"writer": k, "i": i, "pad": "x" * (1000 * (k + 1))})
            try:
                replace_atomically(target, lambda tmp, text=text: tmp.write_text(text))
                json.loads(target.read_text())
            except (OSError, ValueError) as err:
                bad.append(repr(err))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad, bad[:3]
    assert json.loads(target.read_text())["i"] == 199
    assert not list(tmp_path.glob("*.tmp"))


def test_a_resume_removes_the_temporaries_of_a_killed_writer_and_keeps_a_live_ones(tmp_path):
    """kill -9 during a checkpoint write leaves `.step-16.pt.<pid>.<thread>.tmp` (no clean-up ran); the resumed run
    removes it, but never the temporary of a writer that is still alive (this process)."""
    import subprocess
    import sys

    from headprobe.parallel.atomic import remove_stale_temporaries

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (tmp_path / "checkpoints").mkdir()
    stale = tmp_path / "checkpoints" / f".step-16.pt.{dead_pid}.140545406151552.tmp"
    live = tmp_path / f".results.json.{os.getpid()}.1.tmp"
    foreign = tmp_path / ".notes.tmp"  # not one of ours: no pid in its name
    for path in (stale, live, foreign):
        path.write_text("partial")
    assert remove_stale_temporaries(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and foreign.exists()
