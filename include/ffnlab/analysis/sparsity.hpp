// Activation sparsity of FFN hidden units, measured on data: the fraction of exactly-zero and of
// near-zero values, and per hidden unit how often it is non-zero, so that dead units (never
// non-zero on any token of a data set) are counted apart from the zero fraction, and near-dead
// units (0 or near zero on every token: what a smooth gate has instead of dead units, since
// GELU and SiLU are never exactly 0) apart from both. The tutorial
// called ReLU's ~50 % zero fraction at initialisation "dead neurons"; these are different
// things, and this census measures both.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ffnlab/tensor.hpp"

namespace ffnlab {

// A value is near zero when |h| < kNearZeroRelative · rms(h), with rms taken over the batch of
// hidden activations it belongs to (one layer, one forward).
inline constexpr double kNearZeroRelative = 1e-3;

struct UnitSparsity {
  std::int64_t tokens = 0;  // rows seen
  std::int64_t values = 0, zeros = 0, near_zeros = 0;
  std::vector<std::int64_t> nonzero;  // [F] rows in which each unit was non-zero
  std::vector<std::int64_t> clear;    // [F] rows in which each unit was neither 0 nor near zero
  std::vector<std::int64_t> rows;     // [F] rows each unit saw (MoE experts); empty: `tokens`

  double zero_fraction() const;
  double near_zero_fraction() const;
  // Units that were zero on every row seen.
  std::int64_t dead_units() const;
  double dead_fraction() const;
  // Units that were 0 or near zero on every row seen: the dead ones and those a smooth gate
  // (GELU, SiLU), which is never exactly 0, keeps within the near-zero band.
  std::int64_t near_dead_units() const;
  // Per unit: the fraction of the rows it saw in which it was non-zero (0 when it saw none).
  std::vector<double> frequency() const;
};

// Adds the rows of h [T, F] (one layer's hidden activations of one forward) to s.
void add_hidden(UnitSparsity& s, const Tensor& h);
// Adds an MoE layer's hidden rows h [kept, F], permuted into expert blocks [offsets[e],
// offsets[e+1]) (ops/router.hpp's Routing::offsets): expert e's unit u is unit e·F + u, and it
// sees only the rows routed to e. An expert no token reaches has units that are never non-zero:
// they count as dead.
void add_expert_hidden(UnitSparsity& s, const Tensor& h, std::span<const std::int64_t> offsets);

}  // namespace ffnlab
