"""What a job asks Slurm for, and Slurm's own ways of writing times and sizes, each read in one place.

`Resources` is what each job of a sweep asks for (the spec's `resources` over the profile's defaults). The
parsers read what users write and what Slurm prints: a time limit (`HH:MM:SS`, `D-HH:MM`, `INFINITE`, ...)
in whole minutes (`Minutes`, the one type of a time), a size (`4G`, `500M`, `306484K`; a bare number is
megabytes, as for `sbatch --mem`) in megabytes, sacct's durations and TRES lists. `SOURCE` names where each
option a job gets comes from, for a message that names the field to change.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, WithJsonSchema

_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)B?\s*", re.I)
_MB_PER_UNIT = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}
_DURATION = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)")


class Minutes(int):
    """A time limit in whole minutes: the one type a time is, from what wrote it (a spec, a profile, a flag,
    Slurm's own text, a job's recorded options) to what reads it (a comparison, a message, an #SBATCH line).
    `str()` (and an f-string) writes it as Slurm reads it: HH:MM:SS, or D-HH:MM:SS from a day on."""

    @classmethod
    def parse(cls, value: Any) -> Minutes | None:
        """Slurm's time (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`), or a number of minutes,
        rounded up to whole minutes. `INFINITE`/`UNLIMITED`/None give None. Raises ValueError on anything else."""
        if value is None:
            return None
        if isinstance(value, bool):
            raise ValueError(value)
        if isinstance(value, int):
            if value < 0:
                raise ValueError(value)
            return cls(value)
        text = str(value).strip()
        if text.upper() in ("INFINITE", "UNLIMITED"):
            return None
        m = _TIME.fullmatch(text)
        if not m:
            raise ValueError(text)
        days, a, b, c = m.groups()
        if days is not None:  # D-HH[:MM[:SS]]
            total_s = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
        elif c is not None:  # HH:MM:SS
            total_s = int(a) * 3600 + int(b) * 60 + int(c)
        elif b is not None:  # MM:SS
            total_s = int(a) * 60 + int(b)
        else:  # MM
            total_s = int(a) * 60
        return cls(-(-total_s // 60))

    @classmethod
    def limit(cls, text: str) -> Minutes | None:
        """A time limit as Slurm printed it (a partition's MaxTime, a QOS's MaxWall); None for no limit, and for
        text that is not a time (no limit is known)."""
        try:
            return cls.parse(text)
        except ValueError:
            return None

    def times(self, factor: float) -> Minutes:
        """This time grown by `factor`, rounded up to a whole minute."""
        return Minutes(math.ceil(self * factor))

    def __str__(self) -> str:
        days, rem = divmod(int(self), 1440)
        hours, mins = divmod(rem, 60)
        return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"

    def __repr__(self) -> str:
        return f"Minutes({int(self)})"


def size_mb(value: Any) -> float:
    """`4G`, `500M`, `1.5T`, `306484K`, `2048` -> megabytes (Slurm's unit for a bare number). Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(value)
        return float(value)
    m = _SIZE.fullmatch(str(value))
    if not m:
        raise ValueError(value)
    return float(m.group(1)) * _MB_PER_UNIT[m.group(2).upper()]


MAX_MEM_MB = 2**40  # (a million terabytes) the most a request may name: no node holds more; Slurm would refuse


def parse_mem_mb(value: Any) -> int:
    """A memory request in whole megabytes (what `--mem=<N>M` carries), from 1 MB to MAX_MEM_MB: Slurm reads a
    request of 0 as all of each node's memory, which is not the size the user wrote. Raises ValueError."""
    mb = size_mb(value)
    if not 1 <= mb <= MAX_MEM_MB:
        raise ValueError(value)
    return int(mb)


def duration_s(text: str) -> float:
    """Slurm's TotalCPU/Elapsed text ([D-][HH:]MM:SS[.mmm]) in seconds; 0 for what it cannot read."""
    m = _DURATION.fullmatch(text.strip())
    if not m:
        return 0.0
    days, hours, minutes, seconds = m.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)


def tres(text: str) -> dict[str, str]:
    """`cpu=1,mem=3615M,gres/gpu=2` -> {"cpu": "1", "mem": "3615M", "gres/gpu": "2"}."""
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def _minutes(value: Any) -> Minutes | None:
    try:
        minutes = Minutes.parse(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a Slurm time; use HH:MM:SS, D-HH:MM:SS, minutes or INFINITE") from None
    if minutes == 0:  # (to Slurm, a time limit of 0 is none at all)
        raise ValueError(f"{value!r} is a time of 0, which Slurm reads as no time limit; write INFINITE if you mean "
                         f"that, else a time of at least a minute (e.g. 00:30:00)")
    return minutes


def _kept_minutes(value: int | None) -> Minutes | None:
    return None if value is None else Minutes(value)  # (an int field's check may have made Minutes a plain int)


def _megabytes(value: Any) -> int | None:
    try:
        return None if value is None else parse_mem_mb(value)
    except ValueError:
        raise ValueError(mem_problem(value)) from None


def mem_problem(value: Any) -> str:
    """Why `value` is not a memory request parse_mem_mb takes, with the fix."""
    try:
        below_one = size_mb(value) < 1
    except ValueError:
        below_one = False
    if below_one:
        return (f"{value!r} is less than 1 MB, and Slurm reads a memory request of 0 as all of each node's memory "
                f"(--mem=0); ask for the size you mean (e.g. 4G; a node's whole memory by its size), or leave it "
                f"out for the partition's default")
    return f"{value!r} is not a memory size; use e.g. 4G, 500M or 2048 (MB), at most {MAX_MEM_MB // 2**20:,}T"


_TIME_SCHEMA = {"type": ["string", "integer", "null"],
                "description": "a Slurm time: MM, HH:MM:SS, D-HH:MM:SS or INFINITE",
                "pattern": r"^((\d+-)?\d+(:\d+){0,2}|INFINITE|UNLIMITED)$"}
_MEM_SCHEMA = {"type": ["string", "integer", "null"], "description": "a memory size: 4G, 500M, 1T, or MB as a number",
               "pattern": r"^\s*\d+(\.\d+)?\s*[KMGTkmgt]?[Bb]?\s*$"}
# Both read into whole minutes (None: no limit) and megabytes: what the launcher compares and writes.
SlurmTime = Annotated[int | None, BeforeValidator(_minutes), AfterValidator(_kept_minutes),
                      WithJsonSchema(_TIME_SCHEMA)]
MemMB = Annotated[int | None, BeforeValidator(_megabytes), WithJsonSchema(_MEM_SCHEMA)]


@dataclass(frozen=True)
class NamedOption:
    """A Slurm option that the spec's `resources` names by a key of its own and passes on as the text written. Its
    one declaration: the spec's field (and the JSON Schema's), the profile's default, the `#SBATCH` line of both
    backends, the refusal to pass it through `sbatch_options`, and the field its messages name come from it."""

    key: str  # the key under `resources`, and sbatch's long option
    description: str  # the spec field's
    profile_key: str | None = None  # the profile's key that gives it where the spec is silent

    @property
    def source(self) -> str:
        """The field a message about its value names, where the user changes it."""
        if self.profile_key is None:
            return f"resources.{self.key}"
        named = "" if self.profile_key == self.key else f" {self.profile_key}"
        return f"resources.{self.key} (or the profile's{named})"


NAMED_OPTIONS = {o.key: o for o in (
    NamedOption("partition", "the partition (default: the profile's default_partition)", "default_partition"),
    NamedOption("qos", "the QOS (default: the profile's)", "qos"),
    NamedOption("account", "the account (default: the profile's)", "account"),
    NamedOption("constraint", "node features (sbatch --constraint)"),
    NamedOption("exclude", "nodes not to run on (sbatch --exclude)"),
)}

# Where each option a job gets comes from, for a message that names the field to change.
SOURCE = {"time": "resources.time", **{key: o.source for key, o in NAMED_OPTIONS.items()},
          "chdir": "--workdir", "output": "--workdir", "job-name": "name"}


@dataclass(frozen=True)
class Resources:
    """What each job of a sweep asks for: the spec's `resources`, the profile's defaults where it is silent."""

    nodes: int
    gpus_per_node: int
    tasks_per_node: int
    cpus_per_task: int
    mem_mb: int | None
    time: Minutes
    named: dict[str, str] = field(default_factory=dict)  # NAMED_OPTIONS given a value: {key: value}, in its order
    sbatch_extra: dict[str, str | None] = field(default_factory=dict)  # passed through: {long option: value}
    srun_args: tuple[str, ...] = ()  # passed through to srun

    def __post_init__(self) -> None:
        object.__setattr__(self, "time", Minutes(self.time))  # (whatever int it was given: written as Slurm reads)

    @property
    def partition(self) -> str | None:
        return self.named.get("partition")

    def record(self) -> dict[str, Any]:
        """What the manifest keeps of them (what `status` and `resubmit` read back)."""
        return {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "tasks_per_node": self.tasks_per_node,
                "cpus_per_task": self.cpus_per_task, "mem_mb": self.mem_mb, "time": str(self.time),
                "partition": self.partition, **({"exclude": self.named["exclude"]} if "exclude" in self.named else {})}

    def describe(self) -> str:
        gpus = f", {self.gpus_per_node} GPU/node" if self.gpus_per_node else ""
        mem = f", {self.mem_mb} MB" if self.mem_mb else ""
        part = f" on {self.partition}" if self.partition else ""
        return (f"{self.nodes} node(s) x {self.tasks_per_node} task(s){gpus}, {self.cpus_per_task} CPU/task"
                f"{mem}, {self.time}{part}")
