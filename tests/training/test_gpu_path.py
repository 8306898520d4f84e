"""The GPU's code path as far as a CPU runs it: torch.compile with DDP around it, and fp16 with its grad scaler.

One run trains through Inductor (C++ for this CPU: half a minute of code generation); the others use the
aot_eager backend (Dynamo's graph capture and AOTAutograd's forward and backward, without code generation),
since graph breaks, recompiles, checkpoint keys and resume between eager and compiled runs are decided
there, not by the kernels. DDP around the compiled model runs on two gloo ranks in tests/training/test_distributed.py.
"""

import json
import signal
import subprocess
import sys

import pytest
import torch

from tests.support.paths import ROOT
from tests.support.processes import python_env
from tests.support.tiny import COURSE_SCHEDULE, loss_series, read_metrics, tiny_config, train_tiny
from tinygpt.training import checkpoint as ckpt
from tinygpt.training import schedule, trainer

AOT = ["--compile", "on", "--compile-backend", "aot_eager"]
LOSS_TOLERANCE = 1e-5  # aot_eager runs eager's kernels; Inductor's fused ones differed by ~2e-7 here


def dynamo_counters():
    """Dynamo's counters, cleared along with its caches (they are per process, and tests share one)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    return counters


def max_gap(a, b) -> float:
    pairs = [(x, y) for ra, rb in zip(loss_series(a), loss_series(b), strict=True) for x, y in zip(ra, rb)]
    assert all((x is None) == (y is None) for x, y in pairs)
    return max(abs(x - y) for x, y in pairs if x is not None)


def test_inductor_training_has_no_graph_break_and_no_recompile_after_the_first_evaluation(tmp_path, tiny_corpus,
                                                                                         data_dir):
    """The GPU's default, --compile on with Inductor, through the trainer."""
    counters = dynamo_counters()
    graphs_at_eval = []

    def count(step, val_loss, train_s):
        graphs_at_eval.append(counters["stats"]["unique_graphs"])
        return False

    compiled, _ = train_tiny(tmp_path, tiny_corpus, "--compile", "on", "--max-steps", "30", name="compiled",
                             eval_hook=count)
    assert read_metrics(compiled)[0]["compile"] and dict(counters["graph_break"]) == {}
    # One graph for the training step, one for evaluation (eval mode, no grad): then none, however long.
    assert graphs_at_eval == [2, 2, 2], graphs_at_eval
    eager, _ = train_tiny(tmp_path, tiny_corpus, "--max-steps", "30", name="eager")
    assert max_gap(compiled, eager) <= LOSS_TOLERANCE
    a, b = (ckpt.load(ckpt.path_for_step(out, 30)).parts for out in (compiled, eager))
    assert list(a["model"]) == list(b["model"]) and not any(k.startswith("_orig_mod") for k in a["model"])
    assert a["optimizer"]["adamw"]["param_groups"] == b["optimizer"]["adamw"]["param_groups"]
    assert list(a["optimizer"]["adamw"]["state"]) == list(b["optimizer"]["adamw"]["state"])


@pytest.mark.parametrize("first, second", [([], AOT), (AOT, [])], ids=["eager-then-compiled", "compiled-then-eager"])
def test_a_checkpoint_resumes_across_eager_and_compiled(tmp_path, tiny_corpus, data_dir, first, second):
    # (with the course page's schedule: the rate and beta1 set before each step reach the compiled step too)
    common = ["--max-steps", "20", "--log-interval", "1", "--dropout", "0.1", *COURSE_SCHEDULE]
    straight, _ = train_tiny(tmp_path, tiny_corpus, *common, name="straight")
    part, _ = train_tiny(tmp_path, tiny_corpus, *common, *first, "--stop-after", "10", name="part")
    _, result = train_tiny(tmp_path, tiny_corpus, *common, *second, name="part")
    assert result.finished
    starts = [r for r in read_metrics(part) if r.get("event") == "start"]
    assert [s["compile"] for s in starts] == [bool(first), bool(second)] and starts[1]["resumed_from"]
    assert max_gap(straight, part) <= LOSS_TOLERANCE
    rates = [r["lr"] for r in read_metrics(part) if "lr" in r]  # (OneCycleLR's: from its peak / 25)
    assert rates[0] == pytest.approx(max(rates) / schedule.ONECYCLE_DIV)


def test_activation_checkpointing_under_compile(tmp_path, tiny_corpus, data_dir):
    counters = dynamo_counters()
    flags = ["--activation-checkpointing", "--n-layer", "2", "--dropout", "0.1"]
    compiled, result = train_tiny(tmp_path, tiny_corpus, *flags, *AOT, name="compiled")
    assert result.finished and dict(counters["graph_break"]) == {}
    eager, _ = train_tiny(tmp_path, tiny_corpus, *flags, name="eager")
    assert max_gap(compiled, eager) <= LOSS_TOLERANCE


def test_a_compiled_run_samples_at_the_end_and_from_its_checkpoint(tmp_path, tiny_corpus, data_dir, capsys):
    from tinygpt import sample

    out, result = train_tiny(tmp_path, tiny_corpus, *AOT, "--sample-tokens", "30", "--sample-prompt", "ROMEO")
    assert result.sample.startswith("ROMEO") and len(result.sample) == len("ROMEO") + 30
    capsys.readouterr()
    assert sample.main(["--run", str(out), "--tokens", "30", "--prompt", "ROMEO"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO")


# ----------------------------------------------------------------------------------------------------
# fp16 with its grad scaler


def test_fp16_a_step_whose_gradients_overflow_is_skipped_and_the_scale_drops(tmp_path, tiny_corpus, data_dir):
    run = trainer.Trainer(tiny_config(tmp_path, tiny_corpus, "--precision", "fp16"))
    try:
        assert run.scaler.is_enabled() and run.policy.autocast_dtype == torch.float16
        run.train_step()  # the scaler's first step; its scale exists from here
        run.scaler.update(2.0 ** 40)  # so large that fp16 gradients overflow
        skipped = 0
        while True:
            before = [p.detach().clone() for p in run.model.parameters()]
            scale = run.scaler.get_scale()
            run.train_step()
            if any(not torch.equal(a, p) for a, p in zip(before, run.model.parameters())):
                break
            skipped += 1
            assert run.scaler.get_scale() == scale / 2  # backoff: the scale halves at each overflow
        assert skipped >= 1 and run.scaler.get_scale() == 2.0 ** 40 / 2 ** skipped
        print(f"fp16: {skipped} steps skipped, scale 2^40 -> 2^{40 - skipped}")
        assert all(torch.isfinite(p).all() for p in run.model.parameters())
    finally:
        run.close()


def test_fp16_stopped_and_resumed_is_bit_identical_with_the_scaler_in_the_checkpoint(tmp_path, tiny_corpus,
                                                                                    data_dir):
    common = ["--precision", "fp16", "--max-steps", "30", "--log-interval", "1", "--dropout", "0.1"]
    whole, _ = train_tiny(tmp_path, tiny_corpus, *common, name="whole")
    part, _ = train_tiny(tmp_path, tiny_corpus, *common, "--stop-after", "15", name="part")
    scaler = ckpt.load(ckpt.path_for_step(part, 15)).parts["scaler"]
    assert scaler["scale"] > 0 and "_growth_tracker" in scaler
    train_tiny(tmp_path, tiny_corpus, *common, name="part")
    assert loss_series(whole) == loss_series(part)
    scales = [r["loss_scale"] for r in read_metrics(part) if "lr" in r]
    assert scales == [r["loss_scale"] for r in read_metrics(whole) if "lr" in r] and scales[0] == 65536.0


# ----------------------------------------------------------------------------------------------------
# the script a GPU machine runs


def test_gpu_check_quick_passes_on_this_cpu(tmp_path):
    """bench/gpu_check.py --device cpu --quick: every check's CPU counterpart passes, and what the quick mode
    leaves out or this CPU cannot check (bf16 without native bf16) is named in the last line."""
    command = [sys.executable, "-X", "faulthandler", str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--quick"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=python_env(TMPDIR=str(tmp_path))) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=300)  # (about 30 s here, beside the other worker)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # -X faulthandler: every thread's stack on stderr, then the end
            stdout, stderr = proc.communicate(timeout=60)
            pytest.fail(f"gpu_check.py did not end in 300 s; what it said, then where its threads were:\n"
                        f"{stdout}\n{stderr[-8000:]}")
    lines = [json.loads(line) for line in stdout.splitlines()]
    checks = {line["check"]: line for line in lines if "check" in line}
    assert proc.returncode == 0 and lines[-1]["failed"] == [], stdout + stderr[-3000:]
    assert list(checks) == ["compile", "precision", "resume", "throughput", "preempt", "nccl", "sample", "recipe"]
    assert all(c["ok"] for c in checks.values())
    assert set(checks["recipe"]["runs"]) >= {"nanogpt", "ours"} and all(
        checks["recipe"]["runs"][r]["reached"] for r in ("nanogpt", "ours"))
    from tinygpt.training.precision import cpu_has_bf16

    assert ("bf16_val_loss" in checks["precision"]) == cpu_has_bf16()
    assert any("bf16" in n for n in lines[-1]["not_checked"]) != cpu_has_bf16()
    print(stdout)
