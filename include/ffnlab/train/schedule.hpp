// Learning-rate schedule: linear warm-up to the peak, then cosine decay towards min_ratio·peak,
// which s = steps, one after the last step, would reach (or constant). lr(s) for the update of
// step s = 0, 1, ..., steps − 1:
//   s < warmup:  peak·(s + 1)/warmup
//   otherwise:   peak·(min_ratio + (1 − min_ratio)·½(1 + cos(π·(s − warmup)/(steps − warmup))))
#pragma once

#include <cstdint>
#include <string_view>

#include "ffnlab/names.hpp"

namespace ffnlab {

enum class DecayKind : std::uint8_t { cosine, constant, count };
template <>
struct EnumNames<DecayKind> {
  static constexpr auto table = name_table<DecayKind>(
      "schedule", "decay", {{DecayKind::cosine, "cosine"}, {DecayKind::constant, "constant"}});
};
static_assert(EnumNames<DecayKind>::table.complete());

struct Schedule {
  float peak = 3e-3f;
  std::int64_t warmup = 50;
  std::int64_t steps = 600;
  float min_ratio = 0.1f;
  DecayKind decay = DecayKind::cosine;

  float lr(std::int64_t step) const;
};

// The first step s < trained whose rate differs between the two schedules, or -1 for none. A
// checkpoint that took its `trained` steps under `before` and continues under `after` (a resume
// given another --steps) trains what an uninterrupted run under `after` trains only when none
// does: a cosine decay's rates depend on its number of steps, a constant schedule's do not.
std::int64_t first_rate_change(const Schedule& before, const Schedule& after, std::int64_t trained);

}  // namespace ffnlab
