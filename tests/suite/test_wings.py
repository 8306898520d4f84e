"""The floor plan is the code's: the tables of rooms and levels in docs/launcher.md (`tinygpt/launch`) and the
README's code map (`tinygpt`) are held to the folders and to what each module imports (type hints included, as
bench/code_shape.py reads them). A module in no row, a row naming no module, or an import of a room that is not
on a lower level fails."""

from __future__ import annotations

import ast
import re

import pytest

from bench.code_shape import graphs, imported_modules, levels, module_name, rooms_of
from tests.support.paths import ROOT

ROW = re.compile(r"^\| (\d+) \| `([\w/.]+)` \| (.*) \|$")


def table(doc: str, heading: str) -> dict[str, tuple[int, str]]:
    """{room: (level, the rest of its row)} of the first table after `heading` in `doc`."""
    text = (ROOT / doc).read_text()
    rows = {}
    for line in text[text.index(heading):].splitlines():
        if m := ROW.match(line):
            rows[m.group(2).removesuffix("/").removesuffix(".py")] = (int(m.group(1)), m.group(3))
        elif rows and not line.startswith("|"):
            break
    return rows


PLANS = {"tinygpt/launch": ("docs/launcher.md", "| level | room |"),
         "tinygpt": ("README.md", "| level | `tinygpt/` |")}


@pytest.mark.parametrize("package", sorted(PLANS))
def test_every_room_stands_above_every_room_it_imports(package):
    rows = table(*PLANS[package])
    imports, _ = graphs(ROOT / package, type_only=True)  # (every import: in functions and type hints too)
    assert sorted(rows) == sorted(imports), "the table's rooms are not the package's folders and top-level modules"
    upward = [f"{room} (level {rows[room][0]}) imports {other} (level {rows[other][0]})"
              for room, others in sorted(imports.items()) for other in sorted(others)
              if rows[other][0] >= rows[room][0]]
    assert upward == []


def test_the_launchers_table_names_every_module_of_each_wing():
    rows = table(*PLANS["tinygpt/launch"])
    for room, files in rooms_of(ROOT / "tinygpt/launch").items():
        named = set(re.findall(r"`(\w+)`", rows[room][1].split(" | ")[0]))
        assert named == {f.stem for f in files if f.stem != "__init__"} or named == {room}, room


@pytest.mark.parametrize("init", sorted(ROOT.joinpath("tinygpt").rglob("__init__.py")),
                         ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_a_wings_init_says_what_it_is_for_and_holds_no_code(init):
    tree = ast.parse(init.read_text())
    assert ast.get_docstring(tree), f"{init}: no docstring saying what the wing is for and what it may import"
    code = [ast.unparse(node) for node in tree.body[1:]
            if not re.fullmatch(r"__version__ = '[\w.]+'", ast.unparse(node))]
    assert code == []


def test_the_login_nodes_half_imports_nothing_of_this_project():
    login_side = ROOT / "tinygpt/launch/remote/login_side.py"
    known = {module_name(p) for p in ROOT.joinpath("tinygpt").rglob("*.py")}
    assert imported_modules(login_side, known, type_only=True) == set()


def test_every_module_is_named_in_its_wings_docstring():
    wings = [d for d in ROOT.joinpath("tinygpt/launch").iterdir() if (d / "__init__.py").exists()]
    unnamed = [f"{wing.name}/{f.stem}" for wing in sorted(wings)
               for f in sorted(wing.glob("*.py"))
               if f.stem != "__init__" and f"`{f.stem}`" not in ast.get_docstring(ast.parse(
                   (wing / "__init__.py").read_text()))]
    assert unnamed == []


def test_no_module_of_the_launcher_imports_itself_round_a_circle_and_only_cli_imports_a_command():
    _, modules = graphs(ROOT / "tinygpt/launch", type_only=True)
    assert levels(modules)[1] == [], "a circle of imports (type hints counted)"
    commands = "tinygpt.launch.commands."
    crossing = {m: sorted(d for d in deps if d.startswith(commands))
                for m, deps in modules.items() if m.startswith(commands) and m != commands + "cli"}
    assert {m: deps for m, deps in crossing.items() if deps} == {}
