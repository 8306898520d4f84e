r"""A spec's `command:`: a training program of the user's instead of ours, each run's values put into its words.

    command:
      argv: [python, train.py, --lr, "{lr}", --epochs, "{epochs}", --out, "{run_dir}"]
      values: {epochs: 3}                      # every run's values (grid, runs and search over them)
      params:                                  # how a value is checked (none: taken as written)
        lr: {type: float, min: 0, max: 1}
        epochs: {type: int, min: 1}
      project: .                               # the folder whose files the jobs run (default: see below)
      include: [data/shakespeare_char/*.bin]   # files the snapshot takes beside git's (data git ignores)
      resume:                                  # a program that resumes only when told (nanoGPT):
        when: "{run_dir}/ckpt.pt"              #   once a life finds this file, which the program wrote,
        add: [--init_from=resume]              #   it is started with these words after its others
                                               # (Hugging Face: when: checkpoint-*, the newest folder,
                                               #  add: [--resume_from_checkpoint, "{resume}"], its path)
      progress:                                # a program that prints its losses instead of writing JSON:
        - 'step (?P<step>\d+): train loss (?P<train_loss>[\d.]+), val loss (?P<val_loss>[\d.]+)'
      signal: USR1                             # sent before the time limit (default: the profile's)
      heartbeat_s: 600                         # a run whose heartbeat is older than this is hung
      max_requeues: 20                         # a run asks to be requeued at most this many times
      start: tasks                             # or torchrun: once per node, its workers one per task

`{name}` in a word is the run's value of `name` (a word may hold several, and text around them; `{{` and `}}`
are braces; a value is given as the spec writes it: `0755`, `on`, `1.10` stay so, base/schema.load_yaml);
`{run_dir}`, `{run_name}` and `{sweep}` are the launcher's (a run's name and directory hold letters,
digits and `. _ + -` alone: safe in any `--key=value` word). `resume` is keyed on a file the program wrote, not on
the life's number, so a life killed before the first save starts fresh again. `progress` patterns are read on the
node as the program prints (each line, unbuffered: PYTHONUNBUFFERED=1), each match a record of its named groups in
the run's metrics.jsonl, what `status`, `report`, an Optuna search and the retry summary read; a pattern that
matched no line of a life is said in the log. A word stays one word whatever the
value holds: the program is started with these words, never through a shell. The keys are the user's, checked as
`params` declares them. `project` defaults to the git work tree that holds the spec, else the spec's folder; its
files as they are at launch are what the jobs run (node/supervise.py says how a run starts and what it is told).
"""

from __future__ import annotations

import math
import re
import string
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tinygpt.base import schema
from tinygpt.base.config import Signal
from tinygpt.base.schema import Int, OptFloat, OptInt, OptText, Text

LAUNCHER_VALUES = {"run_dir": "the run's directory", "run_name": "the run's name", "sweep": "the sweep's name",
                   "resume": "in resume.add, the path a life resumes from"}
DEFAULT_MAX_REQUEUES = 20
TYPES = {"int": int, "float": float, "str": str, "bool": bool}


class Param(schema.Schema):
    """How one of the program's values is checked."""

    type: Literal["int", "float", "str", "bool"] | None = Field(None, description="int, float, str or bool")
    min: OptFloat = Field(None, description="the smallest value allowed")
    max: OptFloat = Field(None, description="the largest value allowed")
    choices: list[Any] | None = Field(None, min_length=1, description="the values allowed, and no other")


class Resume(schema.Schema):
    """What a life of a run that has something to resume from adds to its words."""

    when: Text = Field(description=(
        "a file the program writes when it saves, e.g. ckpt.pt (relative: in the run's directory), or a glob of "
        "the folders it numbers, e.g. checkpoint-* (the last in natural order counts); once a life finds it, it "
        "resumes"))
    add: list[Text] = Field(min_length=1, description=(
        "the words added after the others, e.g. [--init_from=resume]; {resume} is the path found, e.g. "
        "[--resume_from_checkpoint, '{resume}']"))

    @field_validator("add")
    @classmethod
    def _words(cls, add: list[str]) -> list[str]:
        return check_words(["program", *add], "add")[1:]


class CommandSpec(schema.Schema):
    """A program of the user's that each run starts, with its values in its words."""

    argv: list[Text] = Field(min_length=1, description=(
        "the program and its arguments; `{key}` puts a run's value in, `{run_dir}` its directory"))
    values: dict[str, Any] = Field(default_factory=dict, description="every run's values, under grid, runs and "
                                                                     "search's")
    params: dict[str, Param] = Field(default_factory=dict, description="how each value is checked: type, min, "
                                                                       "max, choices")
    project: OptText = Field(None, description=(
        "the folder whose files the jobs run, as they are at launch (default: the git work tree that holds the "
        "spec, else the spec's folder)"))
    resume: Resume | None = Field(None, description=(
        "for a program that resumes only when told: the words a life adds once a file the program wrote exists"))
    progress: list[Text] = Field(default_factory=list, description=(
        "regular expressions over the lines the program prints, each with a (?P<step>...) group and a group per "
        "value (?P<val_loss>...): each match is a record of the run's metrics.jsonl"))
    include: list[Text] = Field(default_factory=list, description=(
        "globs, relative to the project, of files its snapshot takes beside git's tracked ones (data that git "
        "ignores, e.g. data/shakespeare_char/*.bin); data that stays where it is on the cluster's shared file "
        "system is named by its absolute path in argv instead"))
    signal: Signal | None = Field(None, description=(
        "the signal the program is sent before the time limit (default: the profile's signal); a program that "
        "handles its own, e.g. USR1 for PyTorch Lightning's SLURMEnvironment, which then saves and requeues the "
        "job itself"))
    heartbeat_s: OptInt = Field(None, ge=2, description=(
        "a run whose heartbeat file ($TINYGPT_HEARTBEAT) is older than this many seconds is hung, and stopped"))
    max_requeues: Int = Field(DEFAULT_MAX_REQUEUES, ge=0, le=10_000, description=(
        "how many times a run may ask to be requeued (exit status 75)"))
    start: Literal["tasks", "torchrun"] = Field("tasks", description=(
        "tasks: one process of the program per task (resources.tasks_per_node on each node), told RANK, WORLD_SIZE, "
        "LOCAL_RANK, MASTER_ADDR and MASTER_PORT; torchrun: torchrun once per node, which starts tasks_per_node "
        "workers and joins the nodes with its c10d rendezvous (torch must be on the nodes)"))

    @model_validator(mode="before")
    @classmethod
    def _words_alone(cls, data: Any) -> Any:
        """`command: [python, train.py, ...]` is `command: {argv: [...]}`; one text is no program's words."""
        if isinstance(data, list):
            return {"argv": data}
        if isinstance(data, str):
            raise ValueError(f"{data!r} is one text, and a program is started with its words, never through a "
                             f"shell: write them as a list, command: [{', '.join(data.split()[:3]) or 'python'}, ...], "
                             f"or command: {{argv: [...]}}")
        return data

    @field_validator("argv")
    @classmethod
    def _words(cls, argv: list[str]) -> list[str]:
        if "resume" in placeholders(argv):
            raise ValueError("{resume} is the path a resumed life found: use it in resume.add, which such a life "
                             "adds, e.g. resume: {when: checkpoint-*, add: [--resume_from_checkpoint, '{resume}']}")
        return check_words(argv, "argv")

    @field_validator("progress")
    @classmethod
    def _patterns(cls, progress: list[str]) -> list[str]:
        for i, pattern in enumerate(progress):
            try:
                groups = re.compile(pattern).groupindex
            except re.error as err:
                raise ValueError(f"progress[{i}]: {pattern!r} is not a regular expression ({err})") from None
            if "step" not in groups or len(groups) < 2:
                raise ValueError(f"progress[{i}]: {pattern!r} needs a (?P<step>\\d+) group for the step and one "
                                 f"named group per value, e.g. val loss (?P<val_loss>[\\d.]+)")
        return progress

    def words_of_later_lives(self) -> list[str]:
        """Every word a run's lives may start with: what its placeholders must have values for."""
        return [*self.argv, *([self.resume.when, *self.resume.add] if self.resume else [])]


def check_words(argv: list[str], field: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    """A program's words as a field gives them (`field[i]`), or a ValueError: a NUL, a placeholder that is not one
    (or not among `allowed`), a program that is not a plain name or path."""
    for i, word in enumerate(argv):
        if "\0" in word:
            raise ValueError(f"{field}[{i}] holds a NUL character, which no program can be given")
        unknown = [n for n in names(word, f"{field}[{i}]") if allowed is not None and n not in allowed]
        if unknown:
            raise ValueError(f"{field}[{i}]: {{{unknown[0]}}} is not one of "
                             f"{', '.join('{' + n + '}' for n in allowed)}")
    if argv and (not argv[0].strip() or "{" in argv[0]):
        raise ValueError(f"{field}[0] is the program: a name or path, without placeholders")
    return argv


def names(word: str, where: str) -> list[str]:
    """The placeholders in `word`; a ValueError naming `where` for a brace that opens none."""
    try:
        parts = list(string.Formatter().parse(word))
    except ValueError as err:
        raise ValueError(f"{where}: {word!r}: {err} (a placeholder is a name in braces, {{lr}}; write {{{{ and "
                         f"}}}} for a brace)") from None
    found = []
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(f"{where}: {{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}"
                             f" is not a placeholder; write a value's name in braces, e.g. {{lr}}")
        found.append(name)
    return found


def placeholders(argv: list[str]) -> set[str]:
    return {name for i, word in enumerate(argv) for name in names(word, f"argv[{i}]")}


def check_run(command: CommandSpec, values: dict[str, Any], where: str) -> list[str]:
    """What is wrong with one run's values: a placeholder without a value, a value its `params` refuse."""
    problems = [f"{where}: `{key}` is set by the launcher ({why}); remove it" for key, why in LAUNCHER_VALUES.items()
                if key in values]
    missing = sorted(placeholders(command.words_of_later_lives()) - values.keys() - LAUNCHER_VALUES.keys())
    if missing:
        problems.append(f"{where}: no value for {', '.join('{' + m + '}' for m in missing)} in command.argv; give it "
                        f"in command.values, the grid or the run")
    for key, value in values.items():
        if key in command.params and (why := refusal(value, command.params[key])):
            problems.append(f"{where}: {key}: {why}")
        elif not isinstance(value, (str, int, float, bool)) or isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{where}: {key}: {value!r} is not a word a program can be given; give a number, a "
                            f"truth value or a text")
        elif isinstance(value, str) and "\0" in value:
            problems.append(f"{where}: {key}: {value!r} holds a NUL character, which no program can be given")
    return problems


def set_problems(command: CommandSpec, forced: dict[str, Any], varying: set[str]) -> list[str]:
    """What is wrong with `--set` values: a key that no word of the program uses (it would be dropped), or one the
    grid, runs or search give each run (the runs would be named after values they do not get)."""
    used = placeholders(command.words_of_later_lives())
    problems = []
    for key in forced:
        if key in varying:
            problems.append(f"--set {key}: `{key}` differs between the sweep's runs, which are named after it; change "
                            f"it in the spec's grid, runs or search instead")
        elif key not in used:
            problems.append(f"--set {key}: no word of command.argv has {{{key}}}, so no run would get it; give a "
                            f"value the program's words use ({', '.join(sorted(used)) or 'none has a placeholder'})")
    return problems


def refusal(value: Any, param: Param) -> str | None:
    """Why `param` refuses `value`, or None."""
    if param.type is not None:
        wanted = TYPES[param.type]
        if wanted is float:  # (a whole number is a float too; a truth value is neither; YAML 1.1 reads 1e-3 as text)
            value = _number(value)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else:
            ok = isinstance(value, wanted) and (wanted is bool or not isinstance(value, bool))
        if not ok:
            return f"expected {param.type}, got {value!r}"
    if param.choices is not None and value not in param.choices:
        return f"{value!r} is not one of {', '.join(map(repr, param.choices))}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if param.min is not None and value < param.min:
            return f"must be >= {param.min:g}, got {value!r}"
        if param.max is not None and value > param.max:
            return f"must be <= {param.max:g}, got {value!r}"
    return None


def _number(value: Any) -> Any:
    """A text that Python reads as a number (`1e-3`, which YAML 1.1 leaves a text) as that number, for the checks;
    the program is given the word as written."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def project_root(project: str | None, spec_path: Path) -> Path:
    """The folder whose files the jobs run: `project` (relative to the spec's folder), else the git work tree
    that holds the spec, else the spec's folder."""
    here = spec_path.resolve().parent
    if project is not None:
        return (here / Path(project).expanduser()).resolve()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return folder
    return here


SCRIPTS = (".py", ".sh", ".bash")  # a word naming one of these is code the job runs, not data it reads


def project_problems(argv: list[str], root: Path) -> list[str]:
    """What is wrong with the project and the program in it: a folder that is not there, a program given by a
    path that is not in it, a script outside it (the jobs would run it as it is when they start)."""
    if not root.is_dir():
        return [f"command.project: {root} is not a folder; name the folder of your program (relative to the spec's)"]
    problems = []
    if "/" in argv[0] and not Path(argv[0]).is_absolute() and not (root / argv[0]).is_file():
        problems.append(f"command.argv[0]: {argv[0]} is not a file of the project {root}; give the program's path "
                        f"in it, or a name on the nodes' PATH")
    real_root = root.resolve()
    for i, word in enumerate(argv):
        text = path_in(word)
        if not text or "{" in text or "\0" in text:
            continue
        path = Path(text)
        inside = (root / path).resolve()
        if not path.is_absolute() and inside != real_root and real_root not in inside.parents and (
                inside.exists() or ".." in path.parts):
            problems.append(f"command.argv[{i}]: {text} leads out of the project {root}, and the jobs start in its "
                            f"snapshot, where it names nothing; give its absolute path, or move it into the project")
        elif path.is_absolute() and path.suffix in SCRIPTS and path.is_file() and \
                real_root not in path.resolve().parents:
            problems.append(f"command.argv[{i}]: {text} is outside the project {root}: the jobs would run it as it "
                            f"is when each starts, not as it was at launch; move it into the project, or set "
                            f"command.project to its folder")
    return problems


def path_in(word: str) -> str:
    """The path a word of argv may name: the word, or the value of an `--option=path` word."""
    return word.partition("=")[2] if word.startswith("-") else word


def included_problems(root: Path, include: list[str], field: str) -> list[str]:
    """An `include` glob that is not inside the project, or matches no file there (the jobs would miss what it
    names)."""
    problems = []
    for i, pattern in enumerate(include):
        if Path(pattern).is_absolute() or ".." in Path(pattern).parts or not pattern.strip("./"):
            problems.append(f"{field}[{i}]: {pattern!r} is not inside the project; give a glob relative to "
                            f"{root}, or name a file outside it by its absolute path in argv (it stays where it is)")
        elif root.is_dir() and not any(p.is_file() for p in root.glob(pattern)):
            problems.append(f"{field}[{i}]: {pattern} matches no file of the project {root}; prepare the data "
                            f"first, or fix the glob")
    return problems
