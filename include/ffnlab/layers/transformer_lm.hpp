// TransformerLM: token embedding (+ learned or sinusoidal positions) → dropout → L blocks →
// final norm → LM head (tied to the embedding or its own) → cross-entropy. All parameters live in
// one buffer, named like Hugging Face checkpoints (model.embed_tokens.weight,
// model.layers.{i}.self_attn.q_proj.weight, model.norm.weight, lm_head.weight, ...).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/layers/norm.hpp"
#include "ffnlab/layers/transformer_block.hpp"
#include "ffnlab/ops/linear.hpp"

namespace ffnlab {

class TransformerLM final : public Layer {
 public:
  // `held` (MoE): the experts [first, first + count) every MoE layer keeps (count 0: all) —
  // expert parallelism, where a rank allocates only its own experts (their
  // weights, and the trainer their gradients and moments). Every parameter a model holds has
  // the value it has in the model that holds all (same seed), so runs stay comparable.
  TransformerLM(const LMConfig& config, std::uint64_t seed, HeldExperts held = {});
  // The experts every MoE layer holds ({0, E} for a model holding all; {0, 0} without MoE).
  HeldExperts held_experts() const;

  const LMConfig& config() const { return config_; }
  ParameterSet& parameters() override { return params_; }

  // Runs B = ids.size()/seq sequences of seq tokens. Returns the mean cross-entropy of
  // predicting targets[t] at every position (0 when targets is empty: logits only). With
  // train = true, dropout is on and backward() may follow.
  double forward(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets,
                 std::int64_t seq, bool train);
  // Gradients of scale·cross-entropy + aux_scale·aux_loss() of the last training forward
  // (aux_scale < 0: scale), accumulated into parameters().grads(). `ready` (optional) is called
  // as the gradients finish, back to front: ready(i) says that every gradient from element i
  // of the buffer to its end is complete (so a data-parallel trainer can start summing them
  // over ranks while the rest of backward runs); the last call is ready(0).
  void backward(float scale = 1.f, float aux_scale = -1.f,
                const std::function<void(std::int64_t)>& ready = {});

  const Tensor& logits() const { return logits_; }  // [B·S, V] of the last forward
  double aux_loss() const;                          // Σ over blocks of the MoE aux losses
  std::vector<FFNStats> ffn_stats() const;          // per block, of the last forward
  // Per block, of the last training forward and the gradients now accumulated (call between
  // backward and the optimizer step; the trainer's diagnostics do).
  std::vector<LayerDiagnostics> diagnostics() const;
  // Whether the next training forwards measure what diagnostics() reports of the activations
  // (TransformerBlock::set_diagnostics; on by default). The trainer turns it on for the steps
  // it reports.
  void set_diagnostics(bool on);
  const FeedForward& ffn(int layer) const;  // block `layer`'s FFN
  void after_optimizer_step();  // MoE balancing-bias updates, ReLU routing's L1 coefficient
  void set_precision(Precision p);
  // Dropout of the next forwards draws from (seed, stream·(2L + 1) + i); the trainer passes the
  // step, so that masks depend on the step only (a resumed run draws the same ones). The MoE
  // layers' noise is re-seeded from the same stream.
  void set_dropout_stream(std::uint64_t seed, std::uint64_t stream);
  // Data parallelism: the next training forwards hold tokens [first_token, ...) of a batch
  // spread over `group` (FeedForward::set_data_parallel); null: the whole batch is here.
  // With expert_parallel, the MoE layers split their experts over the ranks of `expert_group`
  // (null: the whole group).
  void set_data_parallel(ProcessGroup* group, std::int64_t first_token,
                         bool expert_parallel = false, ProcessGroup* expert_group = nullptr);
  // The buffer's element ranges [begin, end) that hold the MoE layers' stacked expert tensors,
  // each `experts` equal slices (expert e's is [begin + e·n, begin + (e + 1)·n)).
  struct ExpertSpan {
    std::int64_t begin, end;
    int experts;
  };
  std::vector<ExpertSpan> expert_spans();
  // Whether AdamW decays a parameter: matrices (and embeddings) yes, norm weights and biases no.
  static bool is_decayed(const Parameter& p);

 private:
  void bind_parameters() override;

  LMConfig config_;
  Precision precision_ = Precision::f32;
  std::vector<std::unique_ptr<TransformerBlock>> blocks_;
  std::unique_ptr<Norm> final_norm_;
  ParameterSet params_;
  Tensor embed_, dembed_;  // [V, D]
  Tensor pos_, dpos_;      // [context, D] learned; pos_ is the fixed table when sinusoidal
  Tensor head_, dhead_;    // [V, D] (views of embed_ when tied)
  std::uint64_t dropout_seed_ = 0, dropout_stream_ = 0;
  std::uint64_t dropout_first_ = 0;         // the embedding dropout's first element index
  std::vector<std::int64_t> block_offset_;  // where block i's gradients start in the buffer
  std::int64_t head_offset_ = 0;            // where the final norm's (or the head's) start

  // Saved by forward.
  bool train_ = false;
  std::int64_t seq_ = 0;
  std::vector<std::int32_t> ids_, targets_;
  std::vector<Tensor> xs_;  // L + 1 activations [T, D]: the embedding output and each block's
  Tensor z_;                // [T, D] the final norm's output (xs_.back() without one)
  Tensor logits_, probs_;   // [T, V]
  // Backward workspaces.
  Tensor dlogits_, dz_, dx_a_, dx_b_;
  // What the head's products read (ops/linear.hpp); when it keeps copies, bf16 z [T, D] and
  // head [V, D] made by the forward for its product and the backward's.
  ProductOperands head_operands_;
  Tensor z16_;
  ProductWeight head_operand_;
};

}  // namespace ffnlab
