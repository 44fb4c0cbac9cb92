// Helpers shared by the benchmarks.
#pragma once

#include <fmt/format.h>
#include <omp.h>

#include <functional>
#include <string>
#include <vector>

#include "ffnlab/analysis/machine.hpp"
#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/layers/parameters.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab::bench {

// Median seconds per call of f, run for about `budget` seconds after one warm-up call: the
// library's measurement (analysis/speed.hpp), so the benchmarks and `ffnlab bench` time alike.
inline double time_it(const std::function<void()>& f, double budget) {
  return median_seconds(f, budget);
}

// N(0, 1) values from `seed`.
inline Tensor random(Shape s, std::uint64_t seed) {
  return random_normal(std::move(s), seed);
}

// The threads the measurements run on (OpenMP's, as the layers use).
inline int threads() {
  return omp_get_max_threads();
}

// The machine and threads a program measures on, the first line of its table: "bench_ffn on
// AMD EPYC ..., family 26 model 2 (AVX-512 with bf16, 2 processors), 2 threads." A speed is
// true only of the CPU it ran on; a table pasted without this line says nothing about where.
inline std::string measured_on(const char* program) {
  return fmt::format("{} on {}, {} thread{}.", program, this_machine().describe(), threads(),
                     threads() == 1 ? "" : "s");
}

}  // namespace ffnlab::bench
