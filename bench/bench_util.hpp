// Helpers shared by the benchmarks.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <random>
#include <vector>

#include "ffnlab/tensor.hpp"

namespace ffnlab::bench {

// Median seconds per call of f, run for about `budget` seconds after one warm-up call.
inline double time_it(const std::function<void()>& f, double budget) {
  using clock = std::chrono::steady_clock;
  f();
  std::vector<double> times;
  const auto start = clock::now();
  while (times.size() < 3 ||
         (std::chrono::duration<double>(clock::now() - start).count() < budget &&
          times.size() < 1000)) {
    const auto t0 = clock::now();
    f();
    times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

inline Tensor random(Shape s, std::uint64_t seed) {
  Tensor t(std::move(s));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = d(rng);
  return t;
}

}  // namespace ffnlab::bench
