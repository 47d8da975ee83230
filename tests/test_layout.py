"""The house rules of the package tree (#29): a handful of modules at the root, no import cycles, and no import
that points up the layers of the data flow. Read from the source with `ast`, so lazy imports inside functions
count; imports under `if TYPE_CHECKING:` (annotations only) do not."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "headprobe"
ROOT_MODULES = {"__init__", "__main__", "cli", "registry", "plugins", "checks"}
# Lowest first: a module may import from its own layer and the layers below it, never above.
LAYERS = [
    {"registry", "plugins", "checks", "__init__"},
    {"parallel"},
    {"data", "backbones"},
    {"ssl"},
    {"features"},
    {"stats", "probes"},
    {"geometry"},
    {"recipe"},
    {"train"},
    {"record"},
    {"report"},
    {"pipeline"},
    {"cli", "__main__"},
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph = {name: set() for name in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        typing_only = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                typing_only |= {id(n) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + [node.module] if node.module else base)
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                targets = subs + ([target] if len(subs) < len(node.names) else [])
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def layer_of(module: str) -> int:
    parts = module.split(".")
    return LAYER[parts[1] if len(parts) > 1 else "__init__"]


def test_the_root_holds_a_handful_of_modules():
    assert {p.stem for p in PACKAGE.glob("*.py")} <= ROOT_MODULES
    for sub in PACKAGE.iterdir():
        if sub.is_dir() and sub.name != "__pycache__":
            assert sub.name in LAYER, f"package {sub.name} has no place in LAYERS"


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if b != "headprobe" and layer_of(b) > layer_of(a))


def test_no_import_cycles():
    assert find_cycles(import_graph()) == []


def test_no_import_points_up_the_layers():
    assert upward_imports(import_graph()) == []


def test_the_checks_find_a_planted_cycle_and_upward_import():
    graph = import_graph()
    graph["headprobe.data.sources"].add("headprobe.pipeline.compose")
    graph["headprobe.pipeline.compose"].add("headprobe.data.sources")
    assert any({"headprobe.data.sources", "headprobe.pipeline.compose"} <= set(c) for c in find_cycles(graph))
    assert upward_imports(graph) == ["headprobe.data.sources -> headprobe.pipeline.compose"]
