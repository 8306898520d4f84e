"""The shape of the code, for a before-and-after of a restructuring.

    python bench/code_shape.py [PACKAGE_DIR]     (default: tinygpt/launch)

Prints JSON about the package's rooms: each module at its top level and each folder (a wing, counted as one room
however many modules it holds). A room that imports none of its siblings is level 1; otherwise one above the
highest sibling it imports. Given twice: counting only the imports that can execute (at module level and inside
functions alike), and counting those under `if TYPE_CHECKING:` (type hints) too. Also: the longest chain, the
circles between rooms and between modules, which rooms import each one, the lines of `tinygpt` and `launch.py`,
and the ten longest functions of both. Read from the source text with `ast`; nothing is imported or run.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    """`tinygpt/launch/spec/sweep.py` -> `tinygpt.launch.spec.sweep` (a package is its folder's name)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str], type_only: bool) -> set[str]:
    """The modules of `known` that the file at `path` imports, at any depth of its code; those under `if
    TYPE_CHECKING:` only when `type_only`. `from P import name` counts P.name when that is a module, else P."""
    here = module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]  # (the package a relative import starts from)
    found: set[str] = set()
    for node in _nodes(ast.parse(path.read_text()), type_only):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {_known_prefix(name, known) for name in found} - {None, module_name(path)}


def _known_prefix(name: str, known: set[str]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _nodes(tree: ast.AST, type_only: bool):
    """Every node of `tree`; without `type_only`, none of those under `if TYPE_CHECKING:` (its `else` is kept)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if _type_checking(node) and not type_only:
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def levels(graph: dict[str, set[str]]) -> tuple[dict[str, int], list[list[str]]]:
    """Each node's level, and the circles met (a circle's nodes all get the level of where it was met)."""
    level: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(name: str, stack: list[str]) -> int:
        if name in stack:
            cycles.append(stack[stack.index(name):] + [name])
            return 0
        if name not in level:
            level[name] = 1 + max((visit(dep, stack + [name]) for dep in sorted(graph[name])), default=0)
        return level[name]

    for name in sorted(graph):
        visit(name, [])
    return level, cycles


def rooms_of(package_dir: Path) -> dict[str, list[Path]]:
    """{room: its files}: each top-level module of the package, and each folder with all the files under it."""
    rooms = {p.stem: [p] for p in sorted(package_dir.glob("*.py")) if p.stem != "__init__"}
    rooms.update({d.name: sorted(d.rglob("*.py")) for d in sorted(package_dir.iterdir())
                  if d.is_dir() and (d / "__init__.py").exists()})
    return rooms


def graphs(package_dir: Path, type_only: bool) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The package's import graphs: {room: the other rooms it imports}, {module: the modules it imports}."""
    package = module_name(package_dir / "__init__.py")
    rooms = rooms_of(package_dir)
    files = [f for fs in rooms.values() for f in fs]
    known = {module_name(f) for f in files} | {package}
    modules = {module_name(f): imported_modules(f, known, type_only) - {package} for f in files}
    room_of = {module_name(f): room for room, fs in rooms.items() for f in fs}
    graph = {room: set() for room in rooms}
    for name, deps in modules.items():
        graph[room_of[name]].update(room_of[d] for d in deps if room_of[d] != room_of[name])
    return graph, modules


def shape(package_dir: Path, type_only: bool) -> dict:
    """The rooms' and the modules' import graphs of the package at `package_dir`, with their levels and circles."""
    rooms = rooms_of(package_dir)
    graph, modules = graphs(package_dir, type_only)
    level, cycles = levels(graph)
    _, module_cycles = levels(modules)
    chain, name = [], max(level, key=level.get)
    while name is not None:
        chain.append(name)
        name = max(graph[name], key=lambda d: level[d], default=None)
    return {"levels": max(level.values()), "longest_chain": " -> ".join(chain), "cycles": cycles,
            "module_cycles": module_cycles,
            "by_level": {str(n): sorted(r for r in rooms if level[r] == n) for n in sorted(set(level.values()))},
            "imported_by": {r: sorted(m for m, deps in graph.items() if r in deps) for r in rooms}}


def longest_functions(files: list[Path], most: int = 10) -> list[dict]:
    rows = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                rows.append({"function": f"{path.relative_to(ROOT)}:{node.name}",
                             "lines": node.end_lineno - node.lineno + 1})
    return sorted(rows, key=lambda r: -r["lines"])[:most]


def main() -> None:
    package_dir = ROOT / (sys.argv[1] if len(sys.argv) > 1 else "tinygpt/launch")
    rooms = rooms_of(package_dir)
    running, typed = shape(package_dir, type_only=False), shape(package_dir, type_only=True)
    files = sorted((ROOT / "tinygpt").rglob("*.py")) + [ROOT / "launch.py"]
    print(json.dumps({
        "package": module_name(package_dir / "__init__.py"),
        "top_level": len(rooms),
        "modules": sum(len(fs) for fs in rooms.values()),
        "wings": {room: [str(f.relative_to(package_dir)) for f in fs] for room, fs in rooms.items() if len(fs) > 1},
        **running,
        "with_type_imports": {key: typed[key] for key in ("levels", "cycles", "module_cycles", "by_level")},
        "lines": {"tinygpt + launch.py": sum(len(p.read_text().splitlines()) for p in files),
                  "files": len(files)},
        "longest_functions": longest_functions(files),
    }, indent=1))


if __name__ == "__main__":
    main()
