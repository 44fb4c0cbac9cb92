// Dropout: splitmix64 of (seed, stream, index) gives each element's uniform number.
#include "ffnlab/ops/dropout.hpp"

#include <cstring>

#include "check.hpp"
#include "hash.hpp"

namespace ffnlab {

namespace {

void apply(Tensor& y, const Tensor& x, float p, std::uint64_t seed, std::uint64_t stream,
           std::uint64_t first) {
  check(p >= 0.f && p < 1.f, "[dropout] p = {} must be in [0, 1)", p);
  y.ensure(x.shape());
  const std::int64_t n = x.numel();
  const float* xp = x.f32();
  float* yp = y.f32();
  if (p == 0.f) {
    if (yp != xp) std::memcpy(yp, xp, static_cast<std::size_t>(n) * sizeof(float));
    return;
  }
  const float keep = 1.f / (1.f - p);
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i)
    yp[i] = dropout_uniform(seed, stream, first + static_cast<std::uint64_t>(i)) >= p ? xp[i] * keep
                                                                                      : 0.f;
}
}  // namespace

float dropout_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t h = splitmix64(splitmix64(seed ^ splitmix64(stream)) + index);
  return static_cast<float>(h >> 40) * 0x1p-24f;
}

void dropout_forward(Tensor& y, const Tensor& x, float p, std::uint64_t seed, std::uint64_t stream,
                     std::uint64_t first) {
  apply(y, x, p, seed, stream, first);
}

void dropout_backward(Tensor& dx, const Tensor& dy, float p, std::uint64_t seed,
                      std::uint64_t stream, std::uint64_t first) {
  apply(dx, dy, p, seed, stream, first);
}

}  // namespace ffnlab
