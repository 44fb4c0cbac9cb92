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

std::int64_t UnitSparsity::near_dead_units() const {
  std::int64_t near_dead = 0;
  for (auto n : clear) near_dead += n == 0;
  return near_dead;
}

double UnitSparsity::dead_fraction() const {
  return nonzero.empty() ? 0.0
                         : static_cast<double>(dead_units()) / static_cast<double>(nonzero.size());
}

std::vector<double> UnitSparsity::frequency() const {
  std::vector<double> f(nonzero.size(), 0.0);
  for (std::size_t u = 0; u < f.size(); ++u) {
    const std::int64_t seen = rows.empty() ? tokens : rows[u];
    if (seen > 0) f[u] = static_cast<double>(nonzero[u]) / static_cast<double>(seen);
  }
  return f;
}

namespace {

// Rows [T, F] of h into s, row t's unit u counted as unit unit_of(t) + u.
template <typename UnitOf>
void add_rows(UnitSparsity& s, const Tensor& h, std::int64_t units, UnitOf unit_of) {
  check(h.rank() == 2, "[sparsity] hidden activations {} must be [T, F]", shape_string(h.shape()));
  const std::int64_t T = h.dim(0), F = h.dim(1);
  if (s.nonzero.empty()) {
    s.nonzero.assign(static_cast<std::size_t>(units), 0);
    s.clear.assign(static_cast<std::size_t>(units), 0);
  }
  check(static_cast<std::int64_t>(s.nonzero.size()) == units,
        "[sparsity] {} hidden units, earlier batches had {}", units, s.nonzero.size());
  const float* p = h.f32();
  double sum_sq = 0;
  for (std::int64_t i = 0; i < T * F; ++i) sum_sq += static_cast<double>(p[i]) * p[i];
  const double rms = T * F > 0 ? std::sqrt(sum_sq / static_cast<double>(T * F)) : 0.0;
  const double near = kNearZeroRelative * rms;
  std::int64_t zeros = 0, near_zeros = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t first = unit_of(t);
    for (std::int64_t u = 0; u < F; ++u) {
      const float v = p[t * F + u];
      zeros += v == 0.0f;
      near_zeros += std::fabs(v) < near;
      s.nonzero[static_cast<std::size_t>(first + u)] += v != 0.0f;
      // Not `!(|v| < near)` alone: a batch that is all zeros has near = 0, and its zeros are
      // still not clear of zero.
      s.clear[static_cast<std::size_t>(first + u)] += v != 0.0f && std::fabs(v) >= near;
      if (!s.rows.empty()) ++s.rows[static_cast<std::size_t>(first + u)];
    }
  }
  s.tokens += T;
  s.values += T * F;
  s.zeros += zeros;
  s.near_zeros += near_zeros;
}

}  // namespace

void add_hidden(UnitSparsity& s, const Tensor& h) {
  check(h.rank() == 2, "[sparsity] hidden activations {} must be [T, F]", shape_string(h.shape()));
  check(s.rows.empty(), "[sparsity] dense hidden activations added to an expert census");
  add_rows(s, h, h.dim(1), [](std::int64_t) { return std::int64_t{0}; });
}

void add_expert_hidden(UnitSparsity& s, const Tensor& h, std::span<const std::int64_t> offsets) {
  check(h.rank() == 2, "[sparsity] hidden activations {} must be [T, F]", shape_string(h.shape()));
  check(offsets.size() >= 2 && offsets.back() == h.dim(0),
        "[sparsity] expert offsets end at {}, the hidden rows are {}",
        offsets.empty() ? 0 : offsets.back(), h.dim(0));
  const std::int64_t F = h.dim(1), E = static_cast<std::int64_t>(offsets.size()) - 1;
  check(s.nonzero.empty() || !s.rows.empty(),
        "[sparsity] expert hidden activations added to a dense census");
  if (s.rows.empty()) s.rows.assign(static_cast<std::size_t>(E * F), 0);
  std::int64_t e = 0;
  add_rows(s, h, E * F, [&](std::int64_t t) {
    while (t >= offsets[static_cast<std::size_t>(e) + 1]) ++e;
    return e * F;
  });
}

}  // namespace ffnlab
