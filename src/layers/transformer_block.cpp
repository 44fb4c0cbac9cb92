// One Transformer block: norms, attention, FFN, dropout and residual adds, in pre- or post-norm
// order. The block's parameters are its four children's, one after the other.
#include "ffnlab/layers/transformer_block.hpp"

#include <cmath>
#include <string>

#include "check.hpp"
#include "ffnlab/ops/dropout.hpp"
#include "ffnlab/scratch.hpp"

namespace ffnlab {

namespace {

AttentionConfig attention_config(const LMConfig& c) {
  return {c.d_model,   c.heads, c.attn_bias, c.causal, c.positions == PositionKind::rope,
          c.rope_theta};
}

// y = a + b (y may be a or b).
void add(Tensor& y, const Tensor& a, const Tensor& b) {
  y.ensure(a.shape());
  const std::int64_t n = a.numel();
  const float *ap = a.f32(), *bp = b.f32();
  float* yp = y.f32();
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) yp[i] = ap[i] + bp[i];
}

double rms(const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return 0.0;
  const float* v = t.f32();
  double q = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) q += static_cast<double>(v[i]) * v[i];
  return std::sqrt(q / static_cast<double>(t.numel()));
}

const char* const kNorm1 = "input_layernorm.";
const char* const kNorm2 = "post_attention_layernorm.";
const char* const kAttn = "self_attn.";
const char* const kFFN = "mlp.";

}  // namespace

TransformerBlock::TransformerBlock(const LMConfig& c, std::uint64_t seed, HeldExperts held)
    : pre_norm_(c.pre_norm),
      dropout_(c.dropout),
      norm1_(c.norm, c.d_model, c.norm_eps),
      norm2_(c.norm, c.d_model, c.norm_eps),
      attn_(attention_config(c), seed),
      ffn_(make_ffn(c.ffn, seed + 1, held)) {
  params_.declare_all(norm1_.parameters(), kNorm1);
  params_.declare_all(attn_.parameters(), kAttn);
  params_.declare_all(norm2_.parameters(), kNorm2);
  params_.declare_all(ffn_->parameters(), kFFN);
  params_.allocate();
  bind_parameters();
}

void TransformerBlock::bind_parameters() {
  auto move = [&](Layer& child, const char* prefix) {
    child.move_parameters(params_.child_values(child.parameters(), prefix),
                          params_.child_grads(child.parameters(), prefix));
  };
  move(norm1_, kNorm1);
  move(attn_, kAttn);
  move(norm2_, kNorm2);
  move(*ffn_, kFFN);
}

void TransformerBlock::set_precision(Precision p) {
  attn_.set_precision(p);
  ffn_->set_precision(p);
}

void TransformerBlock::set_data_parallel(ProcessGroup* group, std::int64_t first_token,
                                         bool expert_parallel, ProcessGroup* expert_group) {
  dropout_first_ = static_cast<std::uint64_t>(first_token * ffn_->config().d_model);
  ffn_->set_data_parallel(group, first_token, expert_parallel, expert_group);
}

void TransformerBlock::forward(Tensor& y, const Tensor& x, std::int64_t seq, bool train,
                               std::uint64_t dropout_seed, std::uint64_t stream) {
  train_ = false;  // set once this forward has finished: a failed one leaves no backward
  dropout_seed_ = dropout_seed;
  stream_ = stream;
  const float p = train ? dropout_ : 0.f;
  const bool measure = train && diagnose_;
  x_ = x;
  ffn_->context().sequence = seq;
  // The branches a and f are read by this forward only (the backward needs neither).
  Tensor& a = scratch(Scratch::block_a);
  Tensor& f = scratch(Scratch::block_f);
  if (pre_norm_) {
    norm1_.forward(n1_, x);
    attn_.forward(a, n1_, seq, train);
    if (p > 0.f) dropout_forward(a, a, p, dropout_seed, stream, dropout_first_);
    if (measure) attention_rms_ = rms(a);
    add(h_, x, a);
    norm2_.forward(n2_, h_);
    ffn_->forward(f, n2_, train);
    if (p > 0.f) dropout_forward(f, f, p, dropout_seed, stream + 1, dropout_first_);
    if (measure) ffn_rms_ = rms(f);
    add(y, h_, f);
  } else {
    attn_.forward(a, x, seq, train);
    if (p > 0.f) dropout_forward(a, a, p, dropout_seed, stream, dropout_first_);
    if (measure) attention_rms_ = rms(a);
    add(n1_, x, a);  // n1_ holds x + a, the input of norm1
    norm1_.forward(h_, n1_);
    ffn_->forward(f, h_, train);
    if (p > 0.f) dropout_forward(f, f, p, dropout_seed, stream + 1, dropout_first_);
    if (measure) ffn_rms_ = rms(f);
    add(z_, h_, f);
    norm2_.forward(y, z_);
  }
  train_ = train;
}

void TransformerBlock::backward(Tensor& dx, const Tensor& dy) {
  check(train_, "[block] backward needs a training forward");
  // One block's backward runs at a time: its three gradients are the thread's, shared by every
  // block (they were 3·T·D floats a layer).
  Tensor& d1 = scratch(Scratch::block_d1);
  Tensor& d2 = scratch(Scratch::block_d2);
  Tensor& d3 = scratch(Scratch::block_d3);
  // The gradient through a residual branch's dropout: g itself when there is no dropout (no copy),
  // else g ⊙ mask/(1 − p) written into the workspace ws.
  auto dropped = [&](Tensor& ws, const Tensor& g, std::uint64_t stream) -> const Tensor& {
    if (dropout_ == 0.f) return g;
    dropout_backward(ws, g, dropout_, dropout_seed_, stream, dropout_first_);
    return ws;
  };
  if (pre_norm_) {
    // d1 = ∂/∂f, d2 = ∂/∂n2 then ∂/∂h, d3 = ∂/∂a then ∂/∂n1
    ffn_->backward(d2, dropped(d1, dy, stream_ + 1));
    norm2_.backward(d3, d2);
    add(d2, d3, dy);  // dh
    attn_.backward(d1, dropped(d3, d2, stream_));
    norm1_.backward(dx, d1);
    add(dx, dx, d2);
  } else {
    norm2_.backward(d1, dy);  // ∂/∂z
    ffn_->backward(d3, dropped(d2, d1, stream_ + 1));
    add(d3, d3, d1);          // dh
    norm1_.backward(d1, d3);  // ∂/∂(x + a)
    attn_.backward(dx, dropped(d2, d1, stream_));
    add(dx, dx, d1);
  }
}

LayerDiagnostics TransformerBlock::diagnostics() const {
  LayerDiagnostics d;
  d.residual_rms = rms(x_);
  d.attention_rms = attention_rms_;
  d.ffn_rms = ffn_rms_;
  d.attention_entropy = attn_.entropy();
  d.ffn = ffn_->diagnostic_stats();
  // Gradient norms by the parameters' names in this block.
  const std::string router = std::string(kFFN) + "gate.";
  for (const Parameter& p : params_.list()) {
    double* into = p.name.starts_with(kAttn)    ? &d.grad_attention
                   : p.name.starts_with(router) ? &d.grad_router
                   : p.name.starts_with(kFFN)   ? &d.grad_ffn
                                                : nullptr;
    if (!into) continue;
    const float* g = p.grad.f32();
    for (std::int64_t k = 0; k < p.grad.numel(); ++k) *into += static_cast<double>(g[k]) * g[k];
  }
  d.grad_attention = std::sqrt(d.grad_attention);
  d.grad_ffn = std::sqrt(d.grad_ffn);
  d.grad_router = std::sqrt(d.grad_router);
  return d;
}

}  // namespace ffnlab
