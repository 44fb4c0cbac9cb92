// Moving token rows into per-expert blocks and back (the MoE's permute and weighted
// un-permute), forward and backward. Every loop is parallel over rows and race-free: a token
// gathers from its own k rows instead of k rows scattering into it.
#pragma once

#include <cstdint>

#include "ffnlab/tensor.hpp"

namespace ffnlab {

// out [R, D] (resized): out[i] = x[token_of_row[i]].
void permute_rows(Tensor& out, const Tensor& x, const std::int64_t* token_of_row, std::int64_t R);

// y [T, D] = (or +=) Σ_j weight[t, j] · rows[slot[t, j]] over j < k with slot >= 0.
void unpermute_rows(Tensor& y, const Tensor& rows, const std::int64_t* slot, const float* weight,
                    int k, bool accumulate);

// The backward of unpermute_rows: drows [R, D] (resized): drows[slot[t,j]] = weight[t,j]·dy[t];
// dweight [T, k] (overwritten): dweight[t,j] = <dy[t], rows[slot[t,j]]>, 0 when dropped.
void unpermute_rows_backward(Tensor& drows, float* dweight, const Tensor& dy, const Tensor& rows,
                             const std::int64_t* slot, const float* weight, int k);

// The backward of permute_rows: dx [T, D] (+)= Σ_j drows[slot[t, j]] over kept j.
void permute_rows_backward(Tensor& dx, const Tensor& drows, const std::int64_t* slot, int k,
                           bool accumulate);

}  // namespace ffnlab
