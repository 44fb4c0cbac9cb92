// splitmix64: the one integer hash behind every counter-based random draw (dropout masks, batch
// windows), so that a draw is a function of its (seed, step, index) and never of earlier draws.
// fnv1a64: the one hash of bytes (the corpus fingerprint, the ranks' weights check).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ffnlab {

inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline std::uint64_t fnv1a64(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace ffnlab
