// GELU (the exact one, with erf) and its slope in one pass, in fp32 (tinygpt/cpu_kernels.py says why):
//
//   g = h Phi(h)    d = Phi(h) + h phi(h)    with Phi, phi the standard normal's CDF and density
//
// Phi comes from erf by Abramowitz and Stegun 7.1.26 (absolute error <= 1.5e-7), the formula PyTorch's
// own vectorized CPU GELU uses; its exp(-z^2) is also what phi needs, so the slope costs a few
// multiplications more than GELU itself. Backward is then dh = dg * d, with nothing left to recompute.

#include "kernels.h"

#include <ATen/Parallel.h>

#include <cstring>

namespace tinygpt {
namespace {

inline void gelu_vec(vec h, vec& g, vec& d) {
  const vec a = h < 0.f ? -h : h;
  const vec e = exp_nonpositive(h * h * -0.5f);                  // exp(-z^2) for z = |h| / sqrt(2)
  const vec t = 1.f / (a * (0.3275911f * 0.7071067811865476f) + 1.f);
  vec p = splat(1.061405429f);
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const vec tail = p * t * e * 0.5f;                              // (1 - erf(z)) / 2 = Phi(-|h|)
  const vec cdf = h < 0.f ? tail : 1.f - tail;                    // Phi(h)
  g = h * cdf;
  d = cdf + h * e * 0.3989422804014327f;                          // phi(h) = exp(-h^2 / 2) / sqrt(2 pi)
}

}  // namespace

std::vector<at::Tensor> gelu_and_slope(const at::Tensor& h) {
  check_contiguous_float(h, "h");
  at::Tensor g = at::empty_like(h), d = at::empty_like(h);
  const float* hp = h.data_ptr<float>();
  float* gp = g.data_ptr<float>();
  float* dp = d.data_ptr<float>();
  const int64_t n = h.numel();
  at::parallel_for(0, (n + V - 1) / V, 2048, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t o = i * V, left = std::min<int64_t>(V, n - o);
      vec gv, dv;
      if (left == V) {
        gelu_vec(load(hp + o), gv, dv);
        store(gp + o, gv);
        store(dp + o, dv);
      } else {  // the last few: through a padded vector, so every element gets the same arithmetic
        float in[V] = {}, go[V], dout[V];
        std::memcpy(in, hp + o, left * sizeof(float));
        gelu_vec(load(in), gv, dv);
        store(go, gv);
        store(dout, dv);
        std::memcpy(gp + o, go, left * sizeof(float));
        std::memcpy(dp + o, dout, left * sizeof(float));
      }
    }
  });
  return {g, d};
}

}  // namespace tinygpt
