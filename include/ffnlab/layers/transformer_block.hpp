// TransformerBlock: attention and an FFN (any FeedForward, dense or MoE), each inside a residual
// connection with a norm, in either order:
//   pre-norm:  h = x + drop(attn(norm1(x)));   y = h + drop(ffn(norm2(h)))
//   post-norm: h = norm1(x + drop(attn(x)));   y = norm2(h + drop(ffn(h)))
// Hugging Face names: input_layernorm, self_attn, post_attention_layernorm, mlp.
#pragma once

#include <memory>

#include "ffnlab/layers/attention_layer.hpp"
#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/layers/norm.hpp"

namespace ffnlab {

// What one block did in the last training step (TransformerLM::diagnostics): activations of the
// last forward, gradient norms of the gradients accumulated since they were last zeroed.
struct LayerDiagnostics {
  double residual_rms = 0;       // the block's input
  double attention_rms = 0;      // attention's output, the residual branch it adds
  double ffn_rms = 0;            // the FFN's output, the residual branch it adds
  double attention_entropy = 0;  // nats, mean over heads and query positions
  double grad_attention = 0;     // L2 norm of self_attn.* gradients
  double grad_ffn = 0;           // L2 norm of mlp.* gradients without the router's
  double grad_router = 0;        // L2 norm of mlp.gate.* gradients (MoE)
  FFNStats ffn;                  // router entropy, top-1, logit std, expert output RMS (MoE)
};

class TransformerBlock final : public Layer {
 public:
  // `held`: the experts an MoE FFN keeps (make_ffn).
  TransformerBlock(const LMConfig& config, std::uint64_t seed, HeldExperts held = {});

  // y [B·S, D] from x [B·S, D]; x is kept by reference. Dropout (training only) draws from
  // streams `stream` and `stream + 1` of `dropout_seed` (ops/dropout.hpp).
  void forward(Tensor& y, const Tensor& x, std::int64_t seq, bool train, std::uint64_t dropout_seed,
               std::uint64_t stream);
  // dx [B·S, D] (overwritten); parameter gradients accumulate.
  void backward(Tensor& dx, const Tensor& dy);

  ParameterSet& parameters() override { return params_; }
  // Of the last training forward and the gradients now accumulated. The residual branches' RMS
  // are those of the last training forward made while set_diagnostics(true) (the default).
  LayerDiagnostics diagnostics() const;
  // Whether training forwards measure the residual branches for diagnostics(): a pass over each
  // branch, which a trainer skips on the steps it does not report.
  void set_diagnostics(bool on) { diagnose_ = on; }
  FeedForward& ffn() { return *ffn_; }
  const FeedForward& ffn() const { return *ffn_; }
  void set_precision(Precision p);
  // Data parallelism (FeedForward::set_data_parallel): the tokens' place in the whole batch,
  // for the dropout masks and the FFN.
  void set_data_parallel(ProcessGroup* group, std::int64_t first_token, bool expert_parallel,
                         ProcessGroup* expert_group = nullptr);

 private:
  void bind_parameters() override;

  bool pre_norm_;
  float dropout_;
  Norm norm1_, norm2_;
  Attention attn_;
  std::unique_ptr<FeedForward> ffn_;
  ParameterSet params_;
  // Saved by forward: [T, D] each. The residual branches (attention's and the FFN's outputs)
  // and the backward's gradients are not kept: they live in the thread's scratch, shared by
  // every block (scratch.hpp).
  bool train_ = false;
  std::uint64_t dropout_seed_ = 0, stream_ = 0;
  std::uint64_t dropout_first_ = 0;  // element index of the first token's first value
  Tensor x_, n1_, h_, n2_, z_;
  bool diagnose_ = true;
  double attention_rms_ = 0, ffn_rms_ = 0;  // of the last training forward that measured them
};

}  // namespace ffnlab
