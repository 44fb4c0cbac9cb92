// Row-wise L2 normalisation with a scale, as Soft MoE normalises its tokens and slot parameters
// (Puigcerver et al. 2024): y = scale·v / sqrt(|v|² + eps) per row. The squares are summed in
// double. Scalar reference: ops/ref/l2_normalize_ref.hpp; tests: tests/unit/test_l2_normalize.cpp.
#pragma once

#include <vector>

#include "ffnlab/tensor.hpp"

namespace ffnlab {

// Soft MoE's eps, on the sum of squares.
inline constexpr double kL2NormalizeEps = 1e-6;

// y [R, D] = scale·v / sqrt(|v_r|² + eps) (overwritten); inv [R] = 1/sqrt(|v_r|² + eps), saved
// for the backward. v: f32 [R, D].
void l2_normalize_forward(Tensor& y, std::vector<float>& inv, const Tensor& v, float scale,
                          double eps = kL2NormalizeEps);

// dv [R, D] += scale·(inv_r·dy_r − inv_r³·v_r·⟨v_r, dy_r⟩) (accumulated); dscale, when not null,
// += Σ_r inv_r·⟨v_r, dy_r⟩ (accumulated: the gradient of a learned scale).
void l2_normalize_backward(Tensor& dv, float* dscale, const Tensor& dy, const Tensor& v,
                           const std::vector<float>& inv, float scale);

}  // namespace ffnlab
