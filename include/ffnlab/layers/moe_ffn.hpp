// MoEFFN: router + E routed experts (+ shared experts), forward and backward.
//
//   logits = x·W_rᵀ + b_r                       (router; jitter / noisy top-k in training)
//   route: scores, top-k, combine weights w, capacity        (ops/router)
//   permute x into per-expert blocks; per expert e with n_e > 0 rows:
//       A_e = X_e·W_in,eᵀ + b_in,e,  H_e = mix(A_e),  O_e = H_e·W_out,eᵀ + b_out,e
//   y = Σ_j w_j·O[slot_j]  (+ σ(x·w_g)·shared(x))           (ops/permute)
//
// Expert weights are stacked: W_in [E, P, D] with P = F (plain) or 2F (glu: gate rows, then up
// rows), W_out [E, D, F]; each expert's slices carry Hugging Face per-expert names
// (experts.{e}.gate_proj.weight, ...), so checkpoints load without conversion. Every product
// is one oneDNN call per non-empty expert block; an expert with no tokens costs nothing.
// Reference: layers/ref/moe_ffn_ref.hpp. Formulas and options: docs/moe.md.
#pragma once

#include <memory>
#include <random>

#include "ffnlab/layers/dense_ffn.hpp"
#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/ops/router.hpp"

namespace ffnlab {

class MoEFFN final : public FeedForward {
 public:
  MoEFFN(const FFNConfig& config, std::uint64_t seed);

  const FFNConfig& config() const override { return config_; }
  void forward(Tensor& y, const Tensor& x, bool train) override;
  void backward(Tensor& dx, const Tensor& dy) override;
  ParameterSet& parameters() override { return params_; }
  FFNStats stats() const override;
  double aux_loss() const override;
  void set_random_stream(std::uint64_t seed, std::uint64_t stream) override;
  void after_optimizer_step() override;

  // The routing of the last forward (chosen experts, weights, kept rows, losses).
  const Routing& routing() const { return routing_; }
  // The training noise of the last forward (empty tensors when off): the router input's
  // multiplicative jitter [T, D] and noisy top-k's N(0, 1) draws [T, E].
  const Tensor& jitter_noise() const { return jitter_; }
  const Tensor& gate_noise() const { return noise_eps_; }
  // The parameter names of expert e's input projections (gate first), in buffer order.
  static std::vector<std::string> expert_in_names(const FFNConfig& config, int e);
  static std::string expert_out_name(const FFNConfig& config, int e);
  static std::string shared_prefix(const FFNConfig& config);

 private:
  void bind_parameters() override;
  void router_forward(const Tensor& x, bool train);

  FFNConfig config_;
  FFNConfig expert_;  // the dense FFN one expert is
  std::int64_t in_width_;
  ParameterSet params_;
  std::unique_ptr<DenseFFN> shared_;  // its parameters live in params_

  Tensor w_router_, b_router_, w_noise_, balance_bias_, w_gate_;
  Tensor dw_router_, db_router_, dw_noise_, dw_gate_;
  Tensor w_in_, b_in_, w_out_, b_out_;  // [E, P, D], [E, P], [E, D, F], [E, D]
  Tensor dw_in_, db_in_, dw_out_, db_out_;

  std::mt19937_64 rng_;
  Routing routing_;
  std::vector<std::int64_t> step_load_;  // assignments per expert since the last balance update
  bool saved_ = false;

  // Saved by a training forward (workspaces otherwise).
  Tensor x_;                           // [T, D] the caller's input (a view)
  Tensor x_router_;                    // [T, D] jittered router input (jitter only)
  Tensor jitter_;                      // [T, D] the multiplicative noise
  Tensor logits_;                      // [T, E]
  Tensor noise_pre_, noise_eps_;       // [T, E] noisy top-k
  Tensor xp_, ap_, hp_, op_;           // permuted rows: [R, D], [R, P], [R, F], [R, D]
  Tensor shared_y_, gate_pre_, gate_;  // [T, D], [T, 1], [T, 1]
  // Backward workspaces.
  Tensor dop_, dhp_, dap_, dxp_, dlogits_, dx_router_, dshared_, dx_shared_, dgate_;
  Tensor dnoise_pre_, dx_extra_;
  std::vector<float> dweight_;
};

}  // namespace ffnlab
