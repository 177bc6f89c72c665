"""Guard rails on the package layering of ``src/hetrl``.

Every import counts, including those inside functions: a lazy import hides a cycle from the
interpreter, not from the design. The shared floor (control, transport, trainer, loop) never
imports the launcher; the launcher may import it.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
BELOW_LAUNCH = ("hetrl.control", "hetrl.transport", "hetrl.trainer", "hetrl.loop")


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the hetrl package."""
    modules = {}
    for path in sorted((SRC / "hetrl").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict) -> set[str]:
    """The modules an import statement in ``module`` names: ``from a import b`` names module a.b
    when there is one, else a itself (a package's ``__init__`` counts only when named)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}


def import_graph() -> dict[str, set[str]]:
    """Module -> the hetrl modules it imports anywhere in its body (functions included)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets.update(name for name in _imported(node, module, is_package, modules) if name in modules)
        graph[module] = targets - {module}
    return graph


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """The shortest import path from ``start`` back to itself, or None."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node]):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, node, start]
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    return None


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle per module that lies on one, without repeating a cycle already found."""
    cycles, seen = [], set()
    for module in sorted(graph):
        cycle = _cycle_through(graph, module)
        if cycle and frozenset(cycle) not in seen:
            seen.add(frozenset(cycle))
            cycles.append(cycle)
    return cycles


def test_find_cycles_sees_a_lazy_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_import_graph_counts_function_level_imports():
    graph = import_graph()
    assert "hetrl.control.plan" in graph["hetrl.launch.cli"]
    assert graph["hetrl.launch.worker"] >= {"hetrl.control.plan", "hetrl.loop.roles"}  # inside main()


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles in hetrl:\n" + "\n".join("  " + " -> ".join(cycle) for cycle in cycles)


def test_shared_floor_never_imports_launch():
    offenders = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if module.startswith(BELOW_LAUNCH)
        for target in targets
        if target == "hetrl.launch" or target.startswith("hetrl.launch.")
    )
    assert not offenders, "\n".join(offenders)


def test_no_module_is_named_after_the_standard_library():
    """A module named ``math`` or ``types`` shadows the standard library's for any script run from its folder."""
    clashes = [str(p.relative_to(SRC)) for p in (SRC / "hetrl").rglob("*.py") if p.stem in sys.stdlib_module_names]
    assert not clashes, f"modules named after standard-library modules: {clashes}"


def test_function_level_imports_of_hetrl_say_why():
    """An import of a hetrl module inside a function hides a dependency from the reader, so it must say
    why, on its line or above its block of imports: a heavy dependency the caller must not pay for, usually."""
    silent = set()
    for path in sorted((SRC / "hetrl").rglob("*.py")):
        lines = path.read_text().splitlines()
        for func in ast.walk(ast.parse("\n".join(lines), str(path))):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if not (getattr(node, "level", 0) or any(n == "hetrl" or n.startswith("hetrl.") for n in names)):
                    continue
                above = node.lineno - 2  # the line above the import, then above its block of imports
                while above >= 0 and (
                    not lines[above].strip() or lines[above].strip().startswith(("from ", "import "))
                ):
                    above -= 1
                if "#" not in lines[node.lineno - 1] and not lines[above].strip().startswith("#"):
                    silent.add(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not silent, f"function-level hetrl imports without a reason: {sorted(silent)}"
