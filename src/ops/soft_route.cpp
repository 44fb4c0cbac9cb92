// Soft MoE's dispatch and combine weights (Puigcerver et al. 2024) and their backward: softmaxes
// over a sequence's tokens and over the slots. The layer's part is layers/moe/soft_moe.cpp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "activation_kernels.hpp"
#include "check.hpp"
#include "ffnlab/ops/router.hpp"

namespace ffnlab {

void soft_route(Tensor& dispatch, Tensor& combine, const Tensor& logits, std::int64_t sequence,
                double* entropy_sum, double* top_sum) {
  check(logits.rank() == 2, "[router] soft logits {} must be [T, M]", shape_string(logits.shape()));
  const std::int64_t T = logits.dim(0), M = logits.dim(1), S = sequence > 0 ? sequence : T;
  check(T == 0 || T % S == 0, "[router] {} tokens are not whole sequences of {}", T, S);
  dispatch.ensure({T, M});
  combine.ensure({T, M});
  if (T == 0) return;
  const float* L = logits.f32();
  float* Dsp = dispatch.f32();
  // Dispatch: per sequence, the column maxima, then e^(l - max) row by row (contiguous, in
  // float: kernels::exp_fast) with the column sums, then each row scaled by 1/sum.
#pragma omp parallel
  {
    std::vector<float> mx(static_cast<std::size_t>(M)), sum(static_cast<std::size_t>(M));
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < T / S; ++b) {
      const std::int64_t t0 = b * S;
      std::copy(L + t0 * M, L + (t0 + 1) * M, mx.begin());
      for (std::int64_t t = t0 + 1; t < t0 + S; ++t)
#pragma omp simd
        for (std::int64_t j = 0; j < M; ++j) mx[j] = L[t * M + j] > mx[j] ? L[t * M + j] : mx[j];
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (std::int64_t t = t0; t < t0 + S; ++t)
#pragma omp simd
        for (std::int64_t j = 0; j < M; ++j) {
          Dsp[t * M + j] = kernels::exp_fast(L[t * M + j] - mx[j]);
          sum[j] += Dsp[t * M + j];
        }
      for (std::int64_t j = 0; j < M; ++j) sum[j] = 1.0f / sum[j];
      for (std::int64_t t = t0; t < t0 + S; ++t)
#pragma omp simd
        for (std::int64_t j = 0; j < M; ++j) Dsp[t * M + j] *= sum[j];
    }
  }
  // Combine: a softmax row per token. Its entropy without a logarithm per slot:
  // H = -Σ p·(l - m - log z) = m + log z - Σ p·l.
  std::vector<double> entropy(static_cast<std::size_t>(T)), top(static_cast<std::size_t>(T));
  float* C = combine.f32();
#pragma omp parallel
  {
    std::vector<float> e(static_cast<std::size_t>(M));
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < T; ++t) {
      const float* l = L + t * M;
      float mx;
      const float z = kernels::exp_minus_max(e.data(), l, M, &mx);
      const float inv = 1.0f / z;
      double pl = 0;
      float best = 0;
      for (std::int64_t j = 0; j < M; ++j) {
        pl += static_cast<double>(e[j]) * l[j];
        best = e[j] > best ? e[j] : best;
      }
      entropy[t] = mx + std::log(static_cast<double>(z)) - pl * inv;
      top[t] = best * inv;
      float* c = C + t * M;
#pragma omp simd
      for (std::int64_t j = 0; j < M; ++j) c[j] = e[j] * inv;
    }
  }
  for (std::int64_t t = 0; t < T; ++t) {  // in token order: the same sums for any thread count
    *entropy_sum += entropy[t];
    *top_sum += top[t];
  }
}

void soft_route_backward(Tensor& dlogits, const Tensor& dcombine, const Tensor& ddispatch,
                         const Tensor& dispatch, const Tensor& combine, std::int64_t sequence) {
  const std::int64_t T = combine.dim(0), M = combine.dim(1), S = sequence > 0 ? sequence : T;
  dlogits.ensure({T, M});
  if (T == 0) return;
  const float* C = combine.f32();
  const float* dC = dcombine.f32();
  const float* Dsp = dispatch.f32();
  const float* dD = ddispatch.f32();
  float* dL = dlogits.f32();
  // Over the slots: dl = c·(dc - Σ_j c_j·dc_j), per token.
#pragma omp parallel for schedule(static)
  for (std::int64_t t = 0; t < T; ++t) {
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (std::int64_t j = 0; j < M; ++j) dot += C[t * M + j] * dC[t * M + j];
#pragma omp simd
    for (std::int64_t j = 0; j < M; ++j) dL[t * M + j] = C[t * M + j] * (dC[t * M + j] - dot);
  }
  // Over each sequence's tokens: dl += d·(dd - Σ_t d_t·dd_t), per slot.
#pragma omp parallel
  {
    std::vector<float> dot(static_cast<std::size_t>(M));
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < T / S; ++b) {
      std::fill(dot.begin(), dot.end(), 0.0f);
      for (std::int64_t t = b * S; t < (b + 1) * S; ++t)
#pragma omp simd
        for (std::int64_t j = 0; j < M; ++j) dot[j] += Dsp[t * M + j] * dD[t * M + j];
      for (std::int64_t t = b * S; t < (b + 1) * S; ++t)
#pragma omp simd
        for (std::int64_t j = 0; j < M; ++j)
          dL[t * M + j] += Dsp[t * M + j] * (dD[t * M + j] - dot[j]);
    }
  }
}

}  // namespace ffnlab
