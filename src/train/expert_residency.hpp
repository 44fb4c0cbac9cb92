// Internal to train/: the part of an MoE layer's expert span that a rank's experts occupy.
#pragma once

#include <cstdint>
#include <utility>

#include "ffnlab/layers/transformer_lm.hpp"
#include "ffnlab/parallel/group.hpp"

namespace ffnlab {

// The elements of one MoE layer's experts (s.experts equal slices) that the experts of `share`
// occupy: [begin, end).
std::pair<std::int64_t, std::int64_t> held_range(const TransformerLM::ExpertSpan& s,
                                                 const ExpertShare& share);

}  // namespace ffnlab
