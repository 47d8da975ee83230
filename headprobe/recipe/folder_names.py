"""Names that become one file or folder inside another (a sweep run's folder, a head's per-unit store), and the
check that a derived path stays inside its parent: a run writes nowhere but its own folder.

>>> folder_name_problem("relu"), folder_name_problem("..") is not None, folder_name_problem("a/b") is not None
(None, True, True)
"""

from __future__ import annotations

from pathlib import Path


def folder_name_problem(name: object) -> str | None:
    """Why `name` cannot name one entry inside a folder (a phrase to follow "it"), or None where it can."""
    if not isinstance(name, str):
        return "is not a name (a string)"
    if not name.strip():
        return "is empty"
    if name in (".", ".."):
        return "names the folder itself or its parent, not an entry inside it"
    if any(sep in name for sep in ("/", "\\", "\0")):
        return "holds a path separator (/ or \\), so it would name a path, not one folder"
    return None


def is_inside(parent: str | Path, path: str | Path) -> bool:
    """Whether `path` resolves (links followed) to an entry strictly inside `parent`."""
    root, target = Path(parent).resolve(), Path(path).resolve()
    return target != root and target.is_relative_to(root)
