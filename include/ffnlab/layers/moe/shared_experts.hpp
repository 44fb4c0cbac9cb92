// Shared experts: n experts every token goes through, beside the routed ones (DeepSeekMoE,
// Qwen-MoE), stored as one dense FFN of n times an expert's width (expert_config(layer, true)).
// Optionally gated per token (Qwen2-MoE): y += σ(x·w_gᵀ)·S(x), else y += S(x).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "ffnlab/layers/dense_ffn.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/parameters.hpp"

namespace ffnlab {

class SharedExperts {
 public:
  // The shared experts of the MoE layer `layer` (num_shared > 0); the dense FFN is initialised
  // from its own stream of `seed`.
  SharedExperts(const FFNConfig& layer, std::uint64_t seed);

  // The names' prefix of the dense FFN's parameters: "shared_experts." (qwen2_moe naming:
  // "shared_expert.").
  static std::string prefix(const FFNConfig& layer);
  // The dense FFN's parameters under prefix(), then shared_expert_gate.weight [1, D] (gated).
  void declare(ParameterSet& params) const;
  void bind(ParameterSet& params);
  // The gate, as torch.nn.Linear (the dense FFN drew its own at construction).
  void init(std::mt19937_64& rng);

  // y [T, D] += g·S(x) (g = σ(x·w_gᵀ), or 1 without the gate).
  void forward(Tensor& y, const Tensor& x, bool train, Precision precision);
  // dx [T, D] += the gradient through S and the gate, from dy; x: the training forward's input.
  // Adds the parameters' gradients.
  void backward(Tensor& dx, const Tensor& dy, const Tensor& x);
  void set_inference_weights(DType dtype) { dense_->set_inference_weights(dtype); }

 private:
  FFNConfig layer_;
  std::unique_ptr<DenseFFN> dense_;  // its parameters live in the MoE layer's set
  Tensor gate_, dgate_;              // [1, D] shared_expert_gate.weight and its gradient
  Tensor y_, gate_pre_, gate_out_;   // the forward's S(x) [T, D], x·w_gᵀ and σ of it [T, 1]
  Tensor dgate_out_;                 // backward workspace [T, 1]
};

}  // namespace ffnlab
