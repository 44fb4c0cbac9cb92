// DenseFFN: parameter layout, forward and backward for plain, GLU and multi-branch FFNs.
#include "ffnlab/layers/dense_ffn.hpp"

#include <cmath>
#include <string>

#include "check.hpp"
#include "ffnlab/ops/glu.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/scratch.hpp"

namespace ffnlab {

std::vector<std::string> DenseFFN::in_names(const FFNConfig& c) {
  switch (c.kind) {
    case FFNKind::plain:
      return {c.layout == GLULayout::fused ? "dense_h_to_4h" : "up_proj"};
    case FFNKind::glu:
      if (c.layout == GLULayout::fused) return {"dense_h_to_4h"};
      return {"gate_proj", "up_proj"};
    case FFNKind::multi_branch: {
      std::vector<std::string> names;
      for (int b = 0; b < c.branches; ++b) {
        names.push_back("branches." + std::to_string(b) + ".gate_proj");
        names.push_back("branches." + std::to_string(b) + ".up_proj");
      }
      return names;
    }
    default:
      fail("[ffn] DenseFFN cannot build kind '{}'", enum_name(c.kind));
  }
}

std::string DenseFFN::out_name(const FFNConfig& c) {
  return c.layout == GLULayout::fused ? "dense_4h_to_h" : "down_proj";
}

DenseFFN::DenseFFN(const FFNConfig& config, std::uint64_t seed) : config_(config) {
  validate(config_);
  const std::int64_t D = config_.d_model, F = config_.d_ff;
  branches_ = config_.gated_branches();
  in_width_ = config_.in_width();

  const auto names = in_names(config_);
  const std::int64_t rows_each = in_width_ / static_cast<std::int64_t>(names.size());
  for (const auto& n : names) params_.declare(n + ".weight", {rows_each, D});
  if (config_.bias)
    for (const auto& n : names) params_.declare(n + ".bias", {rows_each});
  params_.declare(out_name(config_) + ".weight", {D, F});
  if (config_.bias) params_.declare(out_name(config_) + ".bias", {D});
  params_.allocate();

  bind_parameters();

  // torch.nn.Linear's initialisation, each Linear bounded by 1/√(its input width).
  std::mt19937_64 rng(seed);
  const float in_bound = 1.0f / std::sqrt(static_cast<float>(D));
  const float out_bound = 1.0f / std::sqrt(static_cast<float>(F));
  init_uniform(w_in_, in_bound, rng);
  init_uniform(w_out_, out_bound, rng);
  if (config_.bias) {
    init_uniform(b_in_, in_bound, rng);
    init_uniform(b_out_, out_bound, rng);
  }
}

void DenseFFN::bind_parameters() {
  const std::int64_t D = config_.d_model;
  const auto first = in_names(config_)[0];
  const auto out = out_name(config_);
  w_in_ = params_.value_span(first + ".weight", {in_width_, D});
  dw_in_ = params_.grad_span(first + ".weight", {in_width_, D});
  w_out_ = params_.at(out + ".weight").value;
  dw_out_ = params_.at(out + ".weight").grad;
  if (config_.bias) {
    b_in_ = params_.value_span(first + ".bias", {in_width_});
    db_in_ = params_.grad_span(first + ".bias", {in_width_});
    b_out_ = params_.at(out + ".bias").value;
    db_out_ = params_.at(out + ".bias").grad;
  }
}

void DenseFFN::set_inference_weights(DType dtype) {
  inference_weights_ = dtype;
  inference_.set(dtype, w_in_, w_out_);
}

void DenseFFN::forward(Tensor& y, const Tensor& x, bool train) {
  // What backward reads is this forward's only once it has finished: a forward that throws
  // (bad input, out of memory) leaves no backward to run on half-written activations.
  saved_ = false;
  x_ = Tensor();
  const std::int64_t D = config_.d_model, F = config_.d_ff;
  check(x.rank() == 2 && x.dim(1) == D, "[ffn] input {} must be [T, {}]", shape_string(x.shape()),
        D);
  const std::int64_t T = x.dim(0);
  const Tensor* b_in = config_.bias ? &b_in_ : nullptr;
  const Tensor* b_out = config_.bias ? &b_out_ : nullptr;
  if (train && inference_.defined()) set_inference_weights(DType::f32);
  const InferenceCopy::Read w = inference_.read(train, w_in_, w_out_, precision_);
  h_.ensure({T, F});
  y.ensure({T, D});
  // Decode: each weight row is read once, the mix done as its dot products finish.
  if (ffn_block_stream(y, h_, x, w, b_in, b_out, config_.act, branches_, train, precision_,
                       /*varying_rows=*/false)) {
    finish_forward(x, train);
    return;
  }
  // Training with native bf16 products converts x, h and the weights once, for this forward's
  // products and the backward's (converts_operands_once); at many rows the weights are packed
  // instead (packs_weights); otherwise matmul reads these tensors.
  operands_.start(train, w.precision, T);
  const ProductOperands& operand = operands_;
  if (!mix_in_epilogue(config_.act, branches_, train)) a_.ensure({T, in_width_});
  const BlockOperands op{operand(x16_, x),
                         operand.weight(w_in_operand_, w.w_in),
                         b_in,
                         operand.forward_packing(w_in_operand_),
                         operand.weight(w_out_operand_, w.w_out),
                         b_out,
                         operand.forward_packing(w_out_operand_),
                         operand.copies() ? &h16_ : nullptr};
  ffn_block_products(y, h_, a_, op, config_.act, branches_, train, w.precision,
                     /*varying_rows=*/false);
  finish_forward(x, train);
}

void DenseFFN::finish_forward(const Tensor& x, bool train) {
  saved_ = train;
  x_ = train ? x : Tensor();
}

void DenseFFN::backward(Tensor& dx, const Tensor& dy) {
  check(saved_, "[ffn] backward needs a forward with train = true first");
  operands_.check_unchanged(precision_, "[ffn]");
  const std::int64_t T = x_.dim(0), D = config_.d_model, F = config_.d_ff;
  check(dy.rank() == 2 && dy.dim(0) == T && dy.dim(1) == D,
        "[ffn] dy {} must match the forward's output [{}, {}]", shape_string(dy.shape()), T, D);
  Tensor& dh = scratch(Scratch::ffn_dh, {T, F});
  Tensor& da = scratch(Scratch::ffn_da, {T, in_width_});
  dx.ensure({T, D});
  // The products read what the forward's did; each gradient is converted once for its two.
  const ProductOperands& op = operands_;
  linear_backward(&dh, dw_out_, nullptr, op.gradient(dy), op.saved(h16_, h_),
                  op.saved_weight(w_out_operand_, w_out_), precision_, false,
                  op.dx_packing(w_out_operand_));
  if (config_.bias) bias_backward(db_out_, dy);
  mix_backward(da, dh, a_, h_, config_.act, branches_);
  linear_backward(&dx, dw_in_, nullptr, op.gradient(da), op.saved(x16_, x_),
                  op.saved_weight(w_in_operand_, w_in_), precision_, false,
                  op.dx_packing(w_in_operand_));
  if (config_.bias) bias_backward(db_in_, da);
}

FFNStats DenseFFN::stats() const {
  FFNStats s;
  if (!saved_) return s;
  s.tokens = h_.dim(0);
  s.zero_fraction = zero_fraction(h_.f32(), h_.numel());
  return s;
}

}  // namespace ffnlab
