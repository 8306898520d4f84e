"""Property-based tests of every input: any value at any key of a spec or a cluster profile, and any value of
any flag, gives either a valid run or exit status 1 or 2 with a message naming the field; never a traceback,
and nothing written or submitted for a bad one.

The keys come from the schemas themselves (the trainer's fields, the spec's and the profile's keys), so a
key added later is fuzzed without a new test. Examples that once failed are pinned with @example.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.processes import main_status, run_cli
from tests.support.tiny import TINY_TEXT, tiny_train
from tinygpt import sample
from tinygpt.base import config
from tinygpt.launch.commands import cli
from tinygpt.launch.spec import profiles
from tinygpt.launch.spec import sweep as spec_mod

# 60 examples a property, the same ones every run (conftest's "repeatable" profile); for a longer hunt with
# fresh random cases: TINYGPT_FUZZ_EXAMPLES=1000 pytest --hypothesis-profile hunt tests/base/test_fuzz_inputs.py
SETTINGS = settings(max_examples=int(os.environ.get("TINYGPT_FUZZ_EXAMPLES", "60")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# Values of every kind a YAML file or a command line can hold: wrong types, out of range, empty, huge,
# non-ASCII and hostile.
ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.sampled_from(["", " ", "-1", "0", "1e400", "nan", "inf", "ünïcødé", "a'; echo pwned", "$(reboot)",
                     "../../etc", "x" * 5000, "\n", "00:00:00", "99999-00:00:00", "1T", "-4G"]),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
    st.dictionaries(st.sampled_from(["a", "max_time", "gpus", "image"]), st.integers(), max_size=2),
)

BASE_TRAIN = tiny_train(max_steps=5)


def check_outcome(code: int, err: str, work: Path, *fields: str) -> None:
    """Valid (0), or exit 1 with one message naming the field (or what it names: a partition of a profile),
    and nothing written."""
    if code == 0:
        return  # a value that happens to be valid
    assert code == 1, (code, err)
    assert err.startswith("error: ") and "Traceback" not in err
    assert any(field in err for field in fields), f"the message names none of {fields}: {err}"
    assert not (work / "jobs").exists() and not (work / "runs").exists()  # nothing written


def set_path(mapping: dict, path: tuple[str, ...], value) -> dict:
    node = mapping
    for key in path[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            return mapping
    node[path[-1]] = value
    return mapping


# Every key the schema declares (a key added later is fuzzed without a new test), and a few unknown ones.
SPEC_PATHS = ([(key,) for key in spec_mod.SpecFile.model_fields if key != "search"]
              + [("train", key) for key in config.field_info() if key not in spec_mod.LAUNCHER_KEYS]
              + [("resources", key) for key in spec_mod.ResourcesRequest.model_fields]
              + [("grid", "lr"), ("grid", "n_layer")])


@SETTINGS
@given(path=st.sampled_from(SPEC_PATHS), value=ANY_VALUE)
@example(path=("train",), value=None)
@example(path=("resources", "qos"), value=1)  # was a TypeError in the script's quoting
@example(path=("grid", "lr"), value=[1, 1])  # named only "grid point 1: run name `base` is used twice"
@example(path=("cluster",), value="x" * 5000)  # was an OSError (file name too long)
@example(path=("cluster",), value="/etc")  # a directory: the message did not name `cluster`
@example(path=("train", "data_file"), value="x" * 5000)  # was an OSError (file name too long)
@example(path=("resources", "tasks_per_node"), value=3)  # the message did not name the field
def test_any_value_at_any_key_of_a_spec(path, value):
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        data = {"name": "fuzz", "train": {**BASE_TRAIN, "dataset": "pydoc"}, "resources": {"time": "00:10:00"}}
        spec = Path(tmp) / "fuzz.yaml"
        spec.write_text(yaml.safe_dump(set_path(data, path, value)))
        code, err = run_cli([str(spec), "--dry-run", "--workdir", str(work)])
        check_outcome(code, err, work, path[-1])


PROFILE_BASE = yaml.safe_load(profiles.found("local")[0].read_text())
PROFILE_PATHS = ([(key,) for key in profiles.Profile.model_fields]
                 + [("partitions", "debug")] + [("partitions", "debug", key) for key in profiles.Partition.model_fields]
                 + [("node", key) for key in profiles.Node.model_fields]
                 + [("container", key) for key in profiles.Container.model_fields] + [("env", "SOME_VAR"),
                    ("node", "gpu"), ("container", "imge"), ("partitions", "debug", "max_tme")])  # unknown keys


@SETTINGS
@given(path=st.sampled_from(PROFILE_PATHS), value=ANY_VALUE)
@example(path=("partitions", "debug", "max_time"), value=0)  # a partition of no time at all was accepted
@example(path=("partitions", "debug"), value="fast")  # was an AttributeError
@example(path=("partitions", "debug", "max_nodes"), value="four")  # was a TypeError at the comparison
@example(path=("container", "args"), value="--bind '/a")  # was a ValueError, after files were written
def test_any_value_at_any_key_of_a_cluster_profile(path, value):
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        profile = Path(tmp) / "site.yaml"
        data = yaml.safe_load(yaml.safe_dump(PROFILE_BASE))
        if path[0] == "container":
            data["container"] = {"image": "/images/x.sif"}
        profile.write_text(yaml.safe_dump(set_path(data, path, value)))
        spec = Path(tmp) / "fuzz.yaml"
        spec.write_text(yaml.safe_dump({"name": "fuzz", "cluster": str(profile),
                                        "train": {**BASE_TRAIN, "dataset": "pydoc"}}))
        code, err = run_cli([str(spec), "--dry-run", "--workdir", str(work)])
        check_outcome(code, err, work, *(p for p in path if p != "partitions"), "partitions")


@SETTINGS
@given(name=st.sampled_from(sorted(config.field_info())), text=st.one_of(ANY_VALUE.map(str), st.text(max_size=20)))
@example(name="data_file", text="\x00")
def test_any_value_of_any_trainer_flag(name, text):
    flag = "--" + name.replace("_", "-")
    try:
        config.resolve([flag, text])
    except config.ConfigError as err:  # naming the field, or the argument it could not take as its value
        assert name in str(err) or flag in str(err) or repr(text) in str(err), str(err)


@SETTINGS
@given(flag=st.sampled_from(["--tokens", "--temperature", "--top-k", "--seed", "--device"]),
       text=st.one_of(ANY_VALUE.map(str), st.text(max_size=20)))
def test_any_value_of_any_sample_flag_before_a_run_is_read(flag, text):
    if text.startswith("-"):
        text = " " + text  # (argparse would take it for a flag)
    with tempfile.TemporaryDirectory() as tmp:  # (argparse's own type errors: usage and a message, status 2)
        code, err = main_status(sample.main, ["--run", str(Path(tmp) / "none"), flag, text])
    assert code in (1, 2) and "Traceback" not in err
    assert flag in err or f"--run: {Path(tmp) / 'none'} does not exist" in err or "device" in err


@SETTINGS
@given(key=st.sampled_from(sorted(config.field_info())), value=st.text(max_size=20),
       nproc=st.integers(min_value=-5, max_value=3))
@example(key="data_file", value="\x00", nproc=1)  # was a ValueError (embedded null byte)
@example(key="data_file", value="~0", nproc=1)  # was a RuntimeError (no user `0` to expand ~0 for)
def test_any_set_and_nproc_of_launch(key, value, nproc):
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        corpus = Path(tmp) / "c.txt"
        corpus.write_text(TINY_TEXT)
        spec = Path(tmp) / "fuzz.yaml"
        spec.write_text(yaml.safe_dump({"name": "fuzz", "train": {**BASE_TRAIN, "data_file": str(corpus)}}))
        code, err = run_cli([str(spec), "--dry-run", "--workdir", str(work), "--set", f"{key}={value}",
                             "--nproc", str(nproc)])
        check_outcome(code, err, work, "--nproc" if nproc < 1 else key)


def test_the_fuzz_strategies_reach_the_extremes():
    """The strategies can produce what the properties claim to cover (a check that cannot silently shrink).

    A search with a fixed seed and a budget far above what it needs: the same answer on every run (a random
    `find` with the default budget once missed NaN)."""
    from hypothesis import find

    search = settings(derandomize=True, database=None, max_examples=20_000)
    assert math.isnan(find(ANY_VALUE, lambda v: isinstance(v, float) and math.isnan(v), settings=search))
    assert len(find(ANY_VALUE, lambda v: isinstance(v, str) and len(v) > 1000, settings=search)) == 5000


FLAG_TEXT = st.one_of(ANY_VALUE.map(str), st.text(max_size=20)).map(lambda t: " " + t if t.startswith("-") else t)


def kept_inside(tmp: str, text: str) -> tuple[Path, str]:
    """A folder to run in and `text` as a path the command may write to, both inside `tmp` wherever the drawn text
    points: an absolute path is taken under tmp, and the folder is 40 deep in it, deeper than any run of `..` in
    a drawn text climbs (from tmp itself, "../../etc" was /etc, and tests wrote their sweeps and data there)."""
    here = Path(tmp, *["d"] * 40)
    here.mkdir(parents=True, exist_ok=True)
    path = tmp + text if text.startswith("/") else text
    inside = os.path.realpath(os.path.join(here, path.replace("\x00", ""))) + os.sep
    assert inside.startswith(os.path.realpath(tmp) + os.sep), text  # (the test's own guard)
    return here, path


def any_flag_text(*always: str):
    """Property test of one flag's value: SETTINGS, FLAG_TEXT drawn, and a 5,000-character value and `always`
    tried every time."""
    def decorate(test):
        for text in ("x" * 5000, *always):
            test = example(text=text)(test)
        return SETTINGS(given(text=FLAG_TEXT)(test))
    return decorate


@SETTINGS
@given(flag=st.sampled_from(["name", "--data-file", "--data-dir"]), text=FLAG_TEXT)
@example(flag="--data-dir", text="x" * 5000)
@example(flag="--data-file", text="/dev/zero")
@example(flag="--data-file", text="/")
@example(flag="--data-dir", text="../../etc")
def test_any_value_of_any_data_flag(flag, text):
    from tinygpt import data

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "c.txt"
        corpus.write_text(TINY_TEXT)
        here, data_dir = kept_inside(tmp, text)  # (prepare writes where --data-dir says)
        argv = {"name": ["prepare", text, "--data-file", str(corpus)],
                "--data-file": ["prepare", "--data-file", text, "--data-dir", str(Path(tmp) / "out")],
                "--data-dir": ["prepare", "--data-file", str(corpus), "--data-dir", data_dir]}[flag]
        with contextlib.chdir(here):
            code, err = main_status(data.main, argv)
        if code == 0:
            return
        assert code in (1, 2) and "Traceback" not in err, err
        assert flag.lstrip("-").replace("-", "_") in err or flag in err or "corpus" in err, err
        if flag == "--data-file":
            assert not (Path(tmp) / "out").exists() or not any((Path(tmp) / "out").rglob("*.bin"))


@any_flag_text("/dev/null")
def test_any_value_of_the_report_run_flag(text):
    from tinygpt import report

    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        code, err = main_status(report.main, ["--run", text])
        assert code in (1, 2) and "Traceback" not in err, err  # no run directory anywhere here
        assert "config.yaml" in err or "--run" in err, err
        assert not any(Path(tmp).iterdir())  # nothing written


COMMAND_FLAGS = {"status": ["--interval", "--workdir"], "cancel": ["--run", "--workdir"],
                 "report": ["--prompt", "--workdir"], "sync": ["--workdir"], "logs": ["--tail", "--workdir"],
                 "resubmit": ["--states", "--time", "--mem", "--exclude", "--workdir"]}


@SETTINGS
@given(command=st.sampled_from(sorted(COMMAND_FLAGS)), which=st.integers(0, 5), text=FLAG_TEXT)
@example(command="status", which=0, text="nan")
@example(command="status", which=2, text="\x00")
def test_any_value_of_any_flag_of_the_launch_commands(command, which, text):
    """status, cancel, report, sync, logs and resubmit before anything was launched: each says what is missing."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "fuzz.yaml"
        spec.write_text(yaml.safe_dump({"name": "fuzz"}))
        flags = COMMAND_FLAGS[command]
        if which >= len(flags):  # the spec argument itself
            argv = [command, text, "--workdir", tmp]
        else:
            argv = [command, str(spec), "--workdir", tmp] + [flags[which], text]
        code, err = main_status(cli.main, argv)
        assert code in (1, 2) and "Traceback" not in err, err
        assert any(word in err for word in ("manifest", "spec", "name", "--", repr(text), text.strip())), err
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["fuzz.yaml"]  # nothing written


@any_flag_text("\x00", "../../etc", "/")
def test_any_workdir_of_launch(text):
    with tempfile.TemporaryDirectory() as tmp:
        here, workdir = kept_inside(tmp, text)  # (a dry run writes its jobs/ and logs/ where --workdir says)
        spec = Path(tmp) / "fuzz.yaml"
        spec.write_text(yaml.safe_dump({"name": "fuzz", "train": {**BASE_TRAIN, "dataset": "pydoc"}}))
        before = set(Path(tmp).rglob("*"))
        with contextlib.chdir(here):
            # (--no-snapshot: the workdir's folders and files are made all the same, without reading the
            # checkout's every file again for each example)
            code, err = main_status(cli.main, [str(spec), "--dry-run", "--no-snapshot", "--workdir", workdir])
        assert code in (0, 1) and "Traceback" not in err, err
        if code == 1:
            assert "workdir" in err, err
            assert set(Path(tmp).rglob("*")) == before  # nothing written


SEARCH_BASE = {"method": "random", "trials": 3, "seed": 0, "params": {"lr": {"loguniform": [1.0e-4, 1.0e-3]}}}
SEARCH_PATHS = [("search",), ("search", "method"), ("search", "trials"), ("search", "seed"), ("search", "params"),
                ("search", "params", "lr"), ("search", "params", "lr", "loguniform"), ("search", "workers"),
                ("search", "sampler"), ("search", "pruner"), ("search", "params", "n_layer")]


@SETTINGS
@given(path=st.sampled_from(SEARCH_PATHS), value=ANY_VALUE, optuna=st.booleans())
def test_any_value_at_any_key_of_a_search(path, value, optuna):
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        search = {**SEARCH_BASE, **({"method": "optuna", "workers": 2} if optuna else {})}
        data = {"name": "fuzz", "train": {**BASE_TRAIN, "dataset": "pydoc", "min_lr": 1.0e-6},
                "search": yaml.safe_load(yaml.safe_dump(search))}
        spec = Path(tmp) / "fuzz.yaml"
        spec.write_text(yaml.safe_dump(set_path(data, path, value)))
        code, err = run_cli([str(spec), "--dry-run", "--workdir", str(work)])
        check_outcome(code, err, work, "search")
