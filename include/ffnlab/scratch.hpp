// Workspaces shared by all layers: the gradients of a layer's intermediates live only while that
// layer's backward runs, and what only a forward reads (attention's projections) only while that
// forward runs, so a model of L layers needs one set of them, not L (the attention
// probabilities' gradient alone is B·H·S² floats per layer). One set per thread and
// slot; a slot's tensor is reshaped (and reallocated only when its shape changes) on each use,
// except matmul's, which only grow.
// A caller must not hold a slot across a call that may use the same slot: each layer kind has
// slots of its own, so an MoE's shared expert (a DenseFFN) may run inside the MoE's backward.
#pragma once

#include "ffnlab/tensor.hpp"

namespace ffnlab {

enum class Scratch : int {
  ffn_dh,     // DenseFFN: dL/dh          [T, F]
  ffn_da,     // DenseFFN: dL/da          [T, in_width]
  attn_qkv,   // Attention: the projections q, k, v [T, 3D] (read by the forward only)
  attn_o,     // attention op: per-head outputs [B·H, S, dh], then dL/d(them) in the backward
  attn_da,    // Attention: dL/d(heads' output before o_proj) [T, D]
  attn_dqkv,  // Attention: dL/dqkv       [T, 3D]
  attn_dp,    // attention op: dL/dP      [B·H, S, S]
  attn_dq,    // attention op: dL/dq, dL/dk, dL/dv [B·H, S, dh]
  attn_dk,
  attn_dv,
  block_a,   // TransformerBlock: attention's output, the residual branch [T, D] (forward only)
  block_f,   // TransformerBlock: the FFN's output, the residual branch [T, D] (forward only)
  block_d1,  // TransformerBlock: the backward's three gradients [T, D]
  block_d2,
  block_d3,
  moe_dop,        // MoEFFN: dL/d(expert outputs), permuted rows [R, D]
  moe_dhp,        // MoEFFN: dL/dh, permuted rows [R, F]
  moe_dap,        // MoEFFN: dL/da, permuted rows [R, in_width]
  moe_dxp,        // MoEFFN: dL/dx, permuted rows [R, D]
  moe_dx_router,  // MoEFFN: the router's part of dL/dx [T, D]
  moe_dx_extra,   // MoEFFN: noisy top-k's or the shared gate's part of dL/dx [T, D]
  moe_dshared,    // MoEFFN: dL/d(shared expert output) [T, D]
  moe_dx_shared,  // MoEFFN: the shared expert's part of dL/dx [T, D]
  grad_bf16,      // any layer: a gradient converted once for its two bf16 products (bf16)
  // matmul's own, grow-only byte buffers (as f32 words), held only inside one matmul call:
  matmul_a,           // a converted for a bf16 product
  matmul_b,           // b converted for a bf16 product
  conv_weights,       // b in the 1x1 convolution's layout
  matmul_scratchpad,  // oneDNN's scratchpad for the running primitive
  count
};

// The calling thread's tensor of `slot`, shaped `shape` (contents unspecified).
Tensor& scratch(Scratch slot, const Shape& shape);
// The calling thread's tensor of `slot` as it is, for a caller that gives it its shape and type
// (Tensor::assign_converted).
Tensor& scratch(Scratch slot);
// Frees the calling thread's tensors of every slot (a benchmark that compares how tensors are
// allocated gives each setting fresh ones).
void release_scratch();

}  // namespace ffnlab
