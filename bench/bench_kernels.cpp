// Kernel benchmarks (Google Benchmark): activation and gated-product passes over memory.
#include <benchmark/benchmark.h>

#include "ffnlab/ops/activation.hpp"
#include "ffnlab/ops/glu.hpp"

using namespace ffnlab;

static void BM_ActivationForward(benchmark::State& state) {
  const auto act = static_cast<Activation>(state.range(0));
  const std::int64_t n = 6400 * 2048;
  Tensor x({n}), y({n});
  for (auto _ : state) activation_forward(y, x, Act{act});
  state.SetBytesProcessed(state.iterations() * n * 8);
  state.SetLabel(activation_name(act));
}
BENCHMARK(BM_ActivationForward)->DenseRange(0, static_cast<int>(Activation::count) - 1);

static void BM_GluForwardBackward(benchmark::State& state) {
  const std::int64_t T = 6400, F = 2048;
  Tensor a({T, 2 * F}), h({T, F}), dh({T, F}), da({T, 2 * F});
  for (auto _ : state) {
    glu_forward(h, a, Act{Activation::silu});
    glu_backward(da, dh, a, Act{Activation::silu});
  }
  // forward reads a, writes h; backward reads dh and a, writes da
  state.SetBytesProcessed(state.iterations() * T * F * 4 * (3 + 5));
}
BENCHMARK(BM_GluForwardBackward)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
