// Vector arithmetic shared by the CPU kernels (tinygpt/cpu_kernels.py builds them): GCC vector types
// that the compiler maps onto the CPU it builds for (-march=native), so the same source gives AVX-512,
// AVX2 or NEON code.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace tinygpt {

// 16 floats: one AVX-512 register (two AVX2 ones where that is what the CPU has). Unaligned, may alias.
typedef float vec __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t ivec __attribute__((vector_size(64), aligned(4), may_alias));
constexpr int64_t V = 16;

inline vec load(const float* p) { return *reinterpret_cast<const vec*>(p); }
inline void store(float* p, vec v) { *reinterpret_cast<vec*>(p) = v; }
inline vec splat(float x) {  // (not vec{} + x, which adds to 0 first for -0's sake: a 2nd instruction)
  static_assert(V == 16);
  return vec{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}
inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// What the elementwise kernels read and write: the data of a contiguous float32 CPU tensor.
inline void check_contiguous_float(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), what,
              " must be a contiguous float32 CPU tensor");
}

// exp(x) for x <= 0 (softmax arguments): Cephes' expf range reduction and polynomial in vector arithmetic
// (std::exp does not vectorize without -ffast-math). Relative error at most 8.6e-8, under one float ulp,
// over every float in [-87, 0] (checked against double exp). Below -87 it returns ~1e-38, not 0; callers
// mask what must be exactly 0.
inline vec exp_nonpositive(vec x) {
  x = x < -87.f ? splat(-87.f) : x;
  const vec shifter = splat(12582912.f);  // 1.5 * 2^23: adding it rounds to the nearest integer
  const vec n = (x * 1.44269504088896341f + shifter) - shifter;
  const vec r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  vec p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;  // 2^n
  return p * reinterpret_cast<const vec&>(bits);
}

// Max and sum across the 16 lanes, in four halving steps (a lane-by-lane loop is 15 dependent scalar ops).
template <typename Op>
inline float reduce(vec v, Op op) {
  v = op(v, __builtin_shuffle(v, ivec{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
  v = op(v, __builtin_shuffle(v, ivec{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}));
  v = op(v, __builtin_shuffle(v, ivec{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}));
  v = op(v, __builtin_shuffle(v, ivec{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}));
  return v[0];
}
inline float hmax(vec v) { return reduce(v, [](vec a, vec b) { return a > b ? a : b; }); }
inline float hsum(vec v) { return reduce(v, [](vec a, vec b) { return a + b; }); }

// Functions of the extension, one file each; csrc/module.cpp binds them.
std::vector<at::Tensor> causal_attention_forward(const at::Tensor& qkv, int64_t n_head);
at::Tensor causal_attention_backward(const at::Tensor& qkv, const at::Tensor& y, const at::Tensor& lse,
                                     const at::Tensor& dy, int64_t n_head);
std::vector<at::Tensor> add_layer_norm_forward(const at::Tensor& x, const c10::optional<at::Tensor>& delta,
                                               const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                               double eps);
std::vector<at::Tensor> add_layer_norm_backward(const at::Tensor& dy, const c10::optional<at::Tensor>& ds,
                                                const at::Tensor& s, const at::Tensor& mean,
                                                const at::Tensor& rstd, const at::Tensor& weight);
std::vector<at::Tensor> gelu_and_slope(const at::Tensor& h);

}  // namespace tinygpt
