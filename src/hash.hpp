// splitmix64: the one integer hash behind every counter-based random draw (dropout masks, batch
// windows), so that a draw is a function of its (seed, step, index) and never of earlier draws.
#pragma once

#include <cstdint>

namespace ffnlab {

inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace ffnlab
