// TokenRouter: the router of the routings that score tokens against experts with a Linear (topk,
// top_p, relu, expert_choice; ops/router decides from the scores):
//
//   logits = x·W_rᵀ + b_r       (x × U(1 − ε, 1 + ε) with jitter, in training)
//            + G·W_gᵀ           (MoE++'s gating residual: G the previous MoE layer's logits)
//            + N(0, 1)·softplus(x·W_noiseᵀ)   (noisy top-k, in training)
//   route: choices, combine weights, capacity, losses          (ops/router: route, assign_rows)
//
// It also holds the router's state between steps: the aux-loss-free balancing bias and ReLU
// routing's L1 coefficient λ, with their updates. Parameters: gate.weight [E, D], gate.bias [E],
// gate.noise.weight [E, D], gate.e_score_correction_bias [E] and gate.l1_coef [1] (state), and
// gate.gate_map.weight [E, E], declared and drawn last. E counts MoE++'s zero-computation experts.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/ffn_context.hpp"
#include "ffnlab/layers/parameters.hpp"
#include "ffnlab/ops/router.hpp"
#include "ffnlab/parallel/group.hpp"

namespace ffnlab {

class TokenRouter {
 public:
  // ReLU routing: the gates that were positive, and all gates, over the training forwards since
  // the last optimizer step (over the group's tokens in data-parallel training); in a model's
  // sums as "relu_gates": {active, gates}.
  struct GateActivity {
    double active = 0, gates = 0;
    double sparsity() const { return gates > 0 ? 1.0 - active / gates : 0.0; }
    GateActivity& operator+=(const GateActivity& o) {
      active += o.active;
      gates += o.gates;
      return *this;
    }
  };

  TokenRouter(const FFNConfig& layer, std::uint64_t seed);

  // The router's parameters and state; the gate map (gating residual) apart, declared and drawn
  // after every other part of the layer, so that a config without it keeps its initialisation.
  void declare(ParameterSet& params) const;
  void declare_gate_map(ParameterSet& params) const;
  void bind(ParameterSet& params);
  void init(std::mt19937_64& rng);  // as torch.nn.Linear; λ at l1_coef_init
  void init_gate_map(std::mt19937_64& rng);
  // The training noise's stream (jitter, noisy top-k): counter-based draws of (seed, stream).
  void set_random_stream(std::uint64_t seed, std::uint64_t stream);

  // Routes x [T, D] into r. context: the previous MoE layer's logits (gating residual; none for
  // the first such layer), the tokens per sequence (expert choice) and the tokens' ids (hash
  // routing); first_token: x's first row's place in the group's batch (the noise's counter);
  // group: the ranks whose whole batch is routed as one (training), or null.
  void forward(Routing& r, const Tensor& x, const FFNContext& context, std::int64_t first_token,
               ProcessGroup* group, bool train);
  // dx [T, D] += the router's part, from the combine weights' gradients dweight [T, K] and the
  // losses (scaled by aux_scale); logits_grad: the next MoE layer's gradient of these logits
  // (gating residual), or null. x and r: the training forward's. Adds the parameters' gradients.
  void backward(Tensor& dx, const Routing& r, const float* dweight, const Tensor& x,
                const Tensor* logits_grad, float aux_scale);

  // The logits of the last forward [T, E] (gating residual included): the next layer's G.
  const Tensor& logits() const { return logits_; }
  // The gradient of the loss wrt the last forward's gate residual [T, E] (undefined without).
  const Tensor& gate_residual_grad() const { return dresidual_; }
  // The training noise of the last forward (empty tensors when it drew none).
  const Tensor& jitter_noise() const { return jittered_ ? jitter_ : none_; }
  const Tensor& gate_noise() const { return noised_ ? noise_eps_ : none_; }
  // ReLU routing's L1 coefficient λ now (0 for the other routings).
  float l1_coef() const { return l1_coef_.defined() ? l1_coef_.f32()[0] : 0.0f; }
  // What the layer adds to the model's sums (ReLU routing: "relu_gates").
  ModelSums model_sums() const;
  // Between optimizer steps: λ follows the gates' sparsity (the model's "relu_gates"; null: this
  // layer's own), the balancing bias the experts' loads since the last update.
  void after_optimizer_step(const ModelSums* model);

 private:
  FFNConfig layer_;
  bool linear_;      // the family scores with a Linear (not hash routing)
  bool l1_penalty_;  // the family's own loss is ReLU routing's L1 penalty, λ adapting
  Tensor router_, router_bias_, noise_, gate_map_;      // [E, D], [E], [E, D], [E, E]
  Tensor drouter_, drouter_bias_, dnoise_, dgate_map_;  // their gradients
  Tensor balance_bias_, l1_coef_;                       // [E], [1]: state, values only
  std::uint64_t noise_seed_ = 0, noise_stream_ = 0;
  // Saved by a training forward for backward (workspaces in inference).
  bool jittered_ = false, noised_ = false;  // the last forward's jitter and gate noise
  Tensor none_;
  Tensor x_router_, jitter_;      // [T, D] jittered router input, the multiplicative noise
  Tensor logits_;                 // [T, E]
  Tensor residual_, mapped_;      // [T, E] the previous layer's logits (a view), residual·W_gᵀ
  Tensor noise_pre_, noise_eps_;  // [T, E] noisy top-k: x·W_noiseᵀ and its N(0, 1) draws
  Tensor dlogits_, dnoise_pre_, dresidual_;  // [T, E] backward workspaces
  std::vector<std::int64_t> step_load_;      // assignments per expert since the balance update
  GateActivity step_gates_;                  // ReLU routing: gates since the last optimizer step
};

}  // namespace ffnlab
