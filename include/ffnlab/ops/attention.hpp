// Multi-head causal self-attention on packed projections:
//   qkv [B·S, 3D], row t = [q | k | v], each D = H·dh wide with head h at columns h·dh;
//   out [B·S, D], head h at columns h·dh: softmax(q_h·k_hᵀ/√dh, causal)·v_h.
// The two products per head go through oneDNN as batched products over the B·H heads (G = B·H);
// the causal mask is applied by index inside the softmax (nothing materialised). The softmax
// probabilities are kept for backward: B·H·S² floats. Reference: ops/ref/attention_ref.hpp.
#pragma once

#include <cstdint>

#include "ffnlab/ops/matmul.hpp"

namespace ffnlab {

// Saved by forward for backward, and reused as workspaces from call to call.
struct AttentionCache {
  Tensor q, k, v;  // [B·H, S, dh] head-major copies; q is pre-scaled by 1/√dh
  Tensor p;        // [B·H, S, S] probabilities, zero above the diagonal
  // The per-head outputs (copied into `out`) and the backward's workspaces are shared by all
  // layers (ffnlab/scratch.hpp): the backward needs none of them from the forward.
};

// causal = false lets every position see the whole sequence (the tutorial's encoder).
void attention_forward(Tensor& out, AttentionCache& cache, const Tensor& qkv, std::int64_t seq,
                       std::int64_t heads, bool causal = true,
                       Precision precision = Precision::f32);

// dqkv [B·S, 3D] (overwritten) from dout [B·S, D] and the cache of the last forward.
void attention_backward(Tensor& dqkv, const Tensor& dout, AttentionCache& cache, std::int64_t seq,
                        std::int64_t heads, bool causal = true,
                        Precision precision = Precision::f32);

}  // namespace ffnlab
