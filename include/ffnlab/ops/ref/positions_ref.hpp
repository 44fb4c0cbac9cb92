// Scalar references for embeddings and position encodings (see ops/embedding.hpp and
// ops/positions.hpp), in any floating type.
#pragma once

#include <cmath>
#include <cstdint>

namespace ffnlab::ref {

// y [T, D] = table[ids[t]] (+ pos[t mod S] when pos is not null).
template <typename T>
void embed(T* y, const std::int32_t* ids, const T* table, const T* pos, std::int64_t tokens,
           std::int64_t seq, std::int64_t D) {
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t d = 0; d < D; ++d)
      y[t * D + d] = table[ids[t] * D + d] + (pos ? pos[(t % seq) * D + d] : T(0));
}

// Sinusoidal table value at position s, column c, for width D.
template <typename T>
T sinusoid(std::int64_t s, std::int64_t c, std::int64_t D) {
  const T angle = T(s) / std::pow(T(10000), T(c - c % 2) / T(D));
  return c % 2 == 0 ? std::sin(angle) : std::cos(angle);
}

// Rotates each dh-wide head of the first `width` columns of x [T, stride] in place, pairs
// (i, i + dh/2), angle (t mod S)·θ^(−2i/dh).
template <typename T>
void rope(T* x, std::int64_t tokens, std::int64_t seq, std::int64_t stride, std::int64_t width,
          std::int64_t dh, double theta) {
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t h0 = 0; h0 < width; h0 += dh)
      for (std::int64_t i = 0; i < dh / 2; ++i) {
        const T angle = T(t % seq) * std::pow(T(theta), T(-2.0 * i / dh));
        T& a = x[t * stride + h0 + i];
        T& b = x[t * stride + h0 + dh / 2 + i];
        const T a0 = a, b0 = b;
        a = a0 * std::cos(angle) - b0 * std::sin(angle);
        b = b0 * std::cos(angle) + a0 * std::sin(angle);
      }
}

}  // namespace ffnlab::ref
