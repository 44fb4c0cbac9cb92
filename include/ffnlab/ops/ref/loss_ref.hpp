// Scalar reference for the losses (see ops/loss.hpp), in any floating type.
#pragma once

#include <cmath>
#include <cstdint>

namespace ffnlab::ref {

// Mean over the t whose target is not -1 (ignored) of −log softmax(logits[t])[targets[t]];
// logits [T, V]; 0 when every target is ignored.
template <typename T>
T cross_entropy(const T* logits, const std::int32_t* targets, std::int64_t tokens, std::int64_t V) {
  T loss = T(0);
  std::int64_t counted = 0;
  for (std::int64_t t = 0; t < tokens; ++t) {
    if (targets[t] == -1) continue;
    ++counted;
    const T* l = logits + t * V;
    T mx = l[0];
    for (std::int64_t v = 1; v < V; ++v) mx = l[v] > mx ? l[v] : mx;
    T sum = T(0);
    for (std::int64_t v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
    loss += -(l[targets[t]] - mx - std::log(sum));
  }
  return counted > 0 ? loss / T(counted) : T(0);
}

template <typename T>
T mse(const T* y, const T* target, std::int64_t n) {
  T sum = T(0);
  for (std::int64_t i = 0; i < n; ++i) sum += (y[i] - target[i]) * (y[i] - target[i]);
  return sum / T(n);
}

}  // namespace ffnlab::ref
