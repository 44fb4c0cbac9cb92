// Scalar reference for the linear op (naive loops), in any floating type.
#pragma once

#include <cstdint>

namespace ffnlab::ref {

// y [T, O] = x [T, I] · w [O, I]ᵀ + b [O] (b may be null)
template <typename T>
void linear_forward(T* y, const T* x, const T* w, const T* b, std::int64_t tokens, std::int64_t in,
                    std::int64_t out) {
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t o = 0; o < out; ++o) {
      T acc = b ? b[o] : T(0);
      for (std::int64_t i = 0; i < in; ++i) acc += x[t * in + i] * w[o * in + i];
      y[t * out + o] = acc;
    }
}

// dx = dy · w (overwritten, if dx), dw += dyᵀ · x, db += Σ_t dy (if db)
template <typename T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, std::int64_t tokens,
                     std::int64_t in, std::int64_t out) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    if (dx)
      for (std::int64_t i = 0; i < in; ++i) {
        T acc = T(0);
        for (std::int64_t o = 0; o < out; ++o) acc += dy[t * out + o] * w[o * in + i];
        dx[t * in + i] = acc;
      }
    for (std::int64_t o = 0; o < out; ++o) {
      const T g = dy[t * out + o];
      for (std::int64_t i = 0; i < in; ++i) dw[o * in + i] += g * x[t * in + i];
      if (db) db[o] += g;
    }
  }
}

}  // namespace ffnlab::ref
