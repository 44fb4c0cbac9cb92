// The machine's peak FLOP rate: independent multiply-add chains in registers on every thread, in
// the widest vectors the CPU runs (chosen at run time, like the few-token kernels).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ffnlab/analysis/machine.hpp"
#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/ops/few_rows.hpp"

namespace ffnlab {

namespace {

// Independent chains per thread: more than an FMA's latency times the FMA pipes of any x86 core
// (4 cycles × 2 pipes), so the loop is bound by throughput, not latency.
constexpr int kChains = 12;
// a ← a·m + c converges to c / (1 − m) = 1: no overflow, no subnormals, however long it runs.
constexpr float kMul = 0.999f, kAdd = 0.001f;

// Each returns the FLOPs it did, and a value that depends on every chain (so none is dropped).
struct Loop {
  double flops;
  float value;
};

Loop portable_loop(std::int64_t iterations) {
  constexpr int kLanes = 8;
  float a[kChains][kLanes];
  for (int j = 0; j < kChains; ++j)
    for (int l = 0; l < kLanes; ++l) a[j][l] = 0.5f + 0.01f * static_cast<float>(j + l);
  for (std::int64_t i = 0; i < iterations; ++i)
    for (int j = 0; j < kChains; ++j)
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) a[j][l] = a[j][l] * kMul + kAdd;
  float v = 0;
  for (int j = 0; j < kChains; ++j)
    for (int l = 0; l < kLanes; ++l) v += a[j][l];
  return {2.0 * kChains * kLanes * static_cast<double>(iterations), v};
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) Loop avx2_loop(std::int64_t iterations) {
  __m256 a[kChains];
  for (int j = 0; j < kChains; ++j) a[j] = _mm256_set1_ps(0.5f + 0.01f * static_cast<float>(j));
  const __m256 m = _mm256_set1_ps(kMul), c = _mm256_set1_ps(kAdd);
  for (std::int64_t i = 0; i < iterations; ++i)
    for (int j = 0; j < kChains; ++j) a[j] = _mm256_fmadd_ps(a[j], m, c);
  __m256 s = a[0];
  for (int j = 1; j < kChains; ++j) s = _mm256_add_ps(s, a[j]);
  return {2.0 * kChains * 8 * static_cast<double>(iterations), _mm256_cvtss_f32(s)};
}

__attribute__((target("avx512f"))) Loop avx512_loop(std::int64_t iterations) {
  __m512 a[kChains];
  for (int j = 0; j < kChains; ++j) a[j] = _mm512_set1_ps(0.5f + 0.01f * static_cast<float>(j));
  const __m512 m = _mm512_set1_ps(kMul), c = _mm512_set1_ps(kAdd);
  for (std::int64_t i = 0; i < iterations; ++i)
    for (int j = 0; j < kChains; ++j) a[j] = _mm512_fmadd_ps(a[j], m, c);
  __m512 s = a[0];
  for (int j = 1; j < kChains; ++j) s = _mm512_add_ps(s, a[j]);
  return {2.0 * kChains * 16 * static_cast<double>(iterations), _mm512_cvtss_f32(s)};
}

// 32 bf16 pairs into 16 f32 sums per instruction: 64 FLOPs. The pairs multiply to a small
// product (2⁻⁸ · 2⁻⁸ · 32 per lane and step), so the sums grow slowly and stay finite.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) Loop bf16_loop(std::int64_t iterations) {
  __m512 a[kChains];
  for (int j = 0; j < kChains; ++j) a[j] = _mm512_setzero_ps();
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.00390625f), _mm512_set1_ps(0.00390625f));
  for (std::int64_t i = 0; i < iterations; ++i)
    for (int j = 0; j < kChains; ++j) a[j] = _mm512_dpbf16_ps(a[j], x, x);
  __m512 s = a[0];
  for (int j = 1; j < kChains; ++j) s = _mm512_add_ps(s, a[j]);
  return {2.0 * kChains * 32 * static_cast<double>(iterations), _mm512_cvtss_f32(s)};
}
#endif

using LoopFn = Loop (*)(std::int64_t);

LoopFn best_loop(bool bf16) {
#if defined(__x86_64__)
  if (bf16 && this_machine().bf16 && few_rows_isa_supported(FewRowsIsa::avx512_bf16))
    return bf16_loop;
  if (few_rows_isa_supported(FewRowsIsa::avx512)) return avx512_loop;
  if (few_rows_isa_supported(FewRowsIsa::avx2)) return avx2_loop;
#endif
  (void)bf16;
  return portable_loop;
}

}  // namespace

namespace {

// The best rate of calls of `loop` on `threads` threads at once over about `seconds` (at least
// three calls). A few milliseconds a call at a few GHz: long next to waking a thread or a
// scheduler's tick, short next to the budget. The best call is the peak: anything else running
// only slows one.
double best_rate(LoopFn loop, int threads, double seconds) {
  constexpr std::int64_t kIterations = 1 << 21;
  volatile float sink = 0;  // every chain's value reaches it, so no loop can be dropped
  double best = 0;
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (int call = 0; call < 3 || elapsed() < seconds; ++call) {
    double total = 0;
    float values = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : total, values)
    {
      const Loop r = loop(kIterations);
      total += r.flops;
      values += r.value;
    }
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = values;
    if (t > 0) best = std::max(best, total / t);
  }
  (void)sink;
  return best;
}

}  // namespace

PeakProbe measure_peak_flops(bool bf16, double budget) {
  if (bf16 && this_machine().amx) return {};  // tiles outrun every vector loop: no bound
  const LoopFn loop = best_loop(bf16);
  const int threads = omp_get_max_threads();
  // One thread alone first: every thread together must reach most of threads × its rate (a
  // single core boosts a little higher, hence 75 %). A window in which a core was taken away
  // (a hypervisor's vCPU, another process) reads about half on 2 cores; it is measured again,
  // up to three times, and the best is kept.
  const double one = threads > 1 ? best_rate(loop, 1, budget / 4) : 0;
  // SMT siblings share a core: the threads can reach one thread's rate per core they occupy.
  const Machine& m = this_machine();
  const int cores = std::min(threads, std::max(1, m.processors / std::max(1, m.threads_per_core)));
  PeakProbe probe{0, one, cores};
  for (int attempt = 0; attempt < 3; ++attempt) {
    probe.flops = std::max(probe.flops, best_rate(loop, threads, budget));
    if (probe.held()) break;
  }
  return probe;
}

}  // namespace ffnlab
