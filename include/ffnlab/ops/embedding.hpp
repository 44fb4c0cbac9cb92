// Embedding lookups: token embedding (rows of a table chosen by id) and position embedding
// (the same table row added to every sequence at a position). Reference:
// ops/ref/embedding_ref.hpp.
#pragma once

#include <cstdint>
#include <span>

#include "ffnlab/tensor.hpp"

namespace ffnlab {

// y [T, D] = table [V, D] rows ids[t] (overwritten). Ids are checked against V.
void embedding_forward(Tensor& y, std::span<const std::int32_t> ids, const Tensor& table);
// dtable [V, D] += Σ_t onehot(ids[t]) dy[t] (accumulated, in token order: deterministic).
void embedding_backward(Tensor& dtable, const Tensor& dy, std::span<const std::int32_t> ids);

// y [B·S, D] += table [≥S, D] row s for the token at position s of each of the B sequences.
void position_add_forward(Tensor& y, const Tensor& table, std::int64_t seq);
// dtable [≥S, D] += Σ_b dy[b·S + s] for each position s (accumulated).
void position_add_backward(Tensor& dtable, const Tensor& dy, std::int64_t seq);

}  // namespace ffnlab
