// MoEFFN: an MoE layer, composed of its parts (layers/moe/):
//
//   logits = x·W_rᵀ + b_r                       (router; jitter / noisy top-k in training)
//            (+ G·W_gᵀ: MoE++'s gating residual, G the previous MoE layer's logits)
//   route: scores, top-k, combine weights w, capacity        (ops/router)
//   permute x into per-expert blocks, run them               (ExpertStack)
//   y = Σ_j w_j·O[slot_j]                                    (ops/permute)
//   + MoE++'s zero-computation experts                       (ZeroComputation)
//   + σ(x·w_g)·shared(x)                                     (SharedExperts)
//
// Soft MoE (routing soft) replaces the router and the permutation with its slots (SoftMoE);
// its slots' rows run through the same ExpertStack. An inference forward of a few tokens
// streams only the chosen experts' weights, once each (ops/few_rows.hpp).
// Reference: layers/ref/moe_ffn_ref.hpp. Formulas and options: docs/moe.md.
#pragma once

#include <optional>
#include <vector>

#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/layers/moe/expert_stack.hpp"
#include "ffnlab/layers/moe/shared_experts.hpp"
#include "ffnlab/layers/moe/soft_moe.hpp"
#include "ffnlab/layers/moe/token_router.hpp"
#include "ffnlab/layers/moe/zero_computation.hpp"
#include "ffnlab/ops/router.hpp"

namespace ffnlab {

class MoEFFN final : public FeedForward {
 public:
  // `held`: the experts this layer keeps (expert parallelism: a rank allocates
  // only its own experts, with the values they get in a layer that holds all); count 0, all.
  MoEFFN(const FFNConfig& config, std::uint64_t seed, HeldExperts held = {});

  const FFNConfig& config() const override { return config_; }
  void forward(Tensor& y, const Tensor& x, bool train) override;
  void backward(Tensor& dx, const Tensor& dy) override;
  ParameterSet& parameters() override { return params_; }
  FFNStats stats() const override;
  FFNStats diagnostic_stats() const override;
  double aux_loss() const override;
  void set_random_stream(std::uint64_t seed, std::uint64_t stream) override;
  void after_optimizer_step(const ModelSums* model = nullptr) override;
  ModelSums model_sums() const override { return router_ ? router_->model_sums() : ModelSums{}; }
  void set_inference_weights(DType dtype) override;
  std::vector<Tensor> expert_grads() override;
  const Tensor& previous_logits_grad() const override {
    return router_ ? router_->gate_residual_grad() : empty_;
  }
  const Tensor& router_logits() const override { return router_ ? router_->logits() : empty_; }

  HeldExperts held_experts() const override { return held_; }
  // The routing of the last forward (chosen experts, weights, kept rows, losses).
  const Routing& routing() const { return routing_; }
  // ReLU routing's L1 coefficient λ now (0 for the other routings).
  float l1_coef() const;
  const Tensor& hidden() const override { return experts_->rows().hp; }
  // The training noise of the last forward (empty tensors when off): the router input's
  // multiplicative jitter [T, D] and noisy top-k's N(0, 1) draws [T, E].
  const Tensor& jitter_noise() const { return router_ ? router_->jitter_noise() : empty_; }
  const Tensor& gate_noise() const { return router_ ? router_->gate_noise() : empty_; }

 private:
  void bind_parameters() override;
  void experts_forward(Tensor& y, const Tensor& x, bool train);
  // Backward, in the reverse order of the forward; each step adds its part of dx.
  void combine_backward(const Tensor& dy);
  void experts_backward(Tensor& dx);

  FFNConfig config_;
  HeldExperts held_;  // the experts in params_ (the stack's): held_.first, ...
  ParameterSet params_;
  std::optional<ExpertStack> experts_;   // the routed experts (made once the config is checked)
  std::optional<SharedExperts> shared_;  // num_shared > 0
  std::optional<ZeroComputation> zc_;    // MoE++'s zero-computation experts
  std::optional<TokenRouter> router_;    // every routing but soft
  std::optional<SoftMoE> soft_;          // routing soft

  Routing routing_;
  bool saved_ = false;

  Tensor x_;  // the training forward's input (a view)
  // The combine weights' gradient [T, K], which the zero-computation experts and the router read
  // (the large backward workspaces are scratch slots shared by all MoE layers, scratch.hpp).
  std::vector<float> dweight_;
};

}  // namespace ffnlab
