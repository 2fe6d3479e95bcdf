"""The Python package's architecture (issue 31, part 3), read from its source with ``ast``: no
torch, nothing imported. Every module of ``attn_policy`` imports the others one way (no circle in
the file-level import graph, where an import inside a function counts as much as one at the top),
no module is over 600 lines, and no module reaches a leading-underscore name of another public
module (shared internals live in private ``_*.py`` modules that the public ones import)."""

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "attn_policy"
NAME = "attn_policy"
MAX_LINES = 600
# The package's compiled modules: nothing to parse, and they import no module of the package.
COMPILED = frozenset({"attn_policy._native"})


def package_modules(root: Path = PACKAGE, name: str = NAME) -> Dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name ``from <...> import`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def _known(name: str, known) -> Optional[str]:
    """``name`` or its longest prefix that is a module of ``known`` (``import a.b.c`` imports a.b)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def module_imports(module: str, path: Path, modules: Dict[str, Path]) -> Set[str]:
    """The package modules ``module`` imports, anywhere in the file (top level, functions,
    classes, ``try`` blocks): ``import attn_policy.x``, ``from . import x``, ``from .x import y``
    and ``from attn_policy.x import y`` are edges to ``attn_policy.x``; ``from . import Name``
    (not a module) is an edge to the package's ``__init__``."""
    known = set(modules) | COMPILED
    out: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known(alias.name, known)
                if target:
                    out.add(target)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in known else _known(base, known)
                if target:
                    out.add(target)
    return out & set(modules)


def import_graph(modules: Dict[str, Path]) -> Dict[str, Set[str]]:
    return {m: module_imports(m, p, modules) for m, p in modules.items()}


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The circles of ``graph`` (module -> the modules it imports), each as a path ``[a, b, ...,
    a]``: in every strongly connected component (Tarjan) that has one, the shortest circle
    through each of its modules. Empty when the graph imports one way."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []

    def visit(v: str) -> None:  # recursive: a package has tens of modules, not thousands
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles: List[List[str]] = []
    for comp in components:
        members = set(comp)
        if len(comp) == 1 and comp[0] not in graph.get(comp[0], ()):
            continue
        # Through each member, the shortest way back to it inside the component (breadth first),
        # once per circle (rotated to start at its least module).
        for start in sorted(comp):
            cycle = _shortest_cycle(graph, start, members)
            i = cycle.index(min(cycle[:-1]))
            cycle = cycle[i:-1] + cycle[:i] + [cycle[i]]
            if cycle not in cycles:
                cycles.append(cycle)
    return cycles


def _shortest_cycle(graph: Dict[str, Set[str]], start: str, members: Set[str]) -> List[str]:
    prev: Dict[str, str] = {}
    frontier: List[str] = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [start]
                    while v != start:
                        path.append(v)
                        v = prev[v]
                    return [start] + path[:0:-1] + [start]
                if w in members and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in a strongly connected component but on no circle")


def _show(cycles: List[List[str]]) -> str:
    return "\n".join("  " + " -> ".join(c) for c in cycles)


def test_the_package_is_found():
    modules = package_modules()
    assert {"attn_policy", "attn_policy.torch", "attn_policy.te", "attn_policy.context_parallel"} <= set(modules)


def test_imports_go_one_way():
    graph = import_graph(package_modules())
    for m in sorted(graph):  # shown with -s, and in the report of a failure
        print(f"{m} -> {', '.join(sorted(graph[m])) or '-'}")
    cycles = find_cycles(graph)
    assert not cycles, "the package's modules import each other in a circle:\n" + _show(cycles)


def test_no_module_is_over_600_lines():
    sizes = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in package_modules().items()}
    over = {m: n for m, n in sizes.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by job): {over}"


def _public(module: str) -> bool:
    return not any(part.startswith("_") for part in module.split("."))


def test_no_private_name_of_a_public_module_is_reached():
    """``from attn_policy.torch import _x`` or ``apt._x`` (``apt`` a public module of the
    package) inside the package: what two modules share belongs in a private module."""
    modules = package_modules()
    known = set(modules) | COMPILED
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        aliases: Dict[str, str] = {}  # local name -> public module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(module, path, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in known:  # a module, bound to a name
                        if _public(sub) and sub != module:
                            aliases[alias.asname or alias.name] = sub
                    elif base in modules and base != module and _public(base) and alias.name.startswith("_") \
                            and not alias.name.startswith("__"):
                        found.append(f"{module}: from {base} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in modules and _public(alias.name):
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                found.append(f"{module}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    found.sort()
    assert not found, "private names of public modules reached across modules:\n  " + "\n  ".join(found)


# The checker itself, on graphs and a package planted with circles.


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"a"}, "b": set()}) == [["a", "a"]]
    assert find_cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    # Two separate circles are both reported, each as a path back to its start.
    two = find_cycles({"a": {"b"}, "b": {"a"}, "x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}})
    assert sorted(two) == [["a", "b", "a"], ["x", "y", "z", "x"]]


def test_a_lazy_import_inside_a_function_is_an_edge(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import os\n")
    (pkg / "a.py").write_text("from . import Thing\nfrom .b import helper\n")
    (pkg / "b.py").write_text("def helper():\n    from . import a  # lazy\n    return a\n")
    (pkg / "c.py").write_text("import pkg.b as b\n\nclass C:\n    def m(self):\n        from pkg.a import x\n")
    modules = package_modules(pkg, "pkg")
    graph = import_graph(modules)
    assert graph == {"pkg": set(), "pkg.a": {"pkg", "pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a", "pkg.b"}}
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]


if __name__ == "__main__":  # pragma: no cover - the graph, by hand
    g = import_graph(package_modules())
    for m in sorted(g):
        print(f"{m} -> {', '.join(sorted(g[m])) or '-'}")
    raise SystemExit(pytest.main([__file__, "-q"]))
