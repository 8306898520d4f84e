"""The trainer end to end, in-process on CPU, with the tests' own tiny corpus."""

import gc
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from tests.support.paths import ROOT
from tests.support.processes import python_env, run_module
from tests.support.tiny import TINY_FLAGS, loss_series, read_metrics, train_tiny
from tinygpt.base import config
from tinygpt.launch.submit import fork_server
from tinygpt.training import checkpoint as ckpt
from tinygpt.training import schedule, trainer
from tinygpt.training.optimizers import Optimizers

run = train_tiny


def test_lr_schedule_warms_up_then_decays_to_min_lr():
    o = config.OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    lrs = [schedule.lr_at(s, o) for s in range(120)]
    assert lrs[0] < lrs[5] < lrs[9] < 1.0
    assert max(lrs) == pytest.approx(1.0, abs=1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[110] == lrs[119] == 0.1


@pytest.mark.parametrize("warmup_steps, max_steps", [(150, 1500), (0, 40), (7, 40)])
def test_onecycle_is_pytorchs_one_cycle_lr_with_momentum_cycling(warmup_steps, max_steps):
    """schedule: onecycle and beta1_min give, step by step, the rate and beta1 that the course page's
    OneCycleLR(max_lr, total_steps, pct_start) gives AdamW (bench/course_loop.py runs it)."""
    lr = 3e-3
    o = config.OptimConfig(schedule="onecycle", lr=lr, min_lr=lr / 25 / 1e4, warmup_steps=warmup_steps,
                           max_steps=max_steps, beta1=0.95, beta1_min=0.85, beta2=0.999)
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    one_cycle = torch.optim.lr_scheduler.OneCycleLR(adamw, max_lr=lr, total_steps=max_steps,
                                                    pct_start=warmup_steps / max_steps)
    for step in range(max_steps):
        group = adamw.param_groups[0]
        assert schedule.lr_at(step, o) == pytest.approx(group["lr"], rel=1e-9, abs=1e-15), step
        assert schedule.beta1_at(step, o) == pytest.approx(group["betas"][0], rel=1e-12), step
        adamw.step()
        one_cycle.step()
    assert schedule.lr_at(max_steps + 5, o) == pytest.approx(o.min_lr)  # (past its end: the last rate)


def test_beta1_cycles_only_with_onecycle_and_only_below_beta1():
    assert schedule.beta1_at(10, config.OptimConfig(beta1=0.9)) == 0.9
    for keys, message in (({"beta1_min": 0.85}, "set schedule: onecycle"),
                          ({"schedule": "onecycle", "beta1": 0.8, "beta1_min": 0.85}, "set beta1_min <= beta1")):
        with pytest.raises(ValueError, match=message):
            config.OptimConfig(**keys)


def test_a_onecycle_run_with_cycled_beta1_stopped_and_resumed_is_bit_identical(tmp_path, tiny_corpus, data_dir):
    """The course page's schedule resumes exactly: the rate and beta1 are the step's, and AdamW's saved state
    (its param groups' betas included) is overwritten by them at the next step."""
    common = ["--schedule", "onecycle", "--warmup-steps", "8", "--beta1", "0.95", "--beta1-min", "0.85",
              "--weight-decay-on", "all", "--min-lr", "1e-6", "--max-steps", "30", "--log-interval", "1"]
    whole, _ = run(tmp_path, tiny_corpus, *common, name="whole")
    part, first = run(tmp_path, tiny_corpus, *common, "--stop-after", "5", name="part")
    assert not first.finished
    run(tmp_path, tiny_corpus, *common, name="part")
    assert loss_series(whole) == loss_series(part)  # exact floats
    rates = [m["lr"] for m in read_metrics(whole) if "lr" in m]
    assert len(rates) == 30 and rates[0] < max(rates) > rates[-1], rates


@pytest.mark.parametrize("on", ["matrices", "all"])
def test_weight_decay_applies_to_matrices_or_to_every_parameter(on):
    from tinygpt.model import GPT

    model = GPT(config.ModelConfig(block_size=8, n_layer=1, n_head=1, n_embd=8, bias=True), vocab_size=10)
    opt = Optimizers(model, config.OptimConfig(weight_decay=0.1, weight_decay_on=on), fused=False)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decayed["params"])
    assert plain["weight_decay"] == (0.1 if on == "all" else 0.0) and all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("grad_accum", [1, 3])
def test_a_training_step_is_a_bare_loops_step_bit_for_bit(tmp_path, tiny_corpus, data_dir, grad_accum):
    """What the trainer does in a step beyond forward, backward, clipping and AdamW changes nothing it computes:
    its weights and loss after one step equal a hand-written loop's on a copy of the same model, optimizer and
    batches (each micro-batch's loss divided by their count)."""
    import copy

    from tests.support.tiny import tiny_config

    cfg = tiny_config(tmp_path, tiny_corpus, "--grad-accum", str(grad_accum), "--grad-clip", "0.5",
                     "--dropout", "0")
    t = trainer.Trainer(cfg)
    try:
        model, adamw = copy.deepcopy((t.model, t.optimizer.parts["adamw"]))
        drawn = t.batches.generator.get_state()
        loss, lr = t.train_step()
        t.batches.generator.set_state(drawn)
        for group in adamw.param_groups:
            group["lr"] = lr
        micros = []
        for _ in range(grad_accum):
            x, y = t.batches.next_train()
            _, micro = model(x, y)
            (micro / grad_accum).backward()
            micros.append((micro / grad_accum).detach())
        total = sum(micros, torch.zeros(()))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        adamw.step()
        assert torch.equal(loss, total)
        ours, theirs = t.model.state_dict(), model.state_dict()
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), "the trainer's step differs from the bare one"
    finally:
        t.close()


def test_a_run_writes_metrics_config_checkpoints_and_sample(tmp_path, tiny_corpus, data_dir):
    out, result = run(tmp_path, tiny_corpus, "--sample-tokens", "40", "--sample-prompt", "ROMEO")
    assert result.finished and result.step == 20
    records = read_metrics(out)
    train_lines = [r for r in records if "lr" in r]
    assert [r["step"] for r in train_lines] == [5, 10, 15, 20]
    for r in train_lines:
        assert {"train_loss", "lr", "tokens_per_s", "elapsed_s"} <= r.keys()
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [10, 20] and all("train_loss" in r for r in evals)
    assert records[-1]["event"] == "finished"
    assert records[0]["event"] == "start"
    assert records[0]["precision"] == "fp32" and records[0]["device"] == "cpu"  # auto on CPU: fp32
    assert evals[-1]["val_loss"] < math.log(len(set(tiny_corpus.read_text())))  # it learned something
    saved = config.resolve(["--config", str(out / "config.yaml")])
    assert saved.model.n_embd == 32 and saved.data.data_file == str(tiny_corpus)
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_00000010.pt", "step_00000020.pt"]
    sample = (out / "samples.txt").read_text()
    assert sample.startswith("ROMEO") and len(sample) == len("ROMEO") + 40 + 1


def test_stopped_and_resumed_run_is_bit_identical(tmp_path, tiny_corpus, data_dir):
    common = ["--max-steps", "40", "--dropout", "0.1", "--log-interval", "1"]
    whole, _ = run(tmp_path, tiny_corpus, *common, name="whole")
    part, first = run(tmp_path, tiny_corpus, *common, "--stop-after", "20", name="part")
    assert not first.finished and first.step == 20
    _, second = run(tmp_path, tiny_corpus, *common, name="part")
    assert second.finished and second.step == 40
    assert loss_series(whole) == loss_series(part)  # exact floats, train and val
    a = ckpt.load(ckpt.path_for_step(whole, 40)).parts["model"]
    b = ckpt.load(ckpt.path_for_step(part, 40)).parts["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    events = [r["event"] for r in read_metrics(part) if "event" in r]
    assert events == ["start", "paused", "start", "finished"]


def test_resume_drops_metrics_logged_after_the_checkpoint(tmp_path, tiny_corpus, data_dir):
    out, _ = run(tmp_path, tiny_corpus, "--max-steps", "20", "--ckpt-interval", "10", "--stop-after", "15")
    # stop_after saves at 15; pretend the process died later, having logged more steps
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 17, "train_loss": 9.9}) + "\n" + '{"step": 18, "trai')
    run(tmp_path, tiny_corpus, "--max-steps", "20", "--ckpt-interval", "10")
    steps = [r["step"] for r in read_metrics(out) if "lr" in r]
    assert steps == [5, 10, 15, 20]


DAMAGED_LINES = [b"\xff\xfe\x00garbage", b"[1, 2, 3]", b'"just a string"', b'{"step": "7", "train_loss": 1.0}',
                 b'{"step": -1}', b'{"step": 3, "train_loss": "low", "lr": 0.1}', b'{"step": 4, "event": 5}',
                 b'{"train_loss": 2.0}', b'{"step": 2.5}', b'{"step": 8, "val_loss": true}',
                 b'{"step": 9, "lr": 0.1, "t']


def test_damaged_metrics_lines_are_skipped_by_every_reader(tmp_path, tiny_corpus, data_dir):
    """metrics.jsonl may be damaged (a kill mid-line, a bad disk): the trainer's resume, status and the report
    all read the whole records around any damaged line, and none of them fails on it."""
    from tinygpt import report
    from tinygpt.launch.read import run_states
    from tinygpt.training import metrics

    out, _ = run(tmp_path, tiny_corpus, "--max-steps", "20", "--ckpt-interval", "10", "--stop-after", "10")
    whole = metrics.read(out / "metrics.jsonl")
    lines = (out / "metrics.jsonl").read_bytes().splitlines()
    damaged = [line for pair in zip(lines, DAMAGED_LINES) for line in pair] + lines[len(DAMAGED_LINES):]
    (out / "metrics.jsonl").write_bytes(b"\n".join(damaged) + b"\n")
    assert [metrics.parse(line) for line in DAMAGED_LINES] == [None] * len(DAMAGED_LINES)
    assert metrics.read(out / "metrics.jsonl") == whole
    progress = run_states.read_progress(out)
    assert progress["step"] == 10 and run_states.state_from_run_dir(progress) == "STOPPED"
    assert report.load_run(out).val_curve == [(r["step"], r["val_loss"]) for r in whole if "val_loss" in r]
    _, result = run(tmp_path, tiny_corpus, "--max-steps", "20", "--ckpt-interval", "10")
    assert result.finished
    assert all(metrics.parse(line) for line in (out / "metrics.jsonl").read_bytes().splitlines())  # rewritten whole
    assert [r["step"] for r in read_metrics(out) if "lr" in r] == [5, 10, 15, 20]


def test_keeps_the_newest_k_checkpoints(tmp_path, tiny_corpus, data_dir):
    out, _ = run(tmp_path, tiny_corpus, "--max-steps", "25", "--ckpt-interval", "5", "--keep-checkpoints", "2")
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_00000020.pt", "step_00000025.pt"]


def test_corrupt_newest_checkpoint_is_skipped_with_a_warning(tmp_path, tiny_corpus, data_dir, capsys):
    out, _ = run(tmp_path, tiny_corpus, "--max-steps", "20", "--ckpt-interval", "10")
    newest = ckpt.path_for_step(out, 20)
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated
    newest_valid = ckpt.load_newest(out, warn=print)
    assert newest_valid.path == ckpt.path_for_step(out, 10) and newest_valid.step == 10
    assert "skipping checkpoint" in capsys.readouterr().out
    _, result = run(tmp_path, tiny_corpus, "--max-steps", "20", "--ckpt-interval", "10")
    assert result.finished and result.step == 20


def test_checkpoint_holds_every_part_and_loads_weights_only(tmp_path, tiny_corpus, data_dir):
    out, _ = run(tmp_path, tiny_corpus)
    state = torch.load(ckpt.path_for_step(out, 20), weights_only=True)
    assert state["format"] == 2 and state["step"] == 20 and set(state["meta"]) == {"model_args", "config"}
    parts = state["parts"]
    assert list(parts) == list(trainer.Trainer.PARTS)
    assert not any(k.startswith(("_orig_mod", "module.")) for k in parts["model"])
    assert parts["optimizer"]["kind"] == "adamw" and parts["optimizer"]["adamw"]["state"]
    assert parts["scaler"] == {}  # fp32 on CPU: no scaler
    assert parts["train"]["step"] == 20 and parts["train"]["best_val_loss"] > 0 and parts["train"]["elapsed_s"] > 0
    assert parts["streams"]["world_size"] == 1 and {"python", "numpy", "torch"} <= parts["streams"]["rng"][0].keys()


def test_resume_never_starts_over_and_explicit_path_must_exist(tmp_path, tiny_corpus, data_dir):
    out, _ = run(tmp_path, tiny_corpus)
    _, result = run(tmp_path, tiny_corpus, "--resume", "never")
    assert result.step == 20 and [r["event"] for r in read_metrics(out) if "event" in r] == ["start", "finished"]
    with pytest.raises(trainer.TrainingError, match="does not exist"):
        run(tmp_path, tiny_corpus, "--resume", str(tmp_path / "nope.pt"))
    _, again = run(tmp_path, tiny_corpus, "--resume", str(ckpt.path_for_step(out, 10)), name="other")
    assert again.step == 20


def test_checkpoint_model_settings_win_on_resume(tmp_path, tiny_corpus, data_dir, capsys):
    out, _ = run(tmp_path, tiny_corpus, "--max-steps", "10")
    _, result = run(tmp_path, tiny_corpus, "--max-steps", "20", "--n-embd", "64")
    assert result.step == 20
    assert "n_embd=32 (asked: 64)" in capsys.readouterr().out
    assert config.resolve(["--config", str(out / "config.yaml")]).model.n_embd == 32


def test_non_finite_loss_stops_with_a_clear_message_and_keeps_checkpoints(tmp_path, tiny_corpus, data_dir,
                                                                         monkeypatch):
    out, _ = run(tmp_path, tiny_corpus, "--max-steps", "10")
    from tinygpt.model import GPT

    real_forward = GPT.forward

    def poisoned(self, idx, targets=None):
        logits, loss = real_forward(self, idx, targets)
        return logits, (loss * float("nan") if loss is not None else None)

    monkeypatch.setattr(GPT, "forward", poisoned)
    with pytest.raises(trainer.TrainingError, match="training loss became nan at step 15"):
        run(tmp_path, tiny_corpus, "--max-steps", "20")
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_00000010.pt"]


def warm(module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` from the repository, forked warm (tinygpt/launch/submit/fork_server.py)."""
    return fork_server.run(module, list(args), python_env(), cwd=ROOT)


def test_cli_help_errors_and_sample(tmp_path, tiny_corpus):
    help_out = run_module("tinygpt.train", "--help")
    assert help_out.returncode == 0 and "--n-layer" in help_out.stdout
    bad = run_module("tinygpt.train", "--n-layers", "2", "--lr", "-1")
    assert bad.returncode == 2
    assert "did you mean `n_layer`" in bad.stderr and "lr: must be in (0, 1]" in bad.stderr
    assert "Traceback" not in bad.stderr
    missing = run_module("tinygpt.train", "--data-file", str(tmp_path / "missing.txt"), "--out-dir",
                         str(tmp_path / "x"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr

    out = tmp_path / "cli"  # (the runs that import torch are forked warm: tinygpt/launch/submit/fork_server.py)
    done = warm("tinygpt.train", *TINY_FLAGS, "--data-file", str(tiny_corpus), "--out-dir", str(out),
                      "--data-dir", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    assert "done: step 20" in done.stdout and str(out) in done.stdout
    sample = warm("tinygpt.sample", "--run", str(out), "--prompt", "JULIET:", "--tokens", "30",
                  "--temperature", "0.8", "--top-k", "5", "--seed", "1")
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout.startswith("JULIET:") and len(sample.stdout.rstrip("\n")) == len("JULIET:") + 30
    again = warm("tinygpt.sample", "--run", str(out), "--prompt", "JULIET:", "--tokens", "30",
                 "--top-k", "5", "--seed", "1")
    assert again.stdout == sample.stdout
    missing = warm("tinygpt.sample", "--run", str(tmp_path / "nothing"))
    assert missing.returncode == 1 and f"--run: {tmp_path / 'nothing'} does not exist" in missing.stderr
    (tmp_path / "nothing").mkdir()
    empty = warm("tinygpt.sample", "--run", str(tmp_path / "nothing"))
    assert empty.returncode == 1 and "no valid checkpoint" in empty.stderr


def test_a_forked_child_that_fails_before_its_module_runs_says_why_in_its_own_output(tmp_path):
    """Its streams are captured from its first line: a folder to run in that is gone is named in its stderr, and
    its exit status is the failure's (it was a FileNotFoundError for the stdout file that no child had opened)."""
    gone = fork_server.run("tinygpt.sample", ["--help"], python_env(), cwd=tmp_path / "gone")
    assert gone.returncode == 1 and str(tmp_path / "gone") in gone.stderr and gone.stdout == "", gone.stderr


def test_a_forked_childs_captured_output_is_removed_whether_or_not_it_was_read(tmp_path, monkeypatch):
    """The folder that holds a child's captured streams goes once they are read, or with the Forked object when
    nobody reads them (a process killed and waited for): nothing of it stays behind in the temporary folder."""
    assert fork_server.run("tinygpt.sample", ["--help"], python_env(), cwd=ROOT).returncode == 0  # (the server's up)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    read = fork_server.Forked("tinygpt.sample", ["--help"], python_env(), cwd=ROOT)
    assert read.communicate(timeout=120)[0].startswith("usage:") and read.returncode == 0
    killed = fork_server.Forked("tinygpt.sample", ["--help"], python_env(), cwd=ROOT)
    assert [p.name[:len("tinygpt-forked-")] for p in tmp_path.iterdir()] == ["tinygpt-forked-"]
    killed.kill()
    killed.wait(timeout=120)
    del killed
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_a_forked_child_takes_its_temporary_folder_from_its_own_tmpdir_and_runs_its_exit_hooks(tmp_path):
    """As a new interpreter would: the fork server's own idea of the temporary folder is not the child's, and
    multiprocessing's way of ending a child (os._exit) does not skip what the child's atexit asked for."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "ends.py").write_text(
        "import atexit, pathlib, sys, tempfile\n"
        "print(tempfile.gettempdir())\n"
        "atexit.register(pathlib.Path(sys.argv[1]).write_text, 'the exit hooks ran')\n")
    (tmp_path / "tmp").mkdir()
    env = {**python_env(), "PYTHONPATH": str(tmp_path / "lib"), "TMPDIR": str(tmp_path / "tmp")}
    ended = fork_server.run("ends", [str(tmp_path / "hooks")], env, cwd=tmp_path)
    assert ended.returncode == 0 and ended.stdout == f"{tmp_path / 'tmp'}\n", ended.stderr
    assert (tmp_path / "hooks").read_text() == "the exit hooks ran"


def test_the_notebooks_train_tinygpt_py_is_the_trainer_from_its_folder_and_from_the_root(tmp_path, tiny_corpus):
    """hpc_lab/04_tinygpt/train_tinygpt.py, as the course notebook names it: the same help, exit codes and
    training as `python -m tinygpt.train`, run from its own folder (paths relative to it) or from the root."""
    script = ROOT / "hpc_lab" / "04_tinygpt" / "train_tinygpt.py"
    # (It must find the package itself; its data goes to ./data, the default a notebook's user has.)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TINYGPT_DATA_DIR")}

    def run(*args: str, cwd) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env,
                              timeout=300)

    reference = run_module("tinygpt.train", "--help").stdout
    assert run("train_tinygpt.py", "--help", cwd=script.parent).stdout == reference
    assert run(str(script.relative_to(ROOT)), "--help", cwd=ROOT).stdout == reference
    bad = run("train_tinygpt.py", "--n-layers", "2", cwd=script.parent)
    assert bad.returncode == 2 and "did you mean `n_layer`" in bad.stderr and "Traceback" not in bad.stderr
    folder = tmp_path / "course"
    folder.mkdir()
    done = run(str(script), *TINY_FLAGS, "--data-file", str(tiny_corpus), "--out-dir", "runs/mine", cwd=folder)
    assert done.returncode == 0 and "done: step 20" in done.stdout, done.stderr
    assert (folder / "runs" / "mine" / "checkpoints").is_dir() and (folder / "data").is_dir()


def test_help_and_a_bad_flag_answer_without_importing_torch():
    code = ("import sys\nfrom tinygpt import train\n"
            "assert train.main(['--help']) == 0 and train.main(['--n-layers', '2']) == 2\n"
            "sys.exit(3 if 'torch' in sys.modules else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=python_env())
    assert out.returncode == 0, out.stderr
    assert "--n-layer" in out.stdout and "did you mean `n_layer`" in out.stderr


def test_the_console_script_takes_the_same_path_as_python_m():
    """`tinygpt-train` and `python -m tinygpt.train` both run train.cli: early signal recorder, exit handling."""
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "tinygpt-train"]
    assert script.value == "tinygpt.train:cli"
    assert "if __name__ == \"__main__\":\n    cli()" in (ROOT / "tinygpt" / "train.py").read_text()
    installed = Path(sys.executable).parent / "tinygpt-train"
    out = subprocess.run([str(installed), "--n-layer", "0"], capture_output=True, text=True, env=python_env())
    assert out.returncode == 2 and "n_layer: must be from 1 to 4,096" in out.stderr and "Traceback" not in out.stderr


def _format_1(new: dict) -> dict:
    """One flat dict, before named parts."""
    parts = new["parts"]
    return {"format": 1, "step": new["step"], "model": parts["model"], "optimizer": parts["optimizer"],
            "scaler": {}, "config": new["meta"]["config"], "model_args": new["meta"]["model_args"],
            "rng": parts["streams"]["rng"], "data": parts["streams"]["data"], "world_size": 1,
            "best_val_loss": parts["train"]["best_val_loss"], "elapsed_s": parts["train"]["elapsed_s"]}


def _without(part: str, key: str):
    """A part's state without `key`, with a digest of its own (so that it is whole, not damaged)."""
    def older(new: dict) -> dict:
        state = dict(new["parts"][part])
        inner = state.pop(key)
        if key == "kind":  # (AdamW's own state, as the optimizer part held it before there was a choice)
            state = state.pop(inner)
        whole = {k: v for k, v in new.items() if k != "digest"} | {"parts": {**new["parts"], part: state}}
        return {**whole, "digest": ckpt.digest(whole)}
    return older


def _without_digest(new: dict) -> dict:
    return {k: v for k, v in new.items() if k != "digest"}


@pytest.mark.parametrize("older, says", [
    (_format_1, "a checkpoint of format 1, and this version of tinygpt reads format 2; continue it with the "
                "tinygpt that wrote it, or start anew with --resume never or another --out-dir"),
    (_without("optimizer", "kind"), "its optimizer state has no 'kind', as a development version of tinygpt "
                                    "wrote it and no release does; continue it with the tinygpt that wrote it"),
    (_without("train", "eval_s"), "its train state has no 'eval_s'"),
    (_without_digest, "a checkpoint without a digest, as a development version of tinygpt wrote it"),
], ids=["format-1", "optimizer-without-kind", "train-without-eval_s", "without-digest"])
def test_a_checkpoint_of_an_older_shape_is_refused_and_kept(tmp_path, tiny_corpus, data_dir, older, says):
    """Shapes no release wrote (one flat dict; an optimizer part without its kind; a train part without the
    evaluation seconds) are whole, not damaged: resuming over one stops with what to do, and the file is
    neither converted, set aside nor replaced by a fresh start."""
    out, _ = run(tmp_path, tiny_corpus, "--max-steps", "10")
    newest = ckpt.list_checkpoints(out)[-1]
    torch.save(older(torch.load(newest, weights_only=True)), newest)
    before = {p.name: p.read_bytes() for p in (out / "checkpoints").iterdir()}
    again = warm("tinygpt.train", "--config", str(out / "config.yaml"), "--max-steps", "20")
    assert again.returncode == 1 and "Traceback" not in again.stderr, again.stderr
    assert f"error: resume: {newest}: {says}" in again.stderr
    assert {p.name: p.read_bytes() for p in (out / "checkpoints").iterdir()} == before


def test_sample_refuses_a_checkpoint_of_format_1(tmp_path, tiny_corpus, data_dir):
    out, _ = run(tmp_path, tiny_corpus, "--max-steps", "10")
    newest = ckpt.list_checkpoints(out)[-1]
    torch.save(_format_1(torch.load(newest, weights_only=True)), newest)
    sample = warm("tinygpt.sample", "--run", str(out), "--tokens", "10")
    assert sample.returncode == 1 and "a checkpoint of format 1" in sample.stderr, sample.stderr


def test_a_checkpoint_that_does_not_load_is_set_aside_and_never_counts_as_kept(tmp_path, tiny_corpus, data_dir,
                                                                               capsys):
    """With keep 2 and a garbage file among the checkpoints, retention keeps two good checkpoints (never the
    garbage and one good one), and the final line names a good one."""
    out, _ = run(tmp_path, tiny_corpus, "--max-steps", "10", "--ckpt-interval", "5", "--keep-checkpoints", "2")
    garbage = ckpt.path_for_step(out, 12)
    garbage.write_bytes(b"not a checkpoint")
    _, result = run(tmp_path, tiny_corpus, "--max-steps", "20", "--ckpt-interval", "5", "--keep-checkpoints", "2")
    said = capsys.readouterr().out
    assert result.finished and "resumed from" in said and f"{ckpt.path_for_step(out, 10)} at step 10" in said
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_00000015.pt", "step_00000020.pt"]
    aside = ckpt.checkpoint_dir(out) / "step_00000012.pt.corrupt"
    assert aside.read_bytes() == b"not a checkpoint"  # moved, never deleted
    assert said.count("set aside step_00000012.pt as step_00000012.pt.corrupt") == 1
    assert f"checkpoint: {ckpt.path_for_step(out, 20)}" in said  # the final line names a valid checkpoint


def test_a_checkpoint_holding_code_is_refused_without_advice_to_run_it(tmp_path):
    import os

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'ran'}",)

    path = tmp_path / "evil.pt"
    torch.save({"model": Payload()}, path)
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load(path)
    assert "holds objects other than tensors" in str(err.value) and "weights_only" not in str(err.value)
    assert not (tmp_path / "ran").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a machine without CUDA")
def test_sampling_on_cuda_where_there_is_none_is_a_clear_error(tmp_path):
    out = run_module("tinygpt.sample", "--run", str(tmp_path / "any"), "--device", "cuda")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "error: device: cuda was asked for but no CUDA GPU is visible; use --device cpu" in out.stderr
