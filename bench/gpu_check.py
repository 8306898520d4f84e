"""The checks for a lent GPU machine: what CPU tests cannot show, in one short run.

    python bench/gpu_check.py                      # every check, on CUDA
    python bench/gpu_check.py --only throughput    # one or more: --only compile,resume
    python bench/gpu_check.py --device cpu --quick # the same code paths, shrunk, on CPU (run in CI)

One JSON line per check, with `ok` and the figures behind it, and a last line with the checks that failed
and those this machine cannot make; the exit status is 1 when any check fails.

On CPU each check makes its CPU counterpart: gloo stands in for NCCL (nccl), fp16 autocast with its grad
scaler runs on the CPU, and bf16 where the CPU has native bf16 (else the bf16 runs are named as not
checked). The quick mode on CPU is sized for the test suite: it compiles with aot_eager (Dynamo and
AOTAutograd without code generation: Inductor's CPU code is not what a GPU runs, and the suite trains
through Inductor once, in tests/training/test_gpu_path.py), resumes the compiled autocast run only, and times one
throughput run; the last line names what it left out.

* compile: the model compiled (Inductor) against eager under bf16 autocast, and dropout's keep rate on
  the device.
* precision: the small config (nanoGPT's CPU recipe, 2000 steps) in fp32, bf16 and fp16 with its grad
  scaler: each run's val loss on Tiny Shakespeare (when ../shared/data has it) and their spread; each run
  must have run in its precision (its start record says so, an autocast run's loss is not fp32's, an fp16
  run logs its loss scale).
* resume: a run stopped halfway and resumed against the same run straight through, in fp32 and under
  the auto policy (bf16, compiled), both with dropout. Exact where the GPU's kernels are deterministic;
  where two straight runs already differ, the resumed run must differ from them no more than they do.
* preempt: SIGUSR2 to a CUDA run under a Slurm job id saves a checkpoint and exits 75 for a requeue;
  the next start resumes from it and finishes.
* nccl: a one-rank NCCL process group, all_reduce, and DDP around the compiled model under bf16
  autocast giving the gradients of the bare model (one GPU cannot hold two NCCL ranks).
* sample: text generated on the GPU from a trained checkpoint.
* throughput: the large config (6x384, block 256, batch 64): auto (bf16, compiled), fp16, fp32 (TF32),
  and auto with the published recipe's dropout 0.2: ms/iter, tokens/s, MFU against the GPU's datasheet
  peak (tinygpt.training.speed.PEAK_FLOPS), peak memory.
* recipe: the time to val 1.47 of nanoGPT's shakespeare_char recipe (AdamW, 5000 steps) and of ours
  (jobs/shakespeare-char-gpu.yaml: Muon, 2500 steps), one after the other under the auto policy: seconds of
  training and tokens to the crossing (metrics.crossing), and the final loss. The quick mode on CPU runs
  both shrunk, for the code path only.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from common import PRESETS, ROOT, SHAKESPEARE, data_flags, flags_for, run_trainer
from tinygpt.launch.submit import fork_server
from tinygpt.training import metrics as metrics_mod

CHECKS = ("compile", "precision", "resume", "throughput", "preempt", "nccl", "sample", "recipe")  # GPU figures first
QUICK = dict(n_layer=2, n_head=2, n_embd=64, block_size=32, batch_size=8)  # the quick mode's model: seconds a run


class CheckFailed(Exception):
    pass


NOT_CHECKED: list[str] = []  # what this machine cannot show, said in the last line


@functools.cache  # (asked by several checks; said once)
def autocast_precisions(device: str) -> tuple[str, ...]:
    """The autocast precisions this device runs: all on CUDA; on CPU fp16, and bf16 where it is native."""
    from tinygpt.training.precision import cpu_has_bf16

    if device.startswith("cuda"):
        return ("bf16", "fp16")
    if cpu_has_bf16():
        return ("bf16", "fp16")
    NOT_CHECKED.append("bf16 runs (precision, sample): this CPU has no native bf16 (AVX512-BF16 or AMX)")
    return ("fp16",)


def compile_backend(device: str, quick: bool) -> str:
    """Inductor, the GPU's default; aot_eager in the quick mode on CPU."""
    return "aot_eager" if quick and device == "cpu" else "inductor"


def compile_flags(device: str, quick: bool) -> list[str]:
    return ["--compile", "on", "--compile-backend", compile_backend(device, quick)]


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def trainer_args(out: Path, device: str, *flags: str) -> list[str]:
    return ["--device", device, "--out-dir", str(out), "--data-dir", str(out.parent / "data"), "--progress", "off",
            "--sample-tokens", "0", *flags]


def trainer_env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TINYGPT_OFFLINE": "1", **extra}


def trainer(out: Path, device: str, *flags: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """A trainer process to its end. Each is forked from one server that imported torch once (fork_server.py;
    the server never touches CUDA, so each child starts CUDA afresh): a dozen runs would otherwise spend a
    minute of a lent GPU's time importing torch."""
    return fork_server.run("tinygpt.train", trainer_args(out, device, *flags), trainer_env(), timeout=timeout)


def metrics(out: Path) -> list[dict]:
    return metrics_mod.read(metrics_mod.of_run(out))


def losses(out: Path) -> list[tuple]:
    return [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in metrics(out) if "event" not in r]


def ran(proc: subprocess.CompletedProcess, what: str) -> None:
    expect(proc.returncode == 0, f"{what} exited {proc.returncode}: {proc.stderr[-2000:]}")


# ----------------------------------------------------------------------------------------------------


def check_compile(device: str, quick: bool, tmp: Path) -> dict:
    """The model as training runs it under the auto policy (compiled, bf16 autocast) against eager, and
    dropout's keep rate."""
    import torch
    import torch.nn.functional as F

    from tinygpt.base.config import ModelConfig
    from tinygpt.model import GPT

    torch.manual_seed(0)
    result = {}
    x = torch.ones(1 << 20, device=device)
    kept = (F.dropout(x, 0.2, training=True) != 0).float().mean().item()
    result["dropout_keep_rate_at_p0.2"] = round(kept, 4)
    expect(abs(kept - 0.8) < 0.005, f"dropout kept {kept:.4f} of the elements at p=0.2, not 0.8")

    shape = dict(block_size=32, n_layer=1, n_head=2, n_embd=64) if quick else dict(block_size=64, n_layer=2,
                                                                                       n_head=4, n_embd=128)
    model = GPT(ModelConfig(**shape), vocab_size=65).to(device)
    idx = torch.randint(0, 65, (8, shape["block_size"]), device=device)
    amp = dict(device_type=device.split(":")[0], dtype=torch.bfloat16)
    runs = []
    for m in (model, torch.compile(model, backend=compile_backend(device, quick))):
        model.zero_grad()
        with torch.autocast(**amp):
            _, loss = m(idx, idx)
        loss.backward()
        runs.append((loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    (eager_loss, eager_g), (comp_loss, comp_g) = runs
    cos = F.cosine_similarity(eager_g, comp_g, dim=0).item()
    result.update(backend=compile_backend(device, quick), eager_loss=round(eager_loss, 5),
                  compiled_loss=round(comp_loss, 5), grad_cosine=round(cos, 6))
    expect(abs(eager_loss - comp_loss) < 1e-2, f"compiled loss {comp_loss} vs eager {eager_loss}")
    expect(cos > 0.999, f"compiled and eager gradients point apart (cosine {cos})")
    return result


def check_precision(device: str, quick: bool, tmp: Path) -> dict:
    steps = 60 if quick else 2000
    flags = [*flags_for(QUICK if quick else PRESETS["small"]), *data_flags(), "--max-steps", str(steps), "--lr",
             "1e-3", "--min-lr", "1e-4", "--warmup-steps", "30" if quick else "100", "--beta2", "0.99",
             "--eval-interval", str(steps), "--eval-windows", "200" if quick else "2000", "--log-interval", "10",
             "--ckpt-interval", str(steps), "--compile", "off"]
    result = {"steps": steps, "data": "tinyshakespeare" if SHAKESPEARE.exists() else "pydoc"}
    precisions = ("fp32", *autocast_precisions(device))
    vals = {}
    for precision in precisions:
        out = tmp / f"precision-{precision}"
        t0 = time.perf_counter()
        ran(trainer(out, device, *flags, "--precision", precision), f"the {precision} run")
        records = metrics(out)
        start = next(r for r in records if r.get("event") == "start")
        expect(start["precision"] == precision, f"the {precision} run ran in {start['precision']}")
        if precision == "fp16":
            scales = [r["loss_scale"] for r in records if "loss_scale" in r]
            expect(bool(scales), "the fp16 run logged no loss scale: no grad scaler")
            result["fp16_loss_scale_last"] = scales[-1]
        vals[precision] = [r["val_loss"] for r in records if "val_loss" in r][-1]
        result[f"{precision}_val_loss"] = round(vals[precision], 6)
        result[f"{precision}_wall_s"] = round(time.perf_counter() - t0, 1)
    result["spread"] = round(max(vals.values()) - min(vals.values()), 6)
    expect(all(math.isfinite(v) for v in vals.values()), f"a val loss is not finite: {vals}")
    for precision in precisions[1:]:  # rounding to 16 bits changes every loss: an equal one was not autocast
        expect(vals[precision] != vals["fp32"], f"the {precision} run's val loss is fp32's to the last bit")
    limit = 0.05 if quick else 0.03
    expect(result["spread"] <= limit, f"val losses differ by {result['spread']} across precisions (limit {limit})")
    return result


def check_resume(device: str, quick: bool, tmp: Path) -> dict:
    """Stopped and resumed against straight through. On CPU the kernels are deterministic, so the resumed
    run must equal the straight one exactly (no second straight run needed to tell the run-to-run noise)."""
    steps = 20 if quick else 60
    shape = QUICK if quick else dict(n_layer=2, n_head=4, n_embd=128, block_size=64, batch_size=16)
    base = [*flags_for(shape), *data_flags(),
            "--max-steps", str(steps), "--dropout", "0.1", "--log-interval", "1", "--eval-interval",
            str(steps // 2), "--ckpt-interval", str(steps), "--eval-windows", "64"]
    result = {"steps": steps}
    # On CPU, "auto" is the GPU's path as far as a CPU takes it: autocast (fp16 with its scaler), compiled.
    auto = ["--precision", autocast_precisions(device)[0], *compile_flags(device, quick)] if device == "cpu" else []
    labels = [("fp32", ["--precision", "fp32", "--compile", "off"]), ("auto", auto)]
    if quick and device == "cpu":
        NOT_CHECKED.append("resume in fp32 (quick mode on CPU; tests/training/test_train.py resumes fp32 exactly)")
        labels = labels[1:]
    for label, policy in labels:
        flags = base + policy
        whole, again, part = (tmp / f"resume-{label}-{n}" for n in ("whole", "again", "part"))
        ran(trainer(whole, device, *flags), f"{label}: the straight run")
        if device != "cpu":
            ran(trainer(again, device, *flags), f"{label}: the second straight run")
        ran(trainer(part, device, *flags, "--stop-after", str(steps // 2)), f"{label}: the first half")
        ran(trainer(part, device, *flags), f"{label}: the resumed half")
        events = [r["event"] for r in metrics(part) if "event" in r]
        expect(events == ["start", "paused", "start", "finished"], f"{label}: events {events}")

        def gap(a, b):
            return max(abs(x - y) for ra, rb in zip(losses(a), losses(b)) for x, y in zip(ra[1:], rb[1:])
                       if x is not None)

        resumed = gap(whole, part)
        result[f"{label}_max_loss_gap_resumed"] = resumed
        if device == "cpu":
            expect(resumed == 0, f"{label}: the resumed run differs by {resumed} from the straight one on CPU")
            continue
        run_to_run = gap(whole, again)
        result[f"{label}_max_loss_gap_run_to_run"] = run_to_run
        if run_to_run == 0:
            expect(resumed == 0, f"{label}: straight runs are identical but the resumed one differs by {resumed}")
        else:
            expect(resumed <= 3 * run_to_run + 1e-3,
                   f"{label}: resumed run differs by {resumed}, straight runs by {run_to_run}")
    return result


def check_preempt(device: str, quick: bool, tmp: Path) -> dict:
    out = tmp / "preempt"
    bindir = tmp / "bin"  # no scontrol: the run asks its batch script to resubmit (exit 75)
    bindir.mkdir(exist_ok=True)
    flags = [*flags_for(QUICK if quick else PRESETS["small"]), *data_flags(), "--max-steps", "100000",
             "--log-interval", "1", "--eval-interval", "100000", "--ckpt-interval", "100000", "--eval-windows", "64"]
    proc = fork_server.Forked("tinygpt.train", trainer_args(out, device, *flags),
                              trainer_env(SLURM_JOB_ID="4242", PATH=str(bindir)))
    deadline, at_step = time.monotonic() + 300, 10 if quick else 50
    while time.monotonic() < deadline and proc.poll() is None:
        if any("lr" in r and r["step"] >= at_step for r in metrics(out)):
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR2)
    stdout, stderr = proc.communicate(timeout=120)
    expect(proc.returncode == 75, f"exit {proc.returncode} after SIGUSR2, not 75: {stderr[-2000:]}")
    event = metrics(out)[-1]
    expect(event.get("event") == "preempted", f"last record {event}")
    stopped = event["step"]
    resumed = trainer(out, device, *[f if f != "100000" else str(stopped + 20) for f in flags])
    ran(resumed, "the resumed run")
    records = metrics(out)
    starts = [r for r in records if r.get("event") == "start"]
    expect(len(starts) == 2 and starts[1]["resumed_from"] is not None, f"starts: {starts}")
    expect(records[-1].get("event") == "finished" and records[-1]["step"] == stopped + 20, f"end: {records[-1]}")
    return {"stopped_at_step": stopped, "exit_code": proc.returncode, "resumed_and_finished_at": stopped + 20,
            "device": starts[1]["device"]}


def check_nccl(device: str, quick: bool, tmp: Path) -> dict:
    """A one-rank process group (NCCL on a GPU, gloo on CPU): all_reduce, and DDP around a compiled model gives
    the bare model's gradients."""
    import torch
    import torch.distributed as dist

    backend = "nccl" if device.startswith("cuda") else "gloo"
    # (an in-memory store: one rank needs no TCPStore, whose server thread and port outlive the check)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.arange(4.0, device=device)
        dist.all_reduce(t)
        expect(t.tolist() == [0.0, 1.0, 2.0, 3.0], f"all_reduce over one rank gave {t.tolist()}")
        cos = _ddp_grad_cosine(device, quick, backend)
        expect(cos > 0.999, f"DDP(compiled) gradients differ from the bare model's (cosine {cos})")
        version = torch.cuda.nccl.version() if backend == "nccl" else None  # a tuple, or an int on old torch
        version = ".".join(map(str, version)) if isinstance(version, tuple) else version
        return {"backend": backend, "nccl": version, "grad_cosine": round(cos, 6)}
    finally:
        # DDP's reducer holds the group: gone first, here, not in a later garbage collection that would tear the
        # group down at whatever line it happens on (a gpu_check.py that hung there, in C, was seen twice).
        gc.collect()
        dist.destroy_process_group()


def _ddp_grad_cosine(device: str, quick: bool, backend: str) -> float:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tinygpt.base.config import ModelConfig
    from tinygpt.model import GPT

    cfg = ModelConfig(block_size=64, n_layer=2, n_head=4, n_embd=128)
    torch.manual_seed(0)
    bare = GPT(cfg, vocab_size=65).to(device)
    torch.manual_seed(0)
    wrapped_model = GPT(cfg, vocab_size=65).to(device)
    compiled = torch.compile(wrapped_model, backend=compile_backend(device, quick))
    ddp = DDP(compiled, device_ids=[torch.device(device).index] if backend == "nccl" else None)
    idx = torch.randint(0, 65, (8, 64), device=device)
    amp = dict(device_type=device.split(":")[0], dtype=torch.bfloat16)
    for m in (bare, ddp):
        with torch.autocast(**amp):
            _, loss = m(idx, idx)
        loss.backward()
    g1 = torch.cat([p.grad.flatten() for p in bare.parameters()])
    g2 = torch.cat([p.grad.flatten() for p in wrapped_model.parameters()])
    return torch.nn.functional.cosine_similarity(g1, g2, dim=0).item()


def check_sample(device: str, quick: bool, tmp: Path) -> dict:
    run = tmp / f"precision-{autocast_precisions(device)[0]}"
    if not run.exists():
        check_precision(device, True, tmp)
    proc = fork_server.run("tinygpt.sample", ["--run", str(run), "--device", device, "--tokens", "300", "--prompt",
                                              "ROMEO:"], trainer_env(), timeout=300)
    ran(proc, "tinygpt.sample")
    text = proc.stdout
    expect(text.startswith("ROMEO:") and len(text) >= 300, f"sample: {text[:200]!r}")
    return {"sample": text[:300]}


def check_throughput(device: str, quick: bool, tmp: Path) -> dict:
    import torch

    config = dict(PRESETS["large"])
    if quick:  # the large config's heads and width, one block, short windows: fp16 on a CPU is emulated
        config.update(n_layer=1, block_size=64, batch_size=4)
    long, short = (4, 3) if quick else (200, 60)
    runs = {}
    for label, steps, extra in (("auto", long, ["--precision", "auto", "--compile", "auto"]),
                                ("fp16", short, ["--precision", "fp16", "--compile", "off"]),
                                ("fp32_tf32", short, ["--precision", "fp32", "--compile", "off"]),
                                ("auto_dropout0.2", short, ["--precision", "auto", "--compile", "auto",
                                                            "--dropout", "0.2"])):
        if quick and device == "cpu" and label != "auto":
            continue
        runs[label] = run_trainer(config, steps, min(20, steps // 3), [*extra, "--device", device])
    if quick and device == "cpu":
        NOT_CHECKED.append("throughput of fp16, fp32 and dropout (quick mode on CPU: the auto run only)")
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else None
    expect(all(math.isfinite(r["final_train_loss"]) for r in runs.values()), f"non-finite loss: {runs}")
    return {"config": config, "gpu": gpu, "runs": runs}


# nanoGPT's config/train_shakespeare_char.py, as our trainer's keys
NANOGPT_GPU = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, dropout=0.2, lr=1e-3,
                   min_lr=1e-4, warmup_steps=100, max_steps=5000, beta2=0.99, eval_interval=100, eval_windows=500)
RECIPE_TARGET = 1.47


def check_recipe(device: str, quick: bool, tmp: Path) -> dict:
    import yaml

    ours = yaml.safe_load((ROOT / "jobs" / "shakespeare-char-gpu.yaml").read_text())["train"]
    runs = {}
    for label, recipe in (("nanogpt", NANOGPT_GPU), ("ours", ours)):
        recipe = {k: v for k, v in recipe.items() if k not in ("dataset", "precision", "compile")}
        if quick:  # the code path only: one small block, a few steps, a target every run reaches
            recipe.update(n_layer=1, n_embd=48, block_size=32, batch_size=4, max_steps=20, eval_interval=10,
                          eval_windows=16, warmup_steps=2)
        out = tmp / f"recipe-{label}"
        ran(trainer(out, device, *flags_for(recipe), *data_flags(), "--precision", "auto", "--compile",
                    "auto" if not quick else "off", "--ckpt-interval", str(recipe["max_steps"]), timeout=3600),
            f"the {label} recipe")
        curve = [r for r in metrics(out) if "train_s" in r]
        start = next(r for r in metrics(out) if r.get("event") == "start")
        found = metrics_mod.crossing(curve, 10.0 if quick else RECIPE_TARGET)
        runs[label] = {"final_val_loss": round(curve[-1]["val_loss"], 4), "reached": found is not None,
                       **({"train_s": round(found["train_s"], 1), "step": round(found["step"]),
                           "tokens": round(found["step"] * start["tokens_per_step"])} if found else {})}
    if quick:
        NOT_CHECKED.append(f"recipe: the time to val {RECIPE_TARGET} (quick mode: both recipes shrunk)")
    expect(all(r["reached"] for r in runs.values()) or not quick, f"a quick recipe run did not reach 10: {runs}")
    if runs["nanogpt"].get("train_s") and runs["ours"].get("train_s"):
        runs["ratio_ours_to_nanogpt"] = round(runs["ours"]["train_s"] / runs["nanogpt"]["train_s"], 3)
    return {"target": RECIPE_TARGET, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help=f"comma-separated, of: {', '.join(CHECKS)}")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--quick", action="store_true", help="shrunk sizes (to try the script itself on CPU)")
    args = parser.parse_args()
    wanted = args.only.split(",") if args.only else list(CHECKS)
    unknown = sorted(set(wanted) - set(CHECKS))
    if unknown:
        parser.error(f"--only: unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECKS)}")
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA GPU is visible; run on a GPU machine, or try the script with --device cpu --quick")
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "host": platform.node(),
                      "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}), flush=True)
    failed = []
    with tempfile.TemporaryDirectory(prefix="tinygpt-gpu-check-") as tmp:
        for name in CHECKS:
            if name not in wanted:
                continue
            t0 = time.perf_counter()
            try:
                result = {"check": name, "ok": True, **globals()[f"check_{name}"](args.device, args.quick, Path(tmp))}
            except CheckFailed as err:
                result = {"check": name, "ok": False, "error": str(err)}
            except (Exception, SystemExit):  # noqa: BLE001 (one broken check must not hide the others' figures)
                result = {"check": name, "ok": False, "error": traceback.format_exc()[-3000:]}
            result["seconds"] = round(time.perf_counter() - t0, 1)
            if not result["ok"]:
                failed.append(name)
            print(json.dumps(result), flush=True)
    print(json.dumps({"failed": failed, "not_checked": NOT_CHECKED}), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
