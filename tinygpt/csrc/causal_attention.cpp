// Causal self-attention for the CPU, forward and backward, in fp32, for small heads (TinyGPT's 32 or 64
// channels). Built on first use by tinygpt/cpu_kernels.py; the reasons are in its docstring.
//
// One task per (batch row, head), spread over PyTorch's threads. A task copies its head's q, k, v out of
// the interleaved qkv rows into small contiguous buffers (a few tens of KB: they stay in L1/L2), computes
// the (T, T) scores in a buffer of its own (backward recomputes them from q, k and the saved log-sum-exp
// of each row), and writes its slice of the output in place. Only the lower
// triangle (key j <= query i) is ever computed. The inner loops are written so that the compiler turns
// them into full-width vector FMAs (-O3 -march=native): 16 consecutive keys or channels per vector,
// a few rows at a time so that each loaded vector is used several times.

#include "kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

namespace tinygpt {
namespace {

constexpr int64_t R = 8;       // rows of a tile: 8 rows x 2 vectors = 16 accumulators in registers
constexpr int64_t TILE = 2 * V;  // columns of a tile; T is padded to a multiple of it

// The one matrix product here, on a tile of R rows and NV vectors of columns:
//   C[r][c] = sum_{k in [k0, k1)} A(r, k) B[k][c]
// A(r, k) = A[r * a_row + k * a_k] (strided, so that A can be read transposed), B rows contiguous at
// stride ldb, C rows at stride ldc. Each loaded B vector feeds R FMAs; the accumulators stay in registers.
template <int64_t NV>
inline void tile(const float* A, int64_t a_row, int64_t a_k, const float* B, int64_t ldb, float* C, int64_t ldc,
                 int64_t k0, int64_t k1) {
  vec acc[R][NV] = {};
  for (int64_t k = k0; k < k1; ++k) {
    vec b[NV];
    for (int64_t v = 0; v < NV; ++v) b[v] = load(B + k * ldb + v * V);
#pragma GCC unroll 8
    for (int64_t r = 0; r < R; ++r) {
      const vec a = splat(A[r * a_row + k * a_k]);
      for (int64_t v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t v = 0; v < NV; ++v) store(C + r * ldc + v * V, acc[r][v]);
}

// Which part of C = A B the causal mask leaves non-zero, for a tile of rows [i0, i0 + R):
//   scores: S = q k^T (rows queries, columns keys): only columns up to the tile's last row;
//   lower:  P v (rows queries, k keys): only k <= the tile's last row;
//   upper:  P^T X (rows keys, k queries): only k >= the tile's first row.
enum class Causal { scores, lower, upper };

// C (rows x cols) = A B with k in [0, K) cut down by the causal mask; rows a multiple of R, cols of V.
template <Causal mask>
void matmul(const float* A, int64_t a_row, int64_t a_k, const float* B, int64_t ldb, float* C, int64_t ldc,
            int64_t rows, int64_t cols, int64_t K) {
  for (int64_t i0 = 0; i0 < rows; i0 += R) {
    const int64_t col_end = mask == Causal::scores ? std::min(cols, i0 + R) : cols;
    const int64_t k0 = mask == Causal::upper ? std::min(i0, K) : 0;
    const int64_t k1 = mask == Causal::lower ? std::min(K, i0 + R) : K;
    for (int64_t j0 = 0; j0 < col_end; j0 += TILE) {
      const float* a = A + i0 * a_row;
      float* c = C + i0 * ldc + j0;
      if (cols - j0 >= TILE)
        tile<2>(a, a_row, a_k, B + j0, ldb, c, ldc, k0, k1);
      else
        tile<1>(a, a_row, a_k, B + j0, ldb, c, ldc, k0, k1);
    }
  }
}

// Row i of S (stride Tp) to exp(S[i][j] - shift) for keys j <= i and exactly 0 for the rest of the
// vectors that hold them (the products above read no further). Forward shifts by the row max and
// returns the row sum (the caller divides the output row by it); backward shifts by the saved
// log-sum-exp, which normalizes too.
inline float exp_row(float* row, int64_t i, float shift, bool find_max, float* max_out) {
  ivec lane;
  for (int64_t c = 0; c < V; ++c) lane[c] = static_cast<int32_t>(c);
  const int64_t n = round_up(i + 1, V);
  if (find_max) {
    vec m = splat(-INFINITY);
    for (int64_t j = 0; j < n; j += V) {
      const vec s = load(row + j);
      m = (lane + static_cast<int32_t>(j)) <= static_cast<int32_t>(i) && s > m ? s : m;
    }
    shift = hmax(m);
    *max_out = shift;
  }
  vec sum = vec{};
  for (int64_t j = 0; j < n; j += V) {
    vec p = exp_nonpositive(load(row + j) - shift);
    p = (lane + static_cast<int32_t>(j)) <= static_cast<int32_t>(i) ? p : vec{};
    store(row + j, p);
    sum += p;
  }
  return hsum(sum);
}

// Scratch of one thread, reused across its heads: (Tp, D) rows and (D, Tp) transposes of the head's
// q (scaled), k, v and dy, two (Tp, Tp) score buffers and a (Tp, D) result. Rows past T stay zero.
struct Scratch {
  int64_t T, D, Tp;
  std::vector<float> q, k, v, g, kt, vt, s, s2, out, row_scale;
  Scratch(int64_t T, int64_t D)
      : T(T), D(D), Tp(round_up(T, TILE)), q(Tp * D, 0.f), k(Tp * D, 0.f), v(Tp * D, 0.f), g(Tp * D, 0.f),
        kt(D * Tp, 0.f), vt(D * Tp, 0.f), s(Tp * Tp, 0.f), s2(Tp * Tp, 0.f), out(Tp * D, 0.f), row_scale(Tp) {}

  // (T, D) rows at `src` (row stride `stride`) into dst, times scale.
  void rows_in(const float* src, int64_t stride, float* dst, float scale = 1.f) const {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; d += V) store(dst + t * D + d, load(src + t * stride + d) * scale);
  }

  // (T, D) rows at `src` (row stride `stride`) into dst as (D, Tp), V rows at a time: each column of a
  // block of V rows is gathered into one vector and stored whole.
  void transposed_in(const float* src, int64_t stride, float* dst) const {
    for (int64_t t0 = 0; t0 < T; t0 += V) {
      const int64_t n = std::min(V, T - t0);
      for (int64_t d = 0; d < D; ++d) {
        vec col = vec{};
        for (int64_t c = 0; c < n; ++c) col[c] = src[(t0 + c) * stride + d];
        store(dst + d * Tp + t0, col);
      }
    }
  }

  // The first T rows of `out` to dst (row stride `stride`), row t times scale and row_scale[t] if given.
  void rows_out(float* dst, int64_t stride, const float* row_scale = nullptr, float scale = 1.f) const {
    for (int64_t t = 0; t < T; ++t) {
      const vec f = splat(row_scale ? row_scale[t] * scale : scale);
      for (int64_t d = 0; d < D; d += V) store(dst + t * stride + d, load(&out[t * D + d]) * f);
    }
  }
};

struct Dims {
  int64_t B, T, C, H, D;
  float scale;  // of the scores: 1 / sqrt(D)
};

Dims check_qkv(const at::Tensor& qkv, int64_t n_head) {
  TORCH_CHECK(qkv.device().is_cpu() && qkv.scalar_type() == at::kFloat, "qkv must be a float32 CPU tensor");
  TORCH_CHECK(qkv.dim() == 3 && qkv.is_contiguous(), "qkv must be a contiguous (B, T, 3C) tensor");
  TORCH_CHECK(n_head > 0 && qkv.size(2) % (3 * n_head) == 0, "3C must split into q, k, v of n_head heads each");
  const int64_t C = qkv.size(2) / 3, D = C / n_head;
  TORCH_CHECK(D % V == 0, "the head size must be a multiple of 16");
  return {qkv.size(0), qkv.size(1), C, n_head, D, 1.f / std::sqrt(static_cast<float>(D))};
}

// fn(scratch, b, h) for every (batch row, head), split over PyTorch's threads in contiguous runs.
template <typename Fn>
void for_each_head(const Dims& n, Fn fn) {
  at::parallel_for(0, n.B * n.H, 1, [&](int64_t begin, int64_t end) {
    Scratch w(n.T, n.D);
    for (int64_t bh = begin; bh < end; ++bh) fn(w, bh / n.H, bh % n.H);
  });
}

}  // namespace

// qkv: (B, T, 3C), q | k | v side by side, heads side by side within each. Returns y (B, T, C), heads
// side by side, and the log-sum-exp of each softmax row (B, H, T) for backward.
std::vector<at::Tensor> causal_attention_forward(const at::Tensor& qkv, int64_t n_head) {
  const Dims n = check_qkv(qkv, n_head);
  const int64_t T = n.T, C = n.C, D = n.D;
  auto y = at::empty({n.B, T, C}, qkv.options());
  auto lse = at::empty({n.B, n.H, T}, qkv.options());
  const float* src = qkv.data_ptr<float>();
  float* y_all = y.data_ptr<float>();
  float* lse_all = lse.data_ptr<float>();
  for_each_head(n, [&](Scratch& w, int64_t b, int64_t h) {
    const int64_t Tp = w.Tp;
    const float* head = src + b * T * 3 * C + h * D;  // q; k at + C, v at + 2C
    w.rows_in(head, 3 * C, w.q.data(), n.scale);
    w.transposed_in(head + C, 3 * C, w.kt.data());
    w.rows_in(head + 2 * C, 3 * C, w.v.data());
    matmul<Causal::scores>(w.q.data(), D, 1, w.kt.data(), Tp, w.s.data(), Tp, Tp, Tp, D);  // S
    float* lse_row = lse_all + (b * n.H + h) * T;
    for (int64_t i = 0; i < T; ++i) {
      float row_max;
      const float sum = exp_row(&w.s[i * Tp], i, 0.f, /*find_max=*/true, &row_max);
      lse_row[i] = row_max + std::log(sum);
      w.row_scale[i] = 1.f / sum;
    }
    matmul<Causal::lower>(w.s.data(), Tp, 1, w.v.data(), D, w.out.data(), D, Tp, D, T);  // exp(S) v
    w.rows_out(y_all + b * T * C + h * D, C, w.row_scale.data());                         // / row sums
  });
  return {y, lse};
}

// Gradient of causal_attention_forward: dqkv (B, T, 3C) from dy (B, T, C), with the forward's y and lse.
//   P = softmax(scale q k^T)   dv = P^T dy   dP = dy v^T   dS = P * (dP - rowsum(dy * y))
//   dq = scale dS k            dk = dS^T (scale q)
at::Tensor causal_attention_backward(const at::Tensor& qkv, const at::Tensor& y, const at::Tensor& lse,
                                     const at::Tensor& dy_in, int64_t n_head) {
  const Dims n = check_qkv(qkv, n_head);
  const int64_t T = n.T, C = n.C, D = n.D;
  const auto dy = dy_in.contiguous();
  TORCH_CHECK(y.is_contiguous() && dy.sizes() == y.sizes() && lse.is_contiguous(), "bad y, dy or lse");
  auto dqkv = at::empty_like(qkv);
  const float* src = qkv.data_ptr<float>();
  const float* y_all = y.data_ptr<float>();
  const float* dy_all = dy.data_ptr<float>();
  const float* lse_all = lse.data_ptr<float>();
  float* dst = dqkv.data_ptr<float>();
  for_each_head(n, [&](Scratch& w, int64_t b, int64_t h) {
    const int64_t Tp = w.Tp;
    const float* head = src + b * T * 3 * C + h * D;
    const float* y_head = y_all + b * T * C + h * D;
    const float* dy_head = dy_all + b * T * C + h * D;
    float* dhead = dst + b * T * 3 * C + h * D;
    w.rows_in(head, 3 * C, w.q.data(), n.scale);
    w.rows_in(head + C, 3 * C, w.k.data());
    w.transposed_in(head + C, 3 * C, w.kt.data());
    w.transposed_in(head + 2 * C, 3 * C, w.vt.data());
    w.rows_in(dy_head, C, w.g.data());
    matmul<Causal::scores>(w.q.data(), D, 1, w.kt.data(), Tp, w.s.data(), Tp, Tp, Tp, D);   // S
    matmul<Causal::scores>(w.g.data(), D, 1, w.vt.data(), Tp, w.s2.data(), Tp, Tp, Tp, D);  // dP
    const float* lse_row = lse_all + (b * n.H + h) * T;
    for (int64_t i = 0; i < T; ++i) {
      float* p = &w.s[i * Tp];
      exp_row(p, i, lse_row[i], /*find_max=*/false, nullptr);  // P
      vec dot = vec{};
      for (int64_t d = 0; d < D; d += V) dot += load(dy_head + i * C + d) * load(y_head + i * C + d);
      const vec delta = splat(hsum(dot));
      float* ds = &w.s2[i * Tp];
      for (int64_t j = 0; j < round_up(i + 1, V); j += V)  // dS = P (dP - delta), 0 where P is
        store(ds + j, load(p + j) * (load(ds + j) - delta));
    }
    matmul<Causal::lower>(w.s2.data(), Tp, 1, w.k.data(), D, w.out.data(), D, Tp, D, T);  // dS k
    w.rows_out(dhead, 3 * C, nullptr, n.scale);
    matmul<Causal::upper>(w.s2.data(), 1, Tp, w.q.data(), D, w.out.data(), D, Tp, D, T);  // dS^T q
    w.rows_out(dhead + C, 3 * C);
    matmul<Causal::upper>(w.s.data(), 1, Tp, w.g.data(), D, w.out.data(), D, Tp, D, T);  // P^T dy
    w.rows_out(dhead + 2 * C, 3 * C);
  });
  return dqkv;
}

}  // namespace tinygpt
