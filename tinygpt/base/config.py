"""The trainer's configuration: one schema shared by the trainer and the launcher.

This module imports no torch: the launcher validates every run of a sweep against this very schema on
a login node, before anything is submitted.

Five sections, one per concern (model, data, optim, run, track), gathered in `TrainConfig`; each field is
declared once, with its type, bounds, choices and help, in the schema engine's terms (schema.py). Every
field name is unique across the sections, so a key can be written flat (`n_layer: 6`, `--n-layer 6`) or
dotted (`model.n_layer: 6`) or nested in YAML (`model: {n_layer: 6}`).

Precedence: command-line flags > YAML file (`--config FILE`) > defaults. Every problem is collected and
reported at once in a `ConfigError`, each message naming the field and the fix.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator

from tinygpt.base import schema
from tinygpt.base.errors import ProblemsError, not_utf8
from tinygpt.base.schema import Bool, Float, Int, Items, OptFloat, OptInt, OptText, Text, suggest

__all__ = ["suggest"]  # (the launcher's modules take it from here)


class ConfigError(ProblemsError, ValueError):
    """One or more problems with a configuration; `problems` holds one message per problem."""


def _f(default: Any, help: str, hint: str | None = None, **bounds: Any) -> Any:
    return Field(default, description=help, json_schema_extra={"hint": hint} if hint else None, **bounds)


class ModelConfig(schema.Schema):
    n_layer: Int = _f(4, "number of transformer blocks", ge=1, le=4096)
    n_head: Int = _f(4, "attention heads per block; must divide n_embd", ge=1, le=4096)
    n_embd: Int = _f(128, "width of the residual stream", ge=1, le=65536)
    block_size: Int = _f(128, "context length in characters", ge=1, le=2**20)
    dropout: Float = _f(0.0, "dropout probability, 0 <= p < 1", ge=0.0, lt=1.0)
    bias: Bool = _f(False, "use biases in Linear and LayerNorm layers")
    pos_emb: Bool = _f(True, "learned position embeddings (false: the 'no positions' exercise)")
    causal: Bool = _f(True, "attend to earlier positions only (false: the 'remove the mask' exercise, where "
                            "training reads the answer and generation fails)")

    @field_validator("n_embd")
    @classmethod
    def _heads_divide_width(cls, n_embd: int, info: ValidationInfo) -> int:
        n_head = info.data.get("n_head")  # (declared first, so validated first: absent when it failed)
        if n_head and n_embd % n_head:
            raise ValueError(f"{n_embd} is not divisible by n_head {n_head}; choose n_embd as a multiple of "
                             f"n_head (e.g. {n_head * max(1, round(n_embd / n_head))})")
        return n_embd


DATASETS = ("shakespeare", "pydoc", "sherlock")


# What to give instead of an empty path, by key (PATH_KEYS).
_EMPTY_PATH_FIX = {"data_file": "give a path, or leave it unset", "data_dir": "give a path, or leave it unset",
                   "out_dir": "give a directory for the run", "resume": "give auto, never or the path of a checkpoint"}


def _a_path(value: str | None, info: ValidationInfo) -> str | None:
    """A path key's value: not empty, and when it starts with ~ naming a user of this machine (the trainer
    expands it)."""
    if value is None:
        return value
    if not value.strip():
        raise ValueError(f"is empty; {_EMPTY_PATH_FIX[info.field_name]}")
    if value.startswith("~"):
        try:
            Path(value).expanduser()
        except RuntimeError:
            raise ValueError(f"{value!r} starts with ~ but names no user of this machine; write the path out") \
                from None
    return value


class DataConfig(schema.Schema):
    dataset: Literal[DATASETS] = _f("shakespeare", "built-in corpus (ignored when data_file is set)")
    data_file: OptText = _f(None, "train on any UTF-8 text file instead of a built-in corpus")
    data_dir: OptText = _f(None, "where prepared data is cached (default: $TINYGPT_DATA_DIR, else ./data)")
    batch_size: Int = _f(16, "sequences per micro-batch, per rank", ge=1, le=2**20)
    eval_windows: Int = _f(240, "fixed windows used to measure val (and train) loss", ge=1, le=10**6)

    _paths = field_validator("data_file", "data_dir")(_a_path)


class OptimConfig(schema.Schema):
    max_steps: Int = _f(1600, "optimizer steps to train for", ge=1)
    optimizer: Literal["adamw", "muon"] = _f(
        "adamw", "adamw, or muon: Muon for the blocks' matrices, AdamW for the rest (tinygpt/training/optimizers.py)")
    lr: Float = _f(5e-3, "peak learning rate (AdamW's)", gt=0, le=1)
    min_lr: Float = _f(2e-4, "learning rate at the end of the cosine decay (Muon's ends at the same fraction of "
                             "muon_lr)", ge=0)
    muon_lr: Float = _f(0.02, "Muon's peak learning rate (optimizer: muon)", gt=0, le=1)
    muon_momentum: Float = _f(0.95, "Muon's momentum (optimizer: muon)", ge=0, lt=1)
    muon_weight_decay: Float = _f(0.0, "Muon's decoupled weight decay (optimizer: muon)", ge=0, le=10)
    schedule: Literal["cosine", "onecycle"] = _f(
        "cosine", "cosine (a linear warm-up, then a cosine down to min_lr) or onecycle (PyTorch's OneCycleLR: a "
                  "half cosine from lr/25 up to lr over warmup_steps, then one down to min_lr)")
    warmup_steps: Int = _f(50, "warm-up steps", ge=0)
    lr_decay_steps: OptInt = _f(None, "the step the decay ends at (default: max_steps)", ge=1)
    weight_decay: Float = _f(0.1, "AdamW weight decay, on the parameters weight_decay_on names", ge=0, le=10)
    weight_decay_on: Literal["matrices", "all"] = _f(
        "matrices", "matrices (not biases and LayerNorm gains) or all (as AdamW(model.parameters()))")
    beta1: Float = _f(0.9, "AdamW beta1", ge=0, lt=1)
    beta1_min: OptFloat = _f(None, "with schedule onecycle: beta1 falls to this as the rate rises, and back as it "
                                   "falls (OneCycleLR's momentum cycling)",
                             ge=0, lt=1)
    beta2: Float = _f(0.99, "AdamW beta2", ge=0, lt=1)
    grad_clip: Float = _f(1.0, "clip the global gradient norm to this (0: off)", ge=0)
    grad_accum: Int = _f(1, "micro-batches per optimizer step", ge=1)

    @field_validator("min_lr")
    @classmethod
    def _min_lr_at_most_lr(cls, min_lr: float, info: ValidationInfo) -> float:
        lr = info.data.get("lr")
        if lr is not None and min_lr > lr:
            raise ValueError(f"{min_lr} is above lr {lr}; set min_lr <= lr")
        return min_lr

    @field_validator("beta1_min")
    @classmethod
    def _beta1_min_cycles_below_beta1(cls, beta1_min: float | None, info: ValidationInfo) -> float | None:
        schedule = info.data.get("schedule")  # (None: the schedule was refused, and its own message says why)
        if beta1_min is None or schedule is None:
            return beta1_min
        if schedule != "onecycle":
            raise ValueError("cycles beta1 with schedule: onecycle only; set schedule: onecycle, or leave beta1_min "
                             "unset")
        beta1 = info.data.get("beta1")
        if beta1 is not None and beta1_min > beta1:
            raise ValueError(f"{beta1_min} is above beta1 {beta1}; set beta1_min <= beta1")
        return beta1_min


# The sampling of the course's project page (and of `python -m tinygpt.sample`): defined here, once.
SAMPLE_TEMPERATURE = 0.8
SAMPLE_TOP_K = 20

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
COMPILE_MODES = ("auto", "on", "off")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
PROGRESS_MODES = ("auto", "bar", "plain", "off")
PREEMPT_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "XCPU")
# A cluster profile's `signal`, and a command's: USR2, or SIGUSR2 as `kill -l` and Python name it.
Signal = Annotated[Literal[PREEMPT_SIGNALS], BeforeValidator(lambda v: v.removeprefix("SIG") if isinstance(v, str)
                                                             else v)]
MAX_WAIT_S = 10**7  # (about 116 days) the longest timeout: Python's timers and torch's refuse far longer ones
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")


class RunConfig(schema.Schema):
    out_dir: Text = _f("runs/default", "run directory: config, metrics, checkpoints, samples")
    # (every rank's seeds are derived from it, seed * 1000 + ...: within torch's 64 bits up to schema.INT_MAX)
    seed: Int = _f(1337, "seed for weights, data order and dropout", ge=0)
    resume: Text = _f("auto", "auto (newest valid checkpoint, else fresh), never, or a checkpoint PATH")
    eval_interval: Int = _f(250, "evaluate every this many steps (and at the end)", ge=1)
    log_interval: Int = _f(10, "write a training metrics line every this many steps", ge=1)
    ckpt_interval: Int = _f(500, "checkpoint every this many steps (and at the end)", ge=1)
    keep_checkpoints: Int = _f(3, "keep the newest K checkpoints (at least 2)", ge=2,
                               hint="the newest may be half-written when a job dies")
    stop_after: OptInt = _f(None, "leave after this many steps in this process, resumable (a time box)", ge=1)
    sample_tokens: Int = _f(300, "characters of text sampled at the end (0: none)", ge=0, le=10**6)
    sample_prompt: Text = _f("\n", "prompt for the final sample, at least one character", min_length=1)
    sample_temperature: Float = _f(SAMPLE_TEMPERATURE, "temperature of the final sample, > 0 (python -m "
                                                       "tinygpt.sample's default too)", ge=0.01, le=100)
    sample_top_k: Int = _f(SAMPLE_TOP_K, "the final sample draws from the top K characters (0: all; python -m "
                                         "tinygpt.sample's default too)", ge=0)
    device: Text = _f("auto", "auto, cpu, cuda or cuda:N")
    precision: Literal[PRECISIONS] = _f(
        "auto", "auto: bf16 on sm >= 8.0, fp16 + grad scaler on sm 7.x, fp32 on CPU; on CPU on request bf16 "
                "(where the CPU has native bf16) and fp16 (to try the V100 path: fp16 autocast and its grad scaler)")
    compile: Literal[COMPILE_MODES] = _f(
        "auto", "torch.compile: auto (on for CUDA, off on CPU), on or off; on CPU, inductor generates C++ with "
                "the system compiler: a minute or more before the first step")
    compile_backend: Literal[COMPILE_BACKENDS] = _f(
        "inductor", "torch.compile backend: inductor (generated kernels), or aot_eager / eager to see graph "
                    "breaks and recompiles in seconds")
    activation_checkpointing: Bool = _f(False, "recompute each block in backward: less memory, ~30% more compute")
    threads: OptInt = _f(None, "CPU threads (default: $SLURM_CPUS_PER_TASK, else torch's choice)", ge=1, le=4096)
    peak_flops: OptFloat = _f(None, "peak FLOP/s of one device, for MFU (default: known GPUs)", ge=1e6, le=1e21)
    progress: Literal[PROGRESS_MODES] = _f("auto", "auto (a bar on a terminal, plain lines otherwise), bar, "
                                                   "plain or off")
    preempt_signal: Literal[PREEMPT_SIGNALS] = _f("USR2", "signal Slurm sends before the time limit (SIGTERM is "
                                                          "always handled)")
    max_requeues: Int = _f(20, "give up requeueing after this many restarts", ge=0)
    hang_timeout: Float = _f(900.0, "end the job when no step, evaluation or checkpoint completes for this many "
                                    "seconds, with every live rank's stacks in the log (0: never)", ge=0, le=MAX_WAIT_S)
    join_timeout: Float = _f(600.0, "seconds the ranks may take to find each other at start (a slow shared "
                                    "filesystem delays their imports); then the message names the master and "
                                    "the ranks that never arrived", gt=0, le=MAX_WAIT_S)
    sweep: OptText = _f(None, "the sweep this run belongs to (set by the launcher; the W&B group)")

    _paths = field_validator("out_dir", "resume")(_a_path)

    @field_validator("device")
    @classmethod
    def _a_device(cls, value: str) -> str:
        if not DEVICE.fullmatch(value):
            raise ValueError(f"{value!r} is not one of auto, cpu, cuda, cuda:N")
        return value


LOGGERS = ("tensorboard", "wandb")
TRACKING_EXTRA = 'pip install -e ".[tracking]"'  # what installs the trackers' packages (pyproject.toml)
WANDB_MODES = ("auto", "online", "offline")
WANDB_FORBIDDEN = "/\\#?%:\n\r"  # what W&B refuses in a project (or entity) name: it is part of a URL


class TrackConfig(schema.Schema):
    loggers: Items[Literal[LOGGERS]] = Field(default_factory=list, description=(
        f"experiment trackers fed with metrics.jsonl's records, e.g. tensorboard,wandb ({TRACKING_EXTRA})"))
    wandb_project: OptText = _f(None, "W&B project (default: $WANDB_PROJECT, else tinygpt)")
    wandb_entity: OptText = _f(None, "W&B entity, a user or team (default: $WANDB_ENTITY, else yours)")
    wandb_mode: Literal[WANDB_MODES] = _f("auto", "online, offline (sync later with `launch.py sync`), or auto: "
                                                  "offline when the W&B service cannot be reached")

    @field_validator("wandb_project", "wandb_entity")
    @classmethod
    def _a_wandb_name(cls, value: str | None) -> str | None:
        if value is not None and (not value or len(value) > 128 or set(value) & set(WANDB_FORBIDDEN)):
            forbidden = " ".join(c for c in WANDB_FORBIDDEN if c.isprintable())
            raise ValueError(f"{value!r} is not a name W&B takes: 1 to 128 characters, none of {forbidden} or a "
                             f"line break; e.g. tinygpt-shakespeare")
        return value


# The rules between keys: key -> the other keys its check reads (the validators above that read `info.data`).
# A sweep checks each rule once per distinct combination of these keys' values (launch/spec/sweep_runs.py); a test
# holds this table to the validators.
RULES = {"n_embd": ("n_head",), "min_lr": ("lr",), "beta1_min": ("schedule", "beta1")}


class TrainConfig(schema.Schema):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    track: TrackConfig = Field(default_factory=TrackConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return self.model_dump()

    def flat(self) -> dict[str, Any]:
        return {k: v for section in self.to_dict().values() for k, v in section.items()}

    def tokens_per_step(self, world_size: int = 1) -> int:
        """Tokens in one optimizer step: the global batch (micro-batches of every rank) times the context."""
        return self.data.batch_size * self.optim.grad_accum * world_size * self.model.block_size


SECTION_NAMES = tuple(TrainConfig.model_fields)
PATH_KEYS = ("data_file", "data_dir", "out_dir", "resume")  # the keys that hold paths


# ----------------------------------------------------------------------------------------------------
# The key table: every key with its section, kind and help, read once from the sections' declarations.


@dataclass(frozen=True, slots=True)
class Key:
    name: str
    section: str
    kind: type  # int, float, bool, str, or list (of str)
    optional: bool
    default: Any
    help: str
    choices: tuple[str, ...] | None
    range: str | None = None  # its declared range in words (`from 1 to 4,096`), for --help


def _kind(annotation: Any) -> tuple[type, bool, tuple[str, ...] | None]:
    """(int / float / bool / str / list, whether it may be unset, its choices) of a field's annotation."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    args = typing.get_args(annotation)
    if type(None) in args:
        return _kind(next(a for a in args if a is not type(None)))[0], True, None
    if typing.get_origin(annotation) is Literal:
        return str, False, args
    if typing.get_origin(annotation) is list:
        return list, False, _kind(args[0])[2]
    return annotation, False, None


def _build_keys() -> dict[str, Key]:
    table: dict[str, Key] = {}
    for section, holder in TrainConfig.model_fields.items():
        for name, f in holder.annotation.model_fields.items():
            kind, optional, choices = _kind(f.annotation)
            assert name not in table, f"key {name} appears in two sections"
            default = [] if kind is list else f.default
            table[name] = Key(name, section, kind, optional, default, f.description, choices, schema.range_words(f))
    return table


_KEYS = _build_keys()


def field_info() -> dict[str, Key]:
    """Every trainer key, in declaration order."""
    return dict(_KEYS)


def normalise_key(key: str) -> str:
    """`--n-layer`, `n-layer`, `model.n_layer` -> `n_layer` (the section part is checked separately)."""
    return key.lstrip("-").replace("-", "_")


def flatten_overrides(mapping: dict[str, Any], source: str, problems: list[str]) -> dict[str, Any]:
    """Turn a YAML mapping (flat, dotted or nested by section) into {field: raw value}.

    Unknown keys are reported with the list of valid ones and a close-match suggestion.
    """
    flat: dict[str, Any] = {}

    def put(key: str, value: Any, where: str) -> None:
        name = normalise_key(key)
        section = None
        if "." in name:
            section, _, name = name.partition(".")
        key_info = _KEYS.get(name)
        if key_info is None or (section is not None and section != key_info.section):
            problems.append(unknown_key_message(where + key))
            return
        if name in flat:
            problems.append(f"{name}: given twice in {source}; keep one")
            return
        flat[name] = value

    for key, value in mapping.items():
        key = str(key)
        if key in SECTION_NAMES and isinstance(value, dict):
            for sub_key, sub_value in value.items():
                sub = normalise_key(str(sub_key))
                key_info = _KEYS.get(sub)
                if key_info is None or key_info.section != key:
                    problems.append(unknown_key_message(f"{key}.{sub_key}", section=key))
                else:
                    put(sub, sub_value, f"{key}.")
        elif key in SECTION_NAMES:
            problems.append(f"{key}: a section must be a mapping of keys, got {value!r}")
        else:
            put(key, value, "")
    return flat


def unknown_key_message(key: str, section: str | None = None) -> str:
    names = [n for n, k in _KEYS.items() if section is None or k.section == section]
    return schema.unknown_key(key, names, section)


def _flat_name(loc: tuple) -> str:
    """A trainer key is named flat in messages (`n_layer`, `loggers[1]`), as it is written: its section is
    implied."""
    return schema.path_text(loc[1:])


def build(overrides: dict[str, Any], source: str | None = None) -> TrainConfig:
    """Defaults updated by `overrides` ({field: raw value}), type-checked and validated.

    Raises ConfigError listing every problem.
    """
    problems: list[str] = []
    values: dict[str, dict[str, Any]] = {name: {} for name in SECTION_NAMES}
    for name, raw in overrides.items():
        key_info = _KEYS.get(name)
        if key_info is None:
            problems.append(unknown_key_message(name))
        else:
            values[key_info.section][name] = raw
    try:
        config = schema.validate(TrainConfig, values, source, ConfigError, _flat_name)
    except ConfigError as err:
        raise ConfigError(problems + err.problems, source) from None
    if problems:
        raise ConfigError(problems, source)
    return config


def from_dict(mapping: dict[str, Any], source: str | None = None) -> TrainConfig:
    """A config from a (possibly nested) mapping, as written to `config.yaml`."""
    problems: list[str] = []
    flat = flatten_overrides(mapping, source or "mapping", problems)
    if problems:
        raise ConfigError(problems, source)
    return build(flat, source)


# ----------------------------------------------------------------------------------------------------
# YAML


def yaml_overrides(path: str | Path, problems: list[str]) -> dict[str, Any]:
    data = schema.load_yaml(path, ConfigError)
    if data is None:
        return {}
    if not isinstance(data, dict):
        problems.append(f"{path}: expected a mapping of keys to values at the top, got {type(data).__name__}")
        return {}
    return flatten_overrides(data, str(path), problems)


def dump_yaml(config: TrainConfig) -> str:
    import yaml

    return yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=False)


# ----------------------------------------------------------------------------------------------------
# Command line


class _Given(argparse.Action):
    """Records each option as written, in order, as (spelling, key, value or None): what a flag means and what
    is wrong with it is decided after parsing, so that every problem is reported at once (argparse alone
    stops at the first) and the last of `--bias` / `--no-bias` wins."""

    def __call__(self, parser, namespace, value, option_string=None):
        namespace.given.append((option_string, self.dest, value))


def _spellings(name: str) -> list[str]:
    """`muon_weight_decay` -> --muon-weight-decay, --muon-weight_decay, ... --muon_weight_decay: a dash and an
    underscore are the same in a key, wherever they are written."""
    parts = name.split("_")
    return ["--" + parts[0] + "".join(sep + part for sep, part in zip(seps, parts[1:]))
            for seps in itertools.product("-_", repeat=len(parts) - 1)]


@functools.cache
def _negated() -> frozenset[str]:
    """`no_bias`, ...: the keys of the `--no-KEY` options."""
    return frozenset(f"no_{name}" for name, info in _KEYS.items() if info.kind is bool)


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """One option per key (and `--no-KEY` per boolean key, and `--config`), each taking an optional value."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in ["config", *_KEYS, *sorted(_negated())]:
        parser.add_argument(*_spellings(name), dest=name, nargs="?", action=_Given, default=argparse.SUPPRESS)
    return parser


def _joined(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the options, each with its value joined: `--lr=-1e-3`; a problem per argument that is no option).

    `--key VALUE` takes VALUE unless it starts with `--` (`--no-flag` takes none). Joined, a value such as
    `-1e-3` is not read by argparse as an option, and an unknown option takes its value with it instead of
    leaving it stray; `--` is an argument like any other, not the end of the options."""
    options: list[str] = []
    problems: list[str] = []
    open_ = False  # the argument before was an option that can still take a value
    for arg in argv:
        if open_ and not arg.startswith("--"):
            options[-1] += "=" + arg
            open_ = False
        elif arg.startswith("--") and arg != "--":
            options.append(arg)
            open_ = "=" not in arg and normalise_key(arg) not in _negated()
        else:
            problems.append(f"unexpected argument {arg!r}; options look like --n-layer 6 or --n-layer=6")
            open_ = False
    return options, problems


def _meaning(given: list[tuple[str, str, str | None]]) -> tuple[dict[str, Any], str | None, list[str]]:
    """({key: raw value}, config path, problems) of the options as argparse matched them."""
    overrides: dict[str, Any] = {}
    config_path: str | None = None
    problems: list[str] = []
    for spelling, name, value in given:
        if name == "config" and value is None:
            problems.append("--config: needs the path of a YAML file")
        elif name == "config":
            config_path = value
        elif name not in _KEYS:  # --no-KEY, which takes no value: `--no-bias=1` is no option
            if value is None:
                overrides[name.removeprefix("no_")] = False
            else:
                problems.append(_unknown(spelling))
        elif value is not None:
            overrides[name] = value
        elif _KEYS[name].kind is bool:
            overrides[name] = True  # a bare --flag
        else:
            problems.append(f"{spelling}: needs a value ({_KEYS[name].help})")
    return overrides, config_path, problems


def parse_cli(argv: list[str]) -> tuple[dict[str, Any], str | None, list[str]]:
    """`--key value`, `--key=value`, `--flag`, `--no-flag` -> ({key: raw value}, config path, problems).

    The problems come grouped: the arguments that are no option, the unknown options, the misused ones."""
    if problems := not_utf8(argv):
        return {}, None, problems
    options, problems = _joined(argv)
    matched = argparse.Namespace(given=[])
    _, unknown = _parser().parse_known_args(options, matched)
    overrides, config_path, more = _meaning(matched.given)
    return overrides, config_path, problems + [_unknown(option.partition("=")[0]) for option in unknown] + more


def _unknown(option: str) -> str:
    return f"unknown option {option}{suggest(normalise_key(option), _KEYS)}; run with --help to list the options"


def resolve(argv: list[str], base: dict[str, Any] | None = None) -> TrainConfig:
    """The trainer's config from command-line arguments: CLI > --config YAML > base > defaults."""
    overrides, config_path, problems = parse_cli(argv)
    merged: dict[str, Any] = dict(base or {})
    if config_path is not None:
        try:
            merged.update(yaml_overrides(config_path, problems))
        except ConfigError as err:
            problems.extend(err.problems)
    merged.update(overrides)
    try:
        config = build(merged)
    except ConfigError as err:
        problems.extend(p for p in err.problems if p not in problems)
        raise ConfigError(problems) from None
    if problems:
        raise ConfigError(problems)
    return config


def help_text(prog: str = "python -m tinygpt.train") -> str:
    lines = [
        f"usage: {prog} [--config FILE] [--key VALUE ...]",
        "",
        "Train a character-level GPT. Every key can also be set in a YAML file given with --config;",
        "command-line flags win over the file, the file over the defaults. Dashes and underscores are",
        "both accepted (--n-layer 6, --n_layer=6); booleans take true/false or --flag/--no-flag.",
        f"No whole number is above {schema.INT_MAX:,} (2^53 - 1); none or null unsets a key that may be unset.",
    ]
    for section in SECTION_NAMES:
        lines += ["", f"{section}:"]
        for info in _KEYS.values():
            if info.section != section:
                continue
            flag = f"--{info.name.replace('_', '-')}"
            default = "unset" if info.default is None else repr(info.default)
            choices = f" [{'|'.join(info.choices)}]" if info.choices else ""
            within = f"; {info.range}" if info.range else ""
            lines.append(f"  {flag:<20} {info.help}{choices} (default: {default}{within})")
    return "\n".join(lines)
