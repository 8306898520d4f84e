import math

import pytest
import torch

from tinygpt.base.config import ModelConfig
from tinygpt.model import GPT


def small(vocab_size: int = 50, checkpoint_blocks: bool = False, **kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(block_size=16, n_layer=2, n_head=2, n_embd=32)
    cfg.update(kw)
    return GPT(ModelConfig(**cfg), vocab_size, checkpoint_blocks)


def test_loss_at_init_is_close_to_uniform_guess():
    model = small()
    x = torch.randint(0, 50, (8, 16))
    y = torch.randint(0, 50, (8, 16))
    _, loss = model(x, y)
    assert abs(loss.item() - math.log(50)) < 0.1


@pytest.mark.parametrize("pos_emb", [True, False])
def test_attention_is_causal(pos_emb):
    model = small(pos_emb=pos_emb).eval()
    x = torch.randint(0, 50, (1, 10))
    changed = x.clone()
    changed[0, 7:10] = (changed[0, 7:10] + 1) % 50
    a, _ = model(x)
    b, _ = model(changed)
    torch.testing.assert_close(a[0, :7], b[0, :7], rtol=0, atol=0)
    assert not torch.equal(a[0, 7:], b[0, 7:])


def test_without_the_mask_every_position_sees_the_whole_window_in_the_model_and_its_maps():
    model = small(causal=False).eval()
    x = torch.randint(0, 50, (1, 10))
    changed = x.clone()
    changed[0, 9] = (changed[0, 9] + 1) % 50
    a, _ = model(x)
    b, _ = model(changed)
    assert not torch.equal(a[0, 0], b[0, 0])  # the first position sees the last one
    future = torch.ones(10, 10, dtype=torch.bool).triu(1)
    maps = model.attention_maps(x[0])
    assert maps.shape == (2, 10, 10) and bool((maps[:, future] > 0).all())  # nothing masked
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 10))
    assert bool((small().eval().attention_maps(x[0])[:, future] == 0).all())  # the causal model's future is 0


def test_the_project_pages_recipe_has_exactly_its_820992_parameters():
    """jobs/sherlock.yaml at the book's vocabulary of 88, counted as the page counts: every parameter, the tied
    head once, biases on."""
    from pathlib import Path

    import yaml

    from tinygpt.base import config

    recipe = yaml.safe_load((Path(__file__).parents[2] / "jobs" / "sherlock.yaml").read_text())["train"]
    model = GPT(config.build(recipe).model, vocab_size=88)
    assert model.cfg.bias and model.num_params(non_embedding=False) == 820_992


def test_generate_crops_context_and_appends():
    model = small(block_size=16).eval()
    out = model.generate(torch.zeros((1, 1), dtype=torch.long), 40, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 41)
    assert int(out.max()) < 50


def test_generate_is_reproducible_with_a_generator_and_respects_top_k():
    model = small().eval()
    start = torch.zeros((1, 1), dtype=torch.long)
    a = model.generate(start, 30, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(3))
    b = model.generate(start, 30, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(start, 1, temperature=0)


def test_two_layer_model_memorises_a_sequence():
    model = small(vocab_size=20)
    seq = torch.randint(0, 20, (1, 17), generator=torch.Generator().manual_seed(1))
    x, y = seq[:, :16], seq[:, 1:]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(200):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def test_sequence_longer_than_block_size_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match="length 17, block size is only 16"):
        small()(torch.zeros((1, 17), dtype=torch.long))


def test_output_head_is_tied_and_residual_projections_are_scaled():
    model = small(n_layer=8)
    assert model.head.weight is model.tok_emb.weight
    proj_std = model.blocks[0].mlp.proj.weight.std().item()
    fc_std = model.blocks[0].mlp.fc.weight.std().item()
    assert abs(fc_std - 0.02) < 0.003
    assert abs(proj_std - 0.02 / math.sqrt(16)) < 0.002


def test_attention_maps_are_causal_distributions():
    model = small(n_head=4, n_embd=32)
    maps = model.attention_maps(torch.randint(0, 50, (12,)), layer=1)
    assert maps.shape == (4, 12, 12)
    torch.testing.assert_close(maps.sum(-1), torch.ones(4, 12))
    assert torch.all(maps.triu(1) == 0)
    assert model.training  # the picture path leaves the mode as it found it
    with pytest.raises(ValueError, match="layer must be in 0..1"):
        model.attention_maps(torch.zeros(3, dtype=torch.long), layer=2)


def test_attention_maps_agree_with_the_fused_path():
    """The explicit softmax path for pictures computes what scaled_dot_product_attention uses."""
    model = small().eval()
    idx = torch.randint(0, 50, (1, 9))
    attn = model.blocks[0].attn
    x = model.blocks[0].ln1(model.embed(idx))
    w = attn.weights(x)  # (1, nh, T, T)
    q, k, v = attn._heads(x)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(w @ v, expected, rtol=1e-5, atol=1e-6)


def test_bias_option_and_parameter_count():
    with_bias = small(bias=True)
    without = small(bias=False)
    assert with_bias.num_params() > without.num_params()
    assert without.num_params(non_embedding=False) == without.num_params() + 50 * 32 + 16 * 32


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    x = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(4))
    results = []
    for checkpointed in (False, True):
        model = small(dropout=0.1, checkpoint_blocks=checkpointed)
        torch.manual_seed(5)
        _, loss = model(x, x)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.equal(loss_a, loss_b)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(grads_a, grads_b))
