"""The trainer end to end, in-process on CPU, with the tests' own tiny corpus."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, TINY_FLAGS, loss_series, python_env, read_metrics, run_module
from tinygpt import checkpoint as ckpt
from tinygpt import config, trainer


def run(tmp_path, corpus, *extra, name="run"):
    out = tmp_path / name
    argv = [*TINY_FLAGS, "--data-file", str(corpus), "--out-dir", str(out), *extra]
    result = trainer.train(config.resolve(argv))
    return out, result


def test_lr_schedule_warms_up_then_decays_to_min_lr():
    o = config.OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    lrs = [trainer.lr_at(s, o) for s in range(120)]
    assert lrs[0] < lrs[5] < lrs[9] < 1.0
    assert max(lrs) == pytest.approx(1.0, abs=1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[110] == lrs[119] == 0.1


def test_weight_decay_applies_to_matrices_only():
    from tinygpt.model import GPT

    model = GPT(config.ModelConfig(block_size=8, n_layer=1, n_head=1, n_embd=8, bias=True), vocab_size=10)
    opt = trainer.make_optimizer(model, config.OptimConfig(weight_decay=0.1), fused=False)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decayed["params"])
    assert plain["weight_decay"] == 0.0 and all(p.dim() == 1 for p in plain["params"])


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
    a = ckpt.load(ckpt.path_for_step(whole, 40))["model"]
    b = ckpt.load(ckpt.path_for_step(part, 40))["model"]
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


def test_keeps_the_newest_k_checkpoints(tmp_path, tiny_corpus, data_dir):
    out, _ = run(tmp_path, tiny_corpus, "--max-steps", "25", "--ckpt-interval", "5", "--keep-checkpoints", "2")
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_00000020.pt", "step_00000025.pt"]


def test_corrupt_newest_checkpoint_is_skipped_with_a_warning(tmp_path, tiny_corpus, data_dir, capsys):
    out, _ = run(tmp_path, tiny_corpus, "--max-steps", "20", "--ckpt-interval", "10")
    newest = ckpt.path_for_step(out, 20)
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated
    path, state = ckpt.load_newest(out, warn=print)
    assert path == ckpt.path_for_step(out, 10) and state["step"] == 10
    assert "skipping checkpoint" in capsys.readouterr().out
    _, result = run(tmp_path, tiny_corpus, "--max-steps", "20", "--ckpt-interval", "10")
    assert result.finished and result.step == 20


def test_checkpoint_holds_every_part_and_loads_weights_only(tmp_path, tiny_corpus, data_dir):
    out, _ = run(tmp_path, tiny_corpus)
    state = torch.load(ckpt.path_for_step(out, 20), weights_only=True)
    for key in ("model", "model_args", "optimizer", "step", "config", "rng", "data", "best_val_loss", "world_size"):
        assert key in state
    assert not any(k.startswith(("_orig_mod", "module.")) for k in state["model"])
    assert {"python", "numpy", "torch"} <= state["rng"][0].keys()


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


def test_cli_help_errors_and_sample(tmp_path, tiny_corpus):
    help_out = run_module("tinygpt.train", "--help")
    assert help_out.returncode == 0 and "--n-layer" in help_out.stdout
    bad = run_module("tinygpt.train", "--n-layers", "2", "--lr", "-1")
    assert bad.returncode == 2
    assert "did you mean `n_layer`" in bad.stderr and "lr: must be > 0" in bad.stderr
    assert "Traceback" not in bad.stderr
    missing = run_module("tinygpt.train", "--data-file", str(tmp_path / "missing.txt"), "--out-dir",
                         str(tmp_path / "x"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr

    out = tmp_path / "cli"
    done = run_module("tinygpt.train", *TINY_FLAGS, "--data-file", str(tiny_corpus), "--out-dir", str(out),
                      "--data-dir", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    assert "done: step 20" in done.stdout and str(out) in done.stdout
    sample = run_module("tinygpt.sample", "--run", str(out), "--prompt", "JULIET:", "--tokens", "30",
                        "--temperature", "0.8", "--top-k", "5", "--seed", "1")
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout.startswith("JULIET:") and len(sample.stdout.rstrip("\n")) == len("JULIET:") + 30
    again = run_module("tinygpt.sample", "--run", str(out), "--prompt", "JULIET:", "--tokens", "30",
                       "--top-k", "5", "--seed", "1")
    assert again.stdout == sample.stdout
    empty = run_module("tinygpt.sample", "--run", str(tmp_path / "nothing"))
    assert empty.returncode == 1 and "no valid checkpoint" in empty.stderr


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
    assert out.returncode == 2 and "n_layer: must be >= 1" in out.stderr and "Traceback" not in out.stderr


def test_a_run_written_with_the_removed_cpu_keys_resumes_and_samples(tmp_path, tiny_corpus, data_dir):
    """Runs from before the native CPU layer was removed hold run.cpu_kernels / cpu_allocator in their
    config.yaml and checkpoints: they still resume and sample (the keys are noted and ignored)."""
    import yaml

    out, _ = run(tmp_path, tiny_corpus, "--max-steps", "10")
    for path in ckpt.list_checkpoints(out):
        state = torch.load(path, weights_only=True)
        state["config"]["run"].update(cpu_kernels="auto", cpu_allocator="caching")
        torch.save(state, path)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    saved["run"].update(cpu_kernels="on", cpu_allocator="malloc")
    (out / "config.yaml").write_text(yaml.safe_dump(saved))
    sample = run_module("tinygpt.sample", "--run", str(out), "--tokens", "10")
    assert sample.returncode == 0 and "note: `cpu_allocator` is ignored" in sample.stderr, sample.stderr
    again = run_module("tinygpt.train", "--config", str(out / "config.yaml"), "--max-steps", "20")
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stdout and "note: `cpu_kernels` is ignored" in again.stderr
    assert "done: step 20" in again.stdout


def test_a_checkpoint_that_does_not_load_is_set_aside_and_never_counts_as_kept(tmp_path, tiny_corpus, data_dir,
                                                                               capsys):
    """With keep 2 and a garbage file among the checkpoints, retention used to keep the garbage and one good
    checkpoint, and the final line named the garbage."""
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
