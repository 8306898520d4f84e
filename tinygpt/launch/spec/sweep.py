"""Job and sweep specs: one YAML file in, a list of fully validated runs out.

    name: width-depth             # the sweep's name: jobs/<name>/, runs/<name>/, logs/<name>/
    cluster: local                # a profile by name (layout.profile_dirs), a path, or auto
    backend: sbatch               # or submitit
    train: {max_steps: 2000, ...} # the base trainer config: the trainer's own keys
    command: {argv: [...], ...}   # instead of train: a program of yours (see command.py)
    grid:                         # cartesian product; keys flat (n_layer) or dotted (model.n_layer)
      n_layer: [2, 4]
      n_embd: [64, 128]
    search: {method: random, trials: 32, seed: 0, params: {lr: {loguniform: [1.0e-4, 3.0e-3]}}}
                                  # instead of a grid: random search (see search.py)
    runs:                         # explicit extra points (with an optional `name`)
      - {name: one-head, n_head: 1}
    resources: {nodes: 1, gpus_per_node: 0, cpus_per_task: 1, mem: 2G, time: "00:30:00"}
                                  # also partition, qos, ... (resources.NAMED_OPTIONS), and
                                  # sbatch_options / srun_args passed through (see passthrough.py)
    placement: {soonest: [{partition: a100}, {partition: h100}]}
                                  # ways over `resources`: the one Slurm would start first (submit/placement.py)
    array_parallelism: 4          # at most this many array tasks at once
    pack: 2                       # two runs at once in each array task: they share its CPUs, split its GPUs
    snapshot_max_file_mb: 10      # the code snapshot refuses a tracked file larger than this

With both `grid` and `runs`, the sweep has the grid's points followed by the explicit runs. Each run's
trainer config is checked with the trainer's own schema, and every problem in the file is reported at
once. A run's name comes from its sweep point (`n_layer=2,n_embd=64`), so a requeued job finds its own
run directory and checkpoints.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pydantic import Field, create_model, field_validator

from tinygpt.base import config as train_config
from tinygpt.base import schema
from tinygpt.base.config import ConfigError, suggest
from tinygpt.base.schema import OptFloat, OptInt, OptText
from tinygpt.launch import manifest
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.layout import NAMING, SweepDirs, check_safe_name, joined, name_problem, pair, unwritable_dir
from tinygpt.launch.manifest import BACKENDS
from tinygpt.launch.spec import command as command_mod
from tinygpt.launch.spec import passthrough, retry, search, sweep_runs
from tinygpt.launch.spec.command import CommandSpec
from tinygpt.launch.spec.resources import NAMED_OPTIONS, MemMB, Minutes, Resources, SlurmTime
from tinygpt.launch.spec.retry import RetryPolicy
from tinygpt.launch.spec.search import Search
from tinygpt.launch.spec.sweep_runs import Run, run_name

if TYPE_CHECKING:
    from tinygpt.launch.spec.profiles import Profile

LAUNCHER_KEYS = {"out_dir": "runs/<sweep>/<run>", "sweep": "the spec's name"}  # set by the launcher, never a spec
SHOWN_FAILING_POINTS = 3  # an Optuna search that fails on many combinations shows this many, then a count
DEFAULT_TIME_MIN = 60


class _Amounts(schema.Schema):

    nodes: OptInt = Field(None, ge=1, description="nodes per job (default 1)")
    gpus_per_node: OptInt = Field(None, ge=0, description="GPUs per node (default: the profile's node.gpus)")
    tasks_per_node: OptInt = Field(None, ge=1, description="processes per node (default: one per GPU, else 1)")
    cpus_per_task: OptInt = Field(None, ge=1, description="CPUs per process (default: the profile's cpus_per_gpu)")
    mem: MemMB = Field(None, description="memory per node, e.g. 4G (default: the profile's mem_per_gpu per GPU)")
    time: SlurmTime = Field(DEFAULT_TIME_MIN, validate_default=True,  # (read as a written one is: Minutes)
                            description="time limit per job, e.g. 01:00:00 (default one hour)")

    @field_validator("time")
    @classmethod
    def _finite(cls, minutes: int | None) -> int:
        if minutes is None or minutes < 1:
            raise ValueError("give a finite time limit of at least one minute (e.g. '00:30:00')")
        return minutes


# A spec's `resources`: the amounts above, then a field per named option (resources.NAMED_OPTIONS), then what is
# passed through as it is.
ResourcesRequest = create_model(
    "ResourcesRequest", __base__=_Amounts, __doc__="A spec's `resources`: what each job asks for (unset: from the "
                                                    "cluster profile).",
    **{key: (OptText, Field(None, description=o.description)) for key, o in NAMED_OPTIONS.items()},
    sbatch_options=(passthrough.sbatch_options_field("resources.sbatch_options"), Field(
        default_factory=dict, description=(
            "extra #SBATCH options ({reservation: x, exclusive: true}); see launch/spec/passthrough.py"))),
    srun_args=(passthrough.srun_args_field("resources.srun_args"), Field(
        [], description="extra srun options, e.g. [--cpu-bind=cores]")))


class Placement(schema.Schema):
    """A spec's `placement`: the ways its jobs could run, of which a launch checked against the live cluster takes
    the one Slurm says would start first (submit/placement.py)."""

    soonest: list[ResourcesRequest] = Field(min_length=2, description=(
        "two or more ways to run the jobs, each a `resources` of its keys over the spec's own (e.g. "
        "[{partition: a100}, {partition: h100, gpus_per_node: 4}]); the first is the spec's choice, kept on a tie "
        "and where Slurm gives no estimate"))


class SpecFile(schema.Schema):
    """A job or sweep spec as its file says it; `train`, `grid` and `runs` hold trainer keys, checked per run
    by the trainer's schema."""

    name: OptText = Field(None, description="the sweep's name: jobs/<name>/, runs/<name>/, logs/<name>/ "
                                            "(default: the file's name)")
    description: OptText = Field(None, description="what the sweep is for")
    cluster: OptText = Field(None, description="a profile's name (found in $TINYGPT_CLUSTERS, your folder "
                                               "~/.config/tinygpt-hpc/clusters, hpc_lab/clusters), its path, or "
                                               "auto (default: local)")
    backend: Literal[BACKENDS] | None = Field(None, description="sbatch (default) or submitit")
    train: dict[str, Any] | None = Field(None, description="the base trainer config: the trainer's own keys")
    command: CommandSpec | None = Field(None, description="instead of train: a program of yours, each run's values "
                                                          "in its words")
    grid: dict[str, Any] | None = Field(None, description="trainer keys and their lists of values: every "
                                                          "combination is a run")
    search: Search | None = Field(None, description="instead of a grid: random or Optuna search")
    runs: list[dict[str, Any]] | None = Field(None, description="explicit runs: trainer keys and an optional name")
    resources: ResourcesRequest = Field(default_factory=ResourcesRequest, description="what each job asks for")
    placement: Placement | None = Field(None, description=(
        "ways to run the jobs (other partitions, GPU types, sizes); the launch takes the one that starts first"))
    array_parallelism: OptInt = Field(None, ge=1, description="at most this many array tasks at once")
    queue_margin: int = Field(0, ge=0, description=(
        "places of your queue limit left to your other jobs when the sweep is larger than the limit lets out at "
        "once and goes out in waves (read again before each wave)"))
    pack: OptInt = Field(None, ge=1, description=(
        "runs at once in each array task: they share its CPUs and split its GPUs"))
    snapshot_max_file_mb: OptFloat = Field(None, gt=0, lt=1e9, description=(
        "the code snapshot refuses a tracked file larger than this"),
        json_schema_extra={"hint": "megabytes: the largest tracked file a code snapshot copies"})
    code_counts: bool = Field(False, description=(
        "launched again, a run last submitted with other code (the project's for a command, the launcher's for "
        "the trainer) counts as changed"))
    retry: RetryPolicy | None = Field(None, description=(
        "which ends of a run its heal job sends again, and how (over the profile's `retry`); see "
        "launch/spec/retry.py"))

    @field_validator("name")
    @classmethod
    def _a_safe_name(cls, name: str | None) -> str | None:
        if name is not None and (why := name_problem(name)):
            raise ValueError(why)
        return name


class Way(NamedTuple):
    """One of `placement.soonest`: its keys as the spec gives them (`partition: a100`), and the resources."""

    said: str
    resources: Resources


@dataclass
class Sweep:
    name: str
    spec_path: Path
    profile: Profile
    backend: str
    resources: Resources
    array_parallelism: int | None
    workdir: Path
    runs: list[Run] = field(default_factory=list)
    varying: list[str] = field(default_factory=list)  # keys whose value differs between runs
    search: dict[str, Any] | None = None  # an Optuna search's settings (search.py); its runs are the workers
    pack: int = 1  # runs at once in each array task: they share its CPUs and split its GPUs
    snapshot_max_file_mb: float | None = None  # the code snapshot refuses a tracked file larger than this
    command: CommandSpec | None = None  # a program of the user's instead of the trainer
    project: Path | None = None  # the folder whose files a command's jobs run
    code_counts: bool = False  # a relaunch counts a run submitted with other code as changed
    retry: RetryPolicy | None = None  # how its heal job sends again the runs that ended badly
    queue_margin: int = 0  # places of the user's queue limit left to their other jobs (heal/waves.py)
    naming: int = NAMING  # how its runs are named (layout.NAMING): a sweep launched before keeps its own
    placement: list[Way] = field(default_factory=list)  # `placement: soonest`: `resources` is the first until chosen

    @property
    def dirs(self) -> SweepDirs:
        return SweepDirs(self.workdir, self.name)


def _trainer_key(key: Any) -> str:
    """A grid's key as the trainer's flat name (`model.n_layer` is `n_layer`)."""
    return train_config.normalise_key(str(key)).rpartition(".")[2]


def _as_given(mapping: dict, where: str, problems: list[str]) -> dict[str, Any]:
    """A program of the user's takes its keys as the spec writes them (command.params checks their values)."""
    return dict(mapping)


def _expand_grid(grid: dict[str, Any] | None, problems: list[str], name_of=_trainer_key) -> list[dict[str, Any]]:
    if grid is None:
        return []
    if not grid:
        problems.append("grid: is empty; give at least one key with a list of values, or remove `grid`")
        return []
    keys, value_lists = [], []
    for key, values in grid.items():
        name = name_of(key)
        if not isinstance(values, list):
            values = [values]
        if not values:
            problems.append(f"grid.{key}: the list of values is empty; give at least one value")
            return []
        counts = Counter(repr(v) for v in values)
        repeated = sorted(text for text, count in counts.items() if count > 1)
        if repeated:
            problems.append(f"grid.{key}: {', '.join(repeated)} given more than once; give each value once")
            return []
        keys.append(name)
        value_lists.append(values)
    return [dict(zip(keys, combo)) for combo in itertools.product(*value_lists)]


def _check_keys(mapping: dict, where: str, problems: list[str]) -> dict[str, Any]:
    """Flatten a trainer mapping (flat, dotted or nested), reporting unknown keys and launcher-owned ones."""
    sub: list[str] = []
    flat = train_config.flatten_overrides(mapping, where, sub)
    problems.extend(f"{where}: {p}" for p in sub)
    for key, value in LAUNCHER_KEYS.items():
        if key in flat:
            problems.append(f"{where}: `{key}` is set by the launcher ({value}); remove it")
            flat.pop(key)
    return flat


def _resources(asked: Any, profile: Profile, problems: list[str], ours: bool = True) -> Resources:
    """What each job asks Slurm for: the spec's `resources`, the profile's defaults where it is silent. A program
    that is not `ours` (the trainer) gets no GPU unless the spec asks: of a program the launcher knows nothing
    of, a profile's GPUs are the most it may ask for, not what it is given (one task per GPU would start it
    several times, each copy told a RANK)."""
    gpus = (profile.node.gpus if ours else 0) if asked.gpus_per_node is None else asked.gpus_per_node
    cpus = asked.cpus_per_task or (profile.cpus_per_gpu if (gpus and profile.cpus_per_gpu) else 1)
    mem_mb = asked.mem if asked.mem is not None else (gpus * profile.mem_per_gpu if gpus and profile.mem_per_gpu
                                                      else None)
    named = {key: getattr(asked, key) or (getattr(profile, o.profile_key) if o.profile_key else None)
             for key, o in NAMED_OPTIONS.items()}
    resources = Resources(asked.nodes or 1, gpus, asked.tasks_per_node or gpus or 1, cpus, mem_mb, asked.time,
                          {key: value for key, value in named.items() if value},
                          {**profile.sbatch_options, **asked.sbatch_options}, profile.srun_args + asked.srun_args)
    _check_limits(resources, profile, problems)
    return resources


def _placed(spec: SpecFile, profile: Profile | None, problems: list[str],
            ours: bool) -> tuple[Resources | None, list[Way]]:
    """The jobs' resources and, with `placement`, each of its ways (each over `resources`, checked against the
    profile as `resources` is); the resources are then the first way's, the spec's choice until one is taken."""
    if profile is None:
        return None, []
    if spec.placement is None:
        return _resources(spec.resources, profile, problems, ours), []
    ways = []
    for i, way in enumerate(spec.placement.soonest):
        given = way.model_dump(exclude_unset=True)
        own: list[str] = []
        resources = _resources(spec.resources.model_copy(update=given), profile, own, ours)
        problems.extend(p.replace("resources.", f"placement.soonest[{i}].", 1) for p in own)
        ways.append(Way(", ".join(f"{key}: {_shown(key, value)}" for key, value in given.items()), resources))
    return ways[0].resources, ways


def _shown(key: str, value: Any) -> str:
    """A way's value as the spec wrote it, near enough (a time and a memory were read as minutes and MB)."""
    return str(Minutes(value)) if key == "time" else f"{value}M" if key == "mem" else str(value)


def _check_limits(r: Resources, profile: Profile, problems: list[str]) -> None:
    """Refuse before submission what the cluster could never give: the profile's node and partition limits."""
    where = f"cluster profile `{profile.name}`"
    node = profile.node
    if r.gpus_per_node > node.gpus == 0:
        problems.append(f"resources.gpus_per_node: {r.gpus_per_node} GPUs asked, but the nodes of {where} have no "
                        f"GPUs; set gpus_per_node: 0 to train on CPUs, or use the profile of a cluster with GPUs "
                        f"(--cluster)")
    elif r.gpus_per_node > node.gpus:
        problems.append(f"resources.gpus_per_node: {r.gpus_per_node} GPUs asked, but a node of {where} has "
                        f"{node.gpus}; ask for at most {node.gpus} and more nodes instead")
    if node.cpus and r.tasks_per_node * r.cpus_per_task > node.cpus:
        problems.append(f"resources.tasks_per_node x cpus_per_task: {r.tasks_per_node} x {r.cpus_per_task} CPUs "
                        f"per node is more than the {node.cpus} CPUs of a node of {where}")
    if node.mem and r.mem_mb and r.mem_mb > node.mem:
        problems.append(f"resources.mem: {r.mem_mb} MB is more than the {node.mem} MB of a node of {where}")
    if not profile.partitions:
        return
    partition = r.partition
    part = profile.partitions.get(partition) if partition else None
    if partition is None:
        problems.append(f"resources.partition: {where} has no default partition; choose one of "
                        f"{', '.join(profile.partitions)}")
    elif part is None:
        problems.append(f"resources.partition: unknown partition `{partition}`"
                        f"{suggest(partition, profile.partitions)}; {where} has {', '.join(profile.partitions)}")
    else:
        if part.max_time is not None and r.time > part.max_time:
            problems.append(f"resources.time: {r.time} is over the maximum "
                            f"{part.max_time} of partition `{partition}`; ask for less "
                            f"(the job resumes from its checkpoint when requeued)")
        if part.max_nodes is not None and r.nodes > part.max_nodes:
            problems.append(f"resources.nodes: {r.nodes} nodes asked, partition `{partition}` has at most "
                            f"{part.max_nodes}")


def load(path: str | Path, workdir: str | Path = ".", cluster: str | None = None, backend: str | None = None,
         set_values: dict[str, Any] | None = None) -> Sweep:
    """Read and validate a spec into runs whose trainer configs are final; raise LaunchError listing every problem.

    workdir: where runs/, data/ (the default data_dir) and jobs/ go; each run's out_dir is
    <workdir>/runs/<sweep>/<run>. set_values: trainer keys set for every run (`launch.py --set KEY=VALUE`),
    over the spec's own values.
    """
    from tinygpt.launch.spec import profiles

    path, workdir = Path(path), check_workdir(workdir)
    data = schema.load_yaml(path, LaunchError)
    if data is None:
        raise LaunchError(f"{path}: the spec is empty; give at least its train keys (see jobs/*.yaml), or "
                          f"`name: {path.stem}` for one run with every default")
    if not isinstance(data, dict):
        raise LaunchError(f"{path}: a spec is a mapping with keys such as name, train, grid, resources")
    problems: list[str] = []
    spec = _spec_file(data, problems)
    name = spec.name or path.stem
    check_safe_name(name, "name", problems)
    backend = backend or spec.backend or "sbatch"
    if backend not in BACKENDS:
        problems.append(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    profile = None
    try:
        profile = profiles.load(str(cluster or spec.cluster or "local"))
    except LaunchError as err:  # (a profile's own problems are named with its file)
        problems.extend(f"cluster profile {err.source}: {p}" if err.source else p for p in err.problems)
    naming = manifest.naming(SweepDirs(workdir, name).manifest, NAMING)  # (a sweep keeps its own)
    if spec.command is not None or "command" in data:
        forced = {key: schema.yaml_value(value) for key, value in (set_values or {}).items()}
        return _command_sweep(spec, path, name, profile, backend, workdir, forced, problems, naming)
    base = _base(spec.train, profile, problems)
    forced = _check_keys(set_values or {}, "--set", problems)
    inputs = {"data_dir": str(workdir / "data"), **base}  # (under each run's own; the launcher's keys over them)
    launcher = {**forced, "sweep": name}
    optuna = _optuna(spec, {**inputs, **launcher}, problems)
    points, grid_size = _workers(optuna, naming) if optuna else _points(spec, problems, naming)
    varying = sweep_runs.name_keys(points, base)
    runs = sweep_runs.make(points, grid_size, varying, inputs, launcher, str(SweepDirs(workdir, name).runs),
                           problems, naming)
    resources, ways = _placed(spec, profile, problems, ours=True)
    pack = _pack(spec.pack or 1, backend, optuna, resources, problems)
    policy = _retry(spec, profile, resources, backend, problems)
    if unique := list(dict.fromkeys(problems)):
        raise LaunchError(unique, str(path))
    return Sweep(name, path, profile, backend, resources, spec.array_parallelism, workdir, runs, varying, optuna, pack,
                 spec.snapshot_max_file_mb, code_counts=spec.code_counts, retry=policy, naming=naming,
                 queue_margin=spec.queue_margin, placement=ways)


def _workers(optuna: dict[str, Any], naming: int) -> tuple[list[tuple[str | None, dict[str, Any]]], int]:
    """An Optuna search's runs: its workers, each named by its number."""
    return [(pair("worker", str(w), naming), {}) for w in range(optuna["workers"])], optuna["workers"]


def _command_sweep(spec: SpecFile, path: Path, name: str, profile: Profile | None, backend: str, workdir: Path,
                   forced: dict[str, Any], problems: list[str], naming: int) -> Sweep:
    """A sweep of a program of the user's (`command:`): its runs' values checked as the spec declares them."""
    command = spec.command
    if spec.train is not None:
        problems.append("train: a spec runs the trainer (train:) or a program of yours (command:), not both; "
                        "remove one")
    if backend != "sbatch":
        problems.append("backend: a command runs with the sbatch backend; remove `backend: submitit`")
    runs, optuna, varying, project = [], None, [], None
    if command is not None:
        project = command_mod.project_root(command.project, path)
        problems.extend(command_mod.project_problems(command.argv, project))
        problems.extend(command_mod.included_problems(project, command.include, "command.include"))
        optuna = _command_optuna(spec, command, forced, problems)
        points, grid_size = _workers(optuna, naming) if optuna else _points(spec, problems, naming, _as_given, str)
        problems.extend(command_mod.set_problems(command, forced, {k for _, p in points for k in p}))
        varying = sweep_runs.name_keys(points, command.values)
        runs = sweep_runs.make_plain(points, grid_size, varying, command.values, forced,
                                     str(SweepDirs(workdir, name).runs), problems, naming)
        for run in runs if optuna is None else []:  # (a worker's values are its trials': checked above)
            problems.extend(command_mod.check_run(command, {**run.shared, **run.own}, f"run {run.name}"))
    if profile is not None and command is not None and command.signal is not None:  # (its jobs' --signal too)
        profile = profile.model_copy(update={"signal": command.signal})
    resources, ways = _placed(spec, profile, problems, ours=False)
    pack = _pack(spec.pack or 1, backend, optuna, resources, problems)
    policy = _retry(spec, profile, resources, backend, problems)
    if unique := list(dict.fromkeys(problems)):
        raise LaunchError(unique, str(path))
    return Sweep(name, path, profile, backend, resources, spec.array_parallelism, workdir, runs, varying, optuna,
                 pack, spec.snapshot_max_file_mb, command, project, code_counts=spec.code_counts, retry=policy,
                 naming=naming, queue_margin=spec.queue_margin, placement=ways)


def _retry(spec: SpecFile, profile: Profile | None, resources: Resources | None, backend: str,
           problems: list[str]) -> RetryPolicy | None:
    """The sweep's retry policy (spec over profile), its caps the profile's partition and node limits."""
    if profile is None or resources is None:
        return None
    part = profile.partitions.get(resources.partition or "")
    limits = (part.max_time if part else None, profile.node.mem)
    policy = retry.resolve(spec.retry, profile.retry, resources, limits, problems, f"profile `{profile.name}`")
    if policy is not None and backend != "sbatch":
        problems.append("retry: a sweep's heal job resubmits with the sbatch backend; remove `backend: "
                        "submitit` or `retry`")
    return policy


def _command_optuna(spec: SpecFile, command: CommandSpec, forced: dict[str, Any], problems: list[str]
                    ) -> dict[str, Any] | None:
    """An Optuna search of a command's runs: its settings, every value a trial may get checked as `params` says."""
    if spec.search is None or spec.search.method != "optuna":
        return None
    settings = spec.search.settings()
    if spec.grid is not None or spec.runs is not None:
        problems.append("search: an Optuna search makes the sweep's runs (its workers); remove grid and runs")
    if "metric" not in settings:
        problems.append("search.metric: an Optuna search of a command minimises a named value of its runs' "
                        "metrics.jsonl; name it (e.g. metric: loss)")
    if "target" in settings or "budget_s" in settings:
        problems.append("search: target and budget_s are the trainer's (its validation loss, its seconds); a "
                        "command's search minimises search.metric")
    for point in search.points_to_check(settings):
        problems.extend(command_mod.check_run(command, {**command.values, **point, **forced}, "search.params"))
    return {**settings, "dists": {k: list(v) for k, v in settings["dists"].items()}}


def _spec_file(data: dict, problems: list[str]) -> SpecFile:
    """The spec checked with its schema; what has problems is named and left at its default, so that the rest
    is checked too (every problem at once)."""
    spec, found = schema.validate_what_can_be(SpecFile, data)
    problems.extend(found)
    return spec


def _pack(pack: int, backend: str, optuna: dict | None, resources: Resources | None, problems: list[str]) -> int:
    """`pack`, checked, and with it what asks for one process per run: packed runs, an Optuna worker."""
    one_process = resources is None or (resources.nodes, resources.tasks_per_node) == (1, 1)
    if optuna and not one_process:
        problems.append("resources: an Optuna worker trains one trial at a time in one process; ask for nodes: 1, "
                        "tasks_per_node: 1 (and search.workers for more at once)")
    if pack > 1 and backend != "sbatch":
        problems.append("pack: packing runs into one task is for the sbatch backend; remove pack or use "
                        "backend: sbatch")
    if pack > 1 and optuna:
        problems.append("pack: an Optuna search's workers train one trial each; remove pack (more workers "
                        "instead)")
    if pack > 1 and not one_process:
        problems.append("pack: packed runs are one process each; ask for resources nodes: 1, tasks_per_node: 1 "
                        "(the packed runs share the task's CPUs, and each takes its share of its GPUs)")
    if pack > 1 and resources is not None and pack > resources.cpus_per_task:
        problems.append(f"pack: {pack} runs at once would share {resources.cpus_per_task} CPU(s) (resources."
                        f"cpus_per_task), more runs than CPUs; ask for cpus_per_task >= {pack}, or pack at most "
                        f"{resources.cpus_per_task}")
    return pack


def _optuna(spec: SpecFile, inputs: dict[str, Any], problems: list[str]) -> dict[str, Any] | None:
    """An Optuna search's settings; every value a trial may get, and every pair of values, checked with the
    trainer's schema (search.points_to_check)."""
    if spec.search is None or spec.search.method != "optuna":
        return None
    if spec.grid is not None or spec.runs is not None:
        problems.append("search: an Optuna search makes the sweep's runs (its workers); remove grid and runs")
    settings = spec.search.settings()
    if "metric" in settings or "value" in settings:
        problems.append("search.metric, search.value: are a command's (a search of the trainer minimises its "
                        "validation loss); remove them")
    points = search.points_to_check(settings)
    _check_keys(points[0], "search.params", problems)  # (unknown and launcher-owned keys: said once)
    failing = []
    for point in points:
        try:
            train_config.build({**inputs, **_check_keys(point, "search.params", []), "out_dir": "/"})
        except ConfigError as err:
            failing.append((point, err.problems))
    for point, found in failing[:SHOWN_FAILING_POINTS]:
        problems.extend(f"search.params: a trial may get {search.params_text(point)}, and then {p}" for p in found)
    if len(failing) > SHOWN_FAILING_POINTS:
        problems.append(f"search.params: {len(failing) - SHOWN_FAILING_POINTS} more combination(s) of "
                        f"{len(points)} checked fail too; narrow the ranges or choices")
    return {**settings, "dists": {k: list(v) for k, v in settings["dists"].items()}}


def check_workdir(workdir: str | Path) -> Path:
    """The absolute work directory, or a LaunchError naming --workdir when jobs/, logs/ and runs/ could not be
    made in it (checked before anything is written)."""
    if "\x00" in str(workdir):
        raise LaunchError(f"--workdir: {str(workdir)!r} holds a NUL character; give a directory path")
    where = Path(os.path.abspath(workdir))
    if problem := unwritable_dir(where, probe=True):
        raise LaunchError(f"--workdir: {str(workdir)[:200]!r} cannot hold jobs/, logs/ and runs/ ({problem}); "
                          f"give a directory you can write to")
    return where.resolve()


def _base(raw: dict[str, Any] | None, profile: Profile | None, problems: list[str]) -> dict[str, Any]:
    """The spec's `train` keys, with the profile's trainer defaults under them."""
    base = _check_keys(raw or {}, "train", problems)
    if profile is not None:
        for key, value in profile.trainer_defaults.items():
            base.setdefault(key, value)
        base.setdefault("preempt_signal", profile.signal)
    return base


def _points(spec: SpecFile, problems: list[str], naming: int, check=_check_keys, name_of=_trainer_key
            ) -> tuple[list[tuple[str | None, dict[str, Any]]], int]:
    """The sweep's points, (given name or None, flat trainer keys, or a command's as written: `check` and
    `name_of`): the grid's, then the explicit runs; and how many came from the grid."""
    points: list[tuple[str | None, dict[str, Any]]] = []
    grid_points = _expand_grid(spec.grid, problems, name_of)
    if grid_points:  # (every point has the grid's keys: they are checked once)
        known = check(dict(grid_points[0]), "grid", problems)
        unchanged = known.keys() == grid_points[0].keys()
        points += [(None, point if unchanged else {k: v for k, v in point.items() if k in known})
                   for point in grid_points]
    if spec.search is not None:
        if grid_points:
            problems.append("search: a spec has a grid or a search, not both; remove one")
        drawn = search.points(spec.search.settings())
        width = len(str(len(drawn) - 1))
        for trial, point in enumerate(drawn):
            name = joined([pair("trial", f"{trial:0{width}d}", naming), run_name(point, naming)], naming)
            points.append((name, check(point, "search.params", problems)))
        grid_points = drawn  # (counted like grid points: the explicit runs come after)
    explicit = spec.runs
    for i, entry in enumerate(explicit or []):
        entry = dict(entry)
        given = entry.pop("name", None)
        flat = check(entry, f"runs[{i}]", problems)
        points.append((str(given) if given is not None else None, flat))
    if spec.grid is None and spec.search is None and explicit is None:
        points.append((None, {}))  # a single job
    elif not points and not problems:
        problems.append("the spec defines no run: give a non-empty grid or runs list")
    return points, len(grid_points)


def load_name(path: str | os.PathLike[str]) -> str:
    """Only the sweep's name (for status, cancel and report, which read the manifest, not the spec)."""
    path = Path(path)
    data = schema.load_yaml(path, LaunchError)
    name = str((data or {}).get("name") or path.stem) if isinstance(data, dict) else path.stem
    problems: list[str] = []
    if not check_safe_name(name, "name", problems):
        raise LaunchError(problems, str(path))
    return name


def manifest_path(spec: str | os.PathLike[str], workdir: str | os.PathLike[str]) -> Path:
    """The manifest of the sweep that `spec` launched under `workdir`; `spec` may also be that manifest itself."""
    if Path(spec).name == "manifest.json":
        return Path(spec).resolve()
    if "\x00" in str(workdir):
        raise LaunchError(f"--workdir: {str(workdir)!r} holds a NUL character; give a directory path")
    return SweepDirs(Path(workdir).resolve(), load_name(spec)).manifest
