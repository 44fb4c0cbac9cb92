// Helpers shared by the benchmarks.
#pragma once

#include <functional>
#include <random>
#include <vector>

#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab::bench {

// Median seconds per call of f, run for about `budget` seconds after one warm-up call: the
// library's measurement (analysis/speed.hpp), so the benchmarks and `ffnlab evolve` time alike.
inline double time_it(const std::function<void()>& f, double budget) {
  return median_seconds(f, budget);
}

inline Tensor random(Shape s, std::uint64_t seed) {
  Tensor t(std::move(s));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = d(rng);
  return t;
}

}  // namespace ffnlab::bench
