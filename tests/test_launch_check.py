"""A launcher that asked for N processes and started one is named in one warning line (#18), and the command the
README shows for several processes on a CPU machine really starts two."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from timeouts import HANG_TIMEOUT_S

from headprobe.parallel.launch_check import launch_warning, requested_processes, warn_if_fewer_processes

# What `accelerate launch --num_processes 2 --cpu script.py` puts in the one process it starts (read off
# accelerate.utils.launch.prepare_simple_launcher_cmd_env and checked by printing os.environ under it).
ACCELERATE_CPU_SIMPLE = {"ACCELERATE_USE_CPU": "True", "ACCELERATE_MIXED_PRECISION": "no",
                         "ACCELERATE_DYNAMO_BACKEND": "NO", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                         "OMP_NUM_THREADS": "1"}
# ... and with --num_processes 1: no rendezvous address.
ACCELERATE_CPU_ONE = {"ACCELERATE_USE_CPU": "True", "ACCELERATE_MIXED_PRECISION": "no"}
# What torchrun (and accelerate --multi_gpu, which runs it) sets in each of two processes.
TORCHRUN_TWO = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_a_world_size_above_the_world_is_one_warning_line_naming_both_and_the_fix():
    message = launch_warning({"WORLD_SIZE": "2", "RANK": "0"}, world=1)
    assert message is not None and "\n" not in message
    assert message.startswith("warning: the launcher asked for 2 processes (WORLD_SIZE=2) but headprobe runs in 1")
    assert "torchrun --nproc_per_node N" in message and "--multi_gpu" in message
    assert "4 processes (OMPI_COMM_WORLD_SIZE=4)" in launch_warning({"OMPI_COMM_WORLD_SIZE": "4"}, world=2)


def test_accelerate_cpu_with_two_processes_is_recognised_without_a_world_size():
    assert requested_processes(ACCELERATE_CPU_SIMPLE) == (
        None, "accelerate launch set MASTER_ADDR and MASTER_PORT but started no other rank")
    message = launch_warning(ACCELERATE_CPU_SIMPLE, world=1)
    assert message.startswith("warning: the launcher asked for several processes")
    assert "`accelerate launch --cpu` runs a single process unless MPI is set up" in message


@pytest.mark.parametrize("env, world", [
    ({}, 1),  # a plain `headprobe run`
    ({"WORLD_SIZE": "1", "RANK": "0"}, 1),  # torchrun --nproc_per_node 1
    (ACCELERATE_CPU_ONE, 1),  # accelerate launch --num_processes 1 --cpu
    (TORCHRUN_TWO, 2),  # the launch worked
    ({"WORLD_SIZE": "two"}, 1),  # not a number: nothing to compare
], ids=["plain", "torchrun-1", "accelerate-cpu-1", "torchrun-2", "garbage"])
def test_no_warning_when_the_launch_matches(env, world):
    assert launch_warning(env, world) is None


def test_the_warning_goes_to_stderr_once_and_only_when_shown(capsys):
    assert warn_if_fewer_processes(1, env={"WORLD_SIZE": "3"}) is not None
    assert warn_if_fewer_processes(1, env={"WORLD_SIZE": "3"}, show=False) is not None
    assert warn_if_fewer_processes(1, env={}) is None
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("warning: the launcher asked for 3 processes") == 1


def _accelerate() -> str | None:
    return shutil.which("accelerate", path=str(Path(sys.executable).parent))


RECIPE_OPTIONS = {"data": {"source": "sklearn-digits", "limit": {"train": 60, "test": 30}},
                  "features": {"batch_size": 16}, "probes": {"knn": {"ks": [5]}}}


def _launch(args: list[str], tiny_recipe: dict, tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict]:
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump({**tiny_recipe, **RECIPE_OPTIONS}))
    env = {**os.environ, "HEADPROBE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run([_accelerate(), "launch", *args, "--main_process_port", "29517", "-m", "headprobe", "run",
                           str(recipe), "--out", str(tmp_path / "run")],
                          env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads((tmp_path / "run" / "results.json").read_text())


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(_accelerate() is None, reason="accelerate's launcher is missing")
def test_readme_command_accelerate_multi_gpu_runs_two_processes_on_cpu(tiny_recipe, tmp_path):
    done, results = _launch(["--multi_gpu", "--num_processes", "2"], tiny_recipe, tmp_path)
    assert results["environment"]["num_processes"] == 2
    assert results["status"] == "complete"
    assert "warning: the launcher asked for" not in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(_accelerate() is None, reason="accelerate's launcher is missing")
def test_accelerate_cpu_with_two_processes_runs_one_and_says_so_once(tiny_recipe, tmp_path):
    done, results = _launch(["--cpu", "--num_processes", "2"], tiny_recipe, tmp_path)
    assert results["environment"]["num_processes"] == 1
    lines = [line for line in done.stderr.splitlines() if "warning: the launcher asked for" in line]
    assert len(lines) == 1, done.stderr[-2000:]
    assert "several processes" in lines[0] and "runs in 1" in lines[0]
