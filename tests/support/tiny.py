"""Tiny corpora, models and configs, a trainer run to its end here, and what it wrote (metrics.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

# A small corpus with some structure, made here so that tests need no network and no files.
TINY_TEXT = "".join(
    f"{name}: {verb} the {thing}, {name.lower()}!\n"
    for name in ("ROMEO", "JULIET", "NURSE", "FRIAR", "TYBALT")
    for verb in ("love", "fear", "seek", "keep", "lose", "greet")
    for thing in ("rose", "moon", "night", "sword", "ring", "letter", "tomb")
)


# The tiny model the tests train (seconds on one CPU), as trainer keys; each test adds its own steps.
TINY_MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "batch_size": 4, "eval_windows": 8,
              "sample_tokens": 0, "threads": 1}


def tiny_train(**keys) -> dict:
    """The tiny model's keys, with these added or changed: a spec's `train` section."""
    return {**TINY_MODEL, **keys}


def tiny_yaml(**keys) -> str:
    """tiny_train(**keys) as the inside of a YAML flow mapping, for a spec written as text:
    f"train: {{data_file: {corpus}, {tiny_yaml(max_steps=20)}}}"."""
    import yaml

    return yaml.safe_dump(tiny_train(**keys), default_flow_style=True, width=1_000_000).strip()[1:-1]


def as_flags(keys: dict) -> list[str]:
    """Trainer keys as `python -m tinygpt.train` flags."""
    return [item for key, value in keys.items() for item in (f"--{key.replace('_', '-')}", str(value))]


# The tiny model for the trainer's command line, with a run of 20 steps.
TINY_FLAGS = as_flags(tiny_train(max_steps=20, eval_interval=10, log_interval=5, ckpt_interval=10, warmup_steps=2,
                                 eval_windows=16, progress="plain"))


# The course page's optimisation (jobs/sherlock.yaml): OneCycleLR with beta1 cycled, every parameter decayed
COURSE_SCHEDULE = ["--schedule", "onecycle", "--warmup-steps", "4", "--beta1", "0.95", "--beta1-min", "0.85",
                   "--weight-decay-on", "all"]


def tiny_config(tmp_path: Path, corpus: Path, *extra: str, name: str = "run"):
    """The tiny model's config (TINY_FLAGS, then `extra`), its run directory tmp_path/name."""
    from tinygpt.base import config

    return config.resolve([*TINY_FLAGS, "--data-file", str(corpus), "--out-dir", str(tmp_path / name), *extra])


def train_tiny(tmp_path: Path, corpus: Path, *extra: str, name: str = "run", **hooks):
    """Train the tiny model in this process into tmp_path/name: (out_dir, result)."""
    from tinygpt.training import trainer

    return tmp_path / name, trainer.train(tiny_config(tmp_path, corpus, *extra, name=name), **hooks)


def read_metrics(run_dir: Path) -> list[dict]:
    from tinygpt.training import metrics

    return [json.loads(line) for line in metrics.of_run(run_dir).read_text().splitlines()]


def loss_series(run_dir: Path) -> list[tuple]:
    """(step, train_loss, val_loss) of every training and evaluation line, in order."""
    return [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in read_metrics(run_dir) if "event" not in r]
