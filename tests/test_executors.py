"""The executor seam (pipeline/executors.py): the process count is decided once, where the run starts; the local
executors do what one process does; the shared seed executor times the stage by its slowest process."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import headprobe.pipeline as pipeline
from headprobe.pipeline.executors import LocalProbes, LocalSeeds, executors_for
from headprobe.pipeline.seed_sharing import SharedSeeds
from headprobe.record.directory import RunDir
from headprobe.record.writer import RecordWriter, TapSummary

PROCESS_COUNT = re.compile(r"num_processes|process_index|is_main_process|\bworld\b|all_objects|wait_for_everyone")


@pytest.mark.parametrize("module", ["stages.py", "taps.py", "probing.py"])
def test_the_stages_never_ask_how_many_processes_run(module):
    source = (Path(pipeline.__file__).parent / module).read_text()
    assert not PROCESS_COUNT.findall(source), f"{module} branches on the process count; ask the executor instead"


def test_one_process_gets_the_local_executors():
    probes, seeds = executors_for(SimpleNamespace(num_processes=1, process_index=0))
    assert isinstance(probes, LocalProbes) and isinstance(seeds, LocalSeeds)
    assert not probes.backbone_with_heads and probes.all_agree(True) and not probes.all_agree(False)


def test_local_seeds_train_every_seed_here_and_the_stage_takes_their_sum(tmp_path):
    logged = []
    trained = LocalSeeds().train(None, [3, 5], [], 8, lambda seed, log: (log({"step": seed}), (seed, {}))[1],
                                 lambda entry, seed: logged.append((seed, entry)))
    assert trained == {3: (3, {}), 5: (5, {})} and logged == [(3, {"step": 3}), (5, {"step": 5})]
    assert LocalSeeds().stage_seconds([3, 5], {3: 2.0, 5: 4.0}) == 6.0
    record = RecordWriter(RunDir(tmp_path, writable=False), {"timing": {}}, None)
    assert LocalSeeds().writes_checkpoints([3, 5], record) is False  # only the process that writes the folder


def test_shared_seeds_take_the_slowest_process_s_time():
    shared = SharedSeeds(SimpleNamespace(num_processes=2, process_index=0, is_main_process=True))
    # Process 0 trains seeds 0 and 2 (1 + 3 s), process 1 seed 1 (5 s): side by side, the stage took 5 s.
    assert shared.stage_seconds([0, 1, 2], {0: 1.0, 1: 5.0, 2: 3.0}) == 5.0
    assert shared.stage_seconds([7], {7: 2.0}) == 2.0  # one seed: every process trains it, as one process does


def test_local_probes_hand_each_summary_to_the_record(tmp_path):
    record = RecordWriter(RunDir(tmp_path), {"taps": {"a": {"metrics": {}}, "b": {"metrics": {}}}, "timing": {}},
                          None)
    LocalProbes().summaries(["a", "b"], lambda name: TapSummary(name, {"m": {"ci95": [0, len(name)]}}), record)
    assert record.record["taps"]["b"]["uncertainty"] == {"m": {"ci95": [0, 1]}}
    assert LocalProbes().probed_intervals("a", {"m": 1.0}) is None  # one process keeps no intervals of its own
