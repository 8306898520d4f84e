import json

import pytest

from tinygpt.training.precision import PrecisionError, choose_policy, cpu_has_bf16
from tinygpt.training.speed import flops_per_token, peak_flops_for

GPUS = {  # name: (compute capability, precision, scaler, tf32)
    "A100": ((8, 0), "bf16", False, True),
    "H100": ((9, 0), "bf16", False, True),
    "V100": ((7, 0), "fp16", True, False),
    "T4": ((7, 5), "fp16", True, False),  # is_bf16_supported() says True here (emulated): capability decides
}


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_auto_policy_on_gpus(gpu):
    capability, precision, scaler, tf32 = GPUS[gpu]
    policy = choose_policy("cuda", capability)
    assert (policy.precision, policy.use_scaler, policy.tf32) == (precision, scaler, tf32)
    assert policy.compile and policy.fused_adamw


@pytest.mark.parametrize("cpu_bf16", [False, True])
def test_auto_policy_on_cpu_is_fp32_uncompiled_whatever_the_cpu(cpu_bf16):
    policy = choose_policy("cpu", None, cpu_bf16=cpu_bf16)
    assert (policy.precision, policy.use_scaler, policy.compile, policy.fused_adamw) == ("fp32", False, False, True)


def test_explicit_choices():
    assert choose_policy("cpu", None, "bf16", cpu_bf16=True).precision == "bf16"
    fp16 = choose_policy("cpu", None, "fp16")  # the V100 path, tried on a CPU
    assert (fp16.precision, fp16.use_scaler, fp16.fused_adamw) == ("fp16", True, True)
    assert choose_policy("cpu", None, compile="on").compile
    assert not choose_policy("cuda", (8, 0), compile="off").compile
    assert choose_policy("cuda", (8, 0), "fp16").use_scaler
    assert choose_policy("cuda", (9, 0), "fp32").precision == "fp32"


@pytest.mark.parametrize(
    "args, message",
    [
        (("cuda", (7, 0), "bf16"), "bf16 needs compute capability >= 8.0.*sm_70.*fp16"),
        (("cuda", (7, 5), "bf16"), "sm_75"),
        (("cpu", None, "bf16"), "AVX512-BF16"),
        (("tpu", None), "unknown device type"),
    ],
)
def test_impossible_requests_are_clear_errors(args, message):
    with pytest.raises(PrecisionError, match=message):
        choose_policy(*args)


def test_peak_flops_table():
    assert peak_flops_for("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_for("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_for("NVIDIA H100 PCIe") == 756e12
    assert peak_flops_for("NVIDIA H200") == 989e12
    assert peak_flops_for("Tesla V100-SXM2-32GB") == 125e12
    assert peak_flops_for("Some Future GPU") is None


def test_flops_per_token_formula():
    assert flops_per_token(1000, n_layer=2, n_embd=8, block_size=4) == 6 * 1000 + 12 * 2 * 8 * 4


def test_bf16_autocast_runs_on_this_cpu_when_it_has_the_units():
    import torch

    from tinygpt.base.config import ModelConfig
    from tinygpt.model import GPT

    if not cpu_has_bf16():
        with pytest.raises(PrecisionError):
            choose_policy("cpu", None, "bf16", cpu_bf16=False)
        return
    policy = choose_policy("cpu", None, "bf16", cpu_bf16=True)
    model = GPT(ModelConfig(block_size=8, n_layer=1, n_head=2, n_embd=16), vocab_size=11)
    x = torch.randint(0, 11, (2, 8))
    with policy.autocast():
        logits, loss = model(x, x)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    assert model.tok_emb.weight.grad.dtype == torch.float32  # fp32 master weights


WORK = "8 matrices of 96x96 to 384x96"
SAID = WORK + " take {}x the time in bf16 as in fp32 on this CPU"


@pytest.mark.parametrize("device, capability, ratio, expected", [
    ("cuda", (9, 0), None, ("bf16", "as torch.optim.Muon on a GPU")),
    ("cpu", None, 0.47, ("bf16", SAID.format("0.47"))),
    ("cpu", None, 0.9, ("bf16", SAID.format("0.90"))),
    ("cpu", None, 0.95, ("fp32", SAID.format("0.95"))),  # (fp32 is the exacter: bf16 must be clearly faster)
    ("cpu", None, 34.5, ("fp32", SAID.format("34.50"))),
    ("cpu", None, None, ("fp32", "how fast this CPU orthogonalises in bf16 is not known")),
])
def test_muon_orthogonalises_in_bf16_only_where_the_cpu_does_it_clearly_faster(device, capability, ratio, expected):
    policy = choose_policy(device, capability, muon=WORK, bf16_ratio=ratio)
    assert (policy.orthogonalise, policy.orthogonalise_why) == expected
    assert f"Muon in {expected[0]}: {expected[1]}" in policy.describe()
    assert choose_policy(device, capability, bf16_ratio=ratio).orthogonalise is None  # (no Muon: no word)


def test_the_bf16_probe_is_measured_once_per_cpu_torch_and_shapes_and_a_damaged_cache_is_measured_around(
        tmp_path, monkeypatch):
    from tinygpt.training import bf16_probe

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measured = []
    monkeypatch.setattr(bf16_probe, "measure", lambda shapes: measured.append(shapes) or 12.5)
    shapes, other = [(96, 32), (32, 32)], [(384, 128)]
    assert bf16_probe.ratio(shapes) == 12.5 and bf16_probe.ratio(shapes) == 12.5 and measured == [shapes]
    here = bf16_probe.key(shapes)
    assert json.loads(bf16_probe.cache_file().read_text()) == {here: 12.5}
    assert "torch " in here and "thread(s)" in here and "oneDNN" in here and "2 matrices of 32x32 to 96x32" in here
    assert bf16_probe.ratio(other) == 12.5 and measured == [shapes, other]  # (other shapes: measured anew)
    for damage in (b"{not json", b"[1, 2]", json.dumps({here: "fast"}).encode()):
        bf16_probe.cache_file().write_bytes(damage)
        assert bf16_probe.ratio(shapes) == 12.5
    assert measured == [shapes, other, shapes, shapes, shapes]
    assert json.loads(bf16_probe.cache_file().read_text()) == {here: 12.5}  # (rewritten whole)


def test_the_bf16_probe_times_both_dtypes_of_the_very_work():
    """Not its speed (that is the machine's): that it runs the orthogonalisation in both dtypes and answers a
    positive ratio."""
    from tinygpt.training import bf16_probe

    assert bf16_probe.measure([(24, 8), (8, 8)]) > 0
