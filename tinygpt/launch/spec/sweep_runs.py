"""A sweep's runs from its points: each named by what makes it differ, given its trainer inputs (the sweep's shared
ones once, its own beside them), and checked against the trainer's schema at the cost of the sweep's distinct
values rather than of its runs.

A grid of 1,000 seeds by 100 learning rates is 1,100 checks here, not 100,000 whole configs: the keys whose
values differ between runs fall into groups, those a rule between keys reads together (config.RULES: min_lr with
lr, n_embd with n_head) in one group, every other key alone; a config is valid exactly when, for each group, the
shared inputs with that group's values are, so each group is checked once per distinct combination of its values.
A run that some group's check refuses is then checked whole, so that its messages are those of its own config,
every one, as if nothing were remembered. A run's whole config (`Run.config`) is built only when asked for.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinygpt.base import config as train_config
from tinygpt.base.config import ConfigError
from tinygpt.launch.layout import NAMING, check_safe_name, joined, pair, unwritable_dir

MISSING = object()  # a key a run does not give (its value is the shared one, or the trainer's default)


@dataclass(frozen=True, slots=True)
class Run:
    index: int
    name: str
    point: dict[str, Any]  # the values that make this sweep point, as the spec gives them
    own: dict[str, Any]  # its trainer inputs that differ between the sweep's runs
    shared: dict[str, Any]  # the trainer inputs every run of the sweep has (one dict for all of them)
    out_dir: str
    max_steps: int | None  # (validated: what status and reports measure progress against; None: not ours)

    @property
    def inputs(self) -> dict[str, Any]:
        """What the trainer's config is built from."""
        return {**self.shared, **self.own, "out_dir": self.out_dir}

    @property
    def config(self) -> train_config.TrainConfig:
        """The run's whole trainer config, validated (built anew on each call)."""
        return train_config.build(self.inputs)


_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def _value_token(key: str, value: Any, naming: int = NAMING) -> str:
    """The part of a run name that one value contributes."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = repr(value)
    elif key in ("data_file", "data_dir") and value is not None:
        text = Path(str(value)).stem  # a path: its file name is the readable part
    else:
        text = str(value)
    if naming >= 2 and (_UNSAFE.search(text) or ".." in text):
        text = f"{_UNSAFE.sub('-', text).replace('..', '.')}-{hashlib.sha256(text.encode()).hexdigest()[:6]}"
    return text


def run_name(point: dict[str, Any], naming: int = NAMING) -> str:
    if not point:
        return "base"
    return joined([pair(key, _value_token(key, value, naming), naming) for key, value in point.items()], naming)


def name_keys(points: list[tuple[str | None, dict[str, Any]]], base: dict[str, Any]) -> list[str]:
    """The keys whose value differs between points: names are built from those alone, so a run's name says
    what makes it different."""
    return [k for k in dict.fromkeys(k for _, p in points for k in p)
            if _differs((repr(p.get(k, base.get(k))) for _, p in points))]


def _differs(values) -> bool:
    first = next(values, None)
    return any(value != first for value in values)


def make(points: list[tuple[str | None, dict[str, Any]]], grid_size: int, varying: list[str], base: dict[str, Any],
         forced: dict[str, Any], runs_dir: str, problems: list[str], naming: int = NAMING) -> list[Run]:
    """Each point named (from the `varying` keys, as `naming` says), given its inputs (`base` < point < `forced`,
    and its out_dir) and checked; what is wrong is added to `problems`, and a run with a problem in its name is
    left out."""
    labelled = _labelled(points, grid_size, varying, len(points) == 1, problems, naming)
    if not labelled:
        return []
    own_keys, shared = _split(labelled, base, forced)
    paths = _Paths(shared)  # (makes the shared paths absolute)
    check = _Checker(shared, f"{runs_dir}/{labelled[0][1]}", own_keys)
    runs = []
    for index, label, point in labelled:
        own = paths.resolved({k: point[k] for k in own_keys if k in point}, label, problems)
        out_dir = f"{runs_dir}/{label}"
        max_steps = check(own, out_dir, label, problems)
        if max_steps is not None:
            runs.append(Run(index, label, point, own, shared, out_dir, max_steps))
    return runs


def make_plain(points: list[tuple[str | None, dict[str, Any]]], grid_size: int, varying: list[str],
               base: dict[str, Any], forced: dict[str, Any], runs_dir: str, problems: list[str],
               naming: int = NAMING) -> list[Run]:
    """`make` for a program that is not the trainer: each point named and given its values (`base` < point <
    `forced`), which the caller checks as the spec declares them."""
    labelled = _labelled(points, grid_size, varying, len(points) == 1, problems, naming)
    if not labelled:
        return []
    own_keys, shared = _split(labelled, base, forced)
    return [Run(index, label, point, {k: point[k] for k in own_keys if k in point}, shared, f"{runs_dir}/{label}",
                None) for index, label, point in labelled]


def _split(labelled: list[tuple[int, str, dict[str, Any]]], base: dict[str, Any], forced: dict[str, Any]
           ) -> tuple[list[str], dict[str, Any]]:
    """The keys whose values differ between the runs (each run's own), and the inputs every run shares (`base` <
    the points' common values < `forced`)."""
    own_keys = [k for k in dict.fromkeys(k for _, _, p in labelled for k in p) if k not in forced
                and _differs((repr(p.get(k, MISSING)) for _, _, p in labelled))]
    return own_keys, {**base, **{k: v for k, v in labelled[0][2].items() if k not in own_keys}, **forced}


def _labelled(points, grid_size: int, varying: list[str], alone: bool, problems: list[str], naming: int
              ) -> list[tuple[int, str, dict[str, Any]]]:
    """(index, name, point) of each point whose name can be used and is not taken."""
    seen: dict[str, int] = {}
    out = []
    for index, (given, point) in enumerate(points):
        label = given if given is not None else run_name({k: v for k, v in point.items() if k in varying or alone},
                                                         naming)
        where = f"runs[{index - grid_size}]" if index >= grid_size else f"grid point {index}"
        if not check_safe_name(label, f"{where} name", problems):
            continue
        if label in seen:
            problems.append(f"{where}: run name `{label}` is used twice (also by run {seen[label]}); give the runs "
                            f"different values or explicit `name`s")
            continue
        seen[label] = index
        out.append((index, label, point))
    return out


class _Checker:
    """Checks a run's inputs (`shared` with its own) group by group, each distinct combination of a group's
    values once; answers the run's validated max_steps, or None when its config has problems (then named).

    Every run's out_dir is the runs' folder and a name that passed check_safe_name, so one of them (`out_dir`)
    stands for all in the group checks: the path checks (not empty, a `~` naming a user) read only the folder."""

    def __init__(self, shared: dict[str, Any], out_dir: str, own_keys: list[str]):
        self.shared = {**shared, "out_dir": out_dir}
        self.groups = _groups(own_keys) or [()]
        self.seen: dict[tuple, train_config.TrainConfig | None] = {}
        self.steps_group = next((g for g in self.groups if "max_steps" in g), self.groups[0])

    def __call__(self, own: dict[str, Any], out_dir: str, label: str, problems: list[str]) -> int | None:
        configs = {group: self._checked(group, own) for group in self.groups}
        if all(configs.values()):
            return configs[self.steps_group].optim.max_steps
        # Refused by a group's check: the whole config, for exactly its own messages. (It may yet pass: a group
        # is checked with the trainer's defaults for the other groups' keys.)
        try:
            return train_config.build({**self.shared, **own, "out_dir": out_dir}).optim.max_steps
        except ConfigError as err:
            problems.extend(f"run `{label}`: {p}" for p in err.problems)
            return None

    def _checked(self, group: tuple[str, ...], own: dict[str, Any]) -> train_config.TrainConfig | None:
        values = tuple(repr(own.get(k, MISSING)) for k in group)
        if (group, values) not in self.seen:
            try:
                config = train_config.build({**self.shared, **{k: own[k] for k in group if k in own}})
            except ConfigError:
                config = None
            self.seen[group, values] = config
        return self.seen[group, values]


def _groups(keys: list[str]) -> list[tuple[str, ...]]:
    """`keys` in groups: two keys that a rule reads together (config.RULES) are in one group."""
    group_of = {k: {k} for k in keys}
    for key, others in train_config.RULES.items():
        together = [k for k in (key, *others) if k in group_of]
        merged = set().union(*(group_of[k] for k in together))
        for k in merged:
            group_of[k] = merged
    return list(dict.fromkeys(tuple(k for k in keys if k in group) for group in group_of.values()))


PATH_CHECKS = ("data_file", "resume", "data_dir")  # in the order their problems are named


class _Paths:
    """The files a run reads made absolute and checked (data_file, a resume checkpoint), and whether its data_dir
    can be written in: each distinct value once, and each run that has a problem named with it."""

    def __init__(self, shared: dict[str, Any]):
        self.seen: dict[tuple[str, str], tuple[Any, Callable[[str], str] | None]] = {}
        self.shared_problems = {}
        for key in PATH_CHECKS:
            if key in shared:
                shared[key], self.shared_problems[key] = self._checked(key, shared[key])

    def resolved(self, own: dict[str, Any], label: str, problems: list[str]) -> dict[str, Any]:
        """`own`, its paths made absolute; the problems of the paths the run reads named with its `label`."""
        for key in PATH_CHECKS:
            if key in own:
                own[key], problem = self._checked(key, own[key])
            else:
                problem = self.shared_problems.get(key)
            if problem is not None:
                problems.append(problem(label))
        return own

    def _checked(self, key: str, value: Any) -> tuple[Any, Callable[[str], str] | None]:
        if key == "data_dir":
            check = _writable if isinstance(value, str) and "\x00" not in value else None
        elif key == "resume":
            check = _input_file if value not in (None, "auto", "never") else None
        else:
            check = _input_file if value else None
        if check is None:
            return value, None
        if (key, repr(value)) not in self.seen:
            self.seen[key, repr(value)] = check(key, value)
        return self.seen[key, repr(value)]


def _writable(key: str, data_dir: str) -> tuple[str, Callable[[str], str] | None]:
    problem = unwritable_dir(Path(os.path.abspath(os.path.expanduser(data_dir))))
    if problem is None:
        return data_dir, None
    return data_dir, lambda label: (f"run `{label}`: data_dir: {data_dir!r} cannot hold the prepared data "
                                    f"({problem}); give a directory you can write to")


def _input_file(key: str, value: Any) -> tuple[str, Callable[[str], str] | None]:
    """The absolute path of a file a run reads (`data_file`, a `resume` checkpoint), checked to exist (a data
    file to hold something): the job may start elsewhere, and every run would fail on it. With the problem,
    given the run's name."""
    try:
        file = Path(str(value)).expanduser()
    except RuntimeError:  # ~user of no user here: the trainer's config check says so
        return str(value), None
    if not file.is_absolute():
        file = Path.cwd() / file
    try:
        file.stat()
    except (OSError, ValueError) as err:  # (ValueError: a NUL character, which the config check names)
        if not isinstance(err, FileNotFoundError):
            why = getattr(err, "strerror", None) or err
            return str(file), lambda label: f"run `{label}`: {key}: {value!r} cannot be used ({why}); check the path"
    if not file.is_file():
        return str(file), lambda label: (f"run `{label}`: {key}: {value} does not exist; check the path "
                                         f"(relative paths start at {Path.cwd()})")
    if key == "data_file" and file.stat().st_size == 0:
        return str(file), lambda label: f"run `{label}`: data_file: {value} is empty; give a file with text in it"
    return str(file), None
