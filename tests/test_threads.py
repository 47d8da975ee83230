"""The thread count: affinity and cgroup quota (v2 and v1, fake files), the overrides in their order, a count that
does not follow the load (only a warning does), a resume that keeps the recorded count, and what a run records in
results.json["environment"]["threads"]."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from headprobe.parallel.threads import (
    busy_elsewhere,
    cgroup_cpu_quota,
    choose_threads,
    load_warning,
    prefer_passive_waiting,
    resumed_threads,
    usable_cpus,
)


def _v2(tmp_path, cpu_max: dict[str, str], own: str = "/job/step"):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "cgroup").write_text(f"0::{own}\n")
    for relative, text in cpu_max.items():
        folder = tmp_path / "fs" / relative
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cpu.max").write_text(text + "\n")
    return tmp_path / "cgroup", tmp_path / "fs"


def test_cgroup_v2_quota_is_quota_over_period_and_the_tightest_ancestor_wins(tmp_path):
    proc, root = _v2(tmp_path, {"job/step": "max 100000", "job": "250000 100000", "": "max 100000"})
    assert cgroup_cpu_quota(proc, root) == 2.5
    proc, root = _v2(tmp_path / "b", {"job/step": "50000 100000", "job": "300000 100000"})
    assert cgroup_cpu_quota(proc, root) == 0.5


def test_cgroup_v2_without_a_limit_or_without_files_has_no_quota(tmp_path):
    proc, root = _v2(tmp_path, {"job/step": "max 100000", "job": "max 100000"})
    assert cgroup_cpu_quota(proc, root) is None
    assert cgroup_cpu_quota(tmp_path / "missing", root) is None


def test_cgroup_v1_quota_from_cfs_files_and_minus_one_means_none(tmp_path):
    (tmp_path / "cgroup").write_text("12:memory:/slurm/job\n4:cpu,cpuacct:/slurm/job\n0::/\n")
    folder = tmp_path / "fs" / "cpu,cpuacct" / "slurm" / "job"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("400000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path / "cgroup", tmp_path / "fs") == 4.0
    (folder / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(tmp_path / "cgroup", tmp_path / "fs") is None


def test_usable_cpus_is_the_affinity_capped_by_the_quota_rounded_down():
    assert usable_cpus(affinity=16, quota=None)[0] == 16
    assert usable_cpus(affinity=16, quota=3.9)[0] == 3  # a 4th thread would be throttled past the quota
    assert usable_cpus(affinity=2, quota=8.0)[0] == 2
    assert usable_cpus(affinity=4, quota=0.5)[0] == 1
    assert 1 <= usable_cpus()[0] <= len(os.sched_getaffinity(0))  # this machine: never past its affinity


def test_the_overrides_in_order_environment_recipe_omp_then_auto():
    machine = {"affinity": 8, "quota": None}
    both = {"HEADPROBE_THREADS": "3", "OMP_NUM_THREADS": "5"}
    assert (choose_threads(2, both, **machine).count, choose_threads(2, both, **machine).source) == \
        (3, "HEADPROBE_THREADS")
    assert choose_threads(2, {"OMP_NUM_THREADS": "5"}, **machine).source == "recipe runtime.threads"
    assert choose_threads(None, {"OMP_NUM_THREADS": "5"}, **machine).count == 5
    auto = choose_threads(None, {}, **machine)
    assert (auto.count, auto.source) == (8, "auto") and "8 usable CPUs" in auto.rule


@pytest.mark.parametrize("busy", [0.0, 1.2, 2.6, 15.0])
def test_the_automatic_count_does_not_follow_the_load_only_the_warning_does(busy):
    choice = choose_threads(None, {}, affinity=4, quota=None)
    assert (choice.count, choice.source) == (4, "auto") and "busy" not in choice.rule
    line = load_warning(choice, busy, machine_cpus=4)
    if busy < 0.5:
        assert line is None
    else:
        assert f"leaving {max(1, round(4 - busy))} for headprobe's 4 threads" in line
        assert f"HEADPROBE_THREADS={max(1, round(4 - busy))}" in line
    assert load_warning(choose_threads(2, {}, affinity=4, quota=None), busy, 4) is None  # a count asked for: no line


def test_auto_shares_the_cpus_among_the_local_processes_and_the_quota():
    assert choose_threads(None, {"LOCAL_WORLD_SIZE": "2"}, affinity=8, quota=None).count == 4
    assert choose_threads(None, {}, affinity=64, quota=6.0).count == 6


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_thread_variable_is_refused_with_the_fix(value):
    with pytest.raises(ValueError, match=f"HEADPROBE_THREADS='{value}' is not a thread count.*whole number"):
        choose_threads(None, {"HEADPROBE_THREADS": value}, affinity=2, quota=None)


def test_busy_elsewhere_reads_the_runnable_threads_less_its_own(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3 4\nprocs_running 5\nprocs_blocked 0\n")
    assert busy_elsewhere(stat, samples=3, interval_s=0.0) == (4.0,
                                                           "runnable threads elsewhere now (median of 3 reads)")
    stat.write_text("cpu  1 2 3 4\nprocs_running 1\n")  # only the reader itself: a quiet machine
    assert busy_elsewhere(stat, samples=2, interval_s=0.0)[0] == 0.0
    busy, how = busy_elsewhere(tmp_path / "missing", samples=2, interval_s=0.0)  # not Linux: the load average
    assert how == "the 1-minute load average" and busy == pytest.approx(os.getloadavg()[0], abs=2.0)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux's /proc/stat")
def test_busy_elsewhere_counts_busy_processes_that_are_running_now():
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        import time

        time.sleep(0.5)  # past their start-up
        loaded, _ = busy_elsewhere()
    finally:
        for job in spinners:
            job.kill()
            job.wait()
    # Three spinners are runnable whenever they are sampled, whatever else the machine is doing. (Not compared with
    # a read before them: other work, another pytest-xdist worker's included, may stop in between.)
    assert loaded >= 3


def test_a_busy_machine_gives_the_same_count_and_rule_with_one_warning(monkeypatch):
    import torch

    from headprobe.parallel import threads

    for name in ("HEADPROBE_THREADS", "OMP_NUM_THREADS", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda *a: (2, "affinity 2 CPUs, cgroup quota none"))
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(threads, "busy_elsewhere", lambda: (0.0, "now"))
        quiet = threads.configure_threads(None)
        monkeypatch.setattr(threads, "busy_elsewhere", lambda: (3.0, "now"))  # another job came in
        with pytest.warns(UserWarning, match="leaving 1 for headprobe's 2 threads.*HEADPROBE_THREADS=1"):
            busy = threads.configure_threads(None)
        assert busy == quiet and (busy["count"], torch.get_num_threads()) == (2, 2)
        assert threads.configure_threads(1)["count"] == 1  # an explicit count still wins
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux's /proc/stat")
def test_real_spinning_processes_do_not_change_the_automatic_count():
    quiet = choose_threads(None, {})
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        import time

        time.sleep(0.3)
        loaded = choose_threads(None, {})
    finally:
        for job in spinners:
            job.kill()
            job.wait()
    assert loaded == quiet


def test_resume_reuses_the_recorded_count_and_warns_when_headprobe_threads_differs(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"environment": {"threads": {"count": 3, "source": "auto"}}}))
    assert resumed_threads(tmp_path, environ={}) == 3
    choice = choose_threads(1, {"OMP_NUM_THREADS": "5"}, affinity=8, quota=None, recorded=3)
    assert (choice.count, choice.source) == (3, "resumed run")  # over the recipe's and OMP_NUM_THREADS
    with pytest.warns(UserWarning, match="HEADPROBE_THREADS=2 overrides the 3 threads the resumed run"):
        assert resumed_threads(tmp_path, environ={"HEADPROBE_THREADS": "2"}) == 3
    assert choose_threads(None, {"HEADPROBE_THREADS": "2"}, recorded=3).count == 2
    assert resumed_threads(tmp_path / "none", environ={}) is None  # nothing recorded: chosen as a new run
    (tmp_path / "results.json").write_text(json.dumps({"environment": {}}))
    assert resumed_threads(tmp_path, environ={}) is None


def test_passive_waiting_is_set_only_before_torch_and_never_over_the_users_choice():
    env: dict = {}
    assert prefer_passive_waiting(env) is False  # torch is already imported in this process
    assert "OMP_WAIT_POLICY" not in env
    code = ("import os; from headprobe.parallel.threads import prefer_passive_waiting as p; e = {}; "
            "print(p(e), e.get('OMP_WAIT_POLICY'), p({'OMP_WAIT_POLICY': 'ACTIVE'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "PASSIVE", "False"]


def test_a_bad_thread_variable_stops_the_run_with_exit_2_before_anything_is_written(tiny_recipe, tmp_path,
                                                                                     monkeypatch, capsys):
    from headprobe.cli import main

    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe))
    monkeypatch.setenv("HEADPROBE_THREADS", "many")
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 2
    assert "HEADPROBE_THREADS='many' is not a thread count" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_run_uses_and_records_the_recipes_thread_count(tiny_recipe, tmp_path, monkeypatch):
    import torch

    from headprobe import run

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("HEADPROBE_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        results = run({**tiny_recipe, "runtime": {"threads": 1}}, out=tmp_path / "run", quiet=True)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    threads = results["environment"]["threads"]
    assert (threads["count"], threads["source"]) == (1, "recipe runtime.threads")
    assert threads["rule"] == "runtime.threads: 1 in the recipe"
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())["environment"]["threads"]
    assert on_disk == threads
