"""Which device, dtype, autocast, grad scaler and compile mode a run uses, and the dtype Muon orthogonalises in.

The decision is a pure function of (device kind, compute capability, flags), `choose_policy`, so it is
unit-tested for A100, H100, V100, T4 and CPU without owning any of them. `resolve_policy` reads the real
hardware and calls it.

Capability, not `torch.cuda.is_bf16_supported()`, decides: that function answers True on sm_75 (T4)
through emulation, which is slower than fp16 there. On a CPU, Muon's Newton-Schulz steps run in bf16 only where
they are measured faster in bf16 than in fp32 for the model's own matrices (bf16_probe.py); elsewhere in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass


class PrecisionError(ValueError):
    """The requested precision or compile mode cannot run on this hardware."""


@dataclass(frozen=True)
class Policy:
    device_type: str  # "cpu" or "cuda"
    precision: str  # "bf16", "fp16" or "fp32"
    use_scaler: bool  # fp16 needs loss scaling to keep small gradients from flushing to zero
    tf32: bool  # let fp32 matmuls use TF32 tensor cores (Ampere and newer)
    compile: bool
    fused_adamw: bool
    orthogonalise: str | None = None  # the dtype Muon's Newton-Schulz steps run in ("bf16", "fp32"); None: no Muon
    orthogonalise_why: str = ""

    @property
    def autocast_dtype(self):
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)

    def autocast(self):
        """A context manager: autocast to the policy's dtype, or nothing for fp32."""
        import contextlib

        import torch

        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)

    def describe(self) -> str:
        extra = [x for x, on in (("grad scaler", self.use_scaler), ("TF32", self.tf32),
                                 ("compiled", self.compile), ("fused AdamW", self.fused_adamw),
                                 (f"Muon in {self.orthogonalise}: {self.orthogonalise_why}", self.orthogonalise)) if on]
        return f"{self.device_type} {self.precision}" + (f" ({', '.join(extra)})" if extra else "")


def choose_policy(
    device_type: str,
    capability: tuple[int, int] | None,
    precision: str = "auto",
    compile: str = "auto",
    cpu_bf16: bool = False,
    muon: str | None = None,
    bf16_ratio: float | None = None,
) -> Policy:
    """The precision policy for a device. device_type: "cpu" or "cuda"; capability: CUDA compute capability, e.g.
    (8, 0) for A100; cpu_bf16: whether this CPU has native bf16 matmuls (AVX512-BF16 / AMX), for `precision bf16`
    on CPU; muon: the matrices the run's Muon orthogonalises, in words (None: no Muon); bf16_ratio: the time
    this CPU takes to orthogonalise them in bf16 over the time in fp32."""
    if device_type == "cuda":
        if capability is None:
            raise PrecisionError("a CUDA device needs its compute capability")
        native_bf16 = capability >= (8, 0)
        if precision == "auto":
            precision = "bf16" if native_bf16 else ("fp16" if capability >= (7, 0) else "fp32")
        elif precision == "bf16" and not native_bf16:
            raise PrecisionError(
                f"precision: bf16 needs compute capability >= 8.0 (A100, H100); this GPU is "
                f"sm_{capability[0]}{capability[1]}; use --precision fp16 (or auto)"
            )
        tf32 = capability >= (8, 0)
        use_compile = compile in ("auto", "on")
        fused = True
    elif device_type in ("cpu", "mps"):
        # CPU runs are smoke tests of the GPU code: fp32 is bit-reproducible on any CPU, and whether bf16
        # autocast is faster depends on the CPU and the shapes (docs/performance.md), so it is asked for;
        # fp16 (with its grad scaler) is there to run the V100 path where there is no V100.
        if precision == "auto":
            precision = "fp32"
        elif precision == "bf16" and not cpu_bf16 and device_type == "cpu":
            raise PrecisionError(
                "precision: bf16 on CPU needs native bf16 instructions (AVX512-BF16 or AMX), which this "
                "CPU lacks; use --precision fp32"
            )
        tf32 = False
        # torch.compile on CPU generates C++ and needs a compiler; a smoke test must start anywhere.
        use_compile = compile == "on"
        fused = device_type == "cpu"  # PyTorch's fused AdamW kernel exists for CPU (and CUDA), not for MPS
    else:
        raise PrecisionError(f"device: unknown device type {device_type!r}")
    if precision not in ("bf16", "fp16", "fp32"):
        raise PrecisionError(f"precision: {precision!r} is not one of auto, bf16, fp16, fp32")
    if compile not in ("auto", "on", "off"):
        raise PrecisionError(f"compile: {compile!r} is not one of auto, on, off")
    return Policy(device_type, precision, precision == "fp16", tf32, use_compile, fused,
                  *(_orthogonalise(device_type, muon, bf16_ratio) if muon else (None, "")))


BF16_AT_MOST = 0.9  # bf16's time over fp32's at which a CPU orthogonalises in bf16: fp32 is exacter, so bf16 must win


def _orthogonalise(device_type: str, work: str, bf16_ratio: float | None) -> tuple[str, str]:
    """The dtype of Muon's Newton-Schulz steps, and why: torch's bf16 on a GPU, and on a CPU that does the run's
    `work` at least a tenth faster in bf16; fp32 elsewhere (a serial bf16 fallback is tens of times slower)."""
    if device_type == "cuda":
        return "bf16", "as torch.optim.Muon on a GPU"
    if bf16_ratio is None:
        return "fp32", "how fast this CPU orthogonalises in bf16 is not known"
    said = f"{work} take {bf16_ratio:.2f}x the time in bf16 as in fp32 on this CPU"
    return ("bf16" if bf16_ratio <= BF16_AT_MOST else "fp32"), said


def cpu_has_bf16() -> bool:
    """Native bf16 matmul support on this CPU (Linux: the avx512_bf16 or amx_bf16 flags in /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line for line in fh if line.startswith("flags")), "").split()
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


def pick_device(requested: str, local_rank: int = 0) -> str:
    import torch

    if requested == "auto":
        return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise PrecisionError(f"device: {requested} was asked for but no CUDA GPU is visible; use --device cpu")
    return requested


def resolve_policy(device: str, precision: str, compile: str, muon: list[tuple[int, int]] | None = None) -> Policy:
    """The policy of this process on `device`; `muon`: the shapes of the matrices the run's Muon orthogonalises."""
    import torch

    from tinygpt.training import bf16_probe

    kind = device.split(":")[0]
    capability = torch.cuda.get_device_capability(device) if kind == "cuda" else None
    cpu_bf16 = kind == "cpu" and precision == "bf16" and cpu_has_bf16()  # read only when it matters
    ratio = bf16_probe.ratio(muon) if muon and kind == "cpu" else None  # (timed only when it matters)
    return choose_policy(kind, capability, precision, compile, cpu_bf16=cpu_bf16,
                         muon=bf16_probe.describe(muon) if muon else None, bf16_ratio=ratio)


def apply(policy: Policy) -> None:
    """Process-wide switches that follow from the policy."""
    import torch

    if policy.device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = policy.tf32
        torch.backends.cudnn.allow_tf32 = policy.tf32


