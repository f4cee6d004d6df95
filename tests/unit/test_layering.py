"""The import layering that docs/architecture.md promises, checked: every import of the package,
the ones made inside functions too, points down the folders' list, and no two modules import each
other, directly or round a loop. A lazy import hides a cycle from Python but not from this test."""

import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
# Folders on disk and the package names they install as (pyproject.toml's package-dir).
ROOTS = {"fabriclab": "fabriclab", "traffic": "fabriclab.traffic", "apps": "fabriclab.apps",
         "topologies": "fabriclab.topologies"}
# Top to bottom: a layer imports only from the layers after it. "front" is the Python API and the
# pytest plugin, "base" the top-level helpers every folder uses (errors, loading, units, table).
LAYERS = ("cli", "front", "workflows", "model", "export", "view", "results", "jobs", "switchml", "cluster", "lab", "traffic",
          "apps", "topologies", "queues", "measure", "system", "base")
FRONT = {"fabriclab.api", "fabriclab.pytest_plugin"}
# (importing module, imported module): an upward import kept on purpose, with its reason. None today.
ALLOWED = {}


def modules():
    """{dotted name: file} of every module of the installed package."""
    out = {}
    for folder, package in ROOTS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(REPO / folder).with_suffix("").parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


MODULES = modules()


def layer(name):
    if name in FRONT:
        return "front"
    parts = name.split(".")
    if len(parts) > 1 and MODULES.get(f"fabriclab.{parts[1]}", pathlib.Path()).name == "__init__.py":
        return parts[1]
    return "base"


def imports(name):
    """[(imported module, line)] of `name`, every import statement wherever it is."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        out += [(t, node.lineno) for t in targets if t in MODULES and t != name]
    return out


GRAPH = {name: imports(name) for name in MODULES}


def test_the_tree_is_read_whole():
    assert len(MODULES) > 150 and "fabriclab.traffic.collective" in MODULES
    assert {layer(n) for n in MODULES} == set(LAYERS)


def test_every_import_points_down_the_layers():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = [f"{a}:{line} imports {b} ({layer(a)} -> {layer(b)})"
              for a, targets in GRAPH.items() for b, line in targets
              if rank[layer(b)] < rank[layer(a)] and (a, b) not in ALLOWED]
    assert upward == []
    assert len(ALLOWED) <= 5


def test_no_modules_import_each_other_round_a_loop():
    # Tarjan's strongly connected components; a package's __init__ imported by its own modules is
    # how Python loads them, not a loop.
    edges = {a: {b for b, _ in targets if not a.startswith(b + ".")} for a, targets in GRAPH.items()}
    index, low, stack, on, loops = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                loops.append(sorted(members))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert loops == []


def test_the_architecture_page_lists_the_folders_in_the_layers_order():
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("## The folders", 1)[1].split("\n## ", 1)[0]
    firsts = [m.group(1) for m in re.finditer(r"^\| `([^`]+)`", table, re.M)]
    named = {"fabriclab/api.py": "front", "fabriclab/pytest_plugin.py": "front", "fabriclab/errors.py": "base"}
    order = []
    for cell in firsts:
        name = named.get(cell) or cell.strip("/").split("/")[-1]
        if not order or order[-1] != name:
            order.append(name)
    assert order == list(LAYERS)
