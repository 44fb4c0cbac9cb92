// Fixed position encodings: the sinusoidal table of "Attention Is All You Need" (added to the
// token embeddings like a learned table, see ops/embedding.hpp) and rotary embeddings (RoPE,
// applied to queries and keys inside attention, Hugging Face's rotate_half convention: the pairs
// are (i, i + dh/2) of each head). Reference: ops/ref/positions_ref.hpp.
#pragma once

#include <cstdint>

#include "ffnlab/tensor.hpp"

namespace ffnlab {

// [S, D]: row s, column 2i = sin(s / 10000^(2i/D)), column 2i+1 = cos(the same angle).
Tensor sinusoidal_table(std::int64_t seq, std::int64_t d_model);

// Rotates, in place, each head_dim-wide head of the first `width` columns of every row of x
// [B·S, ≥width] (row t is at position t mod S) by the angles s·θ^(−2i/dh):
//   forward: (a, b) → (a·cos − b·sin, b·cos + a·sin); backward (inverse = transpose): angle −s·…
// Applying backward to a gradient of the rotated values gives the gradient of the inputs.
void rope_forward(Tensor& x, std::int64_t seq, std::int64_t width, std::int64_t head_dim,
                  float theta);
void rope_backward(Tensor& dx, std::int64_t seq, std::int64_t width, std::int64_t head_dim,
                   float theta);

}  // namespace ffnlab
