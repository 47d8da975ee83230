"""No module of headprobe imports another module's private names, and none uses torch's private API (#15).

Private: a name starting with "_" that is not a dunder. Caught, by reading every file's syntax tree:
- `from X import _name` from another module (a package's `__init__` re-exporting its own modules is fine);
- torch's private API: `import torch._x` / `from torch._x import ...` / `from torch.x import _y`, and any
  `._name` attribute (or `getattr(..., "_name")`) on a name bound to torch or one of its modules;
- `importlib.import_module("a._b")` with a private component of a torch path.
Private attributes of third-party objects (`model._blocks`) are not imports and are not checked here.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "headprobe"

# Known offenders: (file, private name as written). Empty since #15; an entry added here must still occur
# (`test_every_allowed_offender_still_exists`), so the list cannot go stale.
ALLOWED: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_of(path: Path, root: Path) -> tuple[list[str], bool]:
    """headprobe/probes/knn.py -> (["headprobe", "probes", "knn"], False); a package's __init__ -> its name, True."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return (parts[:-1], True) if parts[-1] == "__init__" else (parts, False)


def _target(node: ast.ImportFrom, module: list[str], is_package: bool) -> list[str]:
    """The absolute module a from-import reads, relative imports resolved."""
    if not node.level:
        return node.module.split(".") if node.module else []
    package = module if is_package else module[:-1]
    base = package[: len(package) - (node.level - 1)]
    return base + (node.module.split(".") if node.module else [])


def _is_torch(parts: list[str]) -> bool:
    return bool(parts) and parts[0] == "torch"


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def offences(path: Path, root: Path = ROOT) -> list[tuple[int, str, str]]:
    """(line, private name as written, why) for every private import or torch-private use in one file under root."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module, is_package = _module_of(path, root)
    found: list[tuple[int, str, str]] = []
    torch_names: set[str] = set()  # local names bound to torch or anything imported from it
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if _is_torch(parts):
                    torch_names.add(alias.asname or parts[0])
                    found += [(node.lineno, alias.name, "imports a private torch module")
                              for part in parts if _private(part)][:1]
        elif isinstance(node, ast.ImportFrom):
            target = _target(node, module, is_package)
            if _is_torch(target):
                torch_names.update(alias.asname or alias.name for alias in node.names)
                if any(_private(part) for part in target):
                    found.append((node.lineno, ".".join(target), "imports from a private torch module"))
            own_reexport = is_package and target[: len(module)] == module
            for alias in node.names:
                if _private(alias.name) and target != module and not own_reexport:
                    found.append((node.lineno, alias.name, f"imports a private name of {'.'.join(target)}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _root(node) in torch_names:
            found.append((node.lineno, ast.unparse(node), "uses torch's private API"))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[-1], ast.Constant):
            name, value = ast.unparse(node.func), node.args[-1].value
            if not isinstance(value, str):
                continue
            if name == "getattr" and len(node.args) == 2 and _root(node.args[0]) in torch_names and _private(value):
                found.append((node.lineno, f"{ast.unparse(node.args[0])}.{value}", "uses torch's private API"))
            elif name in ("importlib.import_module", "import_module", "__import__"):
                parts = value.split(".")
                if _is_torch(parts) and any(_private(part) for part in parts):
                    found.append((node.lineno, value, "imports a private torch module"))
    return sorted(set(found))


def all_offences() -> dict[tuple[str, str], list[str]]:
    """(file, name) -> ["file:line: name (why)", ...] over every file of the package."""
    table: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        file = path.relative_to(ROOT).as_posix()
        for line, name, why in offences(path):
            table.setdefault((file, name), []).append(f"{file}:{line}: {name} ({why})")
    return table


def test_no_module_imports_another_modules_private_names_or_torch_internals():
    found = all_offences()
    new = [where for key, wheres in sorted(found.items()) if key not in ALLOWED for where in wheres]
    assert not new, (
        "private names reached from another module (make the name public in its home module, or move the helper "
        "to where it belongs; for torch, use a public API or vendor the code with its licence):\n" + "\n".join(new)
    )


def test_every_allowed_offender_still_exists():
    stale = sorted(ALLOWED - all_offences().keys())
    assert not stale, f"these allow-list entries no longer occur; delete them from ALLOWED: {stale}"


def _offences_in(source: str, tmp_path: Path, name: str = "headprobe/probes/example.py") -> list[tuple[int, str]]:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return [(line, found) for line, found, _ in offences(path, tmp_path)]


def test_the_scan_catches_each_kind_of_offence(tmp_path):
    source = "\n".join([
        "import torch",
        "import torch.nn as nn",
        "from torch.optim.lbfgs import _strong_wolfe",
        "from torch._dynamo import config",
        "from headprobe.probes.knn import _as_tensor, knn",
        "from .logistic import _fit",
        "from . import __version__",
        "x = nn.modules.batchnorm._BatchNorm",
        "y = torch.ops.mkldnn._is_mkldnn_bf16_supported()",
        "z = getattr(torch.cpu, '_is_avx512_bf16_supported')",
        "model._blocks, torch.__version__, self._cache",
        "import importlib; importlib.import_module('torch._C')",
    ])
    assert _offences_in(source, tmp_path) == [
        (3, "_strong_wolfe"), (4, "torch._dynamo"), (5, "_as_tensor"), (6, "_fit"),
        (8, "nn.modules.batchnorm._BatchNorm"), (9, "torch.ops.mkldnn._is_mkldnn_bf16_supported"),
        (10, "torch.cpu._is_avx512_bf16_supported"), (12, "torch._C"),
    ]


def test_a_packages_own_reexport_is_allowed(tmp_path):
    source = "from headprobe.probes.knn import _BF16_UNIT\nfrom .knn import _TOPK_BLOCK\nfrom ..runs import _x\n"
    assert _offences_in(source, tmp_path, "headprobe/probes/__init__.py") == [(3, "_x")]
