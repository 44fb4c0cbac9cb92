// Linear (fully connected) op: y = x·Wᵀ + b with W stored like torch.nn.Linear.weight, [O, I].
// Products go through ops/matmul (oneDNN), f32 products of a few rows through ops/skinny (they
// stream the weights once; skinny_f32_max_rows says how few); the scalar reference is
// ops/ref/linear_ref.hpp.
#pragma once

#include "ffnlab/ops/matmul.hpp"

namespace ffnlab {

// y [T, O] = x [T, I] · w [O, I]ᵀ + b [O] (b may be null); act, if given, is fused into the
// product as a oneDNN post-op (inference: the pre-activation is not kept).
// varying_rows: T changes from call to call (an MoE's expert blocks): the product runs as a few
// fixed-shape parts (the rows rounded down to a multiple of max(16, 2^⌊log2 T⌋/8), then the
// rest), so a run creates few primitives; up to 8 rows, one run-time-dimension primitive or a
// fixed shape per T, whichever measured faster for the weight's size.
void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b,
                    Precision precision = Precision::f32, const Act* act = nullptr,
                    bool varying_rows = false);

// dx [T, I] = dy · w        (overwritten; skipped when dx is null)
// dw [O, I] += dyᵀ · x      (accumulated)
// db [O]    += Σ_t dy[t]    (accumulated; skipped when db is null)
void linear_backward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, Precision precision = Precision::f32,
                     bool varying_rows = false);

// What a product at `precision` reads for t: t itself in an f32 product or when t is bf16
// already; in a bf16 product, t rounded to bf16 into `buffer`. A layer whose tensor feeds several
// bf16 products (x: the forward and dW; a weight: the forward and dx) converts it once with this
// instead of once in every matmul() call, with the same values.
const Tensor& product_operand(const Tensor& t, Precision precision, Tensor& buffer);

// db [O] += Σ_t dy[t, :], in a fixed order (deterministic for any thread count).
void bias_backward(Tensor& db, const Tensor& dy);

}  // namespace ffnlab
