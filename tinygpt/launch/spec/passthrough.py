"""The Slurm options a spec or profile passes through as they are: extra `#SBATCH` lines and `srun` arguments.

    sbatch_options: {reservation: maint-window, mail-type: END, exclusive: true}
    srun_args: [--cpu-bind=cores]

A site needs a line the launcher cannot know (a reservation, mail, exclusive nodes, a licence); these
keys give it, checked here: long option names only, one value each (true for a flag), no line breaks,
and never an option the launcher sets itself (the array, the logs, the signal, requeueing, the job
name, dependencies) or one the spec's `resources` already has a key for, nor any prefix of one (sbatch
reads `--hol` as `--hold`). `mail_type` is `mail-type`; both in one mapping is an error. Values are
encoded for sbatch's parser where the backends write them (directives.py). `srun_args` are options
only: the command srun runs is the trainer.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

from tinygpt.base import schema
from tinygpt.launch.slurm import directives
from tinygpt.launch.spec.resources import NAMED_OPTIONS

# Options the launcher writes itself, and why a spec must not.
OWNED = {
    "array": "the sweep's runs make the array",
    "output": "logs go to logs/<sweep>/ (see `launch.py logs`)",
    "error": "logs go to logs/<sweep>/ (see `launch.py logs`)",
    "signal": "set by the profile's `signal` and `signal_lead_s`",
    "requeue": "always on: preempted and timed-out runs resume",
    "no-requeue": "always requeued: preempted and timed-out runs resume",
    "job-name": "the spec's `name`",
    "open-mode": "logs are appended across requeues",
    "dependency": "set by `launch.py SPEC --chain`",
    "chdir": "set by `--workdir`",
    "hold": "use `launch.py SPEC --hold`",
    "parsable": "used by the launcher to read job ids",
    "wrap": "the launcher writes the batch script",
}
# Options with a key of their own under `resources`.
FIRST_CLASS = {
    "nodes": "nodes", "ntasks-per-node": "tasks_per_node", "cpus-per-task": "cpus_per_task", "time": "time",
    "mem": "mem", **{key: key for key in NAMED_OPTIONS}, "gres": "gpus_per_node", "gpus-per-node": "gpus_per_node",
    "gpus": "gpus_per_node", "ntasks": "tasks_per_node",
}
OPTION_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


def _has_break(text: str) -> bool:
    return any(ch in text for ch in "\n\r\x00")


def sbatch_options(raw: Any, where: str, problems: list[str]) -> dict[str, str | None]:
    """{long option: value, None for a flag} from a spec's or profile's `sbatch_options` mapping."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping of long option names to values, e.g. "
                        f"{{reservation: maint, mail-type: END, exclusive: true}}")
        return {}
    options: dict[str, str | None] = {}
    keys: dict[str, str] = {}  # option name -> the key that gave it
    for key, value in raw.items():
        name = str(key).strip().removeprefix("--").replace("_", "-")
        field = f"{where}.{key}"
        owned, first_class = directives.abbreviates(name, OWNED), directives.abbreviates(name, FIRST_CLASS)
        target = owned or first_class  # sbatch takes any unambiguous prefix of a long option: `--hol` is `--hold`
        as_read = f" (sbatch reads `--{name}` as `--{target}`)" if target and target != name else ""
        if not OPTION_NAME.fullmatch(name) or len(name) < 2:
            problems.append(f"{field}: {key!r} is not a long sbatch option name (e.g. reservation, mail-type)")
        elif owned:
            problems.append(f"{field}: `--{owned}` is set by the launcher ({OWNED[owned]}){as_read}; remove it")
        elif first_class:
            problems.append(f"{field}: `--{first_class}` has its own key{as_read}; use "
                            f"resources.{FIRST_CLASS[first_class]} instead")
        elif name in keys:
            problems.append(f"{field}: `{keys[name]}` and `{key}` are the same option, `--{name}`; keep one")
        elif value is True or value is None:
            options[name] = None
        elif isinstance(value, bool) or not isinstance(value, (str, int, float)):
            problems.append(f"{field}: expected one value (text or a number, or true for a flag), got {value!r}")
        elif not str(value).strip():
            problems.append(f"{field}: the value is empty; give one value (or true for a flag)")
        elif why := directives.problem(str(value)):
            problems.append(f"{field}: {str(value)[:60]!r} {why}")
        else:
            options[name] = str(value)
        keys.setdefault(name, str(key))
    return options


def srun_args(raw: Any, where: str, problems: list[str]) -> tuple[str, ...]:
    """The extra `srun` arguments from a spec's or profile's `srun_args` list (each item one argument)."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(a, (str, int, float)) and not isinstance(a, bool)
                                            for a in raw):
        problems.append(f"{where}: expected a list of arguments, e.g. [--cpu-bind=cores]")
        return ()
    args = tuple(str(a) for a in raw)
    for arg in args:
        if _has_break(arg) or not arg.strip():
            problems.append(f"{where}: {arg[:60]!r} is empty or holds a line break; give one argument per item")
            return ()
        if not arg.startswith("-"):
            # srun takes its first non-option argument as the command: `hostname` would replace the trainer.
            problems.append(f"{where}: {arg[:60]!r} is not an option; srun_args holds srun's options only, each "
                            f"as --name or --name=value (the command srun runs is the trainer)")
            return ()
    return args


def sbatch_options_field(where: str) -> Any:
    """The type of a schema field that holds `sbatch_options` at `where` (its path in messages)."""
    return Annotated[dict[str, str | None],
                     BeforeValidator(lambda raw: schema.collected(lambda p: sbatch_options(raw, where, p)))]


def srun_args_field(where: str) -> Any:
    """The type of a schema field that holds `srun_args` at `where`."""
    return Annotated[tuple[str, ...], BeforeValidator(lambda raw: schema.collected(lambda p: srun_args(raw, where, p)))]
