"""The typed run record (headprobe/record/results.py) against docs/reference.md's results.json example; its checks."""

import json
import re
from pathlib import Path

import pytest

from headprobe.record import results as record
from headprobe.record.directory import SCHEMA_VERSION, new_results
from headprobe.record.results import (
    BufferVerdict,
    Claim,
    ClaimAnswer,
    ClaimChange,
    Evidence,
    RunRecord,
    TapRecord,
    Uncertainty,
    check_record,
    check_version,
    fields,
)

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference.md"


def design_example() -> tuple[dict, str]:
    text = REFERENCE.read_text()
    return json.loads(re.search(r"`results.json`\n```json\n(.*?)\n```", text, re.S).group(1)), text


def test_design_example_uses_only_the_record_s_keys_and_documents_every_optional_one():
    example, text = design_example()
    assert example["schema_version"] == SCHEMA_VERSION == record.SCHEMA_VERSION
    assert set(example) <= set(fields(RunRecord)), set(example) - set(fields(RunRecord))
    optional = text[text.index("Written by some runs only:"):].split("\n\n")[0]
    listed = set(re.findall(r"`([a-z_]+)`", optional))
    # Every key of the record is either in the example or listed among the optional ones.
    assert set(fields(RunRecord)) <= set(example) | listed, set(fields(RunRecord)) - set(example) - listed
    for tap in example["taps"].values():
        assert set(tap) <= set(fields(TapRecord))
        for entry in tap.get("uncertainty", {}).values():
            assert set(entry) <= set(fields(Uncertainty))
    for verdict in example["buffer"].values():
        assert set(verdict) <= set(fields(BufferVerdict))
        for entry in verdict["evidence"].values():
            assert set(entry) <= set(fields(Evidence))
    for claim in example["claims"].values():
        assert set(claim) <= set(fields(Claim))
        for answer in claim["heads"].values():
            assert set(answer) <= set(fields(ClaimAnswer))
            for change in answer["secondary"].values():
                assert set(change) <= set(fields(ClaimChange))


def test_new_results_holds_exactly_the_keys_every_run_has():
    assert tuple(new_results({"seed": 0})) == record.ALWAYS
    assert set(record.ALWAYS) <= set(fields(RunRecord))


@pytest.mark.parametrize("bad, words", [
    ({"environment": [1]}, "'environment' is a list, not a mapping"),
    ({"taps": {"backbone": {"uncertainty": 3}}}, "taps.backbone.uncertainty is a int, not a mapping"),
    ({"taps": {"backbone": {"seeds": "0"}}}, "taps.backbone.seeds is a str, not a mapping"),
])
def test_check_record_names_the_key_that_is_not_a_mapping(bad, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        check_record(bad, "results.json")


def test_check_record_accepts_unknown_keys_and_scalars_where_scalars_belong():
    check_record({"status": "complete", "geometry_from": "checkpoints/x", "newer_key": [1]}, "results.json")


def test_check_version_refuses_a_layout_older_than_3_or_none_and_names_the_file():
    for ok in (3, 4):
        check_version({"schema_version": ok}, "results.json")
    for old in ({"schema_version": 2}, {}, {"schema_version": "3"}, {"schema_version": True}):
        with pytest.raises(ValueError, match=r"^results\.json has .*this headprobe reads only schema_version 3: run "):
            check_version(old, "results.json")
