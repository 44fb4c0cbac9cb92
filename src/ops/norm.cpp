// LayerNorm and RMSNorm, forward and backward. Rows are independent (parallel over rows); the
// weight gradients sum over rows in column blocks, in row order, so that they are the same for
// any thread count.
#include "ffnlab/ops/norm.hpp"

#include <algorithm>
#include <cmath>

#include "check.hpp"

namespace ffnlab {

namespace {
constexpr std::int64_t kColumnBlock = 16;

void check_norm(const Tensor& x, const Tensor& w, const Tensor* b, const char* what) {
  check(x.rank() == 2 && w.rank() == 1 && w.dim(0) == x.dim(1) && (!b || b->shape() == w.shape()),
        "[norm] {}: x {} does not match weight {}", what, shape_string(x.shape()),
        shape_string(w.shape()));
}
}  // namespace

void norm_forward(NormKind kind, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x,
                  const Tensor& w, const Tensor* b, float eps) {
  check_norm(x, w, b, "forward");
  const std::int64_t T = x.dim(0), D = x.dim(1);
  y.ensure({T, D});
  rstd.ensure({T});
  if (kind == NormKind::layernorm) mean.ensure({T});
  const bool ln = kind == NormKind::layernorm;
  const float *xp = x.f32(), *wp = w.f32(), *bp = b ? b->f32() : nullptr;
  float *yp = y.f32(), *mp = ln ? mean.f32() : nullptr, *rp = rstd.f32();
#pragma omp parallel for schedule(static) if (T * D > 32768)
  for (std::int64_t t = 0; t < T; ++t) {
    const float* xr = xp + t * D;
    float* yr = yp + t * D;
    float mu = 0.f;
    if (ln) {
#pragma omp simd reduction(+ : mu)
      for (std::int64_t d = 0; d < D; ++d) mu += xr[d];
      mu /= static_cast<float>(D);
    }
    float var = 0.f;
#pragma omp simd reduction(+ : var)
    for (std::int64_t d = 0; d < D; ++d) var += (xr[d] - mu) * (xr[d] - mu);
    const float r = 1.f / std::sqrt(var / static_cast<float>(D) + eps);
    if (ln) mp[t] = mu;
    rp[t] = r;
    if (bp) {
#pragma omp simd
      for (std::int64_t d = 0; d < D; ++d) yr[d] = (xr[d] - mu) * r * wp[d] + bp[d];
    } else {
#pragma omp simd
      for (std::int64_t d = 0; d < D; ++d) yr[d] = (xr[d] - mu) * r * wp[d];
    }
  }
}

void norm_backward(NormKind kind, Tensor& dx, Tensor& dw, Tensor* db, const Tensor& dy,
                   const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w) {
  check_norm(x, w, db, "backward");
  check(dy.shape() == x.shape(), "[norm] dy {} must have the shape of x {}",
        shape_string(dy.shape()), shape_string(x.shape()));
  const std::int64_t T = x.dim(0), D = x.dim(1);
  dx.ensure({T, D});
  const bool ln = kind == NormKind::layernorm;
  const float *xp = x.f32(), *gp = dy.f32(), *wp = w.f32(), *rp = rstd.f32();
  const float* mp = ln ? mean.f32() : nullptr;
  float *dxp = dx.f32(), *dwp = dw.f32(), *dbp = db ? db->f32() : nullptr;
  // x̂ = (x − μ)·r, g = dy ⊙ w:  dx = r·(g − mean(g)·[LN] − x̂·mean(g ⊙ x̂))
#pragma omp parallel for schedule(static) if (T * D > 32768)
  for (std::int64_t t = 0; t < T; ++t) {
    const float *xr = xp + t * D, *gr = gp + t * D;
    const float mu = ln ? mp[t] : 0.f, r = rp[t];
    float sum_g = 0.f, sum_gx = 0.f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (std::int64_t d = 0; d < D; ++d) {
      const float g = gr[d] * wp[d];
      sum_g += g;
      sum_gx += g * (xr[d] - mu) * r;
    }
    const float mg = ln ? sum_g / static_cast<float>(D) : 0.f;
    const float mgx = sum_gx / static_cast<float>(D);
    float* dr = dxp + t * D;
#pragma omp simd
    for (std::int64_t d = 0; d < D; ++d) dr[d] = r * (gr[d] * wp[d] - mg - (xr[d] - mu) * r * mgx);
  }
  const std::int64_t blocks = (D + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (T * D > 32768)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t d0 = blk * kColumnBlock, d1 = std::min(D, d0 + kColumnBlock);
    float accw[kColumnBlock] = {}, accb[kColumnBlock] = {};
    for (std::int64_t t = 0; t < T; ++t) {
      const float *xr = xp + t * D, *gr = gp + t * D;
      const float mu = ln ? mp[t] : 0.f, r = rp[t];
      for (std::int64_t d = d0; d < d1; ++d) {
        accw[d - d0] += gr[d] * (xr[d] - mu) * r;
        accb[d - d0] += gr[d];
      }
    }
    for (std::int64_t d = d0; d < d1; ++d) {
      dwp[d] += accw[d - d0];
      if (dbp) dbp[d] += accb[d - d0];
    }
  }
}

}  // namespace ffnlab
