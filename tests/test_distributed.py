"""Two processes (torchrun, gloo on CPU) give the same features, metrics, intervals and verdicts as one, seed by
seed, with the probes shared out between them."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from timeouts import HANG_TIMEOUT_S

pytestmark = pytest.mark.slow

SCRIPT = """
import json, os, sys, time
import headprobe.pipeline.probing as probing
from headprobe import run
lag = float(os.environ.get("LAG_OF_RANK_1", 0))
if lag and os.environ.get("RANK") == "1":  # process 1 reaches the probe stage `lag` seconds after process 0
    probe_heads = probing.probe_heads
    probing.probe_heads = lambda *args, **kwargs: (time.sleep(lag), probe_heads(*args, **kwargs))[1]
run(json.loads(sys.argv[1]), out=sys.argv[2], resume=len(sys.argv) > 3, quiet=True)
"""
LAG = 4.0


@pytest.mark.distributed
@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="torchrun missing")
def test_two_processes_equal_one(tiny_recipe, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    # shard_bank true: the bank of 101 rows is sharded although the default shards only large banks.
    # orbits: each process forwards the orbits of every other image (orbit_features), gathered into the same result.
    probes = {"linear": {"C_grid": [0.1, 1.0]}, "knn": {"ks": [5], "shard_bank": True}, "invariance": {},
              "orbits": {"sweeps": ["rotation45"], "n_images": 5}}
    spec = {**tiny_recipe, "data": {"source": "sklearn-digits", "limit": {"train": 101, "test": 37}},
                         "features": {"batch_size": 16}, "probes": probes,
                         "heads": [{"name": "relu", "width": 16}], "augment": {"preset": "crop-flip", "views": 3},
                         "train": {"epochs": 2, "batch_size": 32}, "seeds": [0, 1]}
    dealt = {**spec, "probes": {**probes, "knn": {"ks": [5]}}}  # the default on a small bank: not sharded
    torchrun = str(Path(sys.executable).parent / "torchrun")
    two = [torchrun, "--nproc_per_node", "2"]
    runs = {}
    for name, launcher, recipe in (("one", [sys.executable], spec), ("two", two, spec), ("dealt", two, dealt)):
        env = {**os.environ, "HEADPROBE_CACHE": str(tmp_path / f"cache-{name}"), "OMP_NUM_THREADS": "1",
               "LAG_OF_RANK_1": str(LAG) if name == "dealt" else "0"}
        done = subprocess.run([*launcher, str(script), json.dumps(recipe), str(tmp_path / name)], env=env,
                              capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = json.loads((tmp_path / name / "results.json").read_text())
    assert runs["two"]["environment"]["num_processes"] == 2
    assert list(runs["two"]["taps"]) == ["backbone", "relu@1", "relu"]
    assert set(runs["two"]["taps"]["relu"]["seeds"]) == {"0", "1"}  # several seeds, each trained on both ranks
    for tap, values in runs["one"]["taps"].items():
        for metric, value in values["metrics"].items():
            # Features agree to ~1e-6; L-BFGS probes amplify that slightly in continuous metrics.
            assert runs["two"]["taps"][tap]["metrics"][metric] == pytest.approx(value, rel=1e-3, abs=1e-6), metric
        for seed, record in values.get("seeds", {}).items():
            for metric, value in record["metrics"].items():
                two = runs["two"]["taps"][tap]["seeds"][seed]["metrics"][metric]
                assert two == pytest.approx(value, rel=1e-3, abs=1e-6), (seed, metric)
        for metric, record in values["uncertainty"].items():
            two = runs["two"]["taps"][tap]["uncertainty"][metric]
            assert two["method"] == record["method"] and two.get("n_units") == record.get("n_units"), metric
            if record["ci95"] is None:
                assert two["ci95"] is None, metric
            else:
                assert two["ci95"] == pytest.approx(record["ci95"], rel=1e-3, abs=1e-6), metric
    for head, verdict in runs["one"]["buffer"].items():
        two = runs["two"]["buffer"][head]
        assert {k: two[k] for k in ("verdict", "support", "against", "unresolved")} == {
            k: verdict[k] for k in ("verdict", "support", "against", "unresolved")}, head
        assert {m: e["resolved"] for m, e in two["evidence"].items()} == {
            m: e["resolved"] for m, e in verdict["evidence"].items()}, head
    for question, claim in runs["one"]["claims"].items():  # the answers: the same on two processes
        for head, record in claim["heads"].items():
            two = runs["two"]["claims"][question]["heads"][head]
            assert (two["answer"], two["interval"]) == (record["answer"], record["interval"]), (question, head)
            assert two["change"] == pytest.approx(record["change"], rel=1e-3, abs=1e-6), (question, head)
    # The probes were shared out: each process ran some of them, and every one ran once.
    logged = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    probed = [(r["tap"], r.get("seed"), r["probe"], r["process"]) for r in logged if r.get("stage") == "probe"]
    assert {process for *_, process in probed} == {0, 1, "all"}
    # The k-NN ran on both processes at once, each over half the training bank (probes.sharded_knn).
    assert {process for _, _, probe, process in probed if probe == "knn"} == {"all"}
    assert runs["two"]["taps"]["relu"]["seeds"]["0"]["protocol"]["knn"]["shards"] == 2
    # Unsharded, each tap's k-NN runs whole on one process instead: the same metrics.
    logged = [json.loads(line) for line in (tmp_path / "dealt" / "metrics.jsonl").read_text().splitlines()]
    assert {r["process"] for r in logged if r.get("probe") == "knn"} <= {0, 1}
    for tap, values in runs["two"]["taps"].items():
        assert runs["dealt"]["taps"][tap]["metrics"] == values["metrics"], tap
    # Process 1 came late to the probe stage: its lag is not counted as probing (the stage's clock starts when every
    # process is there), though the whole run waited for it.
    assert runs["dealt"]["timing"]["probe_s"] < LAG
    assert len({item[:3] for item in probed}) == len(probed) == 4 * (1 + 2 * 2)  # 4 probes: backbone + 2 taps × 2 seeds
    views = runs["one"]["protocol"]["views"]["cache_key"]
    one = load_file(tmp_path / "cache-one" / "views" / f"{views}.safetensors")
    two = load_file(tmp_path / "cache-two" / "views" / f"{views}.safetensors")
    assert torch.equal(one["params"], two["params"])
    torch.testing.assert_close(one["features"], two["features"], atol=1e-5, rtol=1e-5)
    for split in ("train", "test"):
        key = runs["one"]["protocol"]["features"]["cache"][split]["key"]
        one = load_file(tmp_path / "cache-one" / "features" / f"{key}.safetensors")
        two = load_file(tmp_path / "cache-two" / "features" / f"{key}.safetensors")
        assert torch.equal(one["labels"], two["labels"])
        torch.testing.assert_close(one["features"], two["features"], atol=1e-5, rtol=1e-5)
    # Each seed was trained by one process (seed_sharing), the other process's records written by the main one:
    # the same losses, statuses and logged records as one process trained them all.
    def train_records(name: str) -> list[tuple]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        return sorted((r["seed"], r["step"], r["head"], r["loss"]) for r in records if r.get("stage") == "train")

    assert train_records("two") == train_records("one") and {r[0] for r in train_records("one")} == {0, 1}
    assert runs["two"]["heads"]["relu"]["train_seeds"] == runs["one"]["heads"]["relu"]["train_seeds"]
    # Each process wrote its own seeds' checkpoints, and `--resume` reads them: nothing is trained again.
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir()) == ["seed-0", "seed-1"]
    env = {**os.environ, "HEADPROBE_CACHE": str(tmp_path / "cache-two"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([torchrun, "--nproc_per_node", "2", str(script), json.dumps(spec), str(tmp_path / "two"),
                           "--resume"], env=env,
                          capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = json.loads((tmp_path / "two" / "results.json").read_text())
    assert train_records("two") == train_records("one")  # no step was trained (and logged) again
    for tap, values in runs["two"]["taps"].items():
        assert resumed["taps"][tap]["metrics"] == values["metrics"], tap
