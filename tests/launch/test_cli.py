"""The launcher as a command (commands/cli.py): shell completion of commands, options and a sweep's run names, and
`list` of the sweeps under a work directory, here without Slurm (the cluster's: cluster/test_relaunch.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.paths import ROOT
from tests.support.processes import launch, python_env


def completions(line: str, cwd: Path, tmp_path: Path) -> list[str]:
    """What the shell is told for `line`, the cursor at its end, as bash's completion hook asks argcomplete."""
    out = tmp_path / "completions"
    env = python_env(_ARGCOMPLETE="1", _ARGCOMPLETE_IFS="\n", COMP_LINE=line, COMP_POINT=str(len(line)),
                     _ARGCOMPLETE_STDOUT_FILENAME=str(out))
    done = subprocess.run([sys.executable, str(ROOT / "launch.py")], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return [word.strip() for word in out.read_text().split("\n") if word.strip()]


def sweep(tmp_path: Path, name: str = "s") -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({"name": name, "command": {"argv": ["prog"]}, "grid": {"lr": [0.1, 0.2]}}))
    assert launch(str(spec), "--dry-run", "--workdir", str(tmp_path / "w")).returncode == 0
    return spec


def test_the_shell_completes_commands_options_specs_and_a_sweeps_run_names(tmp_path):
    sweep(tmp_path)
    assert completions("launch.py lo", tmp_path, tmp_path) == ["logs"]
    assert "--json" in completions("launch.py status --", tmp_path, tmp_path)
    assert completions("launch.py status s", tmp_path, tmp_path) == ["s.yaml"]
    names = completions("launch.py logs --workdir w s.yaml lr-0.", tmp_path, tmp_path)
    assert sorted(names) == ["lr-0.1", "lr-0.2"]


def test_list_shows_every_sweep_of_a_work_directory_and_one_it_cannot_read(tmp_path):
    sweep(tmp_path, "first")
    sweep(tmp_path, "second")
    damaged = tmp_path / "w" / "jobs" / "second" / "manifest.json"
    damaged.write_text(damaged.read_text()[:40])
    listed = launch("list", "--workdir", str(tmp_path / "w"))
    assert listed.returncode == 0, listed.stderr
    first, second = listed.stdout.splitlines()
    assert first.startswith("first ") and "2 run(s): 2 NOT_STARTED" in first
    assert second.startswith("second ") and "cannot be read" in second
    document = json.loads(launch("list", "--json", "--workdir", str(tmp_path / "w")).stdout)
    assert [(s["sweep"], s.get("runs")) for s in document["sweeps"]] == [("first", 2), ("second", None)]


WRAPPED_CTRL_C = """
import os, signal, sys
from tinygpt.launch.commands import cli

WORD = sys.argv[-1]


def handler(args):  # (as pydantic does when a Ctrl-C lands while it builds a model's validator)
    try:
        if WORD == "interrupt":
            os.kill(os.getpid(), signal.SIGINT)
        raise ValueError("a bug of the command's own")
    except KeyboardInterrupt as err:
        raise ValueError(f"SchemaError: {err!r}") from None

cli.HANDLERS["schema"] = handler
sys.argv = ["tinygpt-launch", "schema"]
sys.exit(cli.main())
"""


def test_ctrl_c_ends_a_command_130_also_where_a_library_turned_it_into_its_own_error(tmp_path):
    """A Ctrl-C that lands while pydantic builds a model (importing the trainer's config, on the login node at the
    start of a forwarded `status --watch`) comes out as pydantic's SchemaError; the command still ends 130, and an
    error of its own with no Ctrl-C is still a traceback."""
    def run(word: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", WRAPPED_CTRL_C, word], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path, env=python_env())

    interrupted, bug = run("interrupt"), run("bug")
    assert interrupted.returncode == 130 and "Traceback" not in interrupted.stderr, interrupted.stderr
    assert bug.returncode == 1 and "ValueError: a bug of the command's own" in bug.stderr, bug.stderr


SWALLOWED_CTRL_C = """
import os, signal, sys, weakref
from tinygpt.launch.commands import cli
from tinygpt.launch.status import table as status

looked = status.collect


def collect(manifest):  # (a Ctrl-C that lands in a callback of Python's own, as importlib's module lock has)
    class Held:
        pass

    held = Held()
    ref = weakref.ref(held, lambda _: os.kill(os.getpid(), signal.SIGINT))
    del held
    return looked(manifest)


status.collect = collect
sys.argv = ["tinygpt-launch", "status", *sys.argv[1:]]
sys.exit(cli.main())
"""


def test_ctrl_c_ends_a_watch_also_where_python_only_printed_it(tmp_path):
    """Python prints, and drops, a KeyboardInterrupt raised in a callback of its own ("Exception ignored": seen in CI
    on the login node, where a Ctrl-C landed in importlib's module-lock callback and the forwarded `status --watch`
    watched on): the watch of a sweep that never ends still ends 130 at its next look."""
    spec = sweep(tmp_path)
    watch = subprocess.run([sys.executable, "-c", SWALLOWED_CTRL_C, str(spec), "--watch", "--workdir",
                            str(tmp_path / "w")], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                           env=python_env())
    assert "Exception ignored" in watch.stderr and "KeyboardInterrupt" in watch.stderr, watch.stderr
    assert watch.returncode == 130, watch.stderr
