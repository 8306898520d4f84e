"""Every option and key at its edges, derived from the parsers and the schema, not listed: every option of every
command of launch.py, every key of a spec (the trainer's too) and of a cluster profile, each given, by its type,
0, 1, -1, a tiny positive, NaN, +-inf, a huge value, an empty or blank text, a non-UTF-8 byte, a 10,000-character
text and paths that do not exist or cannot be written. An option or key added later is covered without anyone
remembering to.

Each outcome is one of: the value accepted with its meaning (the command does what it does with a valid value),
or a clear message that names the option or key, exit 1 or 2, nothing written and nothing submitted. Never a
traceback, never another exit status. In process, without Slurm (the parsers and schema import no torch); the
trainer's own command line is tested the same way by tests/base/test_config.py's enumeration below.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path

import pytest
import yaml

from tests.support.processes import main_status
from tests.support.tiny import TINY_TEXT, tiny_train
from tinygpt.base import config
from tinygpt.launch.commands import cli
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.serve import server as server_mod
from tinygpt.launch.spec import profiles
from tinygpt.launch.spec import sweep as spec_mod
from tinygpt.launch.spec.resources import Minutes, size_mb
from tinygpt.launch.submit import slurm_options

# The values, by what they stand for; paths are added per case (they need the test's folder).
EDGES = {"zero": "0", "one": "1", "minus one": "-1", "tiny": "1e-45", "nan": "nan", "inf": "inf", "-inf": "-inf",
         "1e308": "1e308", "2**63": str(2**63), "empty": "", "blank": "   ", "non-UTF-8": "\udcff",
         "10,000 characters": "x" * 10_000, "missing path": "{tmp}/missing/x",
         "unwritable path": "/proc/tinygpt/x"}  # (as root, a permission bit stops nothing; /proc takes no folder)


def call(argv: list[str]) -> tuple[int, str]:
    return main_status(cli.main, argv)


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")} if folder.exists() else set()


def judge(code: int, err: str, baseline: tuple[int, str], names: tuple[str, ...], written: bool,
          given: object = None) -> str | None:
    """None when the outcome is one of the two allowed, else what is wrong."""
    if "Traceback" in err or code not in (0, 1, 2, 75):  # (75: a host or Slurm that does not answer, try later)
        return f"exit {code}: {err.strip()[-300:]}"
    if code != 0 and (untrue := untrue_advice(err) or missing_path_blamed_on_contents(err, given)):
        return untrue
    if (code, err) == baseline or code == 0:
        return None  # accepted: the command did with it what it does with a valid value
    if not err.startswith(("error: ", "usage: ")) or not any(n in err for n in names):
        return f"the message names none of {names}: {err.strip()[:300]}"
    if written:
        return f"refused ({err.strip()[:120]}) but wrote files"
    return None


# A message must not tell the user something untrue. Two ways it does, found in every message of every case:
# advice that names an amount nobody can ask for ("ask for at most 0 ... and more nodes instead": at most 0 is
# none, and no count of nodes makes it more), and a path that does not exist blamed on what it would hold ("no
# valid checkpoint in DIR/checkpoints" for a DIR that is not there: a typo, most likely).
ADVICE = re.compile(r"\b(?:at most|no more than|up to) (-?\d+)\b")


def untrue_advice(err: str) -> str | None:
    """What is wrong with an advice in `err` that leaves no amount to ask for (at most 0, or less), if any."""
    if bad := [m.group(0) for m in ADVICE.finditer(err) if int(m.group(1)) < 1]:
        return f"advises {bad[0]!r}, which leaves nothing to ask for: {err.strip()[:300]}"
    return None


def missing_path_blamed_on_contents(err: str, given: object) -> str | None:
    """When `given` is a path that does not exist: the message must name that path itself, or the first of its
    folders that is missing (not only a path under it, as though it were there and what it holds the problem)."""
    if not isinstance(given, str) or not given.startswith("/") or "/missing/" not in given or Path(given).exists():
        return None
    if any(re.search(re.escape(str(p)) + r"(?![/\w])", err) for p in (Path(given), *Path(given).parents)
           if not p.exists()):
        return None
    if given in err:
        return f"blames what {given} would hold, not that it is missing: {err.strip()[:300]}"
    return None


# ---- launch.py's options ----------------------------------------------------------------------------------


def options_of(command: str) -> list[argparse.Action]:
    """Every option and positional of a sub-command that takes a value (flags take none)."""
    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return [a for a in sub._actions if a.nargs != 0 and not isinstance(a, argparse._HelpAction)]


COMMANDS = [name for name in next(a for a in cli.parser()._actions
                                  if isinstance(a, argparse._SubParsersAction)).choices]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """A sweep written (a dry run), for the commands that read one; and a valid argv of each command."""
    work = tmp_path_factory.mktemp("edges")
    corpus = work / "corpus.txt"
    corpus.write_text(TINY_TEXT)
    spec = work / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "train": {"data_file": str(corpus), **tiny_train(max_steps=5)},
                                    "resources": {"time": "00:10:00"}}))
    assert call([str(spec), "--dry-run", "--workdir", str(work)])[0] == 0
    valid = {"launch": [str(spec), "--dry-run", "--no-snapshot"], "check": [str(spec)], "status": [str(spec)],
             "cancel": [str(spec)], "resubmit": [str(spec), "--dry-run"], "heal": [str(spec)], "report": [str(spec)],
             "logs": [str(spec), "base"], "sync": [str(spec), "--dry-run"], "schema": ["spec"],
             "profile": ["new", "--dir", str(work / "p")], "pull": [str(spec)], "list": [], "serve": [str(spec)]}
    return work, spec, valid


def option_cases() -> list[tuple[str, str, str]]:
    return [(command, action.dest, edge) for command in COMMANDS for action in options_of(command)
            for edge in EDGES]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_of_every_command_at_its_edges(launched, tmp_path, monkeypatch, command):
    work, spec, valid = launched
    monkeypatch.chdir(tmp_path)  # (a relative path given lands here)
    if command == "serve":  # (its options, not its loop: given valid ones it would serve until idle)
        monkeypatch.setattr(server_mod.Server, "serve_forever", lambda self, poll_interval=0.5: None)
    failures = []
    baseline = call([command, *_with(command, valid[command], options_of(command)[0], None, work)])
    for action in options_of(command):
        for label, value in EDGES.items():
            value = value.replace("{tmp}", str(tmp_path))
            before = files(work) | files(tmp_path)
            code, err = call([command, *_with(command, valid[command], action, value, work)])
            written = (files(work) | files(tmp_path)) != before and code != 0
            # (an option that sets a spec key, --cluster, is named by the key as the spec's own value is; a
            # positional by its name or, for a path, by the path it was given)
            shown = value.encode(errors="surrogateescape").decode(errors="backslashreplace")[:50]
            names = (*action.option_strings, action.dest, shown or action.dest)
            if problem := judge(code, err, baseline, names, written, value):
                failures.append(f"{command} {action.option_strings or action.dest} = {label}: {problem}")
    assert not failures, "\n".join(failures)


def _with(command: str, argv: list[str], action: argparse.Action, value: str | None, work: Path) -> list[str]:
    """`argv` with `action` given `value` (None: as it is), and --workdir where the command has one."""
    argv = list(argv)
    if value is not None:
        if action.option_strings:
            argv = [*argv, f"{action.option_strings[-1]}={value}"]
            if action.dest == "login":  # (ssh then starts `false` instead of looking the host up: no network here)
                argv.append("--ssh-option=ProxyCommand=false")
        else:
            position = [a.dest for a in options_of(command) if not a.option_strings].index(action.dest)
            argv[position] = value
    has_workdir = any(a.dest == "workdir" for a in options_of(command))
    given = any(a.startswith("--workdir") for a in argv)
    return [*argv, "--workdir", str(work)] if has_workdir and not given else argv


# ---- every key of a spec (the trainer's keys under `train`), of a cluster profile, and the trainer's flags -------

# Each edge as YAML holds it: numbers as numbers, the rest as text (a non-UTF-8 byte makes the file unreadable).
YAML_EDGES = {"zero": 0, "one": 1, "minus one": -1, "tiny": 1e-45, "nan": float("nan"), "inf": float("inf"),
              "-inf": float("-inf"), "1e308": 1e308, "2**63": 2**63, "empty": "", "blank": "   ",
              "10,000 characters": "x" * 10_000, "missing path": "{tmp}/missing/x",
              "unwritable path": "/proc/tinygpt/x"}
SPEC_KEYS = ([(key,) for key in spec_mod.SpecFile.model_fields if key not in ("search", "runs", "grid", "train")]
             + [("train", key) for key in config.field_info() if key not in spec_mod.LAUNCHER_KEYS]
             + [("resources", key) for key in spec_mod.ResourcesRequest.model_fields])
PROFILE_KEYS = ([(key,) for key in profiles.Profile.model_fields
                 if key not in ("partitions", "node", "container", "login")]
                + [("partitions", "debug", key) for key in profiles.Partition.model_fields]
                + [("node", key) for key in profiles.Node.model_fields]
                + [("container", key) for key in profiles.Container.model_fields]
                + [("login", key) for key in profiles.Login.model_fields])


def outcome(load, path: Path) -> tuple[int, str]:
    try:
        load(path)
    except LaunchError as err:
        return 1, f"error: {err}"
    return 0, ""


def set_key(data: dict, keys: tuple[str, ...], value) -> dict:
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return data


def slurm_reads_otherwise(sweep) -> str | None:
    """A value accepted must reach sbatch as Slurm reads it with the meaning the launcher gave it: each option
    that carries a resource, read as sbatch reads it (its man page), against what the launcher took. Slurm's
    special readings (a time of 0 is no limit, a memory of 0 all of a node's) are where the two part; an option
    left out is read as the partition's default."""
    r = sweep.resources
    written = slurm_options.sbatch_options(r, sweep.profile, sweep.workdir)
    taken = {"time": r.time, "mem": r.mem_mb, "nodes": r.nodes, "cpus-per-task": r.cpus_per_task,
             "ntasks-per-node": r.tasks_per_node}
    for option, value in taken.items():
        if value is not None and option not in written:
            return f"the launcher took {option} {value}, and sbatch gets none (the partition's default)"
        read = SLURM_READS[option](written[option]) if option in written else None
        if read != value:
            return f"the launcher took {option} {value}; sbatch reads --{option}={written[option]} as {read}"
    return None


# How sbatch reads each option's value (sbatch(1)): a time or memory of 0 has a meaning of its own.
SLURM_READS = {"time": lambda t: "no time limit" if Minutes.parse(t) == 0 else Minutes.parse(t),
               "mem": lambda m: "all of each node's memory" if size_mb(m) == 0 else size_mb(m),
               "nodes": int, "cpus-per-task": int, "ntasks-per-node": int}


@pytest.mark.parametrize("kind", ["spec", "profile"])
def test_every_key_of_a_spec_and_a_profile_at_its_edges(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text(TINY_TEXT)
    work = tmp_path / "work"
    base_profile = yaml.safe_load(profiles.found("local")[0].read_text())
    base_profile["container"] = {"image": "/images/x.sif"}
    spec = tmp_path / "s.yaml"
    profile = tmp_path / "site.yaml"

    def load(_):
        return spec_mod.load(spec, work)

    failures = []
    for keys in SPEC_KEYS if kind == "spec" else PROFILE_KEYS:
        for label, value in YAML_EDGES.items():
            value = value.replace("{tmp}", str(tmp_path)) if isinstance(value, str) else value
            data = {"name": "s", "cluster": str(profile), "resources": {"time": "00:10:00"},
                    "train": {"data_file": str(tmp_path / "corpus.txt"), **tiny_train(max_steps=5)}}
            site = yaml.safe_load(yaml.safe_dump(base_profile))
            set_key(data if kind == "spec" else site, keys, value)
            spec.write_text(yaml.safe_dump(data))
            profile.write_text(yaml.safe_dump(site))
            try:
                code, err = outcome(load, spec)
            except Exception as crash:  # noqa: BLE001 (a traceback is what this test looks for)
                code, err = 99, f"Traceback: {crash!r}"
            names = (keys[-1], *keys)
            if problem := judge(code, err, (0, ""), names, written=code != 0 and work.exists(), given=value) or (
                    code == 0 and keys[0] == "resources" and slurm_reads_otherwise(spec_mod.load(spec, work))):
                failures.append(f"{'.'.join(keys)} = {label}: {problem}")
    assert not failures, "\n".join(failures)


def test_every_trainer_flag_at_its_edges():
    """`python -m tinygpt.train` (and the course's train_tinygpt.py, which is it): every key as a flag. A value it
    takes is the value given, read as the key's type reads it (nothing silently becomes another value, a
    default); one it refuses is named. What a run does with a path is judged where it is used (test_train.py,
    test_filesystem_errors.py)."""
    failures = []
    for key, info in config.field_info().items():
        flag = "--" + key.replace("_", "-")
        for label, value in EDGES.items():
            try:
                cfg = config.resolve([f"{flag}={value}"])
            except config.ConfigError as err:
                if not any(name in str(err) for name in (key, flag)):
                    failures.append(f"{flag} = {label}: the message names neither: {str(err)[:200]}")
                continue
            except Exception as crash:  # noqa: BLE001
                failures.append(f"{flag} = {label}: {crash!r}")
                continue
            got = getattr(getattr(cfg, info.section), key)
            if got != as_read(info.kind, value):
                failures.append(f"{flag} = {label}: taken as {got!r}")
    assert not failures, "\n".join(failures)


def as_read(kind: type, text: str):
    """What a flag's text means for a key of `kind`: the text itself, the number, the truth value, the items."""
    if kind is str:
        return text
    if kind is list:
        return [part.strip() for part in text.split(",") if part.strip()]
    if kind is bool:
        return text.strip().lower() in ("true", "yes", "on", "1")
    try:
        return kind(float(text)) if kind is int else kind(text)
    except (ValueError, OverflowError):
        return "(no number)"  # (taken anyway: whatever it became, it is not what was given)


@pytest.mark.parametrize("module", ["sample", "data"])
def test_every_option_of_sample_and_data_at_its_edges(tmp_path, monkeypatch, module):
    """`python -m tinygpt.sample` (up to reading the run, which is not there: its options are judged first) and
    `python -m tinygpt.data prepare`."""
    from tinygpt import data, sample

    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text(TINY_TEXT)
    main, top = (sample.main, sample.parser()) if module == "sample" else (data.main, data.parser())
    if module == "data":
        top = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices["prepare"]
    valid = (["--run", str(tmp_path / "no-run")] if module == "sample"
             else ["prepare", "--data-file", str(tmp_path / "corpus.txt"), "--data-dir", str(tmp_path / "d")])
    baseline = main_status(main, valid)
    failures = []
    for action in [a for a in top._actions if a.nargs != 0 and not isinstance(a, argparse._HelpAction)]:
        for label, value in EDGES.items():
            value = value.replace("{tmp}", str(tmp_path))
            argv = [*valid, f"{action.option_strings[-1]}={value}"] if action.option_strings \
                else [*valid[:1], value, *valid[1:]]
            code, err = main_status(main, argv)
            shown = value.encode(errors="surrogateescape").decode(errors="backslashreplace")[:50]
            names = (*action.option_strings, action.dest, shown or action.dest)
            if problem := judge(code, err, baseline, names, written=False, given=value):
                failures.append(f"{module} {action.option_strings or action.dest} = {label}: {problem}")
    assert not failures, "\n".join(failures)


def test_sbatch_variables_of_the_submitting_shell_are_said(launched, monkeypatch):
    """sbatch reads SBATCH_* over the scripts' #SBATCH lines: the launch says which it will read, with their
    values (however odd), and still writes exactly what the spec asks for."""
    work, spec, _ = launched
    monkeypatch.setenv("SBATCH_TIMELIMIT", "1-00:00:00")
    monkeypatch.setenv("SBATCH_PARTITION", "x\ny")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main([str(spec), "--dry-run", "--no-snapshot", "--workdir", str(work)]) == 0
    assert "note: sbatch reads SBATCH_PARTITION='x\\ny', SBATCH_TIMELIMIT='1-00:00:00' from this shell, over the " \
           "scripts' #SBATCH lines" in out.getvalue(), out.getvalue()


def test_values_with_a_meaning_of_their_own_in_slurm_and_impossible_advice_are_said_as_they_are(tmp_path):
    """The cases the rules above were written from: each message now says what is true."""
    (tmp_path / "corpus.txt").write_text(TINY_TEXT)

    def refusal(resources: dict, cluster: str = "local") -> str:
        spec = tmp_path / "s.yaml"
        spec.write_text(yaml.safe_dump({"name": "s", "cluster": cluster, "resources": resources,
                                        "train": {"data_file": str(tmp_path / "corpus.txt"), **tiny_train()}}))
        with pytest.raises(LaunchError) as err:
            spec_mod.load(spec, tmp_path / "work")
        return str(err.value)

    for mem in ("0", 0, "0G", "100K"):
        assert "Slurm reads a memory request of 0 as all of each node's memory" in refusal({"mem": mem})
    assert "the nodes of cluster profile `local` have no GPUs; set gpus_per_node: 0" in refusal({"gpus_per_node": 1})
    assert "at most 0" not in refusal({"gpus_per_node": 1})
    from tinygpt.launch.act.resubmit import parse_changes

    with pytest.raises(LaunchError, match=r"--mem: '0' is less than 1 MB, and Slurm reads"):
        parse_changes(None, "0", [])
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"name": "p", "partitions": {"debug": {"max_time": "0"}}}))
    with pytest.raises(LaunchError, match=r"max_time: '0' is a time of 0, which Slurm reads as no time limit"):
        profiles.from_file(tmp_path / "p.yaml")

    from tinygpt import sample

    code, err = main_status(sample.main, ["--run", str(tmp_path / "runs" / "typo")])
    assert code == 1 and f"--run: {tmp_path / 'runs' / 'typo'} does not exist" in err and "checkpoints;" not in err
