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

#include <memory>
#include <optional>
#include <random>

#include "ffnlab/layers/dense_ffn.hpp"
#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/layers/moe/expert_stack.hpp"
#include "ffnlab/layers/moe/shared_experts.hpp"
#include "ffnlab/layers/moe/soft_moe.hpp"
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
  void after_optimizer_step(const GateActivity* activity = nullptr) override;
  GateActivity gate_activity() const override { return step_gates_; }
  void set_inference_weights(DType dtype) override;
  std::vector<Tensor> expert_grads() override;
  const Tensor& gate_residual_grad() const override { return ws_.dresidual; }
  const Tensor& router_logits() const override { return router_.logits; }

  HeldExperts held_experts() const override { return held_; }
  // The routing of the last forward (chosen experts, weights, kept rows, losses).
  const Routing& routing() const { return routing_; }
  // ReLU routing's L1 coefficient λ now (0 for the other routings).
  float l1_coef() const;
  const Tensor& hidden() const override { return experts_->rows().hp; }
  // The training noise of the last forward (empty tensors when off): the router input's
  // multiplicative jitter [T, D] and noisy top-k's N(0, 1) draws [T, E].
  const Tensor& jitter_noise() const { return router_.jitter; }
  const Tensor& gate_noise() const { return router_.noise_eps; }

 private:
  // Views into params_ (values in w_, gradients in dw_; undefined where the config has none).
  struct Weights {
    Tensor router, router_bias;  // [E, D], [E]   gate.weight / gate.bias
    Tensor noise;                // [E, D]        noisy top-k's gate.noise.weight
    Tensor balance_bias;         // [E]           aux-loss-free bias (state, values only)
    Tensor l1_coef;              // [1]           ReLU routing's λ (state, values only)
    Tensor gate_map;             // [E, E]        MoE++'s gating residual: gate.gate_map.weight
  };
  // Saved by a training forward for backward (workspaces in inference).
  struct RouterCache {
    Tensor x;                     // [T, D] the caller's input (a view)
    Tensor x_router;              // [T, D] jittered router input (jitter only)
    Tensor jitter;                // [T, D] the multiplicative noise
    Tensor logits;                // [T, E]
    Tensor residual;              // [T, E] the previous layer's logits (a view; gating residual)
    Tensor mapped;                // [T, E] residual·W_gᵀ
    Tensor noise_pre, noise_eps;  // [T, E] noisy top-k: x·W_noiseᵀ and its N(0, 1) draws
  };
  // The layer's own small backward workspaces; the large ones (permuted rows' gradients, [T, D]
  // partial dx) are scratch slots shared by all MoE layers (ffnlab/scratch.hpp).
  struct Workspace {
    std::vector<float> dweight;  // [T, K] gradient of the combine weights
    Tensor dlogits, dnoise_pre;  // [T, E]
    Tensor dresidual;            // [T, E] gradient of the previous layer's logits
  };

  void bind_parameters() override;
  void router_forward(const Tensor& x, bool train);
  void experts_forward(Tensor& y, const Tensor& x, bool train);
  // Backward, in the reverse order of the forward; each step adds its part of dx.
  void combine_backward(const Tensor& dy);
  void experts_backward(Tensor& dx);
  void router_backward(Tensor& dx);

  FFNConfig config_;
  HeldExperts held_;  // the experts in params_ (the stack's): held_.first, ...
  ParameterSet params_;
  Weights w_, dw_;
  std::optional<ExpertStack> experts_;   // the routed experts (made once the config is checked)
  std::optional<SharedExperts> shared_;  // num_shared > 0
  std::optional<ZeroComputation> zc_;
  std::optional<SoftMoE>
      soft_;  // Soft MoE's routing (routing soft)    // MoE++'s zero-computation experts

  std::uint64_t noise_seed_ = 0, noise_stream_ = 0;  // training noise: counter-based draws
  Routing routing_;
  std::vector<std::int64_t> step_load_;  // assignments per expert since the last balance update
  GateActivity step_gates_;              // ReLU routing: gates since the last optimizer step
  bool saved_ = false;

  RouterCache router_;
  Workspace ws_;
};

}  // namespace ffnlab
