"""No document points at a file that does not exist (#37): every repository path that README.md, docs/*.md,
benchmarks/README.md and CHANGELOG.md name in backticks or in a link, and every path a recipe's comments name, is
a file or folder of the repository.

A string counts as a path when it looks like one: no spaces, and either a file of the repository's root
(`README.md`), or a path whose first folder is a top-level folder (`headprobe/`, `tests/`, `benchmarks/`, `recipes/`,
`docs/`, `examples/`), a sub-package of headprobe written from inside the package (`pipeline/compose.py`, as
docs/DESIGN.md writes them) or a folder beside the document (`results/knn.json` in benchmarks/README.md). It must
exist from the repository's root, from the document's own folder (a link in docs/ to `reference.md`) or, for a
sub-package path, inside headprobe/. A `*` is a wildcard that must match something; a path with a placeholder
(`<name>`, `{sweep}`, `runs/RUN/`) is not checked; nor are fenced blocks (diagrams, shell sessions). The CHANGELOG's
"### Removed" section names files that are gone on purpose, so it is not read.
"""

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")} & {
    "headprobe", "tests", "benchmarks", "recipes", "docs", "examples"}
ROOT_FILES = {p.name for p in ROOT.iterdir() if p.is_file() and not p.name.startswith(".")}
SUBPACKAGES = {p.name for p in (ROOT / "headprobe").iterdir() if (p / "__init__.py").is_file()}
MARKDOWN = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md",
            *sorted((ROOT / "docs").glob("*.md"))]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))

_BACKTICKED = re.compile(r"`([^`\n]+)`")
_LINKED = re.compile(r"\]\(([^)\s]+)\)")
_BARE = re.compile(r"(?<![\w./-])((?:" + "|".join(sorted(TOP)) + r")/[\w./*-]*)")
_PLACEHOLDER = re.compile(r"[<>{}\[\]$]|(?:^|/)[A-Z][A-Z_]*(?:/|$)")  # `<name>`, `{sweep}`, `runs/RUN/`
_PATHLIKE = re.compile(r"[\w.*-]+(?:/[\w.*-]+)*/?")


def _candidate(text: str, local: frozenset[str] = frozenset()) -> str | None:
    """`text` as a repository path to check, or None when it does not look like one; `local`: the folders beside the
    document (benchmarks/README.md writes `results/knn.json`)."""
    text = text.strip().split("#", 1)[0].rstrip(".,:;)").removeprefix("./")
    text = text.split("::", 1)[0]  # tests/test_x.py::test_y
    if not text or "://" in text or not _PATHLIKE.fullmatch(text) or _PLACEHOLDER.search(text):
        return None
    first = text.split("/", 1)[0]
    if "/" not in text:
        return text if text in ROOT_FILES else None
    if first in TOP or first in SUBPACKAGES or first in local:
        return text
    return None


def _exists(path: str, doc: Path) -> bool:
    bases = [ROOT, doc.parent] + ([ROOT / "headprobe"] if path.split("/", 1)[0] in SUBPACKAGES else [])
    for base in bases:
        if "*" in path:
            if any(base.glob(path.rstrip("/"))):
                return True
        elif (base / path).exists():
            return True
    return False


def _markdown_text(doc: Path) -> str:
    text = doc.read_text(encoding="utf-8")
    if doc.name == "CHANGELOG.md":  # the files it says were removed are gone on purpose
        text = re.sub(r"^### Removed\n.*?(?=^##)", _blank, text, flags=re.S | re.M)
    return re.sub(r"^```.*?^```", _blank, text, flags=re.S | re.M)  # diagrams and shell sessions, not references


def _blank(match: re.Match) -> str:
    """The matched text's line breaks only, so the lines after it keep their numbers."""
    return "\n" * match.group(0).count("\n")


def references(doc: Path) -> list[tuple[int, str]]:
    """(line, path) for every repository path `doc` names."""
    found = []
    local = frozenset(p.name for p in doc.parent.iterdir() if p.is_dir()) if doc.parent != ROOT else frozenset()
    if doc.suffix == ".md":
        text = _markdown_text(doc)
        for pattern in (_BACKTICKED, _LINKED):
            for match in pattern.finditer(text):
                # `a/b.py`, `c/d.py` in one pair of backticks; a command quotes its path among words
                for word in re.split(r"[\s,]+", match.group(1)):
                    if pattern is _LINKED and word.startswith(("../", "./")):  # relative to the document
                        word = os.path.relpath((doc.parent / word).resolve(), ROOT)
                    if (path := _candidate(word, local)) is not None:
                        found.append((text.count("\n", 0, match.start()) + 1, path))
    else:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            comment = line.split("#", 1)[1] if "#" in line else ""
            for match in _BARE.finditer(comment):
                if (path := _candidate(match.group(1))) is not None:
                    found.append((number, path))
    return found


def test_the_scanner_reads_paths_and_leaves_other_words_alone(tmp_path):
    assert _candidate("headprobe/record/writer.py") == "headprobe/record/writer.py"
    assert _candidate("pipeline/compose.py") == "pipeline/compose.py"
    assert _candidate("tests/test_layout.py::test_no_cycles") == "tests/test_layout.py"
    assert _candidate("README.md") == "README.md"
    assert _candidate("docs/DESIGN.md") == "docs/DESIGN.md"
    for word in ("results.json", "knn.k{k}.acc", "per_unit/TAP.safetensors", "runs/RUN/results.json",
                 "headprobe/probes/builtin/<name>.py",
                 "runs/my_study", "hf:facebook/dinov2-small", "https://example.org/docs/x.md", "--resume",
                 "checkpoints/seed-S/", "z / h(z)"):
        assert _candidate(word) is None, word
    doc = tmp_path / "guide.md"
    doc.write_text("See `docs/nowhere.md` and [the record](../headprobe/record/results.py); `x.y`.\n"
                   "```\nheadprobe/in_a_diagram.py\n```\n")
    assert references(doc) == [(1, "docs/nowhere.md")]  # the link leads outside the repository: not its path
    assert not _exists("docs/nowhere.md", doc) and _exists("record/results.py", doc)


@pytest.mark.parametrize("doc", MARKDOWN + RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_document_names_exists(doc):
    missing = [f"{doc.relative_to(ROOT)}:{line}: {path}" for line, path in references(doc) if not _exists(path, doc)]
    assert not missing, "paths named that do not exist (point them at the current file or drop them):\n" + "\n".join(
        missing)
