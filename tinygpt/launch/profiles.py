"""Per-cluster hardware profiles: `hpc_lab/clusters/<name>.yaml`.

A profile says what a cluster's nodes hold and how to ask for them, so that a spec only says what a run
needs (`nodes: 2, gpus_per_node: 4, time: "04:00:00"`) and the launcher writes the right `#SBATCH` lines
and refuses, before submission, what the cluster could never give. Keys (all but `name` optional):

    name, cluster_name          profile name; Slurm's ClusterName, for `--cluster auto`
    account, qos                defaults for every job
    partitions                  {name: {max_time, max_nodes}}; default_partition names one of them
    node                        {gpus, gpu_type, cpus, mem}: what one node holds
    gpu_request                 "gpus-per-node" (--gpus-per-node=N), "gres" (--gres=gpu:TYPE:N) or "none"
    cpus_per_gpu, mem_per_gpu   what a GPU brings along when a spec does not say
    max_array_size              Slurm's MaxArraySize (arrays longer than this are split)
    modules, env, setup         `module load` lines, exported variables, shell lines (venv activation)
    python                      the interpreter on the nodes (default: the one running launch.py)
    container                   {runtime: apptainer, image: PATH, args: "--nv"}: run the trainer inside it
    signal, signal_lead_s       the signal Slurm sends before the time limit, and how long before
    sbatch_options, srun_args   extra #SBATCH options ({reservation: x}) and srun arguments for every job
    precision, compile          trainer defaults on this hardware
    peak_flops                  peak FLOP/s of one GPU (or CPU node), for MFU
    loggers, wandb_mode         trainer defaults for tracking on this site, e.g. [wandb] and offline where
    wandb_project, wandb_entity   compute nodes have no internet (a spec or --set overrides them)
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import passthrough
from .errors import LaunchError

PROFILE_DIR = Path(__file__).resolve().parents[2] / "hpc_lab" / "clusters"
GPU_REQUESTS = ("gpus-per-node", "gres", "none")
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "XCPU")


@dataclass(frozen=True)
class Partition:
    name: str
    max_time_min: int | None  # None: no limit
    max_nodes: int | None


@dataclass(frozen=True)
class Container:
    runtime: str
    image: str
    args: str = ""


@dataclass(frozen=True)
class Profile:
    name: str
    path: str
    cluster_name: str | None = None
    account: str | None = None
    qos: str | None = None
    partitions: dict[str, Partition] = field(default_factory=dict)
    default_partition: str | None = None
    node_gpus: int = 0
    gpu_type: str | None = None
    node_cpus: int | None = None
    node_mem_mb: int | None = None
    gpu_request: str = "gpus-per-node"
    cpus_per_gpu: int | None = None
    mem_per_gpu_mb: int | None = None
    max_array_size: int = 1001
    modules: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()
    python: str | None = None
    container: Container | None = None
    signal: str = "USR2"
    signal_lead_s: int = 120
    trainer_defaults: dict[str, Any] = field(default_factory=dict)  # trainer keys (TRAINER_KEYS) for every run
    sbatch_options: dict[str, str | None] = field(default_factory=dict)  # extra #SBATCH options for every job
    srun_args: tuple[str, ...] = ()  # extra srun arguments for every job


NODE_KEYS = ("gpus", "gpu_type", "cpus", "mem")
CONTAINER_KEYS = ("runtime", "image", "args")
# Trainer keys a profile may set for every run on its cluster (checked with the trainer's own schema).
TRAINER_KEYS = ("precision", "compile", "peak_flops", "loggers", "wandb_mode", "wandb_project", "wandb_entity")
KEYS = ("name", "cluster_name", "account", "qos", "partitions", "default_partition", "node", "gpu_request",
        "cpus_per_gpu", "mem_per_gpu", "max_array_size", "modules", "env", "setup", "python", "container",
        "signal", "signal_lead_s", "sbatch_options", "srun_args", *TRAINER_KEYS, "description")


def parse_time_min(value: Any) -> int | None:
    """Slurm time (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`) in whole minutes, rounded up.

    `INFINITE`/`UNLIMITED`/None give None. Raises ValueError on anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(value)
        return value
    text = str(value).strip()
    if text.upper() in ("INFINITE", "UNLIMITED"):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        raise ValueError(text)
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        h, mi, s = int(a), int(b or 0), int(c or 0)
        total_s = int(days) * 86400 + h * 3600 + mi * 60 + s
    elif c is not None:  # HH:MM:SS
        total_s = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # MM:SS
        total_s = int(a) * 60 + int(b)
    else:  # MM
        total_s = int(a) * 60
    return -(-total_s // 60)


def format_time(minutes: int) -> str:
    days, rem = divmod(minutes, 1440)
    hours, mins = divmod(rem, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


def parse_mem_mb(value: Any) -> int:
    """`4G`, `500M`, `1T`, `2048` (MB) -> MB. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*", str(value), re.I)
    if not m:
        raise ValueError(value)
    number, unit = float(m.group(1)), m.group(2).upper()
    return int(number * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[unit])


def available() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load(name_or_path: str) -> Profile:
    """A profile by name (`hpc_lab/clusters/<name>.yaml`) or by path; `auto` asks Slurm for the cluster name."""
    from tinygpt.config import suggest

    if name_or_path == "auto":
        return detect()
    if "/" in name_or_path or name_or_path.endswith((".yaml", ".yml")):
        path = Path(name_or_path)
        try:
            found = path.is_file()
        except OSError:  # a name too long for the filesystem, ...
            found = False
        if not found:
            raise LaunchError(f"cluster: profile file {path} does not exist or is not a file; give the path of a "
                              f"profile YAML, or a profile name ({', '.join(available())})")
        return from_file(path)
    path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name_or_path) or not path.is_file():
        raise LaunchError(
            f"cluster: unknown cluster profile `{name_or_path}`{suggest(name_or_path, available())}; "
            f"available: {', '.join(available()) or 'none'} (files in {PROFILE_DIR}), "
            f"or `auto`, or a path to a profile YAML"
        )
    return from_file(path)


def from_file(path: Path) -> Profile:
    """A profile read and checked; every problem in the file is reported at once (LaunchError)."""
    from tinygpt.config import ConfigError, load_yaml, suggest

    try:
        data = load_yaml(path)
    except ConfigError as err:
        raise LaunchError(err.problems) from None
    if not isinstance(data, dict):
        raise LaunchError(f"{path}: a profile is a mapping of keys to values")
    problems: list[str] = []
    for key in data:
        if key not in KEYS:
            problems.append(f"unknown profile key `{key}`{suggest(str(key), KEYS)}; valid keys: {', '.join(KEYS)}")
    partitions = _partitions(data.get("partitions"), problems)
    default_partition = _get(data, "default_partition", str, problems, next(iter(partitions), None))
    if default_partition is not None and partitions and default_partition not in partitions:
        problems.append(f"default_partition: `{default_partition}` is not among partitions "
                        f"({', '.join(partitions)})")
    node = data.get("node") or {}
    if not isinstance(node, dict):
        problems.append("node: expected a mapping {gpus, gpu_type, cpus, mem}")
        node = {}
    _known(node, "node", NODE_KEYS, problems)
    gpu_request = _get(data, "gpu_request", str, problems, "gpus-per-node")
    if gpu_request not in GPU_REQUESTS:
        problems.append(f"gpu_request: {gpu_request!r} is not one of {', '.join(GPU_REQUESTS)}")
    signal = _get(data, "signal", str, problems, "USR2").removeprefix("SIG")
    if signal not in SIGNALS:
        problems.append(f"signal: {signal!r} is not one of {', '.join(SIGNALS)}")
    profile = Profile(
        name=str(data.get("name") or path.stem),
        path=str(path),
        cluster_name=_get(data, "cluster_name", str, problems),
        account=_get(data, "account", str, problems),
        qos=_get(data, "qos", str, problems),
        partitions=partitions,
        default_partition=default_partition,
        node_gpus=get_int(node, "gpus", problems, 0),
        gpu_type=str(node["gpu_type"]) if node.get("gpu_type") else None,
        node_cpus=get_int(node, "cpus", problems, None),
        node_mem_mb=_mem(node.get("mem"), "node.mem", "512G", problems),
        gpu_request=gpu_request,
        cpus_per_gpu=_get(data, "cpus_per_gpu", int, problems),
        mem_per_gpu_mb=_mem(data.get("mem_per_gpu"), "mem_per_gpu", "120G", problems),
        max_array_size=_get(data, "max_array_size", int, problems, 1001) or 1001,
        modules=_strings(data, "modules", problems),
        env=_env(data.get("env"), problems),
        setup=_strings(data, "setup", problems),
        python=_get(data, "python", str, problems),
        container=_container(data.get("container"), problems),
        signal=signal,
        signal_lead_s=_get(data, "signal_lead_s", int, problems, 120),
        trainer_defaults=_trainer_defaults(data, problems),
        sbatch_options=passthrough.sbatch_options(data.get("sbatch_options"), "sbatch_options", problems),
        srun_args=passthrough.srun_args(data.get("srun_args"), "srun_args", problems),
    )
    if problems:
        raise LaunchError(problems, str(path))
    return profile


def _known(mapping: dict, where: str, keys: tuple[str, ...], problems: list[str]) -> None:
    from tinygpt.config import suggest

    for key in mapping:
        if key not in keys:
            problems.append(f"{where}: unknown key `{key}`{suggest(str(key), keys)}; valid keys: {', '.join(keys)}")


def _get(data: dict, key: str, kind: type, problems: list[str], default: Any = None) -> Any:
    """A whole number >= 0 (kind int) or a single value as text (kind str); `default` when unset or wrong."""
    value = data.get(key, default)
    if value is None:
        return default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        problems.append(f"{key}: expected a whole number >= 0, got {value!r}")
        return default
    if kind is str and not isinstance(value, (str, int, float)):
        problems.append(f"{key}: expected a single value, got {value!r}")
        return default
    return str(value) if kind is str else value


def get_int(mapping: dict, key: str, problems: list[str], default):
    value = mapping.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        problems.append(f"node.{key}: expected a whole number >= 0, got {value!r}")
        return default
    return value


def _mem(value: Any, name: str, example: str, problems: list[str]) -> int | None:
    if value is None:
        return None
    try:
        return parse_mem_mb(value)
    except ValueError:
        problems.append(f"{name}: {value!r} is not a memory size (e.g. {example})")
        return None


def _strings(data: dict, key: str, problems: list[str]) -> tuple[str, ...]:
    value = data.get(key) or []
    if not isinstance(value, list):
        problems.append(f"{key}: expected a list of strings")
        return ()
    return tuple(str(item) for item in value)


def _partitions(raw: Any, problems: list[str]) -> dict[str, Partition]:
    if not isinstance(raw or {}, dict):
        problems.append("partitions: expected a mapping {name: {max_time: ..., max_nodes: ...}}")
        return {}
    partitions: dict[str, Partition] = {}
    for name, spec in (raw or {}).items():
        spec = spec or {}
        if not isinstance(spec, dict):
            problems.append(f"partitions.{name}: expected a mapping such as {{max_time: '2-00:00:00', max_nodes: 4}}, "
                            f"got {spec!r}")
            continue
        _known(spec, f"partitions.{name}", ("max_time", "max_nodes"), problems)
        try:
            max_time = parse_time_min(spec.get("max_time"))
        except ValueError:
            problems.append(f"partitions.{name}.max_time: {spec.get('max_time')!r} is not a Slurm time "
                            f"(e.g. 2-00:00:00, 04:00:00 or INFINITE)")
            max_time = None
        if max_time is not None and max_time < 1:
            problems.append(f"partitions.{name}.max_time: must be at least one minute (or INFINITE), got "
                            f"{spec.get('max_time')!r}")
            max_time = None
        max_nodes = spec.get("max_nodes")
        if max_nodes is not None and (isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1):
            problems.append(f"partitions.{name}.max_nodes: expected a whole number >= 1, got {max_nodes!r}")
            max_nodes = None
        partitions[str(name)] = Partition(str(name), max_time, max_nodes)
    return partitions


def _env(raw: Any, problems: list[str]) -> dict[str, str]:
    env = raw or {}
    if not isinstance(env, dict) or not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k)) for k in env):
        problems.append("env: expected a mapping of variable names (letters, digits, _) to values")
        return {}
    return {str(k): str(v) for k, v in env.items()}


def _container(raw: Any, problems: list[str]) -> Container | None:
    if not raw:
        return None
    if not isinstance(raw, dict) or not raw.get("image"):
        problems.append("container: expected {runtime: apptainer, image: PATH, args: ...}")
        return None
    _known(raw, "container", CONTAINER_KEYS, problems)
    args = str(raw.get("args", ""))
    try:
        shlex.split(args)  # the scripts pass them on word by word
    except ValueError as err:
        problems.append(f"container.args: {args!r} cannot be split into words ({err}); balance its quotes")
        return None
    return Container(str(raw.get("runtime", "apptainer")), str(raw["image"]), args)


def _trainer_defaults(data: dict, problems: list[str]) -> dict[str, Any]:
    """The trainer keys the profile sets, typed and checked with the trainer's own schema."""
    from tinygpt.config import ConfigError, build

    given = {key: data[key] for key in TRAINER_KEYS if data.get(key) is not None}
    try:
        typed = build(given).flat()
    except ConfigError as err:
        problems.extend(err.problems)
        return {}
    return {key: typed[key] for key in given}


def detect() -> Profile:
    """The profile whose cluster_name is this Slurm's ClusterName."""
    from .slurm_cli import cluster_name

    name = cluster_name()
    if name is None:
        raise LaunchError("cluster: `auto` needs a reachable Slurm (scontrol show config did not answer); "
                          "name a profile with --cluster NAME")
    matches = [p for p in (from_file(PROFILE_DIR / f"{n}.yaml") for n in available()) if p.cluster_name == name]
    if not matches:
        raise LaunchError(f"cluster: no profile in {PROFILE_DIR} has cluster_name `{name}`; add one "
                          f"(copy hpc_lab/clusters/a100-example.yaml) or name a profile with --cluster")
    return matches[0]
