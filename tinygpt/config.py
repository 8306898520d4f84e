"""The trainer's configuration: one schema shared by the trainer and the launcher.

This module imports no torch: the launcher validates every run of a sweep against this very schema on
a login node, before anything is submitted.

Five dataclasses, one per concern (model, data, optim, run, track), gathered in `TrainConfig`. Every field
name is unique across the sections, so a key can be written flat (`n_layer: 6`, `--n-layer 6`) or
dotted (`model.n_layer: 6`) or nested in YAML (`model: {n_layer: 6}`).

Precedence: command-line flags > YAML file (`--config FILE`) > defaults. Every problem is collected and
reported at once in a `ConfigError`, each message naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ProblemsError


class ConfigError(ProblemsError, ValueError):
    """One or more problems with a configuration; `problems` holds one message per problem."""


def _f(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices})


def _list_f(help: str, choices: tuple[str, ...]) -> Any:
    return field(default_factory=list, metadata={"help": help, "choices": choices})


SECTION_NAMES = ("model", "data", "optim", "run", "track")


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    n_layer: int = _f(4, "number of transformer blocks")
    n_head: int = _f(4, "attention heads per block; must divide n_embd")
    n_embd: int = _f(128, "width of the residual stream")
    block_size: int = _f(128, "context length in characters")
    dropout: float = _f(0.0, "dropout probability, 0 <= p < 1")
    bias: bool = _f(False, "use biases in Linear and LayerNorm layers")
    pos_emb: bool = _f(True, "learned position embeddings (false: the 'no positions' exercise)")
    causal: bool = _f(True, "attend to earlier positions only (false: the 'remove the mask' exercise, where "
                            "training reads the answer and generation fails)")

    def check(self, problems: list[str]) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size"):
            if getattr(self, name) < 1:
                problems.append(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.n_head >= 1 and self.n_embd >= 1 and self.n_embd % self.n_head:
            problems.append(
                f"n_embd: {self.n_embd} is not divisible by n_head {self.n_head}; "
                f"choose n_embd as a multiple of n_head (e.g. {self.n_head * max(1, round(self.n_embd / self.n_head))})"
            )
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout: must be in [0, 1), got {self.dropout}")


DATASETS = ("shakespeare", "pydoc", "sherlock")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    dataset: str = _f("shakespeare", "built-in corpus (ignored when data_file is set)", DATASETS)
    data_file: str | None = _f(None, "train on any UTF-8 text file instead of a built-in corpus")
    data_dir: str | None = _f(None, "where prepared data is cached (default: $TINYGPT_DATA_DIR, else ./data)")
    batch_size: int = _f(16, "sequences per micro-batch, per rank")
    eval_windows: int = _f(240, "fixed windows used to measure val (and train) loss")

    def check(self, problems: list[str]) -> None:
        if self.data_file is None and self.dataset not in DATASETS:
            problems.append(_choice_message("dataset", self.dataset, DATASETS))
        if self.data_file is not None and not str(self.data_file).strip():
            problems.append("data_file: is empty; give a path to a UTF-8 text file or leave it unset")
        for name in ("batch_size", "eval_windows"):
            if getattr(self, name) < 1:
                problems.append(f"{name}: must be >= 1, got {getattr(self, name)}")


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    max_steps: int = _f(1600, "optimizer steps to train for")
    lr: float = _f(5e-3, "peak learning rate")
    min_lr: float = _f(2e-4, "learning rate at the end of the cosine decay")
    warmup_steps: int = _f(50, "linear warm-up steps")
    lr_decay_steps: int | None = _f(None, "steps of the cosine decay (default: max_steps)")
    weight_decay: float = _f(0.1, "AdamW weight decay, applied to matrices only")
    beta1: float = _f(0.9, "AdamW beta1")
    beta2: float = _f(0.99, "AdamW beta2")
    grad_clip: float = _f(1.0, "clip the global gradient norm to this (0: off)")
    grad_accum: int = _f(1, "micro-batches per optimizer step")

    def check(self, problems: list[str]) -> None:
        for name in ("max_steps", "grad_accum"):
            if getattr(self, name) < 1:
                problems.append(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps",):
            if getattr(self, name) < 0:
                problems.append(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.lr_decay_steps is not None and self.lr_decay_steps < 1:
            problems.append(f"lr_decay_steps: must be >= 1 (or unset), got {self.lr_decay_steps}")
        if not self.lr > 0:
            problems.append(f"lr: must be > 0, got {self.lr}")
        if self.min_lr < 0:
            problems.append(f"min_lr: must be >= 0, got {self.min_lr}")
        elif self.lr > 0 and self.min_lr > self.lr:
            problems.append(f"min_lr: {self.min_lr} is above lr {self.lr}; set min_lr <= lr")
        for name in ("weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                problems.append(f"{name}: must be >= 0, got {getattr(self, name)}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"{name}: must be in [0, 1), got {getattr(self, name)}")


# The sampling of the course's project page (and of `python -m tinygpt.sample`): defined here, once.
SAMPLE_TEMPERATURE = 0.8
SAMPLE_TOP_K = 20

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
COMPILE_MODES = ("auto", "on", "off")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
PROGRESS_MODES = ("auto", "bar", "plain", "off")
PREEMPT_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "XCPU")


@dataclass(kw_only=True, slots=True)
class RunConfig:
    out_dir: str = _f("runs/default", "run directory: config, metrics, checkpoints, samples")
    seed: int = _f(1337, "seed for weights, data order and dropout")
    resume: str = _f("auto", "auto (newest valid checkpoint, else fresh), never, or a checkpoint PATH")
    eval_interval: int = _f(250, "evaluate every this many steps (and at the end)")
    log_interval: int = _f(10, "write a training metrics line every this many steps")
    ckpt_interval: int = _f(500, "checkpoint every this many steps (and at the end)")
    keep_checkpoints: int = _f(3, "keep the newest K checkpoints (at least 2)")
    stop_after: int | None = _f(None, "leave after this many steps in this process, resumable (a time box)")
    sample_tokens: int = _f(300, "characters of text sampled at the end (0: none)")
    sample_prompt: str = _f("\n", "prompt for the final sample")
    sample_temperature: float = _f(SAMPLE_TEMPERATURE, "temperature of the final sample, > 0 (python -m "
                                                       "tinygpt.sample's default too)")
    sample_top_k: int = _f(SAMPLE_TOP_K, "the final sample draws from the top K characters (0: all; python -m "
                                         "tinygpt.sample's default too)")
    device: str = _f("auto", "auto, cpu, cuda or cuda:N")
    precision: str = _f("auto", "auto: bf16 on sm >= 8.0, fp16 + grad scaler on sm 7.x, fp32 on CPU; on CPU "
                                "on request bf16 (where the CPU has native bf16) and fp16 (to try the V100 path: "
                                "fp16 autocast and its grad scaler)", PRECISIONS)
    compile: str = _f("auto", "torch.compile: auto (on for CUDA, off on CPU), on or off; on CPU, inductor "
                              "generates C++ with the system compiler: a minute or more before the first step",
                      COMPILE_MODES)
    compile_backend: str = _f("inductor", "torch.compile backend: inductor (generated kernels), or aot_eager / "
                                          "eager to see graph breaks and recompiles in seconds", COMPILE_BACKENDS)
    activation_checkpointing: bool = _f(False, "recompute each block in backward: less memory, ~30% more compute")
    threads: int | None = _f(None, "CPU threads (default: $SLURM_CPUS_PER_TASK, else torch's choice)")
    peak_flops: float | None = _f(None, "peak FLOP/s of one device, for MFU (default: known GPUs)")
    progress: str = _f("auto", "auto (a bar on a terminal, plain lines otherwise), bar, plain or off",
                       PROGRESS_MODES)
    preempt_signal: str = _f("USR2", "signal Slurm sends before the time limit (SIGTERM is always handled)",
                             PREEMPT_SIGNALS)
    max_requeues: int = _f(20, "give up requeueing after this many restarts")
    hang_timeout: float = _f(900.0, "end the job when no step, evaluation or checkpoint completes for this many "
                                    "seconds, with every live rank's stacks in the log (0: never)")
    join_timeout: float = _f(600.0, "seconds the ranks may take to find each other at start (a slow shared "
                                    "filesystem delays their imports); then the message names the master and "
                                    "the ranks that never arrived")
    sweep: str | None = _f(None, "the sweep this run belongs to (set by the launcher; the W&B group)")

    def check(self, problems: list[str]) -> None:
        if not str(self.out_dir).strip():
            problems.append("out_dir: is empty; give a directory for the run")
        if self.resume not in ("auto", "never") and not str(self.resume).strip():
            problems.append("resume: give auto, never or the path of a checkpoint")
        for name in ("eval_interval", "log_interval", "ckpt_interval"):
            if getattr(self, name) < 1:
                problems.append(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.keep_checkpoints < 2:
            problems.append(
                f"keep_checkpoints: must be >= 2 (the newest may be half-written when a job dies), "
                f"got {self.keep_checkpoints}"
            )
        if self.stop_after is not None and self.stop_after < 1:
            problems.append(f"stop_after: must be >= 1 (or unset), got {self.stop_after}")
        if self.sample_tokens < 0:
            problems.append(f"sample_tokens: must be >= 0, got {self.sample_tokens}")
        if not (math.isfinite(self.sample_temperature) and self.sample_temperature > 0):
            problems.append(f"sample_temperature: must be a number > 0, got {self.sample_temperature}")
        if self.sample_top_k < 0:
            problems.append(f"sample_top_k: must be >= 0 (0: all characters), got {self.sample_top_k}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", self.device):
            problems.append(f"device: {self.device!r} is not one of auto, cpu, cuda, cuda:N")
        if self.threads is not None and self.threads < 1:
            problems.append(f"threads: must be >= 1 (or unset), got {self.threads}")
        if self.peak_flops is not None and not self.peak_flops > 0:
            problems.append(f"peak_flops: must be > 0 (or unset), got {self.peak_flops}")
        if self.max_requeues < 0:
            problems.append(f"max_requeues: must be >= 0, got {self.max_requeues}")
        if not 0 <= self.hang_timeout < float("inf"):
            problems.append(f"hang_timeout: must be a number of seconds >= 0 (0: off), got {self.hang_timeout}")
        if not 0 < self.join_timeout < float("inf"):
            problems.append(f"join_timeout: must be a number of seconds > 0, got {self.join_timeout}")
        if not 0 <= self.seed <= MAX_SEED:
            problems.append(f"seed: must be a whole number from 0 to {MAX_SEED:,} (2^53 - 1), got {self.seed}")
        _check_choices(self, problems)


MAX_SEED = 2**53 - 1  # every rank's seeds are derived from it (seed * 1000 + ...), within torch's 64 bits

LOGGERS = ("tensorboard", "wandb")
TRACKING_EXTRA = 'pip install -e ".[tracking]"'  # what installs the trackers' packages (pyproject.toml)
WANDB_MODES = ("auto", "online", "offline")


@dataclass(kw_only=True, slots=True)
class TrackConfig:
    loggers: list[str] = _list_f("experiment trackers fed with metrics.jsonl's records, e.g. tensorboard,wandb "
                                 f"({TRACKING_EXTRA})", LOGGERS)
    wandb_project: str | None = _f(None, "W&B project (default: $WANDB_PROJECT, else tinygpt)")
    wandb_entity: str | None = _f(None, "W&B entity, a user or team (default: $WANDB_ENTITY, else yours)")
    wandb_mode: str = _f("auto", "online, offline (sync later with `launch.py sync`), or auto: offline when the "
                                 "W&B service cannot be reached", WANDB_MODES)

    def check(self, problems: list[str]) -> None:
        _check_choices(self, problems)
        for name in ("wandb_project", "wandb_entity"):
            value = getattr(self, name)
            if value is not None and (not value or len(value) > 128 or set(value) & set(WANDB_FORBIDDEN)):
                forbidden = " ".join(c for c in WANDB_FORBIDDEN if c.isprintable())
                problems.append(f"{name}: {value!r} is not a name W&B takes: 1 to 128 characters, none of "
                                f"{forbidden} or a line break; e.g. tinygpt-shakespeare")


WANDB_FORBIDDEN = "/\\#?%:\n\r"  # what W&B refuses in a project (or entity) name: it is part of a URL


def _check_choices(section: Any, problems: list[str]) -> None:
    """Every field of `section` with a fixed set of values (precision, compile, loggers, ...) holds one."""
    for f in dataclasses.fields(section):
        choices, value = _FIELD_INFO[f.name].choices, getattr(section, f.name)
        if not choices:
            continue
        for item in value if isinstance(value, list) else [value]:
            if item not in choices:
                problems.append(_choice_message(f.name, item, choices))


def _copied(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    track: TrackConfig = field(default_factory=TrackConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        # Field by field, not dataclasses.asdict, whose deep copies are slow and not needed: the values are
        # numbers, strings and lists of strings, and the lists are copied. (A dry run calls this per run.)
        return {name: {f.name: _copied(getattr(section, f.name)) for f in dataclasses.fields(section)}
                for name in SECTION_NAMES for section in (getattr(self, name),)}

    def flat(self) -> dict[str, Any]:
        return {k: v for section in self.to_dict().values() for k, v in section.items()}

    def check(self) -> list[str]:
        problems: list[str] = []
        for name in SECTION_NAMES:
            getattr(self, name).check(problems)
        for key, value in self.flat().items():
            if isinstance(value, str) and "\x00" in value:  # no path, name or shell word can hold one
                problems.append(f"{key}: contains a NUL character; remove it")
            elif key in PATH_KEYS and isinstance(value, str) and value.startswith("~"):
                try:
                    Path(value).expanduser()
                except RuntimeError:
                    problems.append(f"{key}: {value!r} starts with ~ but names no user of this machine; "
                                    f"write the path out")
        return problems


PATH_KEYS = ("data_file", "data_dir", "out_dir", "resume")  # the keys that hold paths


# ----------------------------------------------------------------------------------------------------
# The field table: every key, its section, type and help, derived once from the dataclasses.


@dataclass(frozen=True, slots=True)
class FieldInfo:
    name: str
    section: str
    kind: type  # int, float, bool, str, or list (of str)
    optional: bool
    default: Any
    help: str
    choices: tuple[str, ...] | None


def _build_field_info() -> dict[str, FieldInfo]:
    table: dict[str, FieldInfo] = {}
    for section_field in dataclasses.fields(TrainConfig):
        section_cls = typing.get_type_hints(TrainConfig)[section_field.name]
        hints = typing.get_type_hints(section_cls)
        for f in dataclasses.fields(section_cls):
            hint = hints[f.name]
            args = typing.get_args(hint)
            optional = type(None) in args
            if typing.get_origin(hint) is list:
                kind = list
            else:
                kind = next((a for a in args if a is not type(None)), hint) if args else hint
            assert f.name not in table, f"field {f.name} appears in two sections"
            default = [] if kind is list else f.default
            table[f.name] = FieldInfo(f.name, section_field.name, kind, optional, default,
                                      f.metadata["help"], f.metadata["choices"])
    return table


_FIELD_INFO = _build_field_info()


def field_info() -> dict[str, FieldInfo]:
    """Every trainer key, in declaration order."""
    return dict(_FIELD_INFO)


def _choice_message(name: str, value: Any, choices: tuple[str, ...]) -> str:
    return f"{name}: {value!r} is not one of {', '.join(choices)}"


def suggest(word: str, candidates: typing.Iterable[str]) -> str:
    """' (did you mean `x`?)' for the closest candidate, or ''."""
    match = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean `{match[0]}`?)" if match else ""


def normalise_key(key: str) -> str:
    """`--n-layer`, `n-layer`, `model.n_layer` -> `n_layer` (the section part is checked separately)."""
    return key.lstrip("-").replace("-", "_")


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_NONE = {"none", "null", "~", ""}


def coerce(name: str, value: Any) -> Any:
    """Convert a YAML or command-line value to the field's type; raise ValueError with a message."""
    info = _FIELD_INFO[name]
    if info.kind is list:
        return _coerce_list(name, value)
    if value is None or (isinstance(value, str) and info.optional and value.strip().lower() in _NONE):
        if info.optional:
            return None
        raise ValueError(f"{name}: needs a value of type {info.kind.__name__}, got nothing")
    if info.kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError(f"{name}: expected true or false, got {value!r}")
    if info.kind is int:
        if isinstance(value, bool):
            raise ValueError(f"{name}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            text = value.strip().replace("_", "")
            try:
                return int(text)
            except ValueError:
                try:
                    as_float = float(text)
                except ValueError:
                    as_float = math.nan
                if as_float.is_integer():
                    return int(as_float)
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if info.kind is float:
        if isinstance(value, bool):
            raise ValueError(f"{name}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            result = float(value)
        else:
            try:
                result = float(str(value).strip())
            except ValueError:
                raise ValueError(f"{name}: expected a number, got {value!r}") from None
        if not math.isfinite(result):
            raise ValueError(f"{name}: expected a finite number, got {value!r}")
        return result
    if isinstance(value, (dict, list)):
        raise ValueError(f"{name}: expected a single value, got a {type(value).__name__}")
    return str(value)


def _coerce_list(name: str, value: Any) -> list[str]:
    """A list from YAML (`[a, b]`), or from a comma-separated string (`a,b`; `none` or empty: no items)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE):
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or any(isinstance(i, (dict, list, tuple)) or i is None for i in items):
        raise ValueError(f"{name}: expected a list such as [tensorboard, wandb] or tensorboard,wandb, got {value!r}")
    return list(dict.fromkeys(str(i).strip() for i in items if str(i).strip()))


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
        info = _FIELD_INFO.get(name)
        if info is None or (section is not None and section != info.section):
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
                info = _FIELD_INFO.get(sub)
                if info is None or info.section != key:
                    problems.append(unknown_key_message(f"{key}.{sub_key}", section=key))
                else:
                    put(sub, sub_value, f"{key}.")
        elif key in SECTION_NAMES:
            problems.append(f"{key}: a section must be a mapping of keys, got {value!r}")
        else:
            put(key, value, "")
    return flat


def unknown_key_message(key: str, section: str | None = None) -> str:
    plain = normalise_key(key.rpartition(".")[2])
    names = [n for n, i in _FIELD_INFO.items() if section is None or i.section == section]
    where = f"valid keys of `{section}` are" if section else "valid keys are"
    return f"unknown key `{key}`{suggest(plain, names)}; {where}: {', '.join(names)}"


def build(overrides: dict[str, Any], source: str | None = None) -> TrainConfig:
    """Defaults updated by `overrides` ({field: raw value}), type-checked and validated.

    Raises ConfigError listing every problem.
    """
    problems: list[str] = []
    values: dict[str, dict[str, Any]] = {name: {} for name in SECTION_NAMES}
    for name, raw in overrides.items():
        info = _FIELD_INFO.get(name)
        if info is None:
            problems.append(unknown_key_message(name))
            continue
        try:
            value = coerce(name, raw)
        except ValueError as err:
            problems.append(str(err))
            continue
        values[info.section][name] = value
    config = TrainConfig(
        model=ModelConfig(**values["model"]),
        data=DataConfig(**values["data"]),
        optim=OptimConfig(**values["optim"]),
        run=RunConfig(**values["run"]),
        track=TrackConfig(**values["track"]),
    )
    problems.extend(config.check())
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


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file; a missing file or a syntax error is a ConfigError with the line number."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; check the path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot be read ({err})") from None
    except ValueError as err:  # a NUL character in the path
        raise ConfigError(f"{str(path)!r}: not a usable file path ({err}); check the path") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
        if context and start is not None and (mark is None or start.line != mark.line):
            problem += f" ({context} at line {start.line + 1}, column {start.column + 1})"
        raise ConfigError(f"{path}:{where}: YAML syntax error: {problem}; fix the file") from None


def yaml_overrides(path: str | Path, problems: list[str]) -> dict[str, Any]:
    data = load_yaml(path)
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


def parse_cli(argv: list[str]) -> tuple[dict[str, Any], str | None, list[str]]:
    """Split `--key value`, `--key=value`, `--flag`, `--no-flag` into ({field: raw}, config path, problems)."""
    overrides: dict[str, Any] = {}
    config_path: str | None = None
    problems: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--") or arg == "--":
            problems.append(f"unexpected argument {arg!r}; options look like --n-layer 6 or --n-layer=6")
            continue
        key, eq, inline = arg[2:].partition("=")
        name = normalise_key(key)
        if name == "config":
            if eq:
                config_path = inline
            elif i < len(argv):
                config_path = argv[i]
                i += 1
            else:
                problems.append("--config: needs the path of a YAML file")
            continue
        if name not in _FIELD_INFO and name.startswith("no_") and _FIELD_INFO.get(name[3:], None) \
                and _FIELD_INFO[name[3:]].kind is bool and not eq:
            overrides[name[3:]] = False
            continue
        info = _FIELD_INFO.get(name)
        if info is None:
            problems.append(
                f"unknown option --{key}{suggest(name, _FIELD_INFO)}; "
                f"run with --help to list the options"
            )
            if not eq and i < len(argv) and not argv[i].startswith("--"):
                i += 1
            continue
        if eq:
            value: Any = inline
        elif info.kind is bool and (i >= len(argv) or argv[i].startswith("--")):
            value = True  # a bare --flag; `--flag VALUE` takes the value (and checks it) below
        elif i < len(argv) and (not argv[i].startswith("--") or _looks_like_number(argv[i])):
            value = argv[i]
            i += 1
        else:
            problems.append(f"--{key}: needs a value ({info.help})")
            continue
        overrides[name] = value
    return overrides, config_path, problems


def _looks_like_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


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
    ]
    for section in SECTION_NAMES:
        lines += ["", f"{section}:"]
        for info in _FIELD_INFO.values():
            if info.section != section:
                continue
            flag = f"--{info.name.replace('_', '-')}"
            default = "unset" if info.default is None else repr(info.default)
            choices = f" [{'|'.join(info.choices)}]" if info.choices else ""
            lines.append(f"  {flag:<20} {info.help}{choices} (default: {default})")
    return "\n".join(lines)
