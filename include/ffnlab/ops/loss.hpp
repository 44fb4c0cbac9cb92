// Losses: cross-entropy over a vocabulary (the language model) and mean squared error (the
// tutorial's toy experiment). Each returns the mean over tokens and writes its gradient scaled by
// `scale` (the caller's loss weight, e.g. 1/accumulation steps). Reference: ops/ref/loss_ref.hpp.
#pragma once

#include <cstdint>
#include <span>

#include "ffnlab/tensor.hpp"

namespace ffnlab {

// A target that is not predicted (the masked objective's unmasked positions): no loss, no
// gradient, and not counted in the mean (PyTorch's ignore_index).
inline constexpr std::int32_t kIgnoreTarget = -1;

// Mean over the counted t (targets[t] in [0, V); kIgnoreTarget is skipped) of
// −log softmax(logits[t])[targets[t]]; 0 when none is counted. probs [T, V] is saved for backward.
double cross_entropy_forward(Tensor& probs, const Tensor& logits,
                             std::span<const std::int32_t> targets);
// How many targets are counted (not kIgnoreTarget).
std::int64_t counted_targets(std::span<const std::int32_t> targets);

// dlogits [T, V] (overwritten; may be probs itself) = scale·(probs − onehot(targets)) / n with
// n the counted targets; rows of ignored targets are 0.
void cross_entropy_backward(Tensor& dlogits, const Tensor& probs,
                            std::span<const std::int32_t> targets, float scale);

// Mean over all elements of (y − target)², and dy = scale·2·(y − target)/numel (overwritten).
double mse_forward(const Tensor& y, const Tensor& target);
void mse_backward(Tensor& dy, const Tensor& y, const Tensor& target, float scale);

}  // namespace ffnlab
