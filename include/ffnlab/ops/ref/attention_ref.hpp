// Scalar reference for causal multi-head attention (see ops/attention.hpp), forward, in any
// floating type: the textbook loops over sequences, heads, queries and keys.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace ffnlab::ref {

// out [B·S, D] from qkv [B·S, 3D] (row = [q | k | v], head h at columns h·dh of each part).
template <typename T>
void attention_forward(T* out, const T* qkv, std::int64_t batch, std::int64_t seq,
                       std::int64_t heads, std::int64_t D, bool causal = true) {
  const std::int64_t dh = D / heads;
  const T scale = T(1) / std::sqrt(T(dh));
  std::vector<T> w(static_cast<std::size_t>(seq));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < seq; ++i) {
        const T* q = qkv + (b * seq + i) * 3 * D + h * dh;
        T mx = T(-1e300);
        const std::int64_t last = causal ? i : seq - 1;
        for (std::int64_t j = 0; j <= last; ++j) {
          const T* k = qkv + (b * seq + j) * 3 * D + D + h * dh;
          T s = T(0);
          for (std::int64_t e = 0; e < dh; ++e) s += q[e] * k[e];
          w[j] = s * scale;
          mx = w[j] > mx ? w[j] : mx;
        }
        T sum = T(0);
        for (std::int64_t j = 0; j <= last; ++j) sum += (w[j] = std::exp(w[j] - mx));
        T* o = out + (b * seq + i) * D + h * dh;
        for (std::int64_t e = 0; e < dh; ++e) {
          T acc = T(0);
          for (std::int64_t j = 0; j <= last; ++j)
            acc += w[j] / sum * qkv[(b * seq + j) * 3 * D + 2 * D + h * dh + e];
          o[e] = acc;
        }
      }
}

}  // namespace ffnlab::ref
