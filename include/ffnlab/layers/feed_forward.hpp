// FeedForward: the one interface of every FFN layer, dense or MoE, and its factory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/ffn_context.hpp"
#include "ffnlab/layers/layer.hpp"
#include "ffnlab/ops/matmul.hpp"
#include "ffnlab/parallel/group.hpp"

namespace ffnlab {

// Measured on the last forward (training or not); cheap enough to leave on.
struct FFNStats {
  std::int64_t tokens = 0;
  double zero_fraction = 0.0;  // fraction of exactly-zero hidden activations h (training only)

  // MoE only (num_experts == 0 for dense layers).
  int num_experts = 0;
  std::vector<std::int64_t> tokens_per_expert;  // assignments kept per (FFN) expert
  double load_cv = 0.0;           // coefficient of variation (std / mean) of tokens_per_expert
  double max_over_mean = 0.0;     // max load / mean load
  double unused_fraction = 0.0;   // fraction of experts that got no token
  std::int64_t dropped = 0;       // assignments over capacity
  double dropped_fraction = 0.0;  // dropped / assignments (T·k for top-k routing)
  // Experts a token takes (k for top-k routing; fewer with top-p; any number with ReLU
  // routing): the mean, and how many tokens took 0, 1, …, k of them (k = E for ReLU routing).
  double experts_per_token = 0.0;
  std::vector<std::int64_t> tokens_by_experts;  // [k + 1]
  double l1_coef = 0.0;                         // ReLU routing: the L1 penalty's coefficient λ now
  // MoE++: the share of the choices that went to zero-computation experts (zero, copy,
  // constant); tokens_per_expert, experts_per_token and tokens_by_experts count FFN experts.
  double zero_computation_fraction = 0.0;
  double router_entropy = 0.0;  // mean over tokens of the entropy of softmax(logits), nats
  double top1_prob = 0.0;       // mean over tokens of max softmax(logits)
  double balance_loss = 0.0;    // E·Σ f_e·P_e (unweighted)
  double z_loss = 0.0;          // mean over tokens of logsumexp(logits)² (unweighted)
  // diagnostic_stats() only, of the last training forward (0 / empty otherwise): the router
  // logits' standard deviation over tokens and experts (this rank's tokens), and per expert the
  // RMS of its output rows before the combine weights (NaN for an expert that got no row; empty
  // under expert parallelism, where a rank holds other ranks' rows).
  double router_logit_std = 0.0;
  std::vector<double> expert_output_rms;  // [E]
};

class FeedForward : public Layer {
 public:
  virtual const FFNConfig& config() const = 0;
  // y [T, D] = FFN(x [T, D]); y is resized if needed. With train = true the activations that
  // backward needs are saved; x is kept by reference, so it must not change until backward.
  virtual void forward(Tensor& y, const Tensor& x, bool train) = 0;
  // dx [T, D] (overwritten; resized if needed) from dy [T, D] of the last training forward.
  // Parameter gradients accumulate into parameters().grads().
  virtual void backward(Tensor& dx, const Tensor& dy) = 0;
  virtual FFNStats stats() const = 0;
  // stats() and what only diagnostics need (MoE: the router logits' spread, each expert's output
  // RMS), which costs a pass over the layer's saved rows: the trainer asks for it only at the
  // steps that log diagnostics (TrainConfig::diagnostics_every).
  virtual FFNStats diagnostic_stats() const { return stats(); }
  // The hidden activations h that enter the down projection, of the last forward (training or
  // not): [T, F] for a dense FFN; for MoE the kept rows in expert order, [R, F]. Empty before
  // any forward. What activation-sparsity analysis reads (analysis/sparsity.hpp).
  virtual const Tensor& hidden() const = 0;

  // The auxiliary loss of the last training forward, with its coefficients (MoE: aux_coef·
  // balance + z_coef·z); the training loss adds it. Backward adds aux_loss_scale·∂aux/∂θ.
  virtual double aux_loss() const { return 0.0; }
  void set_aux_loss_scale(float scale) { aux_loss_scale_ = scale; }
  float aux_loss_scale() const { return aux_loss_scale_; }
  // Called once per optimizer step: MoE's aux-loss-free balancing bias update, and ReLU
  // routing's L1 coefficient. `model`: the sums of every layer's model_sums() (TransformerLM adds
  // them in block order), or with null the layer's own.
  virtual void after_optimizer_step(const ModelSums* model = nullptr) { (void)model; }
  // What this layer adds to the model's sums since the last optimizer step (empty: nothing).
  virtual ModelSums model_sums() const { return {}; }
  // Re-seeds the layer's random draws in training (MoE: jitter and noisy top-k) from `seed` and
  // `stream` alone; a trainer passes its seed and the step, so that a resumed run draws what an
  // uninterrupted one would.
  virtual void set_random_stream(std::uint64_t /*seed*/, std::uint64_t /*stream*/) {}
  // Data parallelism: the tokens of the next forwards are [first_token, first_token + T) of a
  // batch spread over `group`'s ranks (null: this process holds the whole batch). Training
  // forwards then route over the whole batch (MoE: loads, losses, capacity; collective, so
  // every rank makes the same training forwards) and draw the random numbers of their place in
  // it, so that results do not depend on the number of ranks.
  // With expert_parallel (MoE), each rank of `expert_group` (a part of `group`, or null: all of
  // it) computes only its share of the experts, for the tokens of every rank of that expert
  // group (ffnlab/layers/expert_exchange.hpp); the other experts' weights here are then neither
  // used nor given gradients in training. Routing (loads, losses, capacity) stays `group`'s.
  void set_data_parallel(ProcessGroup* group, std::int64_t first_token,
                         bool expert_parallel = false, ProcessGroup* expert_group = nullptr) {
    group_ = group;
    first_token_ = first_token;
    expert_parallel_ = group != nullptr && expert_parallel;
    expert_group_ = expert_group != nullptr ? expert_group : group;
  }
  // The context of the next forwards and backward (FFNContext).
  FFNContext& context() { return context_; }
  const FFNContext& context() const { return context_; }
  // The router logits of the last forward, [T, E], residual included (empty for dense layers
  // and Soft MoE): what the next MoE layer takes as its context's previous_logits.
  virtual const Tensor& router_logits() const { return empty_; }
  // The gradient of the loss wrt the context's previous_logits, [T, E], written by a backward
  // whose forward read them (empty otherwise): the previous layer's context's logits_grad.
  virtual const Tensor& previous_logits_grad() const { return empty_; }

  // The stacked expert tensors' gradients, each [held experts, ...] (empty for dense layers):
  // what expert parallelism leaves out of the gradient all-reduce.
  virtual std::vector<Tensor> expert_grads() { return {}; }
  // The experts this layer holds (MoE built with a share of them; {0, 0} for dense layers).
  virtual HeldExperts held_experts() const { return {}; }

  void set_precision(Precision p) { precision_ = p; }
  Precision precision() const { return precision_; }

  // The storage of the weights that inference forwards (train = false) read. bf16 keeps a copy
  // of the current weights in bf16, made once: half the bytes to read per token, products in
  // bf16 with f32 accumulation. f32 (the default) drops it and reads the weights themselves. The
  // copy is a snapshot: call this again after changing the weights; a training forward drops it
  // (the weights are about to change). Inference forwards of a few tokens stream the weights
  // once (ops/few_rows.hpp) from either storage: from bf16 as many as few_rows_bf16_max allows
  // (kFewRowsMax, or 3 for a dense layer whose up projection has 2048 inputs or more and 2^20
  // elements or more, where oneDNN's bf16 products are native), and from f32 as many as
  // few_rows_f32_max allows.
  virtual void set_inference_weights(DType dtype) = 0;
  DType inference_weights() const { return inference_weights_; }

 protected:
  Precision precision_ = Precision::f32;
  DType inference_weights_ = DType::f32;
  float aux_loss_scale_ = 1.0f;
  ProcessGroup* group_ = nullptr;
  ProcessGroup* expert_group_ = nullptr;  // expert parallel: the ranks the experts are split over
  std::int64_t first_token_ = 0;
  bool expert_parallel_ = false;
  FFNContext context_;
  Tensor empty_;  // what a layer without a tensor returns for it (undefined)
};

// Builds the layer a config describes, initialised like torch.nn.Linear from `seed`.
// Throws "[ffn] ..." for an invalid config.
// `held` (MoE only): the experts the layer keeps, as MoEFFN's constructor.
std::unique_ptr<FeedForward> make_ffn(const FFNConfig& config, std::uint64_t seed = 0,
                                      HeldExperts held = {});

}  // namespace ffnlab
