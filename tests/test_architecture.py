"""The import graph of ``src/pathlift`` against the layers of docs/architecture.md: no import
cycle between packages, no import from a layer into a higher one, and no function-local
import of a pathlift module except those that buy start-up time (commented ``# start-up:``).

Inside one package, no two modules import each other at module level through any chain.

Every ``import`` statement of every module is read with ``ast``: module level, inside
functions and under ``if TYPE_CHECKING`` alike, so a dependency cannot hide in a function.
A "package" is a sub-package of pathlift (``graph``, ``jobs``...), a top-level module
(``errors``, ``cli``...) or ``pathlift`` itself (the package face). The layer list is read
from the page, its one home.

Run as a script (``python tests/test_architecture.py [CHECKOUT]``) it prints the house: the
package cycles, the module cycles inside a package, the upward imports and the
function-local imports.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = "docs/architecture.md"
LAYER_LINE = re.compile(r"^\s*(\d+)\s+([\w-]+)\s+(.+?)\s*$")
START_UP = "# start-up:"



@dataclass(frozen=True)
class Import:
    """One imported pathlift module: who imports it, where, and whether in a function."""

    source: str
    target: str
    line: int
    local: bool
    comment: str


def modules(root: Path) -> dict[str, Path]:
    """Every module of ``root``/src/pathlift by dotted name (a package by its own name)."""
    base = root / "src"
    found = {}
    for path in sorted((base / "pathlift").rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _targets(name: str, is_package: bool, node: ast.Import | ast.ImportFrom,
             known: dict[str, Path]) -> Iterator[str]:
    """The pathlift modules one statement imports (``from a import b``: ``a.b`` if it is a
    module, else ``a``)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    prefix = node.module or ""
    if node.level:
        parts = name.split(".") if is_package else name.split(".")[:-1]
        parts = parts[:len(parts) - node.level + 1]
        prefix = ".".join(parts + ([node.module] if node.module else []))
    for alias in node.names:
        full = f"{prefix}.{alias.name}"
        yield full if full in known else prefix


def imports(root: Path) -> list[Import]:
    """Every import of a pathlift module in ``root``'s source, module level and local. A
    local import's ``comment`` is its function's text up to it and the module's
    column-0 ``# start-up:`` lines (a module whose every function imports late says so
    once)."""
    known = modules(root)
    found = []
    for name, path in known.items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        whole = " ".join(line for line in lines if line.startswith(START_UP))
        function = {}  # id(node) -> the innermost function holding it
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                function.update((id(n), f) for n in ast.walk(f) if n is not f)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            f = function.get(id(node))
            comment = "" if f is None else \
                whole + " ".join(lines[f.lineno - 1:node.end_lineno])
            for target in _targets(name, path.name == "__init__.py", node, known):
                if target == "pathlift" or target.startswith("pathlift."):
                    found.append(Import(name, target, node.lineno, f is not None, comment))
    return found


def package(module: str) -> str:
    """The package a module belongs to: ``pathlift.graph.ops.base`` -> ``graph``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "pathlift"


def layers(root: Path = ROOT) -> dict[str, int]:
    """Each package's layer (0 the lowest), from the ``text`` block of the page's "The
    layers" section: one line a layer, ``NUMBER NAME PACKAGE...``, bottom first."""
    text = (root / PAGE).read_text()
    section = text.split("## The layers", 1)[1]
    block = section.split("```text", 1)[1].split("```", 1)[0]
    order: dict[str, int] = {}
    for line in block.splitlines():
        match = LAYER_LINE.match(line)
        if match:
            for name in match.group(3).split():
                order[name] = int(match.group(1))
    return order


def package_graph(found: list[Import]) -> dict[str, set[str]]:
    """Package -> the other packages it imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in found:
        a, b = package(imp.source), package(imp.target)
        if a != b:
            graph[a].add(b)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def module_graph(found: list[Import]) -> dict[str, set[str]]:
    """Module -> the other modules of its package it imports at module level (``if
    TYPE_CHECKING`` included: the cycle is there for a reader and a type checker)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in found:
        if not imp.local and imp.source != imp.target \
                and package(imp.source) == package(imp.target):
            graph[imp.source].add(imp.target)
    return graph


def upward(found: list[Import], order: dict[str, int]) -> list[Import]:
    """The imports from a package into a package of a higher layer."""
    return [imp for imp in found if order[package(imp.source)] < order[package(imp.target)]]


def uncommented_local(found: list[Import]) -> list[Import]:
    """Function-local imports of pathlift that are not commented as buying start-up time."""
    return [imp for imp in found if imp.local and START_UP not in imp.comment]


def test_every_package_has_a_layer():
    order = layers()
    missing = sorted({package(m) for m in modules(ROOT)} - set(order))
    assert not missing, f"place these packages in a layer of {PAGE}: {missing}"
    stale = sorted(set(order) - {package(m) for m in modules(ROOT)})
    assert not stale, f"{PAGE} names packages that do not exist: {stale}"


@pytest.fixture(scope="module")
def found() -> list[Import]:
    """The imports of the repository's source, read once for the checks below."""
    return imports(ROOT)


def test_no_import_cycle_between_packages(found):
    assert cycles(package_graph(found)) == []


def test_no_module_level_import_cycle_inside_a_package(found):
    assert cycles(module_graph(found)) == []


def test_no_upward_import_between_layers(found):
    bad = upward(found, layers())
    assert not bad, "\n".join(f"{i.source}:{i.line} imports {i.target}" for i in bad)


def test_function_local_imports_of_pathlift_buy_start_up_time(found):
    bad = uncommented_local(found)
    assert not bad, "\n".join(f"{i.source}:{i.line} imports {i.target} in a function "
                              f"without '{START_UP} ...'" for i in bad)


def test_the_checks_see_a_cycle_an_upward_and_a_local_import():
    """The checks can fail: a graph with a planted cycle, upward and local import, and a
    module-level cycle inside a package (a local import does not make one)."""
    planted = [Import("pathlift.lift.x", "pathlift.graph", 1, False, ""),
               Import("pathlift.graph.y", "pathlift.lift.x", 2, True, "")]
    assert cycles(package_graph(planted)) == [["graph", "lift"]]
    inside = [Import("pathlift.jobs.a", "pathlift.jobs.b", 1, False, ""),
              Import("pathlift.jobs.b", "pathlift.jobs.a", 3, False, ""),
              Import("pathlift.jobs.c", "pathlift.jobs.a", 1, False, ""),
              Import("pathlift.jobs.a", "pathlift.jobs.c", 9, True, "")]
    assert cycles(module_graph(inside)) == [["pathlift.jobs.a", "pathlift.jobs.b"]]
    assert upward(planted, {"graph": 2, "lift": 4}) == [planted[1]]
    assert uncommented_local(planted) == [planted[1]]


def main(root: Path) -> None:
    """Print the house of the checkout at ``root`` (the layers of
    this checkout's page, else of this one's; packages it does not place count as jobs)."""
    found = imports(root)
    order = layers(root if (root / PAGE).is_file() else ROOT)
    order = defaultdict(lambda: order["jobs"], order)
    groups = cycles(package_graph(found))
    print(f"package cycles: {len(groups)} group(s) {groups}")
    inside = cycles(module_graph(found))
    print(f"module-level cycles inside a package: {len(inside)} group(s) {inside}")
    up = upward(found, order)
    print(f"upward imports: {len(up)}")
    for i in up:
        print(f"  {i.source}:{i.line} -> {i.target}{' (local)' if i.local else ''}")
    local = [i for i in found if i.local]
    cli = [i for i in local if package(i.source) in ("cli", "cli_support")]
    print(f"function-local imports of pathlift: {len(local)} ({len(cli)} in the CLI), "
          f"{len(uncommented_local(found))} without '{START_UP}'")
    for i in uncommented_local(found):
        print(f"  {i.source}:{i.line} -> {i.target}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
