// Warm-up and cosine decay.
#include "ffnlab/train/schedule.hpp"

#include <cmath>
#include <numbers>

#include "check.hpp"

namespace ffnlab {

float Schedule::lr(std::int64_t step) const {
  if (step < warmup) return peak * static_cast<float>(step + 1) / static_cast<float>(warmup);
  if (decay == DecayKind::constant || steps <= warmup) return peak;
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(steps - warmup));
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return static_cast<float>(peak * (min_ratio + (1.0 - min_ratio) * cosine));
}

std::int64_t first_rate_change(const Schedule& before, const Schedule& after,
                               std::int64_t trained) {
  for (std::int64_t s = 0; s < trained; ++s)
    if (before.lr(s) != after.lr(s)) return s;
  return -1;
}

}  // namespace ffnlab
