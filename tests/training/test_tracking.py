"""TensorBoard and W&B as sinks of metrics.jsonl: the same values, one curve and one run across lives.

No network: W&B runs offline (its files read back with its own record format), TensorBoard's event files
are read with TensorBoard's own reader.
"""

import json
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from tests.support.paths import ROOT
from tests.support.processes import launch as shared_launch
from tests.support.processes import run_module, wait_until
from tests.support.tiny import TINY_FLAGS, read_metrics, tiny_yaml, train_tiny
from tinygpt.base import config
from tinygpt.training import tracking, trainer


def run(tmp_path: Path, corpus: Path, *extra: str, name: str = "run"):
    return train_tiny(tmp_path, corpus, "--wandb-mode", "offline", *extra, name=name)


def tensorboard_scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def expected_scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    """What metrics.jsonl says each tag should hold, as float32 (TensorBoard's precision)."""
    expected: dict[str, list] = {}
    for record in read_metrics(out):
        for tag, value in tracking._scalars(record).items():
            expected.setdefault(tag, []).append((record["step"], float(np.float32(value))))
    return expected


def wandb_records(run_file: Path):
    """The records of a W&B run file (`run-<id>.wandb`): W&B's protobuf records in LevelDB's log format
    (32 KiB blocks; each chunk a 7-byte header: crc32c, length, type FULL/FIRST/MIDDLE/LAST), after W&B's
    own 7-byte header."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def finished_records(folder: Path, timeout: float = 60.0) -> list:
    """The records of an offline W&B run once its `exit` record is there. W&B's service process writes the file
    and can still be flushing it when `run.finish()` has returned."""
    def finished() -> list:
        files = list(folder.glob("run-*.wandb"))
        records = list(wandb_records(files[0])) if files and files[0].stat().st_size >= 7 else []
        return records if records and records[-1].WhichOneof("record_type") == "exit" else []

    return wait_until(finished, timeout, poll=0.05, what=f"{folder}: the W&B run's exit record")


def wandb_lives(out: Path) -> list[dict]:
    """Per offline W&B directory (one per life of the run): its run id, group, name, history and summary."""
    lives = []
    for folder in sorted((out / "wandb").glob("offline-run-*")):
        life = {"folder": folder.name, "history": {}, "summary": {}}
        for record in finished_records(folder):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                life.update(id=record.run.run_id, group=record.run.run_group, name=record.run.display_name,
                            config={i.key: json.loads(i.value_json) for i in record.run.config.update})
            elif kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                life["history"][row["_step"]] = row
            elif kind == "summary":
                life["summary"].update({i.key: json.loads(i.value_json) for i in record.summary.update if i.key})
        lives.append(life)
    return lives


def test_tensorboard_scalars_equal_the_metrics_step_by_step(tmp_path, tiny_corpus, data_dir):
    out, _ = run(tmp_path, tiny_corpus, "--loggers", "tensorboard", "--max-steps", "40", "--log-interval", "1")
    scalars = tensorboard_scalars(out)
    assert set(scalars) == {"train/loss", "train/lr", "train/tokens_per_s", "eval/val_loss", "eval/train_loss"}
    assert scalars == expected_scalars(out)
    assert [step for step, _ in scalars["train/loss"]] == list(range(1, 41))


def test_a_stopped_and_resumed_run_is_one_curve_and_one_wandb_run(tmp_path, tiny_corpus, data_dir):
    both = ["--loggers", "tensorboard,wandb", "--max-steps", "40"]
    out, first = run(tmp_path, tiny_corpus, *both, "--stop-after", "20")
    _, second = run(tmp_path, tiny_corpus, *both)
    assert (first.step, second.step, second.finished) == (20, 40, True)
    scalars = tensorboard_scalars(out)
    assert [s for s, _ in scalars["train/loss"]] == [5, 10, 15, 20, 25, 30, 35, 40]  # each step once
    assert scalars == expected_scalars(out)
    lives = wandb_lives(out)
    assert len(lives) == 2 and lives[0]["id"] == lives[1]["id"] == tracking.wandb_run_id(config.resolve(
        ["--out-dir", str(out)]))
    # (W&B names a life's folder by the second it started and the run id, with -1 added when two lives start
    # in the same second)
    assert all(re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(life['id'])}(-\d+)?", life["folder"])
               and life["name"] == "run" for life in lives), [(life["folder"], life["id"]) for life in lives]
    assert sorted(lives[0]["history"]) == [5, 10, 15, 20] and sorted(lives[1]["history"]) == [25, 30, 35, 40]
    metrics = read_metrics(out)
    val = {r["step"]: r["val_loss"] for r in metrics if "val_loss" in r}
    assert {s: h["eval/val_loss"] for life in lives for s, h in life["history"].items() if "eval/val_loss" in h} == val
    assert lives[1]["summary"]["best_val_loss"] == metrics[-1]["best_val_loss"] == min(val.values())
    assert lives[1]["summary"]["final_val_loss"] == val[40]
    assert lives[0]["config"]["model"]["n_embd"] == 32 and lives[0]["config"]["track"]["wandb_mode"] == "offline"


def test_what_a_killed_life_logged_after_its_checkpoint_is_purged_from_tensorboard(tmp_path, tiny_corpus, data_dir,
                                                                                    monkeypatch):
    flags = ["--loggers", "tensorboard", "--max-steps", "40", "--ckpt-interval", "10", "--log-interval", "1"]
    real_step = trainer.Trainer.train_step

    def dies_after_step_25(self):
        if self.state.step == 25:
            raise RuntimeError("node lost")  # the life ends after logging 21..25, its checkpoint is step 20
        return real_step(self)

    monkeypatch.setattr(trainer.Trainer, "train_step", dies_after_step_25)
    with pytest.raises(RuntimeError, match="node lost"):
        run(tmp_path, tiny_corpus, *flags)
    assert [s for s, _ in tensorboard_scalars(tmp_path / "run")["train/loss"]][-1] == 25
    monkeypatch.setattr(trainer.Trainer, "train_step", real_step)
    out, result = run(tmp_path, tiny_corpus, *flags)
    assert result.finished
    scalars = tensorboard_scalars(out)
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 41))  # 21..25 once, from the second life
    assert scalars == expected_scalars(out)


def test_config_and_the_spec_name_reach_the_trackers(tmp_path, tiny_corpus, data_dir):
    out, _ = run(tmp_path, tiny_corpus, "--loggers", "wandb", "--sweep", "width-depth", name="n_layer=2")
    (life,) = wandb_lives(out)
    assert life["group"] == "width-depth" and life["name"] == "n_layer=2"
    assert life["id"] == tracking.wandb_run_id(config.resolve(["--sweep", "width-depth", "--out-dir", "x/n_layer=2"]))
    assert life["id"] != tracking.wandb_run_id(config.resolve(["--sweep", "other", "--out-dir", "x/n_layer=2"]))
    assert not (Path.cwd() / "wandb").exists()  # W&B's files stay under the run directory


def test_wandb_auto_mode_goes_offline_with_one_line_when_the_service_cannot_be_reached(tmp_path, monkeypatch):
    import socket

    with socket.socket() as closed:  # a port on this machine that nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    said = []
    cfg = config.resolve(["--wandb-mode", "auto"])
    assert tracking.wandb_mode(cfg, said.append) == "offline"
    assert len(said) == 1 and "offline" in said[0] and "launch.py sync" in said[0]
    assert tracking.wandb_mode(config.resolve(["--wandb-mode", "online"]), said.append) == "online"


@pytest.mark.parametrize("logger, package", [("wandb", "wandb"), ("tensorboard", "tensorboard")])
def test_a_logger_without_its_package_is_a_clear_error_naming_the_extra(tmp_path, tiny_corpus, logger, package):
    """Run with the package made unimportable (a module of that name that fails to import, first on the path)."""
    missing = tmp_path / "missing"
    (missing / package).mkdir(parents=True)
    (missing / package / "__init__.py").write_text(f'raise ModuleNotFoundError("No module named {package!r}")\n')
    out = run_module("tinygpt.train", *TINY_FLAGS, "--data-file", str(tiny_corpus), "--out-dir", str(tmp_path / "r"),
                     "--loggers", logger, PYTHONPATH=f"{missing}{os.pathsep}{ROOT}")
    assert out.returncode == 1, out.stderr
    assert f"loggers: {logger} needs the `{package}` package" in out.stderr
    assert 'pip install -e ".[tracking]"' in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "r" / "metrics.jsonl").exists()  # before any training step


def test_launch_sync_hands_every_offline_life_of_a_sweep_to_wandb_sync(tmp_path, tiny_corpus):
    import subprocess

    spec = tmp_path / "tracked.yaml"
    train = tiny_yaml(max_steps=10, eval_interval=5, loggers=["wandb"], wandb_mode="offline")
    spec.write_text(f"name: tracked\ntrain: {{data_file: {tiny_corpus}, {train}}}\n"
                    f"grid: {{lr: [1.0e-3, 3.0e-3]}}\n")

    def launch(*args: str) -> subprocess.CompletedProcess:
        return shared_launch(*args, "--workdir", str(tmp_path), timeout=300)

    nothing = launch(str(spec), "--dry-run")
    assert nothing.returncode == 0
    assert "nothing to sync" in launch("sync", str(spec)).stdout
    done = launch(str(spec), "--local")
    assert done.returncode == 0, done.stdout + done.stderr
    lives = sorted((tmp_path / "runs" / "tracked").glob("*/wandb/offline-run-*"))
    assert len(lives) == 2 and {wandb_lives(p.parent.parent)[0]["group"] for p in lives} == {"tracked"}
    synced = launch("sync", str(spec), "--dry-run")  # W&B's own sync, told not to upload (no network here)
    assert synced.returncode == 0, synced.stderr
    assert "syncing 2 offline W&B run(s)" in synced.stdout
    for life in lives:
        assert life.name in synced.stdout + synced.stderr


@pytest.mark.slurm
@pytest.mark.shares_cluster
def test_a_two_node_ddp_run_has_one_tensorboard_writer_and_one_wandb_run(tmp_path, tiny_corpus):
    from tests.support.slurm import train_on_two_nodes

    out, temporary = tmp_path / "ddp", tmp_path / "tmp"
    temporary.mkdir()
    train_on_two_nodes(tmp_path, "track2n", [*TINY_FLAGS, "--data-file", str(tiny_corpus), "--out-dir", str(out),
                                             "--data-dir", str(tmp_path / "data"), "--loggers", "tensorboard,wandb",
                                             "--wandb-mode", "offline"], TMPDIR=str(temporary))
    # A rank ends without Python's finalisation (train.exit_process), yet W&B's temporary folders go with it
    # (torch's compile cache stays, as it is meant to).
    assert [p.name for p in temporary.iterdir() if not p.name.startswith("torchinductor_")] == []
    start = read_metrics(out)[0]
    assert start["world_size"] == 2 and sorted(start["hostnames"]) == ["node1", "node2"]
    assert len(list((out / "tensorboard").iterdir())) == 1  # rank 0's writer only
    assert tensorboard_scalars(out) == expected_scalars(out)
    (life,) = wandb_lives(out)  # one W&B run
    assert sorted(life["history"]) == [5, 10, 15, 20]
