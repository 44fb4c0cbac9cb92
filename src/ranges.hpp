// Element ranges of a flat buffer [begin, end): the one walk over "a range minus some ranges",
// used where expert parallelism leaves the other ranks' experts out (the gradient all-reduce,
// the optimizer, gradient zeroing, clipping and norm). Internal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace ffnlab {

using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;  // sorted, disjoint

// Calls f(b, e) for each piece of [begin, end) outside `skip`, in order.
template <class F>
void for_each_outside(std::int64_t begin, std::int64_t end, const Ranges& skip, F f) {
  for (const auto& [b, e] : skip) {
    if (e <= begin || b >= end) continue;
    if (b > begin) f(begin, b);
    begin = std::max(begin, e);
  }
  if (begin < end) f(begin, end);
}

}  // namespace ffnlab
