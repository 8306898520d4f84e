// LayerNorm over the last dimension with the residual add before it fused in, forward and backward, in
// fp32, for widths that are a multiple of 16 (tinygpt/cpu_kernels.py says why and when it is used):
//
//   s = x + delta            (delta optional: then s is x)
//   y = (s - mean(s)) * rstd * weight + bias,   rstd = 1 / sqrt(var(s) + eps)
//
// In a pre-LN transformer every LayerNorm but the first reads the residual stream right after an add;
// PyTorch makes that two passes over memory each way (the add, then the norm; in backward the norm's
// gradient, then the add into the residual's gradient). Here each row is read and written once, while
// it sits in L1. Rows are split over PyTorch's threads; the weight and bias gradients are summed per
// block of ROWS rows and the blocks added in order afterwards, so that the result does not depend on
// the number of threads.

#include "kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>

namespace tinygpt {
namespace {

constexpr int64_t ROWS = 64;  // rows per block of the parameter gradients

int64_t check_rows(const at::Tensor& t, const at::Tensor& like, const char* what) {
  check_contiguous_float(t, what);
  TORCH_CHECK(t.sizes() == like.sizes(), what, " must have the shape of the input");
  return t.size(-1);
}

void check_param(const c10::optional<at::Tensor>& p, int64_t C, const char* what) {
  if (!p) return;
  TORCH_CHECK(p->scalar_type() == at::kFloat && p->is_contiguous() && p->dim() == 1 && p->size(0) == C, what,
              " must be a contiguous float32 tensor of the normalized width");
}

}  // namespace

// Returns s (empty when delta is not given: s is x), y, and the mean and rstd of each row for backward.
std::vector<at::Tensor> add_layer_norm_forward(const at::Tensor& x, const c10::optional<at::Tensor>& delta,
                                               const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                               double eps) {
  const int64_t C = check_rows(x, x, "x");
  TORCH_CHECK(C % V == 0, "the normalized width must be a multiple of 16");
  if (delta) check_rows(*delta, x, "delta");
  check_param(weight, C, "weight");
  check_param(bias, C, "bias");
  const int64_t N = x.numel() / C;
  at::Tensor s = delta ? at::empty_like(x) : at::empty({0}, x.options());
  at::Tensor y = at::empty_like(x);
  at::Tensor mean = at::empty({N}, x.options()), rstd = at::empty({N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* dp = delta ? delta->data_ptr<float>() : nullptr;
  float* sp = delta ? s.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  float* mp = mean.data_ptr<float>();
  float* rp = rstd.data_ptr<float>();
  const float inv_c = 1.f / static_cast<float>(C), epsf = static_cast<float>(eps);
  at::parallel_for(0, N, ROWS, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* row = xp + i * C;
      vec sum = vec{};
      if (dp) {  // s = x + delta, written out (the residual stream goes on from it)
        float* srow = sp + i * C;
        for (int64_t c = 0; c < C; c += V) {
          const vec v = load(row + c) + load(dp + i * C + c);
          store(srow + c, v);
          sum += v;
        }
        row = srow;
      } else {
        for (int64_t c = 0; c < C; c += V) sum += load(row + c);
      }
      const float m = hsum(sum) * inv_c;
      vec sq = vec{};
      for (int64_t c = 0; c < C; c += V) {
        const vec d = load(row + c) - m;
        sq += d * d;
      }
      const float r = 1.f / std::sqrt(hsum(sq) * inv_c + epsf);
      for (int64_t c = 0; c < C; c += V) {
        vec out = (load(row + c) - m) * r * load(wp + c);
        if (bp) out += load(bp + c);
        store(yp + i * C + c, out);
      }
      mp[i] = m;
      rp[i] = r;
    }
  });
  return {s, y, mean, rstd};
}

// Gradients from dy (of y) and ds (of s, from the residual stream; optional): the input's
// ds + LN'(dy), which is also delta's, and the weight's and bias's. s is the normalized input.
//   xhat = (s - mean) * rstd    g = dy * weight
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) + ds    dweight = sum dy * xhat    dbias = sum dy
std::vector<at::Tensor> add_layer_norm_backward(const at::Tensor& dy, const c10::optional<at::Tensor>& ds,
                                                const at::Tensor& s, const at::Tensor& mean,
                                                const at::Tensor& rstd, const at::Tensor& weight) {
  const int64_t C = check_rows(s, s, "s");
  check_rows(dy, s, "dy");
  if (ds) check_rows(*ds, s, "ds");
  check_param(weight, C, "weight");
  const int64_t N = s.numel() / C, blocks = (N + ROWS - 1) / ROWS;
  TORCH_CHECK(mean.numel() == N && rstd.numel() == N && mean.is_contiguous() && rstd.is_contiguous(),
              "mean and rstd must hold one value per row");
  at::Tensor dx = at::empty_like(s);
  at::Tensor partial = at::empty({blocks, 2, C}, s.options());  // per block: dweight, dbias
  const float* gp = dy.data_ptr<float>();
  const float* dsp = ds ? ds->data_ptr<float>() : nullptr;
  const float* sp = s.data_ptr<float>();
  const float* mp = mean.data_ptr<float>();
  const float* rp = rstd.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* dxp = dx.data_ptr<float>();
  float* pp = partial.data_ptr<float>();
  const float inv_c = 1.f / static_cast<float>(C);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* dw = pp + b * 2 * C;
      float* db = dw + C;
      std::fill(dw, dw + 2 * C, 0.f);
      for (int64_t i = b * ROWS; i < std::min(N, (b + 1) * ROWS); ++i) {
        const float* g = gp + i * C;
        const float* row = sp + i * C;
        const float m = mp[i], r = rp[i];
        vec sum_g = vec{}, sum_gx = vec{};
        for (int64_t c = 0; c < C; c += V) {
          const vec d = load(g + c), xhat = (load(row + c) - m) * r, gw = d * load(wp + c);
          sum_g += gw;
          sum_gx += gw * xhat;
          store(dw + c, load(dw + c) + d * xhat);
          store(db + c, load(db + c) + d);
        }
        const float a = hsum(sum_g) * inv_c, bb = hsum(sum_gx) * inv_c;
        for (int64_t c = 0; c < C; c += V) {
          const vec xhat = (load(row + c) - m) * r;
          vec out = (load(g + c) * load(wp + c) - a - xhat * bb) * r;
          if (dsp) out += load(dsp + i * C + c);
          store(dxp + i * C + c, out);
        }
      }
    }
  });
  at::Tensor dweight = at::zeros({C}, s.options()), dbias = at::zeros({C}, s.options());
  float* dwp = dweight.data_ptr<float>();
  float* dbp = dbias.data_ptr<float>();
  for (int64_t b = 0; b < blocks; ++b)  // in order: the same sums for any number of threads
    for (int64_t c = 0; c < C; c += V) {
      store(dwp + c, load(dwp + c) + load(pp + b * 2 * C + c));
      store(dbp + c, load(dbp + c) + load(pp + b * 2 * C + C + c));
    }
  return {dx, dweight, dbias};
}

}  // namespace tinygpt
