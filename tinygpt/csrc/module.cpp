// The Python module of tinygpt's CPU kernels (tinygpt/cpu_kernels.py builds and loads it).

#include <torch/extension.h>

#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attention_forward", &tinygpt::causal_attention_forward, "causal attention forward (fp32)");
  m.def("attention_backward", &tinygpt::causal_attention_backward, "causal attention backward (fp32)");
  m.def("add_layer_norm_forward", &tinygpt::add_layer_norm_forward, "residual add + LayerNorm forward (fp32)");
  m.def("add_layer_norm_backward", &tinygpt::add_layer_norm_backward, "residual add + LayerNorm backward (fp32)");
  m.def("gelu_and_slope", &tinygpt::gelu_and_slope, "GELU and its derivative (fp32)");
}
