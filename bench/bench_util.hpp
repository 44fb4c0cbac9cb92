// Helpers shared by the benchmarks.
#pragma once

#include <functional>
#include <vector>

#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/layers/parameters.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab::bench {

// Median seconds per call of f, run for about `budget` seconds after one warm-up call: the
// library's measurement (analysis/speed.hpp), so the benchmarks and `ffnlab evolve` time alike.
inline double time_it(const std::function<void()>& f, double budget) {
  return median_seconds(f, budget);
}

// N(0, 1) values from `seed`.
inline Tensor random(Shape s, std::uint64_t seed) {
  return random_normal(std::move(s), seed);
}

}  // namespace ffnlab::bench
