// Row-wise L2 normalisation: one pass per row, the squares and the backward's dot product summed
// in double.
#include "ffnlab/ops/l2_normalize.hpp"

#include <cmath>

#include "check.hpp"

namespace ffnlab {

void l2_normalize_forward(Tensor& y, std::vector<float>& inv, const Tensor& v, float scale,
                          double eps) {
  check(v.rank() == 2 && v.dtype() == DType::f32, "[l2_normalize] v must be an f32 matrix, got {}",
        shape_string(v.shape()));
  const std::int64_t R = v.dim(0), D = v.dim(1);
  y.ensure({R, D});
  inv.resize(static_cast<std::size_t>(R));
  const float* in = v.f32();
  float* o = y.f32();
#pragma omp parallel for schedule(static) if (R * D > 65536)
  for (std::int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (std::int64_t d = 0; d < D; ++d) ss += static_cast<double>(in[r * D + d]) * in[r * D + d];
    inv[r] = static_cast<float>(1.0 / std::sqrt(ss + eps));
    for (std::int64_t d = 0; d < D; ++d) o[r * D + d] = scale * inv[r] * in[r * D + d];
  }
}

void l2_normalize_backward(Tensor& dv, float* dscale, const Tensor& dy, const Tensor& v,
                           const std::vector<float>& inv, float scale) {
  const std::int64_t R = v.dim(0), D = v.dim(1);
  check(dv.shape() == v.shape() && dy.shape() == v.shape() &&
            static_cast<std::int64_t>(inv.size()) == R,
        "[l2_normalize] backward: dv {}, dy {} and v {} must agree, with {} saved norms",
        shape_string(dv.shape()), shape_string(dy.shape()), shape_string(v.shape()), inv.size());
  float* out = dv.f32();
  const float* in = v.f32();
  const float* g = dy.f32();
#pragma omp parallel for schedule(static) if (R * D > 65536)
  for (std::int64_t r = 0; r < R; ++r) {
    double dot = 0;
    for (std::int64_t d = 0; d < D; ++d) dot += static_cast<double>(in[r * D + d]) * g[r * D + d];
    const float a = scale * inv[r];
    const auto b = static_cast<float>(scale * static_cast<double>(inv[r]) * inv[r] * inv[r] * dot);
    for (std::int64_t d = 0; d < D; ++d) out[r * D + d] += a * g[r * D + d] - b * in[r * D + d];
  }
  if (!dscale) return;
  double sum = 0;  // ∂y/∂scale = v·inv: Σ_r inv_r·⟨v_r, dy_r⟩, in order
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t d = 0; d < D; ++d)
      sum += static_cast<double>(inv[r]) * in[r * D + d] * g[r * D + d];
  *dscale += static_cast<float>(sum);
}

}  // namespace ffnlab
