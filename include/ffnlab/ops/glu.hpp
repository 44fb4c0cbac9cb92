// The gated product of the GLU family and of the multi-branch gated FFN:
//   h = Σ_b act(g_b) ⊙ u_b
// over n branches (n = 1 is GLU/ReGLU/GEGLU/SwiGLU/bilinear). The input a is the output of one
// projection whose rows are laid out [g_0 | u_0 | g_1 | u_1 | ...], each part F wide: this is
// what x·Wᵀ gives when W stacks gate_proj over up_proj (or is ChatGLM's fused dense_h_to_4h).
// One pass over memory each way. Reference: ops/ref/glu_ref.hpp.
#pragma once

#include "ffnlab/ops/activation.hpp"

namespace ffnlab {

// h [T, F] = Σ_b act(a[:, 2bF : 2bF+F]) ⊙ a[:, 2bF+F : 2bF+2F]; a is [T, 2·n·F].
void glu_forward(Tensor& h, const Tensor& a, Act act, int branches = 1);

// da [T, 2·n·F] (overwritten): dg_b = dh ⊙ u_b ⊙ act'(g_b), du_b = dh ⊙ act(g_b).
void glu_backward(Tensor& da, const Tensor& dh, const Tensor& a, Act act, int branches = 1);

// The hidden mix of any dense FFN kind (FFNConfig::gated_branches()): h = act(a) for
// branches = 0 (plain FFN, a is [T, F]), the gated product above otherwise.
void mix_forward(Tensor& h, const Tensor& a, Act act, int branches);
// da (overwritten) from dh, the backward of mix_forward.
void mix_backward(Tensor& da, const Tensor& dh, const Tensor& a, Act act, int branches);

// Whether a layer applies the mix as its up projection's epilogue (the oneDNN post-op) instead
// of a pass of its own: a plain FFN in inference, and in training too when act' is a function of
// act's output (derivative_from_output: ReLU, sigmoid, tanh), where nothing but h is kept.
bool mix_in_epilogue(Act act, int branches, bool train);
// The backward of either way: from h when the training forward used the epilogue (a is then
// not read and may be empty), from a otherwise.
void mix_backward(Tensor& da, const Tensor& dh, const Tensor& a, const Tensor& h, Act act,
                  int branches);

}  // namespace ffnlab
