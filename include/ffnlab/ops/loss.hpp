// Losses: cross-entropy over a vocabulary (the language model) and mean squared error (the
// tutorial's toy experiment). Each returns the mean over tokens and writes its gradient scaled by
// `scale` (the caller's loss weight, e.g. 1/accumulation steps). Reference: ops/ref/loss_ref.hpp.
#pragma once

#include <cstdint>
#include <span>

#include "ffnlab/tensor.hpp"

namespace ffnlab {

// Mean over t of −log softmax(logits[t])[targets[t]]; logits [T, V], targets in [0, V).
// probs [T, V] is saved for backward.
double cross_entropy_forward(Tensor& probs, const Tensor& logits,
                             std::span<const std::int32_t> targets);

// dlogits [T, V] (overwritten; may be probs itself) = scale·(probs − onehot(targets)) / T.
void cross_entropy_backward(Tensor& dlogits, const Tensor& probs,
                            std::span<const std::int32_t> targets, float scale);

// Mean over all elements of (y − target)², and dy = scale·2·(y − target)/numel (overwritten).
double mse_forward(const Tensor& y, const Tensor& target);
void mse_backward(Tensor& dy, const Tensor& y, const Tensor& target, float scale);

}  // namespace ffnlab
