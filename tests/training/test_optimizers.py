"""`optimizer: adamw | muon`: which parameters each part trains, one schedule for both, and Muon through
everything AdamW goes through (exact resume, fp16 and its scaler, bf16, torch.compile; DDP in
tests/training/test_distributed.py)."""

import math

import pytest
import torch

from tests.support.tiny import loss_series, read_metrics, tiny_config, train_tiny
from tinygpt.base import config
from tinygpt.model import GPT
from tinygpt.training import checkpoint as ckpt
from tinygpt.training import schedule, trainer
from tinygpt.training.optimizers import Optimizers, muon_parameters, muon_shapes, torchs_iteration

MUON = ["--optimizer", "muon", "--muon-lr", "0.02"]


def model(**keys) -> GPT:
    return GPT(config.ModelConfig(**{"block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16, **keys}), vocab_size=12)


def test_muon_trains_the_blocks_matrices_and_adamw_the_embeddings_head_norms_and_biases():
    net = model(bias=True)
    opt = Optimizers(net, config.OptimConfig(optimizer="muon"), fused=False)
    names = {id(p): n for n, p in net.named_parameters()}
    muon = {names[id(p)] for group in opt.parts["muon"].param_groups for p in group["params"]}
    adamw = [names[id(p)] for group in opt.parts["adamw"].param_groups for p in group["params"]]
    assert muon == muon_parameters(net) == {f"blocks.{i}.{m}.weight" for i in range(2)
                                           for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")}
    assert "tok_emb.weight" in adamw and "pos_emb.weight" in adamw  # (the head is tok_emb: tied)
    # (what the precision policy times, from the config alone: the very shapes Muon steps)
    assert sorted(muon_shapes(net.cfg, config.OptimConfig(optimizer="muon"))) == \
        sorted(tuple(p.shape) for group in opt.parts["muon"].param_groups for p in group["params"])
    assert net.head.weight is net.tok_emb.weight
    assert sorted(muon | set(adamw)) == sorted(names.values()) and len(adamw) == len(set(adamw))  # each once
    decayed, plain = opt.parts["adamw"].param_groups
    assert [names[id(p)] for p in decayed["params"]] == ["tok_emb.weight", "pos_emb.weight"]
    assert all(p.dim() == 1 for p in plain["params"]) and plain["weight_decay"] == 0.0
    only_adamw = Optimizers(net, config.OptimConfig(), fused=False)
    assert list(only_adamw.parts) == ["adamw"] and len(list(only_adamw.param_groups[0]["params"])) == 10


def test_one_schedule_scales_both_peak_rates():
    o = config.OptimConfig(optimizer="muon", lr=0.004, min_lr=0.0004, muon_lr=0.05, warmup_steps=10, max_steps=100)
    opt = Optimizers(model(), o, fused=False)
    for step, fraction in ((0, 1 / 11), (10, 1.0), (100, 0.1)):
        opt.set_lr(schedule.lr_at(step, o), o.beta1)
        assert opt.parts["adamw"].param_groups[0]["lr"] == pytest.approx(0.004 * fraction)
        assert opt.parts["muon"].param_groups[0]["lr"] == pytest.approx(0.05 * fraction)


def test_a_muon_run_learns_and_stopped_and_resumed_is_bit_identical(tmp_path, tiny_corpus, data_dir):
    common = [*MUON, "--max-steps", "40", "--dropout", "0.1", "--log-interval", "1"]
    whole, result = train_tiny(tmp_path, tiny_corpus, *common, name="whole")
    part, first = train_tiny(tmp_path, tiny_corpus, *common, "--stop-after", "20", name="part")
    assert not first.finished
    train_tiny(tmp_path, tiny_corpus, *common, name="part")
    assert loss_series(whole) == loss_series(part)  # exact floats
    a = ckpt.load(ckpt.path_for_step(whole, 40)).parts
    b = ckpt.load(ckpt.path_for_step(part, 40)).parts
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["optimizer"]["kind"] == "muon" and set(a["optimizer"]) == {"kind", "adamw", "muon"}
    assert result.last_val_loss < math.log(len(set(tiny_corpus.read_text())))


def test_a_checkpoint_of_one_optimizer_is_not_resumed_with_the_other(tmp_path, tiny_corpus, data_dir):
    out, _ = train_tiny(tmp_path, tiny_corpus, *MUON, "--max-steps", "10")
    with pytest.raises(trainer.TrainingError, match="resume: the checkpoint was trained with optimizer muon, and "
                                                     "this run asks for adamw; resume with --optimizer muon"):
        train_tiny(tmp_path, tiny_corpus, "--max-steps", "20")
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_00000010.pt"]  # (kept as it was)


def test_fp16_with_muon_skips_an_overflowing_step_as_a_whole_and_resumes_exactly(tmp_path, tiny_corpus, data_dir):
    run = trainer.Trainer(tiny_config(tmp_path, tiny_corpus, *MUON, "--precision", "fp16", name="overflow"))
    try:
        run.train_step()
        run.scaler.update(2.0 ** 40)  # fp16 gradients overflow at this scale
        before = [p.detach().clone() for p in run.model.parameters()]
        run.train_step()
        assert all(torch.equal(a, p) for a, p in zip(before, run.model.parameters()))  # neither part stepped
        assert run.scaler.get_scale() == 2.0 ** 39
    finally:
        run.close()
    common = [*MUON, "--precision", "fp16", "--max-steps", "30", "--log-interval", "1"]
    whole, _ = train_tiny(tmp_path, tiny_corpus, *common, name="whole")
    part, _ = train_tiny(tmp_path, tiny_corpus, *common, "--stop-after", "15", name="part")
    train_tiny(tmp_path, tiny_corpus, *common, name="part")
    assert loss_series(whole) == loss_series(part)
    assert [r["loss_scale"] for r in read_metrics(whole) if "lr" in r][0] == 65536.0


def test_bf16_autocast_and_compile_train_with_muon(tmp_path, tiny_corpus, data_dir, monkeypatch):
    """bf16 autocast (emulated where this CPU has no bf16 units) and Dynamo's capture of the model (aot_eager),
    each against the same run in fp32 eager."""
    from tinygpt.training import precision

    # (`--precision bf16` is refused on a CPU without bf16 units, rightly; here it runs on any CPU)
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    common = [*MUON, "--max-steps", "20", "--log-interval", "5"]
    eager, _ = train_tiny(tmp_path, tiny_corpus, *common, name="eager")
    bf16, _ = train_tiny(tmp_path, tiny_corpus, *common, "--precision", "bf16", name="bf16")
    compiled, _ = train_tiny(tmp_path, tiny_corpus, *common, "--compile", "on", "--compile-backend", "aot_eager",
                             name="compiled")
    for out, tolerance in ((bf16, 0.05), (compiled, 1e-5)):
        got, want = loss_series(out), loss_series(eager)
        assert len(got) == len(want)
        assert all(abs(x - y) <= tolerance for g, w in zip(got, want) for x, y in zip(g, w) if x is not None), out


def matrix_shapes() -> list[tuple[int, int]]:
    """Every shape of matrix Muon orthogonalises in the recipes' models (smoke, course-fast, the GPU recipe)."""
    shapes = set()
    for n_embd in (96, 128, 384):
        net = GPT(config.ModelConfig(block_size=8, n_layer=1, n_head=4, n_embd=n_embd), vocab_size=65)
        shapes |= {tuple(p.shape) for n, p in net.named_parameters() if n in muon_parameters(net)}
    return sorted(shapes)


@pytest.mark.parametrize("shape", matrix_shapes())
def test_the_orthogonalisation_is_torchs_iteration_batched_in_either_dtype(shape):
    """Against torch.optim.Muon's own `_zeropower_via_newtonschulz` (bf16, one matrix at a time) and the same
    iteration in float64: in fp32 ours is the iteration to 1e-5; in bf16 it is torch's to within bf16's rounding
    (8 bits of mantissa); a batch of three of one shape gives each what it gives alone."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    from tinygpt.training.optimizers import orthogonalise

    g = torch.Generator().manual_seed(0)
    updates = [torch.randn(shape, generator=g) for _ in range(3)]
    exact = orthogonalise([u.double() for u in updates], *torchs_iteration(), torch.float64)
    fp32 = orthogonalise(updates, *torchs_iteration(), torch.float32)
    bf16 = orthogonalise(updates, *torchs_iteration(), torch.bfloat16)
    torchs = [_zeropower_via_newtonschulz(u, *torchs_iteration()) for u in updates]
    assert all((f.double() - e).abs().max() < 1e-5 for f, e in zip(fp32, exact))
    assert all(b.dtype == torch.bfloat16 and (b.double() - t.double()).abs().max() < 5e-2 for b, t in zip(bf16, torchs))
    assert all((t.double() - e).abs().max() < 5e-2 for t, e in zip(torchs, exact))  # (the bound bf16 itself keeps)
    alone = orthogonalise(updates[1:2], *torchs_iteration(), torch.float32)[0]
    assert (alone - fp32[1]).abs().max() < 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_our_muon_steps_as_torch_optim_muon_and_shares_its_state(dtype):
    """Three steps on every shape the models have: torch.optim.Muon's update, to within bf16's rounding of the
    orthogonalised direction times the rate; the momentum buffers the same, so either resumes the other."""
    from tinygpt.training.optimizers import Muon

    g = torch.Generator().manual_seed(1)
    start = [torch.randn(shape, generator=g) for shape in matrix_shapes()]
    grads = [[torch.randn(shape, generator=g) for shape in matrix_shapes()] for _ in range(3)]
    ours, theirs = ([torch.nn.Parameter(t.clone()) for t in start] for _ in range(2))
    mine, torchs = Muon(ours, dtype, lr=0.02, weight_decay=0.1), torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1)
    for step in grads:
        for params, opt in ((ours, mine), (theirs, torchs)):
            for p, grad in zip(params, step):
                p.grad = grad.clone()
            opt.step()
    for a, b, s in zip(ours, theirs, start):
        assert (a - b).abs().max() <= 5e-2 * 0.02 * 3 * math.sqrt(max(1, s.shape[0] / s.shape[1]))
    assert all(torch.allclose(torchs.state[b]["momentum_buffer"], mine.state[a]["momentum_buffer"])
               for a, b in zip(ours, theirs))
    torchs.load_state_dict(mine.state_dict())  # a checkpoint of one resumes in the other
    assert all(torch.equal(torchs.state[b]["momentum_buffer"], mine.state[a]["momentum_buffer"])
               for a, b in zip(ours, theirs))


@pytest.mark.parametrize("ratio, dtype", [(40.0, "fp32"), (0.5, "bf16")])
def test_a_muon_run_orthogonalises_as_the_cpus_bf16_speed_says_resumes_exactly_and_says_why(
        tmp_path, tiny_corpus, data_dir, monkeypatch, ratio, dtype):
    """The bf16 probe's answer stands in for a slow and a fast CPU: the run orthogonalises in fp32 or bf16, says
    so and why in its start record and provenance.json, and stopped and resumed on that path is bit-identical."""
    import json

    from tinygpt.training import bf16_probe

    monkeypatch.setattr(bf16_probe, "ratio", lambda shapes: ratio)
    common = [*MUON, "--max-steps", "16", "--log-interval", "1"]
    whole, _ = train_tiny(tmp_path, tiny_corpus, *common, name="whole")
    part, _ = train_tiny(tmp_path, tiny_corpus, *common, "--stop-after", "8", name="part")
    train_tiny(tmp_path, tiny_corpus, *common, name="part")
    assert loss_series(whole) == loss_series(part)
    start = next(r for r in read_metrics(whole) if r.get("event") == "start")
    recorded = json.loads((whole / "provenance.json").read_text())["starts"][-1]
    assert start["muon_precision"] == recorded["muon_precision"] == dtype
    said = f"4 matrices of 32x32 to 128x32 take {ratio:.2f}x the time in bf16 as in fp32 on this CPU"
    assert start["muon_precision_why"] == recorded["muon_precision_why"] == said
