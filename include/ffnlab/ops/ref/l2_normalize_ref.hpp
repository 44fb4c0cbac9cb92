// Scalar reference for the row-wise L2 normalisation (see ops/l2_normalize.hpp), forward, in any
// floating type.
#pragma once

#include <cmath>
#include <cstdint>

namespace ffnlab::ref {

// y [R, D] = scale·v / sqrt(|v_r|² + eps) per row.
template <typename T>
void l2_normalize_forward(T* y, const T* v, std::int64_t R, std::int64_t D, T scale, double eps) {
  for (std::int64_t r = 0; r < R; ++r) {
    T ss = T(0);
    for (std::int64_t d = 0; d < D; ++d) ss += v[r * D + d] * v[r * D + d];
    const T inv = T(1) / std::sqrt(ss + T(eps));
    for (std::int64_t d = 0; d < D; ++d) y[r * D + d] = scale * inv * v[r * D + d];
  }
}

}  // namespace ffnlab::ref
