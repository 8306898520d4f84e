"""Per-cluster hardware profiles: `<name>.yaml` in the user's folder or this checkout's (layout.profile_dirs).

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
    login                       {host, user, port, identity_file, remote_dir, python, options}: how a laptop
                                reaches the login node over SSH, to run every command there (remote/laptop.py)
    retry                       every sweep's retry policy, where its spec says none (spec/retry.py)
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator

from tinygpt.base import schema
from tinygpt.base.config import Signal
from tinygpt.base.schema import Bool, Int, OptInt, OptText, Text
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.layout import profile_dirs
from tinygpt.launch.spec import passthrough
from tinygpt.launch.spec.resources import MemMB, SlurmTime
from tinygpt.launch.spec.retry import RetryPolicy

PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # what `--cluster NAME` finds as NAME.yaml
GPU_REQUESTS = ("gpus-per-node", "gres", "none")
# Trainer keys a profile may set for every run on its cluster (checked with the trainer's own schema).
TRAINER_KEYS = ("precision", "compile", "peak_flops", "loggers", "wandb_mode", "wandb_project", "wandb_entity")


class Partition(schema.Schema):
    max_time: SlurmTime = Field(None, description="the partition's MaxTime (INFINITE: none)")
    max_nodes: OptInt = Field(None, ge=1, description="the most nodes one job may have")

    @field_validator("max_time")
    @classmethod
    def _a_minute_at_least(cls, minutes: int | None) -> int | None:
        if minutes is not None and minutes < 1:
            raise ValueError("must be at least one minute (or INFINITE)")
        return minutes


class Node(schema.Schema):
    gpus: Int = Field(0, ge=0, description="GPUs in one node")
    gpu_type: OptText = Field(None, description="the GPU's GRES type (a100), for gpu_request: gres")
    cpus: OptInt = Field(None, ge=0, description="CPUs in one node")
    mem: MemMB = Field(None, description="memory of one node")


class Container(schema.Schema):
    runtime: Text = Field("apptainer", description="the container runtime on the nodes")
    image: Text = Field(description="the image's path on the nodes")
    args: Text = Field("", description="arguments to `RUNTIME exec`, e.g. --nv --bind /scratch")

    @field_validator("args")
    @classmethod
    def _words(cls, args: str) -> str:
        try:
            shlex.split(args)  # the scripts pass them on word by word
        except ValueError as err:
            raise ValueError(f"{args!r} cannot be split into words ({err}); balance its quotes") from None
        return args


SSH_OPTION = r"^[A-Za-z][A-Za-z0-9]*$"  # an ssh_config keyword (ProxyJump, UserKnownHostsFile, ...)


class Login(schema.Schema):
    """How a laptop reaches the cluster's login node (remote/laptop.py): OpenSSH's client with these, and with the
    user's own ~/.ssh/config (ProxyJump, a connection opened once by hand for two-factor logins)."""

    host: Text = Field(description="the login node's host name (or a Host of ~/.ssh/config)",
                       pattern=r"^[A-Za-z0-9_.:\[\]%-]+$")
    user: OptText = Field(None, description="the user there (default: ~/.ssh/config's, else this one's)",
                          pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    port: OptInt = Field(None, ge=1, le=65535, description="its SSH port (default: ~/.ssh/config's, else 22)")
    identity_file: OptText = Field(None, description="the private key, on this laptop (default: ssh's own)")
    remote_dir: Text = Field("tinygpt-hpc", description=(
        "the folder on the cluster that holds the code sent, the launcher's Python, and every sweep's jobs/, "
        "logs/ and runs/ (relative: to the home there)"))
    python: Text = Field("python3", pattern=r"^[A-Za-z0-9_+./][A-Za-z0-9_+./-]*$", description=(
        "a Python 3 on the login node, which sets up the launcher's own: a path or a name on PATH there, of letters, "
        "digits and /._+- only (the one word any login shell reads alike)"))
    trust_group: Bool = Field(False, description=(
        "whether remote_dir may be writable by its group (a lab's project folder, shared on purpose); one writable "
        "by every user is always refused"))
    options: dict[Annotated[str, Field(pattern=SSH_OPTION)], Text] = Field(
        default_factory=dict, description="more ssh -o options, e.g. {ProxyJump: gateway.example.edu}")

    @field_validator("host")
    @classmethod
    def _not_an_option(cls, host: str) -> str:
        if host.startswith("-"):
            raise ValueError(f"{host!r} starts with '-', which ssh would read as an option; give a host name")
        return host

    @field_validator("remote_dir", "identity_file")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or any(c in value for c in "\n\r\0")):
            raise ValueError("must be a path on one line")
        return value

    @field_validator("options")
    @classmethod
    def _one_line_each(cls, options: dict[str, str]) -> dict[str, str]:
        if bad := [k for k, v in options.items() if not v.strip() or any(c in v for c in "\n\r\0")]:
            raise ValueError(f"{', '.join(bad)}: each value is one line of text")
        return options


class Profile(schema.Schema):
    """A cluster profile as its file says it (times in minutes and sizes in MB once read)."""

    name: OptText = Field(None, description="the profile's name (default: the file's name)")
    description: OptText = Field(None, description="what the cluster is")
    cluster_name: OptText = Field(None, description="Slurm's ClusterName, for --cluster auto")
    account: OptText = Field(None, description="the account every job is charged to")
    qos: OptText = Field(None, description="the QOS of every job")
    partitions: dict[str, Partition] = Field(default_factory=dict, description="{name: {max_time, max_nodes}}")
    default_partition: OptText = Field(None, description="one of partitions (default: the first)")
    node: Node = Field(default_factory=Node, description="what one node holds")
    gpu_request: Literal[GPU_REQUESTS] = Field(
        "gpus-per-node", description="how GPUs are asked for: --gpus-per-node=N, --gres=gpu:TYPE:N or not at all")
    cpus_per_gpu: OptInt = Field(None, ge=0, description="CPUs a GPU brings along when a spec does not say")
    mem_per_gpu: MemMB = Field(None, description="memory a GPU brings along when a spec does not say")
    max_array_size: Int = Field(1001, ge=1, description="Slurm's MaxArraySize (longer sweeps are split)")
    modules: list[Text] = Field(default_factory=list, description="`module load` lines")
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], Text] = Field(
        default_factory=dict, description="variables exported in every job")
    setup: list[Text] = Field(default_factory=list, description="shell lines run first (venv activation)")
    python: OptText = Field(None, description="the interpreter on the nodes (default: the one running launch.py)")
    container: Container | None = Field(None, description="run the trainer inside this container")
    signal: Signal = Field(
        "USR2", description="the signal Slurm sends before the time limit")
    signal_lead_s: Int = Field(120, ge=0, description="how many seconds before the time limit it is sent")
    sbatch_options: passthrough.sbatch_options_field("sbatch_options") = Field(default_factory=dict, description=(
        "extra #SBATCH options for every job ({reservation: x, exclusive: true}); see launch/spec/passthrough.py"))
    srun_args: passthrough.srun_args_field("srun_args") = Field(
        [], description="extra srun options for every job, e.g. [--cpu-bind=cores]")
    login: Login | None = Field(None, description="how a laptop reaches the login node over SSH (default: this "
                                                  "is the login node)")
    retry: RetryPolicy | None = Field(None, description="the retry policy of every sweep on this cluster (a spec's "
                                                        "`retry` keys over it)")
    # The trainer's own keys, set for every run on this cluster (TRAINER_KEYS): typed by the trainer's schema.
    precision: Any = None
    compile: Any = None
    peak_flops: Any = None
    loggers: Any = None
    wandb_mode: Any = None
    wandb_project: Any = None
    wandb_entity: Any = None

    _path: str = PrivateAttr("")

    @field_validator("default_partition")
    @classmethod
    def _among_partitions(cls, name: str | None, info: ValidationInfo) -> str | None:
        partitions = info.data.get("partitions") or {}
        if name is not None and partitions and name not in partitions:
            raise ValueError(f"`{name}` is not among partitions ({', '.join(partitions)})")
        return name

    @field_validator(*TRAINER_KEYS)
    @classmethod
    def _a_trainer_value(cls, value: Any, info: ValidationInfo) -> Any:
        from tinygpt.base.config import ConfigError, build

        try:
            return None if value is None else build({info.field_name: value}).flat()[info.field_name]
        except ConfigError as err:
            raise schema.problem("\n".join(err.problems)) from None

    @property
    def path(self) -> str:
        return self._path

    @property
    def interpreter(self) -> str:
        """The Python the jobs run: the profile's, else the one running launch.py."""
        return self.python or sys.executable

    @property
    def trainer_defaults(self) -> dict[str, Any]:
        """The trainer keys this profile sets, typed by the trainer's schema."""
        return {key: getattr(self, key) for key in TRAINER_KEYS if getattr(self, key) is not None}


def available() -> list[str]:
    """The names `--cluster NAME` takes: the profile files of profile_dirs whose name is one (`my lab.yaml` is
    not)."""
    return sorted({p.stem for folder in profile_dirs() for p in folder.glob("*.yaml")
                   if PROFILE_NAME.fullmatch(p.stem)})


def found(name: str) -> list[Path]:
    """Every NAME.yaml where `--cluster NAME` looks, the one it takes first (layout.profile_dirs). One that is there
    but is no file (a broken link, a folder) is refused, not passed over for a later folder's."""
    paths = []
    for path in (folder / f"{name}.yaml" for folder in profile_dirs()):
        if path.is_file():
            paths.append(path)
        elif path.is_symlink() or path.exists():
            raise LaunchError(f"cluster: {path} is {'a link to nothing' if path.is_symlink() else 'not a file'}, "
                              f"where `--cluster {name}` looks first; make it the profile's file, or remove it")
    return paths


_SAID: set[str] = set()  # (a note is said once by a process, however often a profile is loaded)


def load(name_or_path: str) -> Profile:
    """A profile by name (layout.profile_dirs: the first NAME.yaml) or by path; `auto` asks Slurm for the
    cluster name."""
    if name_or_path == "auto":
        return detect()
    if "/" in name_or_path or name_or_path.endswith((".yaml", ".yml")):
        path = Path(name_or_path)
        try:
            exists = path.is_file()
        except OSError:  # a name too long for the filesystem, ...
            exists = False
        if not exists:
            raise LaunchError(f"cluster: profile file {path} does not exist or is not a file; give the path of a "
                              f"profile YAML, or a profile name ({', '.join(available())})")
        return from_file(path)
    paths = found(name_or_path) if PROFILE_NAME.fullmatch(name_or_path) else []
    if not paths:
        raise LaunchError(
            f"cluster: unknown cluster profile `{name_or_path}`{schema.suggest(name_or_path, available())}; "
            f"available: {', '.join(available()) or 'none'} (files in {', '.join(map(str, profile_dirs()))}), "
            f"or `auto`, or a path to a profile YAML"
        )
    if len(paths) > 1 and (said := f"{name_or_path}: {paths}") not in _SAID:
        _SAID.add(said)
        print(f"note: cluster profile `{name_or_path}` is {paths[0]}, found first; also "
              f"{', '.join(map(str, paths[1:]))}", file=sys.stderr)
    return from_file(paths[0])


def from_file(path: Path) -> Profile:
    """A profile read and checked; every problem in the file is reported at once (LaunchError)."""
    return from_data(schema.load_yaml(path, LaunchError), path)


def from_data(data: Any, path: Path) -> Profile:
    """A profile from the YAML of the file at `path` (what `profile new` is about to write, or has read)."""
    if not isinstance(data, dict):
        raise LaunchError(f"{path}: a profile is a mapping of keys to values")
    profile = schema.validate(Profile, data, str(path), LaunchError)
    profile.name = profile.name or path.stem
    profile.default_partition = profile.default_partition or next(iter(profile.partitions), None)
    profile._path = str(path)
    return profile


def detect() -> Profile:
    """The profile whose cluster_name is this Slurm's ClusterName."""
    from tinygpt.launch.slurm.slurm_cli import cluster_name

    name = cluster_name()
    if name is None:
        raise LaunchError("cluster: `auto` needs a reachable Slurm (scontrol show config did not answer); "
                          "name a profile with --cluster NAME")
    matches = [p for p in (from_file(found(n)[0]) for n in available()) if p.cluster_name == name]
    if not matches:
        raise LaunchError(f"cluster: no profile in {', '.join(map(str, profile_dirs()))} has cluster_name "
                          f"`{name}`; write one with `profile new` on a login node, or name a profile with "
                          f"--cluster")
    if len(matches) > 1:
        raise LaunchError(f"cluster: `auto` finds {len(matches)} profiles with cluster_name `{name}` "
                          f"({', '.join(p.path for p in matches)}); name one with --cluster NAME")
    return matches[0]
