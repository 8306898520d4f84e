"""What the node-side command lines answer, flag by flag, held in golden files: `--help` and every bad use of
every flag of `python -m tinygpt.train` (and the course's train_tinygpt.py, which hands over to it) and of
`python -m tinygpt.sample`, with their exit statuses. Written from the behaviour of 4eeb716, so that a new
parser underneath keeps every spelling, message and status users have; regenerate on purpose only
(TINYGPT_REGEN_GOLDEN=1). No case trains or samples: each either fails its checks or asks for help.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import pytest

from tests.support.paths import ROOT
from tests.support.processes import python_env
from tests.support.sweeps import check_golden
from tinygpt import sample, train
from tinygpt.base import config

ALWAYS_BAD = ["--lr", "-1"]  # (added to every trainer case: whatever the flag under test does, nothing trains)


@pytest.fixture(autouse=True)
def _terminal_width(monkeypatch):
    """argparse wraps its usage to the terminal's width: the same width on every machine."""
    monkeypatch.setenv("COLUMNS", "80")


def trainer_cases() -> list[list[str]]:
    """Per flag of the trainer's schema: without a value, with a value of the wrong kind, and in the other
    spellings (underscores, `=`); then the forms the parser has to tell apart."""
    cases = [["--help"], ["-h"]]
    for key in config._KEYS:
        flag = "--" + key.replace("_", "-")
        cases += [[flag, *ALWAYS_BAD], [flag, "bogus", *ALWAYS_BAD], [f"--{key}=1e9999", *ALWAYS_BAD]]
    cases += [["--no-bias", *ALWAYS_BAD], ["--no-dropout", *ALWAYS_BAD], ["--bias", "maybe"],
              ["--bias=false", "--bias", *ALWAYS_BAD],
              ["--n-layers", "4", "--n-embd", "48"], ["--n-lay", "2", *ALWAYS_BAD], ["n_layer", "2", *ALWAYS_BAD],
              ["--", *ALWAYS_BAD], ["--config"], ["--config", "/nonexistent/run.yaml"], ["--lr", "-1e-3"],
              ["--n-layer", "-2", "--n-head", "0", "--dropout", "1.5", "--max-steps", "2.5"],
              ["--lr", "1e-4", "--min-lr", "1e-3"], ["--n-embd", "100", "--n-head", "3"], ["--loggers", "csv,nope"]]
    return cases


SAMPLE_CASES = [["--help"], [], ["--run"], ["--run", "r", "--tokens", "x"], ["--run", "r", "--tokens", "-1"],
                ["--run", "r", "--temperature", "0"], ["--run", "r", "--temperature", "nan"],
                ["--run", "r", "--top-k", "-1"], ["--run", "r", "--device", "tpu"], ["--run", "r", "--seed", "x"],
                ["--run", "r", "--bogus", "1"], ["--run", "r", "--tokens", "-1", "--top-k", "-2", "--device", "x"]]


def answered(main, argv: list[str]) -> str:
    """`main(argv)`'s exit status, stdout and stderr, as one block of the golden file."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # (argparse's own errors and --help)
            code = exit_.code
    return block(argv, code, out.getvalue(), err.getvalue())


def block(argv: list[str], code, stdout: str, stderr: str) -> str:
    return f"$ {subprocess.list2cmdline(argv)}\nexit {code}\n--- stdout\n{stdout}--- stderr\n{stderr}\n"


def test_every_flag_of_the_trainer_answers_as_before():
    text = "".join(answered(train.main, argv) for argv in trainer_cases())
    check_golden("cli/train.txt", text)


def test_every_flag_of_sample_answers_as_before():
    text = "".join(answered(sample.main, argv) for argv in SAMPLE_CASES)
    check_golden("cli/sample.txt", text)


@pytest.mark.parametrize("argv", [["--help"], ["--n-layers", "4"]], ids=["help", "unknown-flag"])
def test_the_course_script_answers_as_the_trainer(argv):
    script = ROOT / "hpc_lab" / "04_tinygpt" / "train_tinygpt.py"
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, cwd=script.parent,
                          env=python_env(COLUMNS="80"), timeout=120)
    assert block(argv, done.returncode, done.stdout, done.stderr) == answered(train.main, argv)
