"""Every import inside the kdq package points one way: no cycle between its modules, nor between its rooms
(a folder such as ``kdq/spark/``, ``kdq/stack/``, ``kdq/stream/`` or ``kdq/traffic/`` taken as one, beside the
top-level modules), and process management (``kdq.procs``) stands on the ground floor.

Imports inside functions count: they hide a cycle from Python's import machinery, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import PROJECT_ROOT

PACKAGE_ROOT = PROJECT_ROOT / "include"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def kdq_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((PACKAGE_ROOT / "kdq").rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The kdq modules ``path`` imports anywhere in its body (``from a import b`` counts as ``a.b`` when
    that is a module, else as ``a``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in known)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert cycles({"a": {"a"}}) == [["a"]]


def module_graph() -> dict[str, set[str]]:
    """kdq module -> the kdq modules it imports (anywhere in its body)."""
    modules = kdq_modules()
    known = set(modules)
    return {name: imports_of(path, known) for name, path in modules.items()}


def room(module: str) -> str:
    """The room a module stands in: its folder under kdq (``kdq.spark.summaries.batch`` -> ``kdq.spark``), or itself."""
    return ".".join(module.split(".")[:2])


def test_no_import_cycle_between_kdq_modules() -> None:
    graph = module_graph()
    assert len(graph) > 30 and graph["kdq.spark.batch_layer"], "the parser must see the package's imports"
    assert graph["kdq.stream.failures"] and graph["kdq.traffic.process"], "and those of its sub-packages"
    # The packages inside kdq are in the graph too: the config package's modules, and its __init__ importing them.
    assert {"kdq.config.model", "kdq.config.loading"} <= graph["kdq.config"], "kdq/config/ must be walked"
    assert "kdq.config.local_stack" in graph["kdq.config.model"]
    assert cycles(graph) == [], "import cycles between kdq modules (imports inside functions count)"


def test_no_import_cycle_between_kdq_rooms() -> None:
    """A folder that imports a module which imports the folder back is an arrow that runs back up (the stream's
    process on kdq.spark.submit inside kdq/stream/, while kdq.spark imports kdq.stream, would be one)."""
    rooms: dict[str, set[str]] = {}
    for name, targets in module_graph().items():
        rooms.setdefault(room(name), set()).update(room(t) for t in targets if room(t) != room(name))
    assert {"kdq.spark", "kdq.stack", "kdq.stream", "kdq.traffic"} <= set(rooms)
    assert cycles(rooms) == [], "import cycles between kdq's folders and top-level modules"


def test_process_management_stands_on_the_ground_floor() -> None:
    """kdq.procs imports no kdq module, and only the CLI (kdq.cli and its kdq.cli_* command modules) reaches up
    into the local stack (kdq.stack): the stream,
    the demo traffic and the Spark side start their processes through kdq.procs."""
    graph = module_graph()
    assert graph["kdq.procs"] == set()
    users = {name for name, targets in graph.items() if room(name) != "kdq.stack" and any(room(t) == "kdq.stack" for t in targets)}
    assert {room(name) for name in users} <= {"kdq.cli", "kdq.cli_sql", "kdq.cli_failures"}, sorted(users)
