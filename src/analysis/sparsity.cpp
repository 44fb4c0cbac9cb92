// Activation-sparsity census.
#include "ffnlab/analysis/sparsity.hpp"

#include <cmath>

#include "check.hpp"

namespace ffnlab {

double UnitSparsity::zero_fraction() const {
  return values ? static_cast<double>(zeros) / static_cast<double>(values) : 0.0;
}

double UnitSparsity::near_zero_fraction() const {
  return values ? static_cast<double>(near_zeros) / static_cast<double>(values) : 0.0;
}

std::int64_t UnitSparsity::dead_units() const {
  std::int64_t dead = 0;
  for (auto n : nonzero) dead += n == 0;
  return dead;
}

double UnitSparsity::dead_fraction() const {
  return nonzero.empty() ? 0.0
                         : static_cast<double>(dead_units()) / static_cast<double>(nonzero.size());
}

std::vector<double> UnitSparsity::frequency() const {
  std::vector<double> f(nonzero.size(), 0.0);
  if (tokens > 0)
    for (std::size_t u = 0; u < f.size(); ++u)
      f[u] = static_cast<double>(nonzero[u]) / static_cast<double>(tokens);
  return f;
}

void add_hidden(UnitSparsity& s, const Tensor& h) {
  check(h.rank() == 2, "[sparsity] hidden activations {} must be [T, F]", shape_string(h.shape()));
  const std::int64_t T = h.dim(0), F = h.dim(1);
  if (s.nonzero.empty()) s.nonzero.assign(static_cast<std::size_t>(F), 0);
  check(static_cast<std::int64_t>(s.nonzero.size()) == F,
        "[sparsity] {} hidden units, earlier batches had {}", F, s.nonzero.size());
  const float* p = h.f32();
  double sum_sq = 0;
  for (std::int64_t i = 0; i < T * F; ++i) sum_sq += static_cast<double>(p[i]) * p[i];
  const double rms = T * F > 0 ? std::sqrt(sum_sq / static_cast<double>(T * F)) : 0.0;
  const double near = kNearZeroRelative * rms;
  std::int64_t zeros = 0, near_zeros = 0;
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t u = 0; u < F; ++u) {
      const float v = p[t * F + u];
      zeros += v == 0.0f;
      near_zeros += std::fabs(v) < near;
      s.nonzero[static_cast<std::size_t>(u)] += v != 0.0f;
    }
  s.tokens += T;
  s.values += T * F;
  s.zeros += zeros;
  s.near_zeros += near_zeros;
}

}  // namespace ffnlab
