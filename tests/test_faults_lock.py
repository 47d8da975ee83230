"""The run-folder lock reads its file as garbage where it is (#40): a bad HEADPROBE_LOCK_TIMEOUT in `report` is one
sentence (exit 2); a pid that names no process (huge, negative, true, text) is no live holder and never an
OverflowError; a heartbeat dated in the future goes stale like an old one; a folder where the lock file belongs is
refused with a sentence, not "free disk space"."""

import json
import os
import socket
import time

import pytest

from headprobe.cli import main
from headprobe.record.lock import LOCK_NAME, RunFolderLocked, RunLock


def _plant(folder, content, age_s: float = 0.0):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    when = time.time() - age_s
    os.utime(path, (when, when))
    return path


def _holder(pid, host=None) -> dict:
    return {"pid": pid, "host": host or socket.gethostname(), "purpose": "run", "started": "2026-12-01 10:00:00 UTC",
            "token": "planted"}


def _run_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"schema_version": 3, "status": "complete",
                                                  "taps": {"backbone": {"metrics": {}}}}))
    return run


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    return " ".join(err.split())


@pytest.mark.parametrize("value, words", [("abc", "HEADPROBE_LOCK_TIMEOUT = 'abc' is not a number of seconds"),
                                          ("-1", "HEADPROBE_LOCK_TIMEOUT = '-1' must be > 0 seconds"),
                                          ("nan", "HEADPROBE_LOCK_TIMEOUT = 'nan' must be > 0 seconds")])
def test_report_with_a_bad_lock_timeout_exits_2_with_a_sentence(value, words, tmp_path, capsys, monkeypatch):
    run = _run_folder(tmp_path)
    lock = _plant(run, _holder(1234, "node-elsewhere"))
    before = lock.read_text()
    monkeypatch.setenv("HEADPROBE_LOCK_TIMEOUT", value)
    assert main(["report", str(run)]) == 2
    assert words in _one_line(capsys)
    assert lock.read_text() == before and sorted(p.name for p in run.iterdir()) == [LOCK_NAME, "results.json"]
    lock.unlink()  # without any lock met, the bad value is refused all the same
    assert main(["report", str(run)]) == 2 and words in _one_line(capsys)


@pytest.mark.parametrize("pid", [99999999999999999999, -1, 0, True, "1234", 1.5, None, 2**31])
def test_a_pid_that_names_no_process_is_garbage_taken_over(pid, tmp_path):
    run = tmp_path / "run"
    _plant(run, _holder(pid), age_s=30)
    with pytest.warns(UserWarning, match="an unknown process: its file names no process .* not changed for 3\\d s"), \
            RunLock(run, "resume"):
        assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_report_meeting_a_huge_pid_finishes(tmp_path, capsys):
    run = _run_folder(tmp_path)
    _plant(run, _holder(99999999999999999999), age_s=30)
    with pytest.warns(UserWarning, match="its file names no process"):
        assert main(["report", str(run)]) == 0
    assert "Traceback" not in capsys.readouterr().err and not (run / LOCK_NAME).exists()


def test_a_fresh_garbage_lock_is_waited_for_not_taken_at_once(tmp_path, monkeypatch):
    import headprobe.record.lock as lock_module

    monkeypatch.setattr(lock_module, "GARBAGE_AFTER_S", 0.6)
    run = tmp_path / "run"
    _plant(run, "{half written")
    start = time.monotonic()
    with pytest.warns(UserWarning, match="not changed for"), RunLock(run, "run"):
        assert time.monotonic() - start >= 0.6


def test_a_heartbeat_dated_in_the_future_goes_stale(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADPROBE_LOCK_TIMEOUT", "60")
    run = tmp_path / "run"
    _plant(run, _holder(1234, "node-elsewhere"), age_s=-30)  # within the bound: another clock a little ahead
    with pytest.raises(RunFolderLocked, match="pid 1234 on host node-elsewhere"):
        RunLock(run, "run").acquire()
    _plant(run, _holder(1234, "node-elsewhere"), age_s=-3600)
    with pytest.warns(UserWarning, match=r"heartbeat is dated 3\d\d\d s in the future"), RunLock(run, "run"):
        assert json.loads((run / LOCK_NAME).read_text())["host"] == socket.gethostname()


def test_a_folder_where_the_lock_belongs_is_refused_with_a_sentence(tmp_path, capsys):
    run = _run_folder(tmp_path)
    (run / LOCK_NAME).mkdir()
    assert main(["report", str(run)]) == 2
    assert f"{run / LOCK_NAME} is a folder, where headprobe keeps the run folder's lock file; move it out" \
           in _one_line(capsys)
    assert (run / LOCK_NAME).is_dir() and not (run / "report.html").exists()


def test_run_resume_meeting_a_huge_pid_takes_the_lock_over_and_finishes(tmp_path, capsys):
    """`run --resume` into a finished run whose lock names pid 99999999999999999999 (os.kill would raise
    OverflowError): one warning, "nothing to do", exit 0, the lock gone and results.json unchanged."""
    import yaml

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "tiny", "backbone": {"id": "scratch:vit-tiny", "pooling": "cls"},
        "data": {"source": "sklearn-digits", "limit": {"train": 60, "test": 30}}, "features": {"batch_size": 30},
        "probes": {"knn": {"ks": [5]}}, "report": False}))
    out = tmp_path / "run"
    assert main(["run", str(recipe), "--out", str(out)]) == 0
    results = (out / "results.json").read_bytes()
    _plant(out, _holder(99999999999999999999), age_s=30)
    capsys.readouterr()
    with pytest.warns(UserWarning, match="an unknown process: its file names no process"):
        assert main(["run", str(recipe), "--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "OverflowError" not in err and "nothing to do" in err
    assert not (out / LOCK_NAME).exists() and (out / "results.json").read_bytes() == results
