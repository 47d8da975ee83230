"""Several seeds in the paper's regime (`backbone.tune`): the backbone tuned with its heads once per seed, one record
with per-seed backbone and head taps, each seed's head compared with the backbone tuned with it
(headprobe/pipeline/tuned_seeds.py, stats/retraining.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from timeouts import HANG_TIMEOUT_S

from headprobe import run
from headprobe.record.writer import RecordWriter
from headprobe.stats.bootstrap import PerUnit, bootstrap_resamples
from headprobe.stats.retraining import HIERARCHICAL, T_SEEDS, change_interval, hierarchical_replicates

UNIT = "test images"
# scratch:vit-tiny at 16 px trained from its random initialisation with an MLP head and the identity (no projector),
# 2 seeds, 3 steps each, on 60/30 digits.
TUNED = {
    "name": "tiny-tuned-seeds",
    "backbone": {"id": "scratch:vit-tiny", "pooling": "cls", "tune": "full", "resolution": 16},
    "data": {"source": "sklearn-digits", "limit": {"train": 60, "test": 30}}, "features": {"batch_size": 60},
    "heads": [{"name": "mlp", "depth": 2, "width": 16, "act": "relu"}, {"name": "ident", "type": "identity"}],
    "objective": {"name": "vicreg"}, "augment": {"preset": "crop-flip", "views": 2},
    "train": {"epochs": 1, "batch_size": 20, "checkpoint_every": 1, "log_every": 1},
    "probes": {"linear": {"C_grid": [1.0]}, "rotation": {"C_grid": [1.0], "mlp_epochs": 2}, "invariance": {}},
    "report": False,
}
TAPS = ("backbone", "mlp@1", "mlp", "ident")


def _unit(values) -> PerUnit:
    return PerUnit(torch.as_tensor(values, dtype=torch.float64), UNIT)


def test_hierarchical_replicates_draw_each_seed_with_its_own_backbone():
    backbones = torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0]], dtype=torch.float64)
    heads = torch.tensor([[10.0, 11.0, 12.0, 13.0], [20.0, 22.0, 24.0, 26.0]], dtype=torch.float64)
    boot = hierarchical_replicates(backbones, heads, seed=5)
    drawn = torch.randint(2, (4, 2), generator=torch.Generator().manual_seed(5))
    expected = torch.tensor([sum(heads[s, b] - backbones[s, b] for s in drawn[b]) / 2 for b in range(4)])
    assert torch.allclose(boot, expected.double())
    assert torch.equal(hierarchical_replicates(backbones[:1], heads[:1]), heads[0] - backbones[0])


def test_a_backbone_per_seed_pairs_each_head_with_its_own():
    g = torch.Generator().manual_seed(0)
    b = [torch.rand(40, generator=g, dtype=torch.float64) + shift for shift in (0.0, 0.3)]
    h = [x + 0.1 * torch.rand(40, generator=g, dtype=torch.float64) for x in b]
    resamples = bootstrap_resamples(40, 300, seed=2)
    out = change_interval([float(x.mean()) for x in b], [float(x.mean()) for x in h], [_unit(x) for x in b],
                          [_unit(x) for x in h], {UNIT: resamples}, seed=4)
    assert out.per_seed == pytest.approx([float((hs - bs).mean()) for hs, bs in zip(h, b, strict=True)], abs=1e-12)
    assert out.change == pytest.approx(sum(out.per_seed) / 2, abs=1e-12)
    assert out.backbone_per_seed == [float(x.mean()) for x in b] and out.record()["per_seed_backbone"] == [
        float(x.mean()) for x in b]
    differences = torch.stack([resamples.weights @ (hs - bs) for hs, bs in zip(h, b, strict=True)])  # (2, n_boot)
    drawn = torch.randint(2, (300, 2), generator=torch.Generator().manual_seed(4))
    expected = torch.stack([differences[drawn[r], r].mean() for r in range(300)])
    if out.kind == HIERARCHICAL:
        assert torch.allclose(out.boot, expected, atol=1e-12)
    else:  # the t interval over the two per-seed changes was the wider
        assert out.kind == T_SEEDS
    # One backbone repeated for every seed is the shared-backbone interval.
    shared = change_interval(float(b[0].mean()), [float(x.mean()) for x in h], _unit(b[0]), [_unit(x) for x in h],
                             {UNIT: resamples}, seed=4)
    repeated = change_interval([float(b[0].mean())] * 2, [float(x.mean()) for x in h], [_unit(b[0])] * 2,
                               [_unit(x) for x in h], {UNIT: resamples}, seed=4)
    assert repeated.kind == shared.kind and repeated.ci95 == pytest.approx(shared.ci95, abs=1e-12)
    assert repeated.change == pytest.approx(shared.change, abs=1e-12)
    with pytest.raises(ValueError, match="one per seed"):
        change_interval([0.1], [0.2, 0.3])


@pytest.mark.slow
def test_pairing_each_head_with_its_own_backbone_covers_and_removes_the_backbones_spread():
    """b_si = a_i + v_s + ε, h_si = b_si + effect + c_i + u_s + e: the tuned backbone's seed shift v_s (large) is
    in both of a seed's taps. Paired per seed the interval covers `effect` ~95% and does not carry v_s; against the
    seeds' mean backbone (as if shared) every per-seed change carries v_s − v̄ and the interval is far wider."""
    effect, reps, n, seeds = -0.05, 300, 200, 3
    covered, widths = 0, {"paired": 0.0, "mean backbone": 0.0}
    for rep in range(reps):
        g = torch.Generator().manual_seed(rep)

        def normal(*shape, g=g):
            return torch.randn(*shape, generator=g, dtype=torch.float64)

        a, c = normal(n), 0.1 * normal(n)
        b = [a + 0.5 * normal(1) + 0.1 * normal(n) for _ in range(seeds)]
        h = [x + effect + c + 0.02 * normal(1) + 0.1 * normal(n) for x in b]
        resamples = {UNIT: bootstrap_resamples(n, 1000, seed=rep)}
        paired = change_interval([float(x.mean()) for x in b], [float(x.mean()) for x in h], [_unit(x) for x in b],
                                 [_unit(x) for x in h], resamples, seed=rep)
        mean_b = torch.stack(b).mean(0)
        unpaired = change_interval(float(mean_b.mean()), [float(x.mean()) for x in h], _unit(mean_b),
                                   [_unit(x) for x in h], resamples, seed=rep)
        covered += paired.ci95[0] <= effect <= paired.ci95[1]
        widths["paired"] += (paired.ci95[1] - paired.ci95[0]) / reps
        widths["mean backbone"] += (unpaired.ci95[1] - unpaired.ci95[0]) / reps
    assert 0.91 <= covered / reps <= 0.995, covered / reps  # binomial sd at 300 reps: 1.3 points
    assert widths["paired"] < widths["mean backbone"] / 5, widths


def test_a_recipe_with_seeds_and_a_tuned_backbone_is_accepted():
    from headprobe.recipe import load_recipe

    for tune in ("full", "last:1", "lora"):
        recipe = load_recipe({**TUNED, "backbone": {**TUNED["backbone"], "tune": tune}, "seeds": [0, 1, 2]})
        assert (recipe.backbone.tune, recipe.seed_list) == (tune, [0, 1, 2])


@pytest.fixture(scope="module")
def tuned_runs(tmp_path_factory):
    """The 2-seed run and the 1-seed run (seed 0) of `TUNED`, each with a cache of its own. The 2-seed run is given
    the 1-seed run as a backbone tap to reuse (as a sweep would): a tuned backbone's tap is never reused."""
    root = tmp_path_factory.mktemp("tuned-seeds")
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        for name, seeds in (("one", [0]), ("two", [0, 1])):
            patch.setenv("HEADPROBE_CACHE", str(root / f"cache-{name}"))
            out[name] = run({**TUNED, "seeds": seeds}, out=root / name, quiet=True,
                            reuse_backbone=out["one"].path if name == "two" else None)
    return out


@pytest.mark.slow
def test_seeds_with_a_tuned_backbone_tune_it_per_seed_into_one_record(tuned_runs):
    one, two = tuned_runs["one"], tuned_runs["two"]
    assert two["status"] == "complete" and list(two["taps"]) == ["backbone_untuned", *TAPS]
    # backbone_untuned, where every seed starts, is probed once and is the 1-seed run's.
    assert "seeds" not in two["taps"]["backbone_untuned"]
    assert two["taps"]["backbone_untuned"]["metrics"] == one["taps"]["backbone_untuned"]["metrics"]
    assert "reused_from" not in two["taps"]["backbone"]
    for name in TAPS:
        tap = two["taps"][name]
        assert set(tap["seeds"]) == {"0", "1"}, name
        # Seed 0 of the 2-seed run tunes and scores exactly as the 1-seed run does.
        assert tap["seeds"]["0"]["metrics"] == one["taps"][name]["metrics"], name
        assert tap["seeds"]["1"]["metrics"] != tap["seeds"]["0"]["metrics"], name
        for metric, value in tap["metrics"].items():
            per_seed = [tap["seeds"][s]["metrics"][metric] for s in ("0", "1")]
            assert value == pytest.approx(sum(per_seed) / 2, rel=1e-12), (name, metric)
            assert tap["uncertainty"][metric]["per_seed"] == per_seed and tap["uncertainty"][metric]["n_seeds"] == 2
        assert all((two.path / "per_unit" / f"{name}.seed-{s}.safetensors").is_file() for s in (0, 1))
    # The identity head (no projector) is each seed's tuned backbone itself.
    assert all(two["taps"]["ident"]["seeds"][s]["metrics"] == two["taps"]["backbone"]["seeds"][s]["metrics"]
               for s in ("0", "1"))
    # Each seed tuned its own backbone; seed 0's weights are the 1-seed run's, bit for bit.
    tuned = two["backbone_tuned"]["seeds"]
    assert tuned["0"]["fingerprint"] == one["backbone_tuned"]["fingerprint"] != tuned["1"]["fingerprint"]
    saved = {s: load_file(two.path / tuned[s]["saved"]) for s in ("0", "1")}
    alone = load_file(one.path / one["backbone_tuned"]["saved"])
    assert all(torch.equal(saved["0"][k], alone[k]) for k in alone)
    assert any(not torch.equal(saved["0"][k], saved["1"][k]) for k in alone)
    assert tuned["1"]["saved"] == "checkpoints/seed-1/backbone.safetensors"
    assert two["protocol"]["seeds"]["seeds"] == [0, 1] and "tuned backbone" in two["protocol"]["seeds"]["varies"]
    assert set(two["heads"]["mlp"]["train_seeds"]) == {"0", "1"}
    lines = [json.loads(x) for x in (two.path / "metrics.jsonl").read_text().splitlines()]
    assert {(x["seed"], x["step"]) for x in lines if x["stage"] == "train" and x["head"] == "mlp"} == {
        (s, step) for s in (0, 1) for step in (1, 2, 3)}


@pytest.mark.slow
def test_the_answers_pair_each_seeds_head_with_its_own_tuned_backbone(tuned_runs):
    two = tuned_runs["two"]
    taps = two["taps"]
    for key, question in two["claims"].items():
        for head, answer in question["heads"].items():
            metric, tap = question["primary"], taps[answer["tap"]]
            backbone = [taps["backbone"]["seeds"][s]["metrics"][metric] for s in ("0", "1")]
            heads = [tap["seeds"][s]["metrics"][metric] for s in ("0", "1")]
            assert answer["n_seeds"] == 2 and answer["interval"] in (HIERARCHICAL, T_SEEDS), (key, head)
            assert answer["per_seed_backbone"] == backbone, (key, head)
            assert answer["per_seed_change"] == pytest.approx([x - y for x, y in zip(heads, backbone, strict=True)],
                                                              abs=1e-12), (key, head)
            assert "2 seeds" in answer["line"], answer["line"]
    # The identity head is the tuned backbone of each seed: no change at all.
    assert two["claims"]["Q-class"]["heads"]["ident"]["per_seed_change"] == [0.0, 0.0]
    assert two["claims"]["Q-class"]["heads"]["ident"]["answer"] == "equivalent"


@pytest.mark.slow
def test_an_interrupted_multi_seed_tuned_run_resumes_each_seed_where_it_stopped(tuned_runs, tmp_path, monkeypatch):
    """Stopped (Ctrl-C) in seed 1's second step, after seed 0 was tuned and probed: --resume restores seed 0 from its
    last checkpoint, continues seed 1 from step 1 and gives the uninterrupted run's record."""
    reference = tuned_runs["two"]
    log = RecordWriter.log

    def stop_in_seed_1(self, entry):
        if entry.get("stage") == "train" and entry.get("seed") == 1 and entry.get("step") == 2:
            raise KeyboardInterrupt
        log(self, entry)

    monkeypatch.setenv("HEADPROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(RecordWriter, "log", stop_in_seed_1)
    recipe = {**TUNED, "seeds": [0, 1]}
    with pytest.raises(KeyboardInterrupt):
        run(recipe, out=tmp_path / "r", quiet=True)
    monkeypatch.setattr(RecordWriter, "log", log)
    partial = json.loads((tmp_path / "r" / "results.json").read_text())
    assert partial["status"] == "interrupted" and set(partial["taps"]["mlp"]["seeds"]) == {"0"}
    assert sorted(p.name for p in (tmp_path / "r" / "checkpoints" / "seed-1").iterdir()) == ["step-1.pt"]
    resumed = run(recipe, out=tmp_path / "r", resume=True, quiet=True)
    assert resumed["status"] == "complete"
    assert resumed["backbone_tuned"]["seeds"] == reference["backbone_tuned"]["seeds"]
    for name, tap in reference["taps"].items():
        assert resumed["taps"][name]["metrics"] == tap["metrics"], name
        assert resumed["taps"][name]["uncertainty"] == tap["uncertainty"], name
    assert resumed["claims"] == reference["claims"]


TWO_PROCESSES = """
import json, sys
from headprobe import run
run(json.loads(sys.argv[1]), out=sys.argv[2], quiet=True)
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_tune_each_seed_together_as_a_one_seed_run_does(tmp_path):
    """With 2 processes every seed is tuned by both (one global batch): seed 1 of the 2-seed run is, bit for bit, the
    run with seeds [1] on 2 processes (the last seed tunes the kept untuned copy itself)."""
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun missing")
    script = tmp_path / "job.py"
    script.write_text(TWO_PROCESSES)
    runs = {}
    for name, seeds in (("two", [0, 1]), ("one", [1])):
        env = {**os.environ, "HEADPROBE_CACHE": str(tmp_path / f"cache-{name}"), "OMP_NUM_THREADS": "1"}
        done = subprocess.run([str(torchrun), "--nproc_per_node", "2", str(script),
                               json.dumps({**TUNED, "seeds": seeds}), str(tmp_path / name)],
                              env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = json.loads((tmp_path / name / "results.json").read_text())
    two, one = runs["two"], runs["one"]
    assert two["environment"]["num_processes"] == 2 and two["protocol"]["train"]["batch_per_process"] == 10
    assert two["backbone_tuned"]["seeds"]["1"]["fingerprint"] == one["backbone_tuned"]["fingerprint"]
    for name in TAPS:
        assert two["taps"][name]["seeds"]["1"]["metrics"] == one["taps"][name]["metrics"], name
