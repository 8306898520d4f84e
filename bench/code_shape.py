"""The shape of the code, for a before-and-after of a restructuring.

    python bench/code_shape.py [PACKAGE_DIR]     (default: tinygpt/launch)

Prints JSON: the package's modules, their import levels (a module that imports none of its siblings is
level 1; otherwise one above the highest sibling it imports), the longest chain, imports that form a
cycle, which modules import each one, the lines of `tinygpt` and `launch.py`, and the ten longest
functions of both. An import counts wherever it can execute: at module level and inside functions alike;
only those under `if TYPE_CHECKING:` (type hints, never run) do not. Read from the source text with `ast`;
nothing is imported or run.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sibling_imports(path: Path, package: str, names: set[str]) -> set[str]:
    """The modules of `package` that the file at `path` imports (at any depth of its code)."""
    found: set[str] = set()
    for node in _executable(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module is None:
                found.update(a.name for a in node.names if a.name in names)
            elif node.level == 1:
                found.add(node.module.split(".")[0])
            elif node.module and node.module.startswith(package + "."):
                found.add(node.module[len(package) + 1:].split(".")[0])
            elif node.module == package:
                found.update(a.name for a in node.names if a.name in names)
        elif isinstance(node, ast.Import):
            found.update(a.name[len(package) + 1:].split(".")[0] for a in node.names
                         if a.name.startswith(package + "."))
    return (found & names) - {path.stem}


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _executable(tree: ast.AST):
    """Every node of `tree` but those under `if TYPE_CHECKING:` (its `else` branch is kept)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if _type_checking(node):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def levels(graph: dict[str, set[str]]) -> tuple[dict[str, int], list[list[str]]]:
    """Each module's level, and the cycles met (a cycle's modules all get the level of where it was met)."""
    level: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(name: str, stack: list[str]) -> int:
        if name in stack:
            cycles.append(stack[stack.index(name):] + [name])
            return 0
        if name not in level:
            level[name] = 1 + max((visit(dep, stack + [name]) for dep in graph[name]), default=0)
        return level[name]

    for name in sorted(graph):
        visit(name, [])
    return level, cycles


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
    package = ".".join(package_dir.relative_to(ROOT).parts)
    modules = {p.stem: p for p in sorted(package_dir.glob("*.py")) if p.stem != "__init__"}
    graph = {name: sibling_imports(path, package, set(modules)) for name, path in modules.items()}
    level, cycles = levels(graph)
    importers = {name: sorted(m for m, deps in graph.items() if name in deps) for name in modules}
    chain, name = [], max(level, key=level.get)
    while name is not None:
        chain.append(name)
        name = max(graph[name], key=lambda d: level[d], default=None)
    files = sorted((ROOT / "tinygpt").rglob("*.py")) + [ROOT / "launch.py"]
    print(json.dumps({
        "package": package,
        "modules": len(modules),
        "levels": max(level.values()),
        "longest_chain": " -> ".join(chain),
        "cycles": cycles,
        "by_level": {str(n): sorted(m for m in modules if level[m] == n) for n in sorted(set(level.values()))},
        "imported_by": importers,
        "lines": {"tinygpt + launch.py": sum(len(p.read_text().splitlines()) for p in files),
                  "files": len(files)},
        "longest_functions": longest_functions(files),
    }, indent=1))


if __name__ == "__main__":
    main()
