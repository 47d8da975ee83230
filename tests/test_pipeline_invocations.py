"""`results.json["invocations"]`: each `headprobe run` of a run keeps the stage times it measured itself, and a
resumed run adds its own after the earlier ones, which it keeps as recorded."""

import json

import pytest
import torch

from headprobe import run
from headprobe.recipe import RecipeError

pytestmark = pytest.mark.slow


def test_a_resume_keeps_the_earlier_invocations_timing(tiny_recipe, tmp_path):
    out = tmp_path / "run"
    first = run(tiny_recipe, out=out, quiet=True)
    [only] = first["invocations"]
    assert only["status"] == "complete" and only["resume"] is False
    assert set(only["timing"]) == set(first["timing"])  # one invocation ran every stage
    assert all(only["timing"][k] == pytest.approx(v) for k, v in first["timing"].items())

    # As if stopped after extraction: the recorded invocation stays the first entry, as it was.
    path = out / "results.json"
    recorded = json.loads(path.read_text())
    recorded["status"] = "interrupted"
    recorded["timing"]["extract_s"] = 123.0
    recorded["invocations"][0]["timing"]["extract_s"] = 123.0
    path.write_text(json.dumps(recorded))
    resumed = run(tiny_recipe, out=out, resume=True, quiet=True)
    earlier, now = resumed["invocations"]
    assert earlier == recorded["invocations"][0] and earlier["timing"]["extract_s"] == 123.0
    assert (now["resume"], now["status"]) == (True, "complete")
    assert now["timing"]["extract_s"] != 123.0  # extraction was redone (a cache hit) and timed again
    assert resumed["timing"]["extract_s"] == now["timing"]["extract_s"]  # `timing` is the run's own clock


def test_resume_keeps_the_recorded_threads_and_ignores_the_runtime_section(tiny_recipe, tmp_path, monkeypatch):
    monkeypatch.delenv("HEADPROBE_THREADS", raising=False)
    out, threads = tmp_path / "run", torch.get_num_threads()
    try:
        run({**tiny_recipe, "runtime": {"threads": 1}}, out=out, quiet=True)
        path = out / "results.json"
        recorded = json.loads(path.read_text())
        recorded["status"] = "interrupted"
        path.write_text(json.dumps(recorded))
        resumed = run({**tiny_recipe, "runtime": {"threads": 2}}, out=out, resume=True, quiet=True)
    finally:
        torch.set_num_threads(threads)
    # The recipe now asks for 2, but the run recorded 1: a resumed run sums in the order its first part did.
    recorded_threads = resumed["environment"]["threads"]
    assert resumed["status"] == "complete" and (recorded_threads["count"], recorded_threads["source"]) == \
        (1, "resumed run")
    with pytest.raises(RecipeError, match="the recipe differs"):  # what it computes still has to match
        run({**tiny_recipe, "seed": 1}, out=out, resume=True, quiet=True)
