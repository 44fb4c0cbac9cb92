// Kernel benchmarks (Google Benchmark): activation and gated-product passes, over memory
// (6400 x 2048: the tensors exceed the caches) and in cache (2048 x 344: the SwiGLU layer of the
// language model that `ffnlab train` trains by default, where arithmetic decides the speed).
#include <benchmark/benchmark.h>

#include "bench_util.hpp"
#include "ffnlab/ops/activation.hpp"
#include "ffnlab/ops/glu.hpp"

using namespace ffnlab;

static void BM_ActivationForward(benchmark::State& state) {
  const auto act = static_cast<Activation>(state.range(0));
  const std::int64_t n = state.range(1) * state.range(2);
  Tensor x = bench::random({n}, 1), y({n});
  for (auto _ : state) activation_forward(y, x, Act{act});
  state.SetBytesProcessed(state.iterations() * n * 8);
  state.SetLabel(enum_name(act));
}
static void BM_ActivationBackward(benchmark::State& state) {
  const auto act = static_cast<Activation>(state.range(0));
  const std::int64_t n = state.range(1) * state.range(2);
  Tensor x = bench::random({n}, 1), dy = bench::random({n}, 2), dx({n});
  for (auto _ : state) activation_backward(dx, dy, x, Act{act});
  state.SetBytesProcessed(state.iterations() * n * 12);
  state.SetLabel(enum_name(act));
}

static void every_activation(benchmark::internal::Benchmark* b) {
  for (const auto& [T, F] : {std::pair{6400, 2048}, std::pair{2048, 344}})
    for (int a = 0; a < static_cast<int>(Activation::count); ++a) b->Args({a, T, F});
}
BENCHMARK(BM_ActivationForward)->Apply(every_activation);
BENCHMARK(BM_ActivationBackward)->Apply(every_activation);

static void BM_GluForwardBackward(benchmark::State& state) {
  const std::int64_t T = state.range(0), F = state.range(1);
  Tensor a = bench::random({T, 2 * F}, 1), h({T, F}), dh = bench::random({T, F}, 2), da({T, 2 * F});
  for (auto _ : state) {
    glu_forward(h, a, Act{Activation::silu});
    glu_backward(da, dh, a, Act{Activation::silu});
  }
  // forward reads a, writes h; backward reads dh and a, writes da
  state.SetBytesProcessed(state.iterations() * T * F * 4 * (3 + 5));
}
BENCHMARK(BM_GluForwardBackward)
    ->Args({6400, 2048})
    ->Args({2048, 344})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
