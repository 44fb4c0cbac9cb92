// The attention layer: one [3D, D] product, RoPE on q and k, ops/attention, the output product.
#include "ffnlab/layers/attention_layer.hpp"

#include <cmath>

#include "check.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/positions.hpp"
#include "ffnlab/scratch.hpp"

namespace ffnlab {

Attention::Attention(const AttentionConfig& config, std::uint64_t seed) : config_(config) {
  const std::int64_t D = config_.d_model, H = config_.heads;
  check(D > 0 && H > 0 && D % H == 0, "[attention] d_model = {} is not a multiple of heads = {}", D,
        H);
  check(!config_.rope || (D / H) % 2 == 0, "[attention] RoPE needs an even head size, got {}",
        D / H);
  for (const char* n : {"q_proj", "k_proj", "v_proj"})
    params_.declare(std::string(n) + ".weight", {D, D});
  if (config_.bias)
    for (const char* n : {"q_proj", "k_proj", "v_proj"})
      params_.declare(std::string(n) + ".bias", {D});
  params_.declare("o_proj.weight", {D, D});
  if (config_.bias) params_.declare("o_proj.bias", {D});
  params_.allocate();
  bind_parameters();
  std::mt19937_64 rng(seed);
  const float bound = 1.f / std::sqrt(static_cast<float>(D));  // torch.nn.Linear's default
  init_uniform(w_qkv_, bound, rng);
  init_uniform(w_o_, bound, rng);
  if (config_.bias) {
    init_uniform(b_qkv_, bound, rng);
    init_uniform(b_o_, bound, rng);
  }
}

void Attention::bind_parameters() {
  const std::int64_t D = config_.d_model;
  w_qkv_ = params_.value_span("q_proj.weight", {3 * D, D});
  dw_qkv_ = params_.grad_span("q_proj.weight", {3 * D, D});
  w_o_ = params_.at("o_proj.weight").value;
  dw_o_ = params_.at("o_proj.weight").grad;
  if (config_.bias) {
    b_qkv_ = params_.value_span("q_proj.bias", {3 * D});
    db_qkv_ = params_.grad_span("q_proj.bias", {3 * D});
    b_o_ = params_.at("o_proj.bias").value;
    db_o_ = params_.at("o_proj.bias").grad;
  }
}

void Attention::forward(Tensor& y, const Tensor& x, std::int64_t seq, bool train) {
  const std::int64_t D = config_.d_model;
  check(x.rank() == 2 && x.dim(1) == D && seq > 0 && x.dim(0) % seq == 0,
        "[attention] input {} is not [B·{}, {}]", shape_string(x.shape()), seq, D);
  x_ = Tensor();  // set once this forward has finished: a failed one leaves no backward
  seq_ = seq;
  // Training with native bf16 products converts x, a and the weights once, for this forward's
  // products and the backward's (converts_operands_once); at many rows the weights are packed
  // instead (packs_weights); otherwise matmul reads these tensors.
  operands_.start(train, precision_, x.dim(0));
  const ProductOperands& operand = operands_;
  // The projections are read by this forward only (the backward reads the cache's head-major
  // copies), so every layer writes them into one shared tensor.
  Tensor& qkv = scratch(Scratch::attn_qkv, {x.dim(0), 3 * D});
  linear_forward(qkv, operand(x16_, x), operand.weight(w_qkv_operand_, w_qkv_),
                 config_.bias ? &b_qkv_ : nullptr, precision_, nullptr, false,
                 operand.forward_packing(w_qkv_operand_));
  if (config_.rope) rope_forward(qkv, seq, 2 * D, D / config_.heads, config_.rope_theta);
  attention_forward(a_, cache_, qkv, seq, config_.heads, config_.causal, precision_);
  y.ensure({x.dim(0), D});
  linear_forward(y, operand(a16_, a_), operand.weight(w_o_operand_, w_o_),
                 config_.bias ? &b_o_ : nullptr, precision_, nullptr, false,
                 operand.forward_packing(w_o_operand_));
  x_ = train ? x : Tensor();
}

void Attention::backward(Tensor& dx, const Tensor& dy) {
  check(x_.defined(), "[attention] backward needs a training forward");
  operands_.check_unchanged(precision_, "[attention]");
  const std::int64_t D = config_.d_model;
  Tensor& da = scratch(Scratch::attn_da, a_.shape());
  Tensor& dqkv = scratch(Scratch::attn_dqkv, {x_.dim(0), 3 * D});
  // The products read what the forward's did; each gradient is converted once for its two.
  const ProductOperands& op = operands_;
  linear_backward(&da, dw_o_, nullptr, op.gradient(dy), op.saved(a16_, a_),
                  op.saved_weight(w_o_operand_, w_o_), precision_, false,
                  op.dx_packing(w_o_operand_));
  if (config_.bias) bias_backward(db_o_, dy);
  attention_backward(dqkv, da, cache_, seq_, config_.heads, config_.causal, precision_);
  if (config_.rope) rope_backward(dqkv, seq_, 2 * D, D / config_.heads, config_.rope_theta);
  dx.ensure(x_.shape());
  linear_backward(&dx, dw_qkv_, nullptr, op.gradient(dqkv), op.saved(x16_, x_),
                  op.saved_weight(w_qkv_operand_, w_qkv_), precision_, false,
                  op.dx_packing(w_qkv_operand_));
  if (config_.bias) bias_backward(db_qkv_, dqkv);
}

double Attention::entropy() const {
  if (!cache_.p.defined() || cache_.p.numel() == 0) return 0.0;
  const std::int64_t rows = cache_.p.dim(0) * cache_.p.dim(1), S = cache_.p.dim(2);
  const float* p = cache_.p.f32();
  double h = 0;
  for (std::int64_t i = 0; i < rows * S; ++i)
    if (p[i] > 0.f) h -= static_cast<double>(p[i]) * std::log(static_cast<double>(p[i]));
  return h / static_cast<double>(rows);
}

}  // namespace ffnlab
