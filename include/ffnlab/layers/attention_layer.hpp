// Attention: multi-head self-attention with q/k/v/o projections (Hugging Face LLaMA names:
// q_proj, k_proj, v_proj, o_proj, each [D, D] like torch.nn.Linear.weight), optional biases and
// optional rotary embeddings of q and k. q, k and v are declared next to each other, so the
// input side is one [3D, D] product.
#pragma once

#include "ffnlab/layers/layer.hpp"
#include "ffnlab/ops/attention.hpp"
#include "ffnlab/ops/linear.hpp"

namespace ffnlab {

struct AttentionConfig {
  std::int64_t d_model = 128;
  std::int64_t heads = 4;
  bool bias = true;
  bool causal = true;
  bool rope = false;
  float rope_theta = 10000.f;
};

class Attention final : public Layer {
 public:
  Attention(const AttentionConfig& config, std::uint64_t seed);

  // y [B·S, D] from x [B·S, D] (B sequences of S tokens); x is kept by reference. train: a
  // backward follows (bf16 products keep their converted operands for it).
  void forward(Tensor& y, const Tensor& x, std::int64_t seq, bool train = true);
  // dx [B·S, D] (overwritten); parameter gradients accumulate.
  void backward(Tensor& dx, const Tensor& dy);
  ParameterSet& parameters() override { return params_; }
  const AttentionConfig& config() const { return config_; }
  // Mean over heads and query positions of the entropy of the attention probabilities (nats),
  // of the last forward; 0 before any.
  double entropy() const;
  void set_precision(Precision p) { precision_ = p; }

 private:
  void bind_parameters() override;

  AttentionConfig config_;
  Precision precision_ = Precision::f32;
  ParameterSet params_;
  Tensor w_qkv_, b_qkv_, w_o_, b_o_;      // [3D, D], [3D], [D, D], [D]
  Tensor dw_qkv_, db_qkv_, dw_o_, db_o_;  // same shapes
  std::int64_t seq_ = 0;
  Tensor x_;  // saved input [T, D]
  Tensor a_;  // [T, D] attention output before o_proj
  // What the products read (ops/linear.hpp); when it keeps copies, bf16 x [T, D], a [T, D],
  // w_qkv [3D, D] and w_o [D, D] made by the forward for its products and the backward's.
  ProductOperands operands_;
  Tensor x16_, a16_;
  ProductWeight w_qkv_operand_, w_o_operand_;
  AttentionCache cache_;  // per-head copies and probabilities (the projections are scratch)
};

}  // namespace ffnlab
