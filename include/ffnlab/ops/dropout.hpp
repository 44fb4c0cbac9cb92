// Inverted dropout with a counter-based random stream: element i of call `stream` is kept when
// hash(seed, stream, i) ≥ p, and scaled by 1/(1 − p). The mask is a function of (seed, stream,
// i), so backward recomputes it instead of storing it, results do not depend on the thread
// count, and a resumed run draws the same masks as an uninterrupted one.
#pragma once

#include <cstdint>

#include "ffnlab/tensor.hpp"

namespace ffnlab {

// Uniform in [0, 1) from (seed, stream, index); the one random source of dropout.
float dropout_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

// y = x ⊙ mask / (1 − p) (y may be x). p = 0 copies. Element i draws index first + i: a process
// holding part of a batch (data parallelism) passes its part's place, so that its masks are
// those of the whole batch.
void dropout_forward(Tensor& y, const Tensor& x, float p, std::uint64_t seed, std::uint64_t stream,
                     std::uint64_t first = 0);
// dx = dy ⊙ mask / (1 − p) (overwritten; dx may be dy).
void dropout_backward(Tensor& dx, const Tensor& dy, float p, std::uint64_t seed,
                      std::uint64_t stream, std::uint64_t first = 0);

}  // namespace ffnlab
