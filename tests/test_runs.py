"""The run directory's record: what a run writes is what docs/DESIGN.md documents."""

import json
import re
from pathlib import Path

from headprobe import run
from headprobe.runs import SCHEMA_VERSION, new_results

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md"


def documented() -> tuple[dict, set[str]]:
    """The results.json example of DESIGN.md, parsed, and the optional top-level keys it lists in backquotes."""
    text = DESIGN.read_text()
    block = re.search(r"`results.json`\n```json\n(.*?)\n```", text, re.S).group(1)
    optional = text[text.index("Written by some runs only:"):].split("\n\n")[0]
    return json.loads(block), set(re.findall(r"`([a-z_]+)`", optional))


def test_design_documents_every_key_a_run_writes(tiny_recipe, tmp_path):
    example, optional = documented()
    assert example["schema_version"] == SCHEMA_VERSION
    assert set(new_results({})) <= set(example) | optional
    recipe = {**tiny_recipe, "heads": [{"name": "relu", "act": "relu", "width": 16}],
              "augment": {"preset": "crop-flip", "views": 2}, "train": {"epochs": 1, "batch_size": 50},
              "probes": {"linear": {"C_grid": [1.0]}, "invariance": {}}, "report": False}
    results = run(recipe, out=tmp_path / "r", quiet=True).data
    assert set(results) <= set(example) | optional, set(results) - set(example) - optional
    tap_keys = set().union(*(set(t) for t in example["taps"].values()))
    for name, tap in results["taps"].items():
        assert set(tap) <= tap_keys, (name, set(tap) - tap_keys)
    evidence_keys = set(example["buffer"]["mlp_swish"]["evidence"]["linear.acc"]) | {
        "method", "n_boot", "why_unresolved", "margin_seeds"}
    for entry in results["buffer"]["relu"]["evidence"].values():
        assert set(entry) <= evidence_keys, set(entry) - evidence_keys
    assert set(results["buffer"]["relu"]) <= set(example["buffer"]["mlp_swish"])
