"""A pytest mark sits on a test: one left on a helper by an edit marks nothing, and the test below it silently
leaves the set the mark chooses (a slurm_release test once ran on one Slurm release only, for that)."""

import ast

from tests.support.paths import ROOT


def marked_non_tests(path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("test_"):
            marks = [ast.unparse(d) for d in node.decorator_list if ast.unparse(d).startswith("pytest.mark.")]
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} (@{m})" for m in marks]
    return found


def test_every_mark_sits_on_a_test():
    assert [hit for path in sorted(ROOT.joinpath("tests").rglob("test_*.py")) for hit in marked_non_tests(path)] == []
