"""No duplicate family lists (#37): the head types, backbone sources and claim questions are declared once (the
registry's entries, and for subsets one named constant), and no module keeps a second literal list of their names.

Read from the source with `ast`: a literal tuple, list or set naming three or more members of one family (``"hf:"``
counts as ``hf``) is a list of that family, and so is a dict keyed by three or more of them (a table per member).
Each allowed one is named below with the reason it is the source or a table of per-member data; any other fails."""

import ast
from pathlib import Path

import pytest

from headprobe.registry import BACKBONES, HEADS, PROBE_QUESTIONS, QUESTIONS, UNTRAINED_HEAD_TYPES

PACKAGE = Path(__file__).resolve().parents[1] / "headprobe"
FAMILIES = {"head type": set(HEADS.names()), "backbone source": set(BACKBONES.names()),
            "question": set(QUESTIONS.names())}
ALLOWED = {
    # the source: the head types never trained (a subset of HEADS), read by the recipe checks and the null heads
    ("head type", "registry.py", "UNTRAINED_HEAD_TYPES"),
    # per-member tables, not lists: the config fields the report shows per head type; claim 5's sentences across runs
    ("head type", "report/training.py", "FIELDS"),
    ("question", "stats/cross_run.py", "ACROSS"),
    # the backbone sources whose checkpoints hold a head of their own (type: pretrained)
    ("backbone source", "recipe/checks.py", None),
}
THRESHOLD = 3


def _names(nodes) -> set[str]:
    return {n.value.removesuffix(":") for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def family_lists(package: Path = PACKAGE) -> list[tuple[str, str, str | None, list[str]]]:
    """(family, file, the name it is assigned to or None, the members it names) of every literal list of a family."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        assigned = {id(node.value): target.id for node in ast.walk(tree)
                    if isinstance(node, (ast.Assign, ast.AnnAssign))
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                    if isinstance(target, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = _names(node.elts)
            elif isinstance(node, ast.Dict):
                names = _names([k for k in node.keys if k is not None])
            else:
                continue
            for family, members in FAMILIES.items():
                if len(names & members) >= THRESHOLD:
                    found.append((family, path.relative_to(package).as_posix(), assigned.get(id(node)),
                                  sorted(names & members)))
    return found


def test_no_module_keeps_a_second_list_of_a_family():
    extra = [f"{file} ({name or 'unnamed'}) lists the {family}s {', '.join(members)}"
             for family, file, name, members in family_lists() if (family, file, name) not in ALLOWED]
    assert not extra, ("; ".join(extra) + ". Read them from their declaration (the registry, or the one constant "
                                         "named in tests/test_declarations_once.py) instead of listing them again.")


def test_each_allowed_list_is_still_there_and_names_declared_members():
    found = {(family, file, name) for family, file, name, _ in family_lists()}
    assert ALLOWED <= found, f"no longer found (take them out of ALLOWED): {sorted(ALLOWED - found)}"
    assert set(UNTRAINED_HEAD_TYPES) <= set(HEADS.names())


def test_claim_5s_questions_are_the_registrys():
    """The questions the probe stage answers and a metric may bear on are declared once, in the registry
    (`PROBE_QUESTIONS`, its first entries): `stats.claims.QUESTIONS` holds the registry's own objects under those keys,
    and a metric that bears on another question is refused where it is declared."""
    from headprobe.probes.declaration import Metric
    from headprobe.stats.claims import QUESTIONS as ANSWERED

    assert PROBE_QUESTIONS == tuple(QUESTIONS.names()[:len(PROBE_QUESTIONS)]) == tuple(ANSWERED)
    assert all(ANSWERED[key] is QUESTIONS.get(key) and ANSWERED[key].claim == 5 for key in PROBE_QUESTIONS)
    assert all(QUESTIONS.get(key).claim != 5 for key in QUESTIONS.names() if key not in PROBE_QUESTIONS)
    with pytest.raises(ValueError, match=r"bears on \['Q-whiten'\]; the questions are Q-aug, Q-inv, Q-class\."):
        Metric("m", "a test's", "unit", "higher = more", answers=("Q-whiten",))


def test_the_scan_finds_a_second_list(tmp_path):
    (tmp_path / "mod.py").write_text('KINDS = ("linear", "mlp", "identity")\nOK = ("linear", "knn")\n'
                                     'SOURCES = {"hf": 1, "timm": 2, "open_clip:": 3}\n')
    assert family_lists(tmp_path) == [("head type", "mod.py", "KINDS", ["identity", "linear", "mlp"]),
                                      ("backbone source", "mod.py", "SOURCES", ["hf", "open_clip", "timm"])]
