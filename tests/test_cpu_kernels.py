"""tinygpt/cpu_kernels.py: the C++ kernels compute causal attention, the residual add + LayerNorm and GELU
with their gradients, the model takes them on CPU, and a machine that cannot build them still trains (or
says clearly why not)."""

import collections
import math
import os
import time

import pytest
import torch
import torch.nn.functional as F

from conftest import TINY_FLAGS, read_metrics, run_module
from tinygpt import cpu_kernels, kernels, native
from tinygpt.model import GPT, GPTConfig
from tinygpt.precision import cpu_has_bf16


@pytest.fixture(scope="module", autouse=True)
def built():
    # Built (or found built) here as the trainer does; a build that fails fails these tests, in CI too.
    assert cpu_kernels.activate("on", say=lambda _: None)
    yield
    cpu_kernels.deactivate()


class CountingExtension:
    """The extension, counting calls of each function: which kernels a model really ran."""

    def __init__(self, ext):
        self.ext, self.calls = ext, collections.Counter()

    def __getattr__(self, name):
        fn = getattr(self.ext, name)

        def call(*args):
            self.calls[name] += 1
            return fn(*args)

        return call


@pytest.fixture
def counting(monkeypatch):
    ext = CountingExtension(cpu_kernels._ext)
    monkeypatch.setattr(cpu_kernels, "_ext", ext)
    return ext.calls


# --- attention ---------------------------------------------------------------------------------------

def reference_attention(qkv: torch.Tensor, n_head: int) -> torch.Tensor:
    """Causal attention by the textbook formula, heads side by side: (B, T, 3C) -> (B, T, C)."""
    B, T, C3 = qkv.shape
    q, k, v = (t.view(B, T, n_head, -1).transpose(1, 2) for t in qkv.split(C3 // 3, dim=2))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    probs = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    return (probs @ v).transpose(1, 2).reshape(B, T, C3 // 3)


@pytest.mark.parametrize("B,T,C,H", [(2, 7, 32, 2), (3, 64, 128, 4), (2, 100, 96, 2), (1, 130, 128, 2)])
def test_attention_matches_an_fp64_reference(B, T, C, H):
    """Head sizes 16, 32, 48, 64; sequence lengths that are and are not multiples of the kernel's tiles."""
    torch.manual_seed(0)
    qkv = torch.randn(B, T, 3 * C, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(B, T, C, dtype=torch.float64)
    expected = reference_attention(qkv, H)
    expected_grad, = torch.autograd.grad(expected, qkv, dy)

    qkv32 = qkv.detach().float().requires_grad_()
    y = cpu_kernels.causal_attention(qkv32, H)
    grad, = torch.autograd.grad(y, qkv32, dy.float())
    assert y.shape == (B, T, C) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), expected, rtol=0, atol=2e-6)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=0, atol=1e-5)


def test_what_the_attention_kernel_does_not_take():
    qkv = torch.randn(2, 8, 3 * 32)
    assert cpu_kernels.attention_usable(qkv, 2, 0.0)
    assert not cpu_kernels.attention_usable(qkv, 2, 0.1)  # attention dropout: tinygpt/kernels.py
    assert not cpu_kernels.attention_usable(qkv, 4, 0.0)  # head size 8: not a multiple of 16
    assert not cpu_kernels.attention_usable(torch.randn(1, 513, 3 * 32), 2, 0.0)  # longer than MAX_BLOCK_SIZE
    assert not cpu_kernels.attention_usable(qkv.to(torch.device("meta")), 2, 0.0)
    assert cpu_kernels.activate("off") is False and not cpu_kernels.attention_usable(qkv, 2, 0.0)
    assert cpu_kernels.activate("auto") is True and cpu_kernels.attention_usable(qkv, 2, 0.0)
    with pytest.raises(ValueError, match="cpu_kernels: 'fused' is not one of auto, on, off"):
        cpu_kernels.activate("fused")


# --- residual add + LayerNorm -----------------------------------------------------------------------

@pytest.mark.parametrize("add", [True, False])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(3, 37, 64), (130, 16)])
def test_add_layer_norm_matches_an_fp64_reference(add, bias, shape):
    """With and without the residual add and the bias; row counts that are not multiples of the kernel's
    blocks. Gradients reach x, delta, the weight and the bias, including through s (the residual stream)."""
    torch.manual_seed(0)
    C = shape[-1]
    norm = torch.nn.LayerNorm(C, bias=bias)
    with torch.no_grad():
        for p in norm.parameters():
            p.normal_()
    norm64 = torch.nn.LayerNorm(C, bias=bias, dtype=torch.float64)
    norm64.load_state_dict(norm.state_dict())
    x, delta, ds, dy = (torch.randn(shape, dtype=torch.float64) for _ in range(4))

    x64, delta64 = x.clone().requires_grad_(), delta.clone().requires_grad_()
    s64 = x64 + delta64 if add else x64
    y64 = norm64(s64)
    torch.autograd.backward((s64, y64), (ds, dy))

    x32, delta32 = x.float().requires_grad_(), delta.float().requires_grad_()
    s, y = cpu_kernels.add_layer_norm(x32, delta32 if add else None, norm)
    assert (s is x32) != add and y.dtype == torch.float32
    torch.autograd.backward((s, y), (ds.float(), dy.float()))

    close = dict(rtol=0, atol=5e-6)
    torch.testing.assert_close(s.double(), s64, **close)
    torch.testing.assert_close(y.double(), y64, **close)
    torch.testing.assert_close(x32.grad.double(), x64.grad, **close)
    if add:
        torch.testing.assert_close(delta32.grad.double(), delta64.grad, **close)
    else:
        assert delta32.grad is None
    for p, p64 in zip(norm.parameters(), norm64.parameters()):
        torch.testing.assert_close(p.grad.double(), p64.grad, rtol=1e-6, atol=2e-5)


def test_add_layer_norm_leaves_to_pytorch_what_the_kernel_does_not_take(counting):
    norm = torch.nn.LayerNorm(24)  # width 24: not a multiple of 16
    x = torch.randn(5, 24)
    s, y = cpu_kernels.add_layer_norm(x, x, norm)
    torch.testing.assert_close(y, norm(x + x))
    assert not counting
    norm16 = torch.nn.LayerNorm(16)
    cpu_kernels.add_layer_norm(torch.randn(5, 16, dtype=torch.float64), None, norm16.double())  # fp64
    cpu_kernels.add_layer_norm(torch.randn(5, 16), torch.randn(1, 16), norm16.float())  # a broadcast delta
    assert not counting
    # Under bf16 autocast the residual stream is fp32 and the sublayer's output bf16: the kernel takes it.
    cpu_kernels.add_layer_norm(torch.randn(5, 16), torch.randn(5, 16, dtype=torch.bfloat16), norm16)
    assert counting["add_layer_norm_forward"] == 1


# --- GELU ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1000, 33), (7,), (4, 16)])
def test_gelu_matches_an_fp64_reference(shape):
    """Sizes that do and do not fill whole vectors, values far into both tails."""
    torch.manual_seed(0)
    h = torch.randn(shape, dtype=torch.float64) * 4
    h.view(-1)[:2] = torch.tensor([-30.0, 30.0], dtype=torch.float64)[: h.numel()]
    h64 = h.clone().requires_grad_()
    dg = torch.randn_like(h)
    expected = F.gelu(h64)
    expected_grad, = torch.autograd.grad(expected, h64, dg)

    h32 = h.float().requires_grad_()
    g = cpu_kernels.gelu(h32)
    grad, = torch.autograd.grad(g, h32, dg.float())
    torch.testing.assert_close(g.double(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-6, atol=1e-6)


def test_gelu_without_a_gradient_to_keep_is_pytorchs(counting):
    h = torch.randn(4, 32)
    torch.testing.assert_close(cpu_kernels.gelu(h), F.gelu(h), rtol=0, atol=0)
    with torch.no_grad():
        cpu_kernels.gelu(h.requires_grad_())
    assert not counting
    cpu_kernels.gelu(h)
    assert counting["gelu_and_slope"] == 1


def test_gelu_linear_recomputes_gelu_and_its_slope_with_the_kernel(monkeypatch, counting):
    """The large config's path (gelu(h) not kept, recomputed in backward) with the kernel gives the
    plain ops' gradients."""
    monkeypatch.setattr(kernels, "GELU_RECOMPUTE_BYTES", 0)
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 16)
    h = torch.randn(5, 64, requires_grad=True)
    dout = torch.randn(5, 16)
    out = kernels.gelu_linear(h, linear)
    grads = torch.autograd.grad(out, (h, linear.weight, linear.bias), dout)
    assert counting["gelu_and_slope"] == 1
    expected = torch.autograd.grad(linear(F.gelu(h)), (h, linear.weight, linear.bias), dout)
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# --- all three ------------------------------------------------------------------------------------------

def test_results_are_the_same_for_any_thread_count():
    torch.manual_seed(1)
    qkv = torch.randn(4, 50, 3 * 64, requires_grad=True)
    x, delta = torch.randn(300, 64, requires_grad=True), torch.randn(300, 64, requires_grad=True)
    norm = torch.nn.LayerNorm(64)
    h = torch.randn(300, 70, requires_grad=True)

    def run():
        y = cpu_kernels.causal_attention(qkv, 2)
        s, z = cpu_kernels.add_layer_norm(x, delta, norm)
        g = cpu_kernels.gelu(h)
        outs = (y, s, z, g)
        grads = torch.autograd.grad(outs, (qkv, x, delta, h, *norm.parameters()), [torch.ones_like(o) for o in outs])
        return (*outs, *grads)

    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(run())
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_the_ops_pass_torchs_custom_op_checks():
    """Schema, fake tensors (what torch.compile traces with) and autograd registration of the ops that
    compiled models call."""
    ops = torch.ops.tinygpt
    qkv = torch.randn(2, 24, 3 * 32, requires_grad=True)
    torch.library.opcheck(ops.causal_attention.default, (qkv, 2))
    y, lse = ops.causal_attention(qkv.detach(), 2)
    torch.library.opcheck(ops.causal_attention_backward.default, (qkv.detach(), y, lse, torch.randn_like(y), 2))

    x, delta = torch.randn(2, 5, 32, requires_grad=True), torch.randn(2, 5, 32, requires_grad=True)
    weight, bias = torch.randn(32, requires_grad=True), torch.randn(32, requires_grad=True)
    for args in ((x, delta, weight, bias, 1e-5), (x, None, weight, None, 1e-5)):
        torch.library.opcheck(ops.add_layer_norm.default, args)
    s, _, mean, rstd = ops.add_layer_norm(x.detach(), delta.detach(), weight.detach(), None, 1e-5)
    torch.library.opcheck(ops.add_layer_norm_backward.default,
                          (torch.randn_like(s), torch.randn_like(s), s, mean, rstd, weight.detach()))
    torch.library.opcheck(ops.gelu_and_slope.default, (torch.randn(3, 40, requires_grad=True),))


def _loss_and_grads(model, idx, targets):
    model.zero_grad()
    _, loss = model(idx, targets)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_the_model_takes_the_kernels_on_cpu_and_agrees_with_pytorchs_ops(counting):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=48, n_layer=2, n_head=2, n_embd=64))
    idx, targets = torch.randint(0, 40, (3, 48)), torch.randint(0, 40, (3, 48))
    loss, grads = _loss_and_grads(model, idx, targets)
    # Per block: attention, two add + LayerNorms (the first block's without an add), GELU; then ln_f.
    assert dict(counting) == {"attention_forward": 2, "attention_backward": 2, "add_layer_norm_forward": 5,
                              "add_layer_norm_backward": 5, "gelu_and_slope": 2}
    cpu_kernels.deactivate()
    try:
        plain_loss, plain_grads = _loss_and_grads(model, idx, targets)
    finally:
        cpu_kernels.activate("on")
    assert sum(counting.values()) == 16  # no more calls with the kernels off
    torch.testing.assert_close(loss, plain_loss, rtol=0, atol=1e-6)
    for a, b in zip(grads, plain_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # attention and LayerNorm stay fp32 under autocast
        _, bf16_loss = model(idx, targets)
    assert abs(bf16_loss.item() - loss.item()) < 0.02


def test_a_compiled_model_calls_the_kernels_in_one_graph(counting):
    """torch.compile traces the ops through their fake implementations (fullgraph: no graph break) and
    the compiled model gives the eager loss and gradients."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=32, n_layer=1, n_head=2, n_embd=32))
    idx, targets = torch.randint(0, 40, (2, 32)), torch.randint(0, 40, (2, 32))
    loss, grads = _loss_and_grads(model, idx, targets)
    eager = dict(counting)
    compiled_loss, compiled_grads = _loss_and_grads(torch.compile(model, fullgraph=True), idx, targets)
    assert all(counting[name] == 2 * n for name, n in eager.items()), (eager, counting)
    torch.testing.assert_close(compiled_loss, loss, rtol=0, atol=1e-5)
    for a, b in zip(compiled_grads, grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


# --- in the trainer --------------------------------------------------------------------------------------

def test_without_a_compiler_auto_trains_on_pytorchs_ops_and_malloc_and_on_says_why(tmp_path, tiny_corpus, monkeypatch):
    """A real failed build: the compiler named by $CXX does not exist. The build directory also holds the
    lock file of a build that died long ago, which must not make the run wait for ever."""
    env = {"CXX": str(tmp_path / "no-such-c++"), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", env["TORCH_EXTENSIONS_DIR"])
    lock = cpu_kernels.build_directory() / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    old = time.time() - 2 * native.STALE_LOCK_S
    os.utime(lock, (old, old))
    common = [*TINY_FLAGS, "--data-file", str(tiny_corpus), "--data-dir", str(tmp_path / "data"), "--max-steps", "5"]
    auto = run_module("tinygpt.train", *common, "--out-dir", str(tmp_path / "auto"), timeout=120, **env)
    assert auto.returncode == 0, auto.stderr
    assert f"note: removing {lock}, left 20 min ago by a build that did not finish" in auto.stdout
    assert "building tinygpt's CPU kernels for this CPU" in auto.stdout
    assert "note: tinygpt's CPU kernels could not be built" in auto.stdout
    assert "cpu kernels off" in auto.stdout
    # The caching allocator is built the same way: malloc instead, said once.
    assert "note: tinygpt's CPU allocator could not be set up (" in auto.stdout
    assert "cpu allocator malloc" in auto.stdout
    start = next(r for r in read_metrics(tmp_path / "auto") if r.get("event") == "start")
    assert start["cpu_kernels"] == [] and start["cpu_allocator"] == "malloc"

    on = run_module("tinygpt.train", *common, "--out-dir", str(tmp_path / "on"), "--cpu-kernels", "on", **env)
    assert on.returncode == 1
    assert on.stderr.startswith("error: cpu_kernels: on, but the kernels (tinygpt/csrc) could not be built: ")
    assert "Install a C++ compiler (g++) or use --cpu-kernels off" in on.stderr
    assert "Traceback" not in on.stderr

    caching = run_module("tinygpt.train", *common, "--out-dir", str(tmp_path / "caching"), "--cpu-kernels", "off",
                         "--cpu-allocator", "caching", **env)
    assert caching.returncode == 1
    assert caching.stderr.startswith("error: cpu_allocator: caching, but the caching allocator (tinygpt/csrc) "
                                     "could not be set up: ")
    assert "Install a C++ compiler (g++) or use --cpu-allocator malloc" in caching.stderr
    assert "Traceback" not in caching.stderr


def test_built_extensions_load_without_a_compiler_on_path(tmp_path, tiny_corpus):
    """Once built, the kernels and the allocator load in a process whose PATH has neither a compiler nor ninja
    (a stripped batch environment) without being built again: every process builds with the same ninja."""
    common = [*TINY_FLAGS, "--data-file", str(tiny_corpus), "--data-dir", str(tmp_path / "data"), "--max-steps", "2"]
    first = run_module("tinygpt.train", *common, "--out-dir", str(tmp_path / "first"))  # builds if need be
    assert first.returncode == 0, first.stderr
    empty = tmp_path / "bin"
    empty.mkdir()
    bare = run_module("tinygpt.train", *common, "--out-dir", str(tmp_path / "bare"), PATH=str(empty))
    assert bare.returncode == 0, bare.stderr
    assert "building" not in bare.stdout and "could not" not in bare.stdout, bare.stdout
    start = next(r for r in read_metrics(tmp_path / "bare") if r.get("event") == "start")
    assert start["cpu_kernels"] == ["attention", "layer_norm", "gelu"] and start["cpu_allocator"] == "caching"


def test_each_kernel_runs_where_the_model_fits_it(tmp_path, tiny_corpus):
    """Heads of 8 channels: attention goes to SDPA, LayerNorm and GELU still run in kernels; bf16 leaves
    GELU to PyTorch (its input is bf16); off uses none."""
    common = [*TINY_FLAGS, "--data-file", str(tiny_corpus), "--data-dir", str(tmp_path / "data"), "--max-steps", "3"]

    def kernels_of(name, *flags):
        done = run_module("tinygpt.train", *common, "--out-dir", str(tmp_path / name), *flags)
        assert done.returncode == 0, done.stderr
        return next(r for r in read_metrics(tmp_path / name) if r.get("event") == "start")["cpu_kernels"]

    assert kernels_of("small-heads", "--n-head", "4", "--cpu-kernels", "on") == ["layer_norm", "gelu"]
    assert kernels_of("off", "--cpu-kernels", "off") == []
    if cpu_has_bf16():  # (bf16 cannot run at all on a CPU without it)
        assert kernels_of("bf16", "--precision", "bf16") == ["attention", "layer_norm"]
