"""A sweep's runs are checked at the cost of its distinct values (sweep_runs.py), and say exactly what checking
each run's whole config says: the same runs, configs, and messages in the same order."""

from __future__ import annotations

import inspect
import itertools
import re
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from tinygpt.base import config
from tinygpt.base.config import ConfigError
from tinygpt.launch.layout import name_problem, unwritable_dir
from tinygpt.launch.spec import sweep_runs

RUNS_DIR = "/w/runs/s"
VALUES = {  # per key, good values and bad ones, and values that break a rule between keys
    "lr": [1e-3, 1e-4, -1, "x"], "min_lr": [1e-5, 5e-4, 2e-3], "n_head": [2, 3, 4, 0], "n_embd": [48, 64, 10],
    "seed": [1, 2, -3], "max_steps": [10, 20.0, 0, 2.5], "dropout": [0.0, 1.5], "data_dir": ["/tmp/d", "", "/proc/no"],
}


def whole(points, varying, base, forced):
    """What checking each run's whole config gives, as the launcher did before it remembered checks (4eeb716):
    ({name: config}, problems), the problems of the names first."""
    configs, problems, names = {}, [], []
    for point in points:
        name = sweep_runs.run_name({k: v for k, v in point.items() if k in varying or len(points) == 1})
        if problem := name_problem(name):
            problems.append(f"grid point {len(names)} name: {problem}")
        names.append(None if problem else name)
    for name, point in zip(names, points):
        if name is None:
            continue
        merged = {**base, **point, **forced, "out_dir": f"{RUNS_DIR}/{name}"}
        if isinstance(merged.get("data_dir"), str) and (why := unwritable_dir(Path(merged["data_dir"]).absolute())):
            problems.append(f"run `{name}`: data_dir: {merged['data_dir']!r} cannot hold the prepared data ({why}); "
                            f"give a directory you can write to")
        try:
            configs[name] = config.build(merged)
        except ConfigError as err:
            problems += [f"run `{name}`: {p}" for p in err.problems]
    return configs, problems


@example(grid={"lr": 2, "min_lr": 3}, base={}, forced={})  # (both keys of a rule vary: checked together)
@example(grid={"n_head": 3, "n_embd": 3, "seed": 2}, base={}, forced={})
@given(grid=st.dictionaries(st.sampled_from(sorted(VALUES)), st.integers(1, 3), min_size=1, max_size=3),
       base=st.dictionaries(st.sampled_from(sorted(VALUES)), st.integers(0, 3), max_size=2),
       forced=st.dictionaries(st.sampled_from(sorted(VALUES)), st.integers(0, 3), max_size=1))
def test_checking_distinct_values_says_what_checking_each_run_says(grid, base, forced):
    pick = lambda key, i: VALUES[key][i % len(VALUES[key])]  # noqa: E731
    lists = {key: [pick(key, i) for i in range(min(n, len(VALUES[key])))] for key, n in grid.items()}
    points = [dict(zip(lists, combo)) for combo in itertools.product(*lists.values())]
    base = {k: pick(k, i) for k, i in base.items()}
    forced = {k: pick(k, i) for k, i in forced.items()}
    varying = sweep_runs.name_keys([(None, p) for p in points], base)
    problems = []
    runs = sweep_runs.make([(None, p) for p in points], len(points), varying, base, forced, RUNS_DIR, problems)
    configs, expected = whole(points, varying, base, forced)
    assert problems == expected
    assert {run.name: run.config for run in runs} == configs
    assert [run.max_steps for run in runs] == [c.optim.max_steps for c in configs.values()]


def test_a_grid_is_checked_once_per_distinct_value(monkeypatch):
    built = []
    real_build = config.build
    monkeypatch.setattr(config, "build", lambda inputs, *a: built.append(inputs) or real_build(inputs, *a))
    points = [(None, {"seed": s, "lr": lr}) for s in range(1, 51) for lr in (1e-3, 2e-3, 3e-3, 4e-3)]
    problems = []
    runs = sweep_runs.make(points, len(points), ["seed", "lr"], {"min_lr": 1e-5}, {}, RUNS_DIR, problems)
    assert problems == [] and len(runs) == 200
    assert len(built) == 50 + 4  # (the seeds' 50 values, the learning rates' 4)


def test_the_rules_table_names_every_validator_that_reads_other_keys():
    """A validator that reads `info.data` is a rule between keys: config.RULES must list it, or a sweep would check
    its keys apart."""
    reading = set()
    for holder in config.TrainConfig.model_fields.values():
        for validator in holder.annotation.__pydantic_decorators__.field_validators.values():
            if "info.data" in inspect.getsource(validator.func):
                reading.update(validator.info.fields)
    assert reading == set(config.RULES)


@given(st.lists(st.one_of(st.text(max_size=8), st.integers(), st.floats(allow_nan=False), st.booleans()),
                min_size=1, max_size=6, unique_by=repr))
@example(["a b", "a,b", "a=b", "a_b", "x/../y", "ü", 0.001, 1e-3 * 3])
def test_a_runs_name_is_safe_in_a_key_value_word_and_in_a_path_and_says_its_value(values):
    """Whatever a value holds, the name our naming gives a run has letters, digits and `. _ + -` alone (no `=`, `,`
    or space for a `--key=value` configurator to split on, no `/` or `..`), a value that was already such is
    written as it is, and two values never share a name."""
    names = [sweep_runs.run_name({"v": value}) for value in values]
    assert len(set(names)) == len(names)
    for value, name in zip(values, names):
        assert not set(name) - set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-") and ".." \
            not in name, name
        said = {True: "true", False: "false"}.get(value) if isinstance(value, bool) else repr(value) \
            if isinstance(value, float) else str(value)
        safe = re.fullmatch(r"[A-Za-z0-9._+-]*", said) and ".." not in said
        assert name == f"v-{said}" if safe else re.fullmatch(r"v-.*-[0-9a-f]{6}", name), (value, name)
    assert sweep_runs.run_name({"n_layer": 2, "lr": 0.001}) == "n_layer-2_lr-0.001"
    assert sweep_runs.run_name({"n_layer": 2, "lr": 0.001}, naming=1) == "n_layer=2,lr=0.001"  # (a sweep of before)
