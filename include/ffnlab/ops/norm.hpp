// Normalisation over the last dimension of x [T, D], one row at a time:
//   LayerNorm: y = (x − μ)·r ⊙ w + b,  r = 1/√(mean((x − μ)²) + eps)   (torch.nn.LayerNorm)
//   RMSNorm:   y = x·r ⊙ w,            r = 1/√(mean(x²) + eps)          (LLaMA's RMSNorm)
// Forward saves μ and r per row for backward. Reference: ops/ref/norm_ref.hpp.
#pragma once

#include "ffnlab/names.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab {

enum class NormKind : std::uint8_t { layernorm, rmsnorm, count };
template <>
struct EnumNames<NormKind> {
  static constexpr auto table = name_table<NormKind>(
      "norm", "norm", {{NormKind::layernorm, "layernorm"}, {NormKind::rmsnorm, "rmsnorm"}});
};
static_assert(EnumNames<NormKind>::table.complete());

// y [T, D]; mean [T] (LayerNorm only; ignored for RMSNorm), rstd [T]; w [D]; b [D] or null.
void norm_forward(NormKind kind, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x,
                  const Tensor& w, const Tensor* b, float eps);

// dx [T, D] (overwritten); dw [D] and db [D] (LayerNorm with bias) are accumulated.
void norm_backward(NormKind kind, Tensor& dx, Tensor& dw, Tensor* db, const Tensor& dy,
                   const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w);

}  // namespace ffnlab
