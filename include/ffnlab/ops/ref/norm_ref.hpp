// Scalar reference for LayerNorm and RMSNorm (see ops/norm.hpp), forward, in any floating type.
#pragma once

#include <cmath>
#include <cstdint>

namespace ffnlab::ref {

// y [T, D] = norm(x) ⊙ w + b (b may be null); layernorm subtracts the mean, rmsnorm does not.
template <typename T>
void norm_forward(bool layernorm, T* y, const T* x, const T* w, const T* b, std::int64_t tokens,
                  std::int64_t D, double eps) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    const T* xr = x + t * D;
    T mu = T(0);
    if (layernorm) {
      for (std::int64_t d = 0; d < D; ++d) mu += xr[d];
      mu /= T(D);
    }
    T var = T(0);
    for (std::int64_t d = 0; d < D; ++d) var += (xr[d] - mu) * (xr[d] - mu);
    const T r = T(1) / std::sqrt(var / T(D) + T(eps));
    for (std::int64_t d = 0; d < D; ++d)
      y[t * D + d] = (xr[d] - mu) * r * w[d] + (b ? b[d] : T(0));
  }
}

}  // namespace ffnlab::ref
