"""Bench-only: with this folder first on PYTHONPATH, PyTorch starts with oneDNN off
(`torch.backends.mkldnn.enabled = False`), which sends bf16 matmuls on a CPU to PyTorch's serial fallback: the
slow bf16 path of a CPU without fast bf16 (a Zen 2 EPYC, say), reproduced on one that has it
(`python bench/throughput.py --onednn off`). fp32 matmuls keep their BLAS."""

import torch

torch.backends.mkldnn.enabled = False
