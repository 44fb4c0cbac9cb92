// Products for a few tokens (decode): one-token inference is bound by reading the weights, so
// these kernels read every weight row once for all T <= kSkinnyMaxTokens tokens, straight from
// f32 or bf16 storage, and finish each row's dot products with its bias, activation and gated
// mix in registers. Nothing else is touched: no primitive, no packing, no scratch allocation.
// Layers use them in inference forwards of up to kSkinnyMaxTokens tokens (DenseFFN, MoEFFN);
// larger T goes through oneDNN (ops/matmul). Reference: ref::linear_forward and
// ref::glu_forward; tests: tests/unit/test_skinny.cpp.
#pragma once

#include <cstdint>

#include "ffnlab/ops/activation.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab {

inline constexpr std::int64_t kSkinnyMaxTokens = 8;

// y [T, O] = x [T, I] · w [O, I]ᵀ + b [O] (b may be null; y += ... with accumulate).
// w is f32 or bf16; with bf16 weights x is rounded to bf16 too, as oneDNN's bf16 products do
// (accumulation is f32 either way). T <= kSkinnyMaxTokens.
void skinny_linear(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b,
                   bool accumulate = false);

// h [T, F] = mix(x [T, D] · w_in [P, D]ᵀ + b_in) of any dense FFN kind, in one pass over w_in:
// branches = 0 is the plain FFN, h = act(·) with P = F; branches = n >= 1 is the gated sum
// Σ_b act(g_b) ⊙ u_b with P = 2nF and rows [g_0 | u_0 | g_1 | ...] (ops/glu.hpp's layout).
// b_in [P] may be null; w_in f32 or bf16 as above.
void skinny_mix(Tensor& h, const Tensor& x, const Tensor& w_in, const Tensor* b_in, Act act,
                int branches);

}  // namespace ffnlab
