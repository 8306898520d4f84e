"""The limits the code is held to: a reader holds any function of tinygpt/ in their head, and the
Trainer only trains (what a run tells is narration.py's, what it is built from run_setup.py's)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import ROOT

MAX_FUNCTION_LINES = 50
MAX_TRAINER_LINES = 250


def definitions():
    for path in sorted((ROOT / "tinygpt").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", node, node.end_lineno - node.lineno + 1


def test_no_function_of_tinygpt_is_over_fifty_lines():
    long = [f"{where} ({lines} lines)" for where, node, lines in definitions()
            if not isinstance(node, ast.ClassDef) and lines > MAX_FUNCTION_LINES]
    assert long == []


def test_the_trainer_class_is_at_most_250_lines():
    [lines] = [lines for where, node, lines in definitions() if where.startswith("tinygpt/training/trainer.py")
               and node.name == "Trainer" and isinstance(node, ast.ClassDef)]
    assert lines <= MAX_TRAINER_LINES


def test_every_file_of_the_package_that_is_not_python_is_installed_with_it():
    """A wheel carries a package's .py files and only the others pyproject.toml names (package-data): one left
    out works in a checkout and breaks an installed launcher (submit/step.sh is read as sbatch.py loads)."""
    import fnmatch
    import subprocess

    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "tinygpt"], capture_output=True, text=True,
                             check=True).stdout.split()
    others = [Path(f) for f in tracked if not f.endswith(".py")]
    assert others, "no file of the package is other than Python: this test holds nothing"

    def installed(f: Path) -> bool:  # (a pattern is relative to its package: `assets/*` of tinygpt.launch.serve)
        return any(fnmatch.fnmatch(f.relative_to(package).as_posix(), pattern)
                   for package in f.parents if package.parts
                   for pattern in declared.get(".".join(package.parts), []))

    missing = [str(f) for f in others if not installed(f)]
    assert missing == []
