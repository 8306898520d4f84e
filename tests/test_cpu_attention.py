"""tinygpt/cpu_attention.py: the fused C++ kernel computes causal attention and its gradient, the model
takes it on CPU, and a machine that cannot build it still trains (or says clearly why not)."""

import math
import os
import time

import pytest
import torch

from conftest import TINY_FLAGS, read_metrics, run_module
from tinygpt import cpu_attention
from tinygpt.model import GPT, GPTConfig


@pytest.fixture(scope="module", autouse=True)
def fused():
    # Built (or found built) here as the trainer does; a build that fails fails these tests, in CI too.
    assert cpu_attention.activate("fused", say=lambda _: None) == "fused"
    yield
    cpu_attention.deactivate()


def reference(qkv: torch.Tensor, n_head: int) -> torch.Tensor:
    """Causal attention by the textbook formula, heads side by side: (B, T, 3C) -> (B, T, C)."""
    B, T, C3 = qkv.shape
    q, k, v = (t.view(B, T, n_head, -1).transpose(1, 2) for t in qkv.split(C3 // 3, dim=2))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    probs = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    return (probs @ v).transpose(1, 2).reshape(B, T, C3 // 3)


@pytest.mark.parametrize("B,T,C,H", [(2, 7, 32, 2), (3, 64, 128, 4), (2, 100, 96, 2), (1, 130, 128, 2)])
def test_values_and_gradients_match_an_fp64_reference(B, T, C, H):
    """Head sizes 16, 32, 48, 64; sequence lengths that are and are not multiples of the kernel's tiles."""
    torch.manual_seed(0)
    qkv = torch.randn(B, T, 3 * C, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(B, T, C, dtype=torch.float64)
    expected = reference(qkv, H)
    expected_grad, = torch.autograd.grad(expected, qkv, dy)

    qkv32 = qkv.detach().float().requires_grad_()
    y = cpu_attention.causal_attention(qkv32, H)
    grad, = torch.autograd.grad(y, qkv32, dy.float())
    assert y.shape == (B, T, C) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), expected, rtol=0, atol=2e-6)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=0, atol=1e-5)


def test_results_are_the_same_for_any_thread_count():
    torch.manual_seed(1)
    qkv = torch.randn(4, 50, 3 * 64, requires_grad=True)
    dy = torch.randn(4, 50, 64)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            y = cpu_attention.causal_attention(qkv, 2)
            results.append((y, *torch.autograd.grad(y, qkv, dy)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_the_ops_pass_torchs_custom_op_checks():
    """Schema, fake tensors (what torch.compile traces with) and autograd registration."""
    qkv = torch.randn(2, 24, 3 * 32, requires_grad=True)
    torch.library.opcheck(torch.ops.tinygpt.causal_attention.default, (qkv, 2))
    y, lse = torch.ops.tinygpt.causal_attention(qkv.detach(), 2)
    torch.library.opcheck(torch.ops.tinygpt.causal_attention_backward.default,
                          (qkv.detach(), y, lse, torch.randn_like(y), 2))


def _loss_and_grads(model, idx, targets):
    model.zero_grad()
    with torch.profiler.profile() as prof:
        _, loss = model(idx, targets)
        loss.backward()
    ops = {e.key for e in prof.key_averages()}
    return loss.detach(), [p.grad.clone() for p in model.parameters()], "tinygpt::causal_attention" in ops


def test_the_model_takes_the_kernel_on_cpu_and_agrees_with_sdpa():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=48, n_layer=2, n_head=2, n_embd=64))
    idx, targets = torch.randint(0, 40, (3, 48)), torch.randint(0, 40, (3, 48))
    loss, grads, used = _loss_and_grads(model, idx, targets)
    assert used
    cpu_attention.deactivate()
    try:
        sdpa_loss, sdpa_grads, used = _loss_and_grads(model, idx, targets)
    finally:
        cpu_attention.activate("fused")
    assert not used
    torch.testing.assert_close(loss, sdpa_loss, rtol=0, atol=1e-6)
    for a, b in zip(grads, sdpa_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # attention itself stays fp32 under autocast
        _, bf16_loss = model(idx, targets)
    assert abs(bf16_loss.item() - loss.item()) < 0.02


def test_what_the_kernel_does_not_take():
    qkv = torch.randn(2, 8, 3 * 32)
    assert cpu_attention.usable(qkv, 2, 0.0)
    assert not cpu_attention.usable(qkv, 2, 0.1)  # attention dropout: tinygpt/kernels.py
    assert not cpu_attention.usable(qkv, 4, 0.0)  # head size 8: not a multiple of 16
    assert not cpu_attention.usable(torch.randn(1, 513, 3 * 32), 2, 0.0)  # longer than MAX_BLOCK_SIZE
    assert not cpu_attention.usable(qkv.to(torch.device("meta")), 2, 0.0)
    assert cpu_attention.activate("sdpa") == "sdpa" and not cpu_attention.usable(qkv, 2, 0.0)
    assert cpu_attention.activate("auto") == "fused" and cpu_attention.usable(qkv, 2, 0.0)
    with pytest.raises(ValueError, match="cpu_attention: 'flash' is not one of auto, fused, sdpa"):
        cpu_attention.activate("flash")


def test_without_a_compiler_auto_trains_on_sdpa_and_fused_says_why(tmp_path, tiny_corpus, monkeypatch):
    """A real failed build: the compiler named by $CXX does not exist. The build directory also holds the
    lock file of a build that died long ago, which must not make the run wait for ever."""
    env = {"CXX": str(tmp_path / "no-such-c++"), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", env["TORCH_EXTENSIONS_DIR"])
    lock = cpu_attention.build_directory() / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    old = time.time() - 2 * cpu_attention.STALE_LOCK_S
    os.utime(lock, (old, old))
    common = [*TINY_FLAGS, "--data-file", str(tiny_corpus), "--data-dir", str(tmp_path / "data"), "--max-steps", "5"]
    auto = run_module("tinygpt.train", *common, "--out-dir", str(tmp_path / "auto"), timeout=120, **env)
    assert auto.returncode == 0, auto.stderr
    assert f"note: removing {lock}, left 20 min ago by a build that did not finish" in auto.stdout
    assert "building the fused CPU attention kernel" in auto.stdout
    assert "note: the fused CPU attention kernel could not be built" in auto.stdout
    start = next(r for r in read_metrics(tmp_path / "auto") if r.get("event") == "start")
    assert start["attention"] == "sdpa"

    fused = run_module("tinygpt.train", *common, "--out-dir", str(tmp_path / "fused"), "--cpu-attention", "fused",
                       **env)
    assert fused.returncode == 1
    assert fused.stderr.startswith("error: cpu_attention: fused, but the kernel (causal_attention.cpp) could not")
    assert "Install a C++ compiler (g++) or use --cpu-attention sdpa" in fused.stderr
    assert "Traceback" not in fused.stderr


def test_a_model_the_kernel_cannot_take_runs_on_sdpa_unless_fused_is_demanded(tmp_path, tiny_corpus):
    """Heads of 8 channels: auto quietly uses SDPA; fused stops before training, saying what to change."""
    common = [*TINY_FLAGS, "--n-head", "4", "--data-file", str(tiny_corpus), "--data-dir", str(tmp_path / "data"),
              "--max-steps", "5"]
    auto = run_module("tinygpt.train", *common, "--out-dir", str(tmp_path / "auto"))
    assert auto.returncode == 0, auto.stderr
    assert next(r for r in read_metrics(tmp_path / "auto") if r.get("event") == "start")["attention"] == "sdpa"
    fused = run_module("tinygpt.train", *common, "--out-dir", str(tmp_path / "fused"), "--cpu-attention", "fused")
    assert fused.returncode == 1 and "Traceback" not in fused.stderr
    assert fused.stderr.strip() == (
        "error: cpu_attention: fused, but this model has heads of 8 channels (n_embd / n_head); the kernel takes "
        "multiples of 16. Change n_embd / n_head or block_size, or use --cpu-attention auto (PyTorch's SDPA for "
        "such models)")
    assert not (tmp_path / "fused" / "metrics.jsonl").exists()  # stopped before anything was written


def test_a_compiled_model_calls_the_kernel_in_one_graph():
    """torch.compile traces the ops through their fake implementations (fullgraph: no graph break) and
    the compiled model gives the eager loss and gradients."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=32, n_layer=1, n_head=2, n_embd=32))
    idx, targets = torch.randint(0, 40, (2, 32)), torch.randint(0, 40, (2, 32))
    loss, grads, used = _loss_and_grads(model, idx, targets)
    compiled_loss, compiled_grads, compiled_used = _loss_and_grads(torch.compile(model, fullgraph=True), idx, targets)
    assert used and compiled_used
    torch.testing.assert_close(compiled_loss, loss, rtol=0, atol=1e-5)
    for a, b in zip(compiled_grads, grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
