// Row gathers for the MoE's permute and un-permute.
#include "ffnlab/ops/permute.hpp"

#include <algorithm>
#include <cstring>

#include "check.hpp"
#include "ffnlab/ops/dispatch.hpp"

namespace ffnlab {

namespace {

constexpr std::int64_t kParallelRows = dispatch::kPermuteRows;  // rows per OpenMP chunk

}  // namespace

void permute_rows(Tensor& out, const Tensor& x, const std::int64_t* token_of_row, std::int64_t R) {
  check(x.rank() == 2, "[permute] x {} must be [T, D]", shape_string(x.shape()));
  const std::int64_t D = x.dim(1);
  out.ensure({R, D});
  const float* in = x.f32();
  float* o = out.f32();
#pragma omp parallel for schedule(static) if (R > kParallelRows)
  for (std::int64_t i = 0; i < R; ++i)
    std::memcpy(o + i * D, in + token_of_row[i] * D, static_cast<std::size_t>(D) * sizeof(float));
}

void unpermute_rows(Tensor& y, const Tensor& rows, const std::int64_t* slot, const float* weight,
                    int k, bool accumulate) {
  check(y.rank() == 2 && rows.rank() == 2 && rows.dim(1) == y.dim(1),
        "[permute] rows {} do not match y {}", shape_string(rows.shape()), shape_string(y.shape()));
  const std::int64_t T = y.dim(0), D = y.dim(1);
  const float* r = rows.f32();
  float* out = y.f32();
#pragma omp parallel for schedule(static) if (T > kParallelRows)
  for (std::int64_t t = 0; t < T; ++t) {
    float* yt = out + t * D;
    if (!accumulate) std::fill(yt, yt + D, 0.0f);
    for (int j = 0; j < k; ++j) {
      const std::int64_t s = slot[t * k + j];
      if (s < 0) continue;
      const float w = weight[t * k + j];
      const float* rs = r + s * D;
#pragma omp simd
      for (std::int64_t d = 0; d < D; ++d) yt[d] += w * rs[d];
    }
  }
}

void unpermute_rows_backward(Tensor& drows, float* dweight, const Tensor& dy, const Tensor& rows,
                             const std::int64_t* slot, const float* weight, int k) {
  const std::int64_t T = dy.dim(0), D = dy.dim(1), R = rows.dim(0);
  drows.ensure({R, D});
  const float* g = dy.f32();
  const float* r = rows.f32();
  float* dr = drows.f32();
#pragma omp parallel for schedule(static) if (T > kParallelRows)
  for (std::int64_t t = 0; t < T; ++t) {
    const float* gt = g + t * D;
    for (int j = 0; j < k; ++j) {
      const std::int64_t s = slot[t * k + j];
      if (s < 0) {
        dweight[t * k + j] = 0.0f;
        continue;
      }
      const float w = weight[t * k + j];
      const float* rs = r + s * D;
      float* ds = dr + s * D;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (std::int64_t d = 0; d < D; ++d) {
        dot += gt[d] * rs[d];
        ds[d] = w * gt[d];
      }
      dweight[t * k + j] = dot;
    }
  }
}

void permute_rows_backward(Tensor& dx, const Tensor& drows, const std::int64_t* slot, int k,
                           bool accumulate) {
  const std::int64_t T = dx.dim(0), D = dx.dim(1);
  const float* dr = drows.f32();
  float* out = dx.f32();
#pragma omp parallel for schedule(static) if (T > kParallelRows)
  for (std::int64_t t = 0; t < T; ++t) {
    float* xt = out + t * D;
    if (!accumulate) std::fill(xt, xt + D, 0.0f);
    for (int j = 0; j < k; ++j) {
      const std::int64_t s = slot[t * k + j];
      if (s < 0) continue;
      const float* ds = dr + s * D;
#pragma omp simd
      for (std::int64_t d = 0; d < D; ++d) xt[d] += ds[d];
    }
  }
}

}  // namespace ffnlab
