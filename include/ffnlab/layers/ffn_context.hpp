// What an FFN layer learns from the model around it (FFNContext, set through
// FeedForward::context()) and what it adds to the model's sums between optimizer steps
// (ModelSums): the one channel between a layer and the Transformer, which knows no routing family.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ffnlab/tensor.hpp"

namespace ffnlab {

// What an FFN layer learns from the model around it for its next forwards and backward. Dense
// layers read none of it; each MoE part reads what it needs. TransformerLM sets it for every
// block; a lone layer (Python, `ffnlab run`, the benchmarks) sets what it has.
struct FFNContext {
  // Tokens per sequence of the inputs, which hold whole sequences one after another (0: the
  // input is one sequence). Routings that look at the whole sequence (expert choice, Soft MoE)
  // route each sequence on its own.
  std::int64_t sequence = 0;
  // The previous MoE layer's router_logits() [T, E] for the same tokens (null: none, as for a
  // first layer), and the gradient of the loss wrt this layer's router_logits() from the next
  // layer, [T, E] (null: none). MoE++'s gating residuals read them. Kept by reference: they must
  // not change until backward.
  const Tensor* previous_logits = nullptr;
  const Tensor* logits_grad = nullptr;
  // This is the model's first MoE layer: it has no previous logits. A layer with the gating
  // residual and neither is refused (a missing input is an error, not a first layer).
  bool first_layer = false;
  // The tokens' ids [T] (null: none). Hash routing chooses by them.
  const std::int32_t* token_ids = nullptr;
  // A training forward routes as in training: the router's jitter and noise, BASE layers'
  // balanced assignment, and its load counts toward the next after_optimizer_step (the
  // balancing bias, ReLU routing's λ). False: it keeps what backward needs but routes as at
  // inference and counts nothing (a framework's evaluation mode with gradients,
  // ffnlab.torch.FFN under module.eval()).
  bool stochastic = true;
};

// Sums over a model's layers that updates between optimizer steps follow, by name (ReLU
// routing's "relu_gates": the positive gates and all gates since the last step, which its one
// L1 coefficient for the whole model follows).
using ModelSums = std::map<std::string, std::vector<double>>;
// into[name][i] += from[name][i] for every name of `from`.
inline void add_sums(ModelSums& into, const ModelSums& from) {
  for (const auto& [name, values] : from) {
    std::vector<double>& sum = into[name];
    sum.resize(std::max(sum.size(), values.size()), 0.0);
    for (std::size_t i = 0; i < values.size(); ++i) sum[i] += values[i];
  }
}

}  // namespace ffnlab
