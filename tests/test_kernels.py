"""tinygpt/kernels.py: the same values and gradients as the plain ops, with less kept for backward."""

import math

import pytest
import torch

from tinygpt import kernels
from tinygpt.kernels import dropout, dropout_attention, gelu_linear
from tinygpt.model import GPT, GPTConfig


def reference(q, k, v, dropped, p):
    """Plain causal attention with a given dropout mask, differentiated by autograd."""
    T = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    probs = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(dim=-1)
    return (probs.masked_fill(dropped, 0.0) / (1 - p)) @ v


@pytest.mark.parametrize("heads_per_block", [1, 4, 6])
def test_values_and_gradients_match_the_plain_math(heads_per_block):
    B, H, T, D, p = 3, 2, 17, 8, 0.3
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    grad = torch.randn(B, H, T, D, dtype=torch.float64)

    torch.manual_seed(5)
    out = dropout_attention(q, k, v, p, heads_per_block=heads_per_block)
    got = torch.autograd.grad(out, (q, k, v), grad)
    # The mask is drawn block after block from the default generator: the same numbers as one draw.
    torch.manual_seed(5)
    dropped = (torch.rand(B * H, T, T, dtype=torch.float64) >= 1 - p).view(B, H, T, T)
    assert 0.2 < dropped.tril().sum() / torch.ones(T, T).tril().sum() / (B * H) < 0.4
    expected_out = reference(q, k, v, dropped, p)
    expected = torch.autograd.grad(expected_out, (q, k, v), grad)

    torch.testing.assert_close(out, expected_out, rtol=1e-12, atol=1e-12)
    for name, a, b in zip("qkv", got, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=f"d{name} differs")


def test_the_same_seed_gives_the_same_masks():
    q, k, v = (torch.randn(2, 2, 9, 4) for _ in range(3))
    torch.manual_seed(1)
    a = dropout_attention(q, k, v, 0.5)
    torch.manual_seed(1)
    b = dropout_attention(q, k, v, 0.5)
    torch.manual_seed(2)
    c = dropout_attention(q, k, v, 0.5)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_compiled_under_autocast_matches_eager(monkeypatch):
    """A compiled graph traces backward under the caller's autocast; the kernel must stay in q's dtype."""
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "fallback_random", True)  # the compiled graph draws eager's masks
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 8, requires_grad=True) for _ in range(3))
    grad = torch.randn(2, 2, 16, 8)

    def attend(q, k, v):
        return dropout_attention(q, k, v, 0.3)

    results = []
    for fn in (attend, torch.compile(attend)):
        torch.manual_seed(3)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(q, k, v)
        results.append((out, *torch.autograd.grad(out, (q, k, v), grad)))
    assert all(t.dtype == torch.float32 for t in results[1])
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name} differs")


@pytest.mark.parametrize("p", [0.0, 1.0, -0.1])
def test_p_outside_the_open_interval_is_refused(p):
    q = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match="0 < p < 1"):
        dropout_attention(q, q, q, p)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_with_dropout_on_cpu_keeps_only_boolean_masks_and_no_gelu_output(precision, monkeypatch):
    """The plain ops would keep float (T, T) attention matrices, float dropout masks and gelu(h)."""
    monkeypatch.setattr(kernels, "GELU_RECOMPUTE_BYTES", 0)  # as for a large model
    T = 32
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=T, n_layer=2, n_head=2, n_embd=16, dropout=0.2)).train()
    x = torch.randint(0, 20, (4, T))
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            _, loss = model(x, x)
    square = [(shape, dtype) for shape, dtype in saved if shape[-2:] == (T, T)]
    assert square, "the attention dropout mask should be saved"
    assert all(dtype == torch.bool for _, dtype in square), square
    # Activations (B, T, C): the dropout masks are booleans, and no gelu(h) is kept, only h.
    activations = [dtype for shape, dtype in saved if math.prod(shape) == 4 * T * 16]
    assert activations.count(torch.bool) == 1 + 2 * 2, activations  # embeddings; attention and MLP of 2 blocks
    wide = [shape for shape, dtype in saved if math.prod(shape) == 4 * T * 4 * 16 and dtype != torch.bool]
    assert len(wide) == 2, wide  # h = fc(x) of each block; gelu(h) is not kept
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_dropout_keeps_a_boolean_mask_scales_kept_values_and_passes_gradients_through_them():
    x = torch.randn(64, 256, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = dropout(x, 0.25, training=True)
    assert [t.dtype for t in saved] == [torch.bool]
    kept = y != 0
    assert 0.72 < kept.float().mean() < 0.78
    torch.testing.assert_close(y[kept], x[kept] / 0.75)
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() / 0.75)
    assert dropout(x, 0.25, training=False) is x and dropout(x, 0.0, training=True) is x


@pytest.fixture
def always_recompute(monkeypatch):
    monkeypatch.setattr(kernels, "GELU_RECOMPUTE_BYTES", 0)


@pytest.mark.parametrize("bias", [False, True])
def test_gelu_linear_matches_the_plain_ops_in_fp64(bias, always_recompute):
    torch.manual_seed(0)
    linear = torch.nn.Linear(12, 5, bias=bias).double()
    h = torch.randn(3, 7, 12, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, 7, 5, dtype=torch.float64)
    params = [h, *linear.parameters()]
    got_out = gelu_linear(h, linear)
    got = torch.autograd.grad(got_out, params, grad)
    want_out = linear(torch.nn.functional.gelu(h))
    want = torch.autograd.grad(want_out, params, grad)
    torch.testing.assert_close(got_out, want_out, rtol=0, atol=0)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_gelu_linear_under_bf16_autocast_gives_the_plain_autocast_gradients(always_recompute):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32)
    h = torch.randn(8, 64, requires_grad=True)
    grads = []
    for fn in (lambda x: gelu_linear(x, linear), lambda x: linear(torch.nn.functional.gelu(x))):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(h.bfloat16())
        assert out.dtype == torch.bfloat16
        grads.append(torch.autograd.grad(out.float().sum(), [h, linear.weight, linear.bias]))
    for a, b in zip(*grads):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_gelu_linear_recomputes_only_when_the_activation_is_big(monkeypatch):
    linear = torch.nn.Linear(16, 4)
    h = torch.randn(2, 16, requires_grad=True)
    kinds = []
    for threshold in (0, h.numel() * h.element_size() + 1):
        monkeypatch.setattr(kernels, "GELU_RECOMPUTE_BYTES", threshold)
        kinds.append(type(gelu_linear(h, linear).grad_fn).__name__)
    assert kinds == ["_GeluLinearBackward", "AddmmBackward0"], kinds
