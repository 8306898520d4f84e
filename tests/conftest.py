"""Shared fixtures: tiny corpora made by the tests, a trainer runner, and the Slurm gate."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["side_by_side"]  # which tests run beside which under pytest-xdist

# Property tests draw the same cases on every run and every machine: a run that fails fails again, and one
# that passes did not pass by luck. `pytest --hypothesis-profile hunt` (with TINYGPT_FUZZ_EXAMPLES=N for a
# larger budget) draws fresh random cases by hand, to find what the fixed ones miss. No deadline: a case is
# judged by what it gives, never by how fast a busy machine ran it (Hypothesis's default fails one over 200 ms).
settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("hunt", derandomize=False, print_blob=True, deadline=None,
                          max_examples=int(os.environ.get("TINYGPT_FUZZ_EXAMPLES", "1000")))
settings.load_profile("repeatable")
SHARED_DATA = ROOT.parent / "shared" / "data"

# A small corpus with some structure, made here so that tests need no network and no files.
TINY_TEXT = "".join(
    f"{name}: {verb} the {thing}, {name.lower()}!\n"
    for name in ("ROMEO", "JULIET", "NURSE", "FRIAR", "TYBALT")
    for verb in ("love", "fear", "seek", "keep", "lose", "greet")
    for thing in ("rose", "moon", "night", "sword", "ring", "letter", "tomb")
)

# The tiny model the tests train (seconds on one CPU), as trainer keys; each test adds its own steps.
TINY_MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "batch_size": 4, "eval_windows": 8,
              "sample_tokens": 0, "threads": 1}


def tiny_train(**keys) -> dict:
    """The tiny model's keys, with these added or changed: a spec's `train` section."""
    return {**TINY_MODEL, **keys}


def tiny_yaml(**keys) -> str:
    """tiny_train(**keys) as the inside of a YAML flow mapping, for a spec written as text:
    f"train: {{data_file: {corpus}, {tiny_yaml(max_steps=20)}}}"."""
    import yaml

    return yaml.safe_dump(tiny_train(**keys), default_flow_style=True, width=1_000_000).strip()[1:-1]


def as_flags(keys: dict) -> list[str]:
    """Trainer keys as `python -m tinygpt.train` flags."""
    return [item for key, value in keys.items() for item in (f"--{key.replace('_', '-')}", str(value))]


# The tiny model for the trainer's command line, with a run of 20 steps.
TINY_FLAGS = as_flags(tiny_train(max_steps=20, eval_interval=10, log_interval=5, ckpt_interval=10, warmup_steps=2,
                                 eval_windows=16, progress="plain"))

# The course page's optimisation (jobs/sherlock.yaml): OneCycleLR with beta1 cycled, every parameter decayed
COURSE_SCHEDULE = ["--schedule", "onecycle", "--warmup-steps", "4", "--beta1", "0.95", "--beta1-min", "0.85",
                   "--weight-decay-on", "all"]


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TINY_TEXT)
    return path


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch) -> Path:
    d = tmp_path / "data"
    monkeypatch.setenv("TINYGPT_DATA_DIR", str(d))
    monkeypatch.setenv("TINYGPT_OFFLINE", "1")
    return d


def tiny_config(tmp_path: Path, corpus: Path, *extra: str, name: str = "run"):
    """The tiny model's config (TINY_FLAGS, then `extra`), its run directory tmp_path/name."""
    from tinygpt import config

    return config.resolve([*TINY_FLAGS, "--data-file", str(corpus), "--out-dir", str(tmp_path / name), *extra])


def train_tiny(tmp_path: Path, corpus: Path, *extra: str, name: str = "run", **hooks):
    """Train the tiny model in this process into tmp_path/name: (out_dir, result)."""
    from tinygpt import trainer

    return tmp_path / name, trainer.train(tiny_config(tmp_path, corpus, *extra, name=name), **hooks)


def hand_made_manifest(workdir: Path, runs: int, submissions: list[dict]):
    """A launched sweep's manifest as a command reads it, made here: `runs` runs under workdir/runs/s/ and these
    submissions (sbatch ones unless they say otherwise)."""
    from tinygpt.launch.manifest import FORMAT, Manifest

    return Manifest.model_validate({
        "format": FORMAT, "name": "s", "workdir": str(workdir), "logs_dir": str(workdir / "logs" / "s"),
        "backend": "sbatch", "base": {}, "code": {}, "resources": {},
        "runs": [{"index": i, "name": f"r{i}", "out_dir": str(workdir / "runs" / "s" / f"r{i}"), "overrides": {}}
                 for i in range(runs)],
        "submissions": [{"backend": "sbatch", "submitted_at": 0.0, **sub} for sub in submissions]})


def check_golden(name: str, text: str) -> None:
    """`text` equals tests/golden/NAME; TINYGPT_REGEN_GOLDEN=1 writes it there instead (a change on purpose)."""
    path = ROOT / "tests" / "golden" / name
    if os.environ.get("TINYGPT_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; create it with TINYGPT_REGEN_GOLDEN=1 python -m pytest"
    assert text == path.read_text(), (f"{name} differs from what the code gives; if the change is intended, "
                                      f"regenerate with TINYGPT_REGEN_GOLDEN=1 python -m pytest")


def sweep_dirs(workdir: Path, name: str):
    """Where a launched sweep's files are (the launcher's own layout)."""
    from tinygpt.launch.layout import SweepDirs

    return SweepDirs(Path(workdir), name)


def read_metrics(run_dir: Path) -> list[dict]:
    from tinygpt import metrics

    return [json.loads(line) for line in metrics.of_run(run_dir).read_text().splitlines()]


def wait_until(predicate, timeout: float = 120.0, poll: float = 0.1, what: str = "condition", proc=None):
    """`predicate()`'s value once it is true, polled every `poll` s; fails loudly when `timeout` s pass first, or
    when `proc` (a process the condition waits on) has ended first (then with its output, if it was captured)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out = proc.communicate()
            pytest.fail(f"the process ended (exit {proc.returncode}) before {what}: {out}")
        if time.monotonic() > deadline:
            if proc is not None:
                proc.kill()
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s")
        time.sleep(poll)


def loss_series(run_dir: Path) -> list[tuple]:
    """(step, train_loss, val_loss) of every training and evaluation line, in order."""
    return [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in read_metrics(run_dir) if "event" not in r]


def slow_saves(seconds: float) -> dict[str, str]:
    """Environment under which every checkpoint write stalls `seconds` before its rename (tests/slow_saves)."""
    path = os.pathsep.join([str(ROOT / "tests" / "slow_saves"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "TINYGPT_TEST_SAVE_STALL_S": str(seconds)}


def python_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TINYGPT_OFFLINE", "1")
    env.update(extra)
    return env


def launch(*args: str, cwd: Path = ROOT, timeout: float = 180, env: dict[str, str] | None = None,
           columns: int = 250) -> subprocess.CompletedProcess:
    """`python launch.py ARGS` as a user runs it, in a COLUMNS-wide terminal: the repository importable, offline,
    `env` on top (it is also what a submitted job inherits: sbatch exports it)."""
    return subprocess.run([sys.executable, str(ROOT / "launch.py"), *args], capture_output=True, text=True, cwd=cwd,
                          env=python_env(COLUMNS=str(columns), **(env or {})), timeout=timeout)


def run_cli(argv: list[str]) -> tuple[int, str]:
    """`launch.py ARGV` in this process: (exit status, what it printed to stderr)."""
    import contextlib
    import io

    from tinygpt.launch import cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    return code, err.getvalue()


def main_status(main, argv: list[str]) -> tuple[int, str]:
    """A command's main() on argv in this process: (exit status, stderr), argparse's own exits (status 2)
    included."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, err.getvalue()


def run_module(module: str, *args: str, cwd: Path | None = None, timeout: float = 300,
               **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=timeout, env=python_env(**env))


def free_port() -> int:
    """A loopback port nothing listens on now (for a master of ranks started here)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(module: str, args: list[str], env: dict[str, str], size: int = 2) -> list:
    """A world of `size` ranks on this machine, each given the variables `torchrun --standalone` gives it."""
    world = {"WORLD_SIZE": str(size), "LOCAL_WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(free_port())}
    from tinygpt.forked import Forked

    return [Forked(module, args, {**env, **world, "RANK": str(rank), "LOCAL_RANK": str(rank)})
            for rank in range(size)]


def run_world(module: str, args: list[str], env: dict[str, str], size: int = 2,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """A world of `size` ranks to its end, as torchrun's run reads: the highest exit status, every rank's output
    (rank 0's first)."""
    world = ranks(module, args, env, size)
    outputs = [rank.communicate(timeout) for rank in world]
    return subprocess.CompletedProcess([f"rank {r}" for r in range(size)], max(abs(r.returncode) for r in world),
                                       "".join(o for o, _ in outputs), "".join(e for _, e in outputs))


# ----------------------------------------------------------------------------------------------------
# Slurm gate: tests marked `slurm` skip with a reason when no cluster answers, and fail instead when
# TINYGPT_REQUIRE_SLURM=1 (CI), so that a cluster that did not come up can never pass silently.


LOCAL_CLUSTER_HOME = Path(os.environ.get("TINYGPT_SLURM_HOME", "/var/lib/tinygpt-slurm"))  # (up.sh's folder)


def slurm_problem() -> str | None:
    if shutil.which("sinfo") is None:
        return "sinfo is not on PATH (bring a cluster up with: sudo hpc_lab/local_cluster/up.sh)"
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    if not conf.exists():  # (sinfo would look for a controller in DNS: nothing here asks the network)
        return f"no Slurm configuration at {conf} (bring a cluster up with: sudo hpc_lab/local_cluster/up.sh)"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError) as err:
        return f"sinfo failed: {err}"
    if out.returncode != 0:
        return f"sinfo failed: {out.stderr.strip()}"
    states = out.stdout.split()
    if not any(s.startswith(("idle", "mix", "alloc")) for s in states):
        return f"no usable Slurm node (states: {' '.join(states) or 'none'})"
    return None


def _output(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def cluster_lacks(need: str) -> str | None:
    """Why the cluster lacks what `@pytest.mark.slurm(needs=[...])` asks for, and the up.sh option that gives it
    (CI's cluster has them all)."""
    if need == "gpus":
        gres = _output("sinfo", "-h", "-o", "%G")
        if "gpu:a100:" not in gres or "gpu:h100:" not in gres:
            return "its nodes have no GPUs of types a100 and h100 (up.sh --gpus 2:a100,2:h100)"
    elif need == "accounts":
        enforce = next((line for line in _output("scontrol", "show", "config").splitlines()
                        if line.startswith("AccountingStorageEnforce")), "")
        if "associations" not in enforce or "tinygpt" not in _output("sacctmgr", "-n", "-P", "show", "account"):
            return "it has no accounts and limits enforced (up.sh --accounts)"
    elif need == "login":
        if not (LOCAL_CLUSTER_HOME / "login" / "known_hosts").exists():
            return "it has no login node (up.sh --login)"
    else:
        raise ValueError(f"unknown need {need!r}")
    return None


_SLURM_PROBLEM: dict = {}


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("slurm")
    if marker is None:
        return
    if None not in _SLURM_PROBLEM:
        _SLURM_PROBLEM[None] = slurm_problem()
    problem = _SLURM_PROBLEM[None]
    for need in marker.kwargs.get("needs", ()) if problem is None else ():
        if need not in _SLURM_PROBLEM:
            _SLURM_PROBLEM[need] = cluster_lacks(need)
        problem = problem or _SLURM_PROBLEM[need]
    if problem is None:
        return
    if os.environ.get("TINYGPT_REQUIRE_SLURM") == "1":
        pytest.fail(f"TINYGPT_REQUIRE_SLURM=1 but Slurm is not available: {problem}", pytrace=False)
    pytest.skip(f"Slurm not available: {problem}")


# ----------------------------------------------------------------------------------------------------
# Hermetic tests: a test that is not marked `slurm` runs as on a machine without Slurm, whether or not a cluster
# is up, so that it gives the same answer in CI and on a newcomer's laptop. For its whole protocol (setup, call,
# teardown: the module-scoped fixtures it sets up too), Slurm's commands are off PATH, the variables that
# steer them are unset and its configuration is empty; a `slurm` test sees the cluster.

SLURM_COMMANDS = frozenset({"sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol",
                            "scrontab", "sdiag", "sh5util", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare",
                            "sstat", "strigger", "sview"})
SLURM_VARIABLES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SACCT_", "SINFO_", "SCONTROL_")
_WITHOUT_SLURM: dict[str, str] = {}  # {PATH folder that holds a Slurm command: the same folder without them}
_SESSION_FOLDER = ""  # the session's own folder (pytest_sessionstart), removed with all it holds at its end


def path_without_slurm(path: str) -> str:
    """PATH with each folder that holds a Slurm command replaced by a copy of it (links) that does not."""
    folders = []
    for folder in path.split(os.pathsep):
        if folder not in _WITHOUT_SLURM:
            _WITHOUT_SLURM[folder] = folder
            try:
                names = set(os.listdir(folder)) if folder else set()
            except OSError:
                names = set()
            if names & SLURM_COMMANDS:
                mirror = Path(tempfile.mkdtemp(prefix="path-without-slurm-", dir=_SESSION_FOLDER or None))
                for name in names - SLURM_COMMANDS:
                    (mirror / name).symlink_to(Path(folder) / name)
                _WITHOUT_SLURM[folder] = str(mirror)
        folders.append(_WITHOUT_SLURM[folder])
    return os.pathsep.join(folders)


def slurm_that_records(folder: Path) -> tuple[dict[str, str], Path]:
    """Stand-ins for every Slurm command, each writing its command line to a log and failing as a controller
    that does not answer: (the environment that puts them on PATH, the log). The log stays absent while
    nothing asks Slurm anything."""
    bindir, log = folder / "slurm-that-records", folder / "slurm-asked.log"
    bindir.mkdir(parents=True)
    for name in SLURM_COMMANDS:
        (bindir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {shlex.quote(str(log))}\n'
                                   f'echo "{name}: error: Unable to contact slurm controller (connect failure)" >&2\n'
                                   f'exit 1\n')
        (bindir / name).chmod(0o755)
    return {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}, log


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker("slurm") is not None:
        yield
        return
    saved = dict(os.environ)
    for name in [n for n in os.environ if n.startswith(SLURM_VARIABLES)]:
        del os.environ[name]
    os.environ["SLURM_CONF"] = os.devnull  # (an empty configuration, not this machine's /etc/slurm/slurm.conf)
    os.environ["PATH"] = path_without_slurm(os.environ.get("PATH", os.defpath))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def pytest_sessionstart(session):
    # What the tests' processes would keep in the user's folders goes to a folder of this run's instead: data
    # prepared without a folder named for it (the trainer's default, $TINYGPT_DATA_DIR, else ./data: the
    # checkout), and W&B's debug logs and settings (~/.cache/wandb, ~/.config/wandb); PATH's mirrors too.
    global _SESSION_FOLDER
    _SESSION_FOLDER = tempfile.mkdtemp(prefix="tinygpt-tests-")
    for name, sub in (("TINYGPT_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "wandb-cache"),
                      ("WANDB_CONFIG_DIR", "wandb-config")):
        os.environ[name] = os.path.join(_SESSION_FOLDER, sub)


def pytest_sessionfinish(session):
    shutil.rmtree(_SESSION_FOLDER, ignore_errors=True)
