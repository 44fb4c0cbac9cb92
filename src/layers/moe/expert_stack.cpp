// The expert stack: its parameters, and its products block by block (see expert_stack.hpp).
#include "ffnlab/layers/moe/expert_stack.hpp"

#include <cmath>

#include "check.hpp"
#include "ffnlab/ops/glu.hpp"
#include "ffnlab/scratch.hpp"

namespace ffnlab {

namespace {

// Calls f(e, rows) for every expert with tokens, with `rows(t)` the expert's block of the
// permuted buffer t. Experts without tokens are skipped: they cost nothing.
template <typename Fn>
void for_each_block(const std::vector<std::int64_t>& offsets, int first_expert, Fn f) {
  for (std::size_t i = 0; i + 1 < offsets.size(); ++i) {
    const std::int64_t begin = offsets[i], end = offsets[i + 1];
    if (begin == end) continue;
    f(first_expert + static_cast<int>(i),
      [begin, end](const Tensor& t) { return t.rows(begin, end); });
  }
}

// Matrix e of a stack [E, rows, cols].
Tensor slice(const Tensor& stack, int e, std::int64_t rows, std::int64_t cols) {
  return stack.view(e * rows * cols, {rows, cols});
}

}  // namespace

ExpertStack::ExpertStack(const FFNConfig& layer, HeldExperts held)
    : layer_(layer), expert_(expert_config(layer)), held_(held), in_width_(expert_.in_width()) {}

std::vector<std::string> ExpertStack::in_names(const FFNConfig& c, int e) {
  const std::string p = "experts." + std::to_string(e) + ".";
  if (c.moe.naming == MoENaming::mixtral) return {p + "w1", p + "w3"};
  if (c.moe.expert_kind == FFNKind::glu) return {p + "gate_proj", p + "up_proj"};
  return {p + "up_proj"};
}

std::string ExpertStack::out_name(const FFNConfig& c, int e) {
  const std::string p = "experts." + std::to_string(e) + ".";
  return c.moe.naming == MoENaming::mixtral ? p + "w2" : p + "down_proj";
}

void ExpertStack::declare(ParameterSet& params) const {
  const std::int64_t D = layer_.d_model, F = expert_.d_ff;
  const int e0 = held_.first, e1 = held_.first + held_.count;
  for (int e = e0; e < e1; ++e)
    for (const auto& n : in_names(layer_, e)) params.declare(n + ".weight", {F, D});
  if (layer_.bias)
    for (int e = e0; e < e1; ++e)
      for (const auto& n : in_names(layer_, e)) params.declare(n + ".bias", {F});
  for (int e = e0; e < e1; ++e) params.declare(out_name(layer_, e) + ".weight", {D, F});
  if (layer_.bias)
    for (int e = e0; e < e1; ++e) params.declare(out_name(layer_, e) + ".bias", {D});
}

void ExpertStack::bind(ParameterSet& params) {
  const std::int64_t D = layer_.d_model, E = held_.count, F = expert_.d_ff, P = in_width_;
  // A stack of every expert's tensors, which are adjacent in the buffer.
  auto bind_span = [&params](const std::string& first, const Shape& shape, Tensor& value,
                             Tensor& grad) {
    value = params.value_span(first, shape);
    grad = params.grad_span(first, shape);
  };
  const std::string in0 = in_names(layer_, held_.first)[0], out0 = out_name(layer_, held_.first);
  bind_span(in0 + ".weight", {E, P, D}, w_in_, dw_in_);
  bind_span(out0 + ".weight", {E, D, F}, w_out_, dw_out_);
  if (layer_.bias) {
    bind_span(in0 + ".bias", {E, P}, w_in_bias_, dw_in_bias_);
    bind_span(out0 + ".bias", {E, D}, w_out_bias_, dw_out_bias_);
  }
}

void ExpertStack::init(std::mt19937_64& rng) {
  const std::int64_t D = layer_.d_model, E = layer_.moe.num_experts, F = expert_.d_ff,
                     P = in_width_;
  const float in_bound = 1.0f / std::sqrt(static_cast<float>(D));
  const float out_bound = 1.0f / std::sqrt(static_cast<float>(F));
  const int e0 = held_.first;
  init_uniform_part(w_in_, in_bound, rng, e0 * P * D, E * P * D);
  init_uniform_part(w_out_, out_bound, rng, e0 * D * F, E * D * F);
  if (layer_.bias) {
    init_uniform_part(w_in_bias_, in_bound, rng, e0 * P, E * P);
    init_uniform_part(w_out_bias_, out_bound, rng, e0 * D, E * D);
  }
}

const Tensor& ExpertStack::forward(const std::vector<std::int64_t>& offsets, ProcessGroup* group,
                                   bool train, Precision precision) {
  const int E = layer_.moe.num_experts;
  const std::vector<std::int64_t>* here = &offsets;
  int first_expert = 0;
  exchanged_ = group != nullptr;
  if (exchanged_) {
    exchange_.plan(*group, offsets, E);
    check(held_.count == E || exchange_.first_expert() == held_.first,
          "[moe] this layer holds experts from {}, but its rank of the expert group computes "
          "experts from {}",
          held_.first, exchange_.first_expert());
    exchange_.dispatch(rows_.xp, rows_.xp_local);
    here = &exchange_.offsets();
    first_expert = exchange_.first_expert();
  }
  blocks_forward(*here, first_expert, train, precision);
  if (exchanged_) exchange_.combine(rows_.op_local, rows_.op);
  return output();
}

Tensor& ExpertStack::backward(const Tensor& dop, const std::vector<std::int64_t>& offsets,
                              Precision precision) {
  // Expert parallel: the output gradients go where their rows were computed (dispatch), the
  // input gradients come back (combine).
  const Tensor* grads = &dop;
  const std::vector<std::int64_t>* here = &offsets;
  int first_expert = 0;
  if (exchanged_) {
    exchange_.dispatch(ep_dop_, dop);
    grads = &ep_dop_;
    here = &exchange_.offsets();
    first_expert = exchange_.first_expert();
  }
  Tensor& dxp = blocks_backward(*grads, *here, first_expert, precision);
  if (!exchanged_) return dxp;
  exchange_.combine(ep_dxp_, dxp);
  return ep_dxp_;
}

void ExpertStack::set_inference_weights(DType dtype) {
  inference_.set(dtype, w_in_, w_out_);
}

std::vector<Tensor> ExpertStack::grads() const {
  std::vector<Tensor> out{dw_in_, dw_out_};
  if (layer_.bias) {
    out.push_back(dw_in_bias_);
    out.push_back(dw_out_bias_);
  }
  return out;
}

void ExpertStack::blocks_forward(const std::vector<std::int64_t>& offsets, int first_expert,
                                 bool train, Precision layer_precision) {
  const std::int64_t D = layer_.d_model, F = expert_.d_ff, P = in_width_;
  Rows& c = rows_;
  const InferenceCopy::Read w = inference_.read(train, w_in_, w_out_, layer_precision);
  const int branches = expert_.gated_branches();
  // Expert e's place in the stacks of the experts this layer holds.
  auto in_bias = [&](int i) { return layer_.bias ? w_in_bias_.view(i * P, {P}) : Tensor(); };
  auto out_bias = [&](int i) { return layer_.bias ? w_out_bias_.view(i * D, {D}) : Tensor(); };
  const std::int64_t rows_here = c.xp.dim(0);
  const bool fused_act = mix_in_epilogue(layer_.act, branches, train);
  if (!fused_act) c.ap.ensure({rows_here, P});
  c.hp.ensure({rows_here, F});
  c.op.ensure({rows_here, D});
  // Each expert's block makes DenseFFN's choices (ffn_products.hpp): in inference a block of a
  // few rows (every block in decode, most at small T) streams its expert's weights once;
  // otherwise linear_forward, which streams few-row f32 products too and runs larger blocks as
  // a few fixed-shape oneDNN products (varying_rows).
  // Training with native bf16 products converts the rows once and each computed expert's
  // weights once, for this forward's products and the backward's (converts_operands_once);
  // otherwise matmul reads these tensors. The bf16 stacks hold the experts of this call
  // (first_expert onwards), so expert parallelism converts only its own.
  operands_.start(train, w.precision);
  const bool copies = operands_.copies();
  const std::int64_t experts_here = static_cast<std::int64_t>(offsets.size()) - 1;
  if (copies) {
    product_operand(c.xp16, c.xp);
    c.hp16.ensure({rows_here, F}, DType::bf16);
    w_in16_.ensure({experts_here, P, D}, DType::bf16);
    w_out16_.ensure({experts_here, D, F}, DType::bf16);
  }
  for_each_block(offsets, first_expert, [&](int e, auto rows) {
    const int i = e - held_.first;
    const Tensor bi = in_bias(i), bo = out_bias(i);
    Tensor h = rows(c.hp), o = rows(c.op);
    Tensor a = fused_act ? Tensor() : rows(c.ap);  // the pre-activation, when it is kept
    const Tensor* b_in = layer_.bias ? &bi : nullptr;
    const Tensor* b_out = layer_.bias ? &bo : nullptr;
    const Tensor w_in_e = slice(w.w_in, i, P, D), w_out_e = slice(w.w_out, i, D, F);
    const InferenceCopy::Read we{w_in_e, w_out_e, w.bf16_copy, w.precision};
    if (ffn_block_stream(o, h, rows(c.xp), we, b_in, b_out, layer_.act, branches, train,
                         layer_precision, /*varying_rows=*/true))
      return;
    if (!copies) {
      const BlockOperands op{rows(c.xp), w_in_e, b_in, nullptr, w_out_e, b_out, nullptr, nullptr};
      ffn_block_products(o, h, a, op, layer_.act, branches, train, w.precision,
                         /*varying_rows=*/true);
      return;
    }
    // Views of the bf16 copies, written in place.
    Tensor w_in16 = slice(w_in16_, e - first_expert, P, D);
    Tensor w_out16 = slice(w_out16_, e - first_expert, D, F);
    Tensor h16 = rows(c.hp16);
    const BlockOperands op{rows(c.xp16),
                           product_operand(w_in16, w_in_e),
                           b_in,
                           nullptr,
                           product_operand(w_out16, w_out_e),
                           b_out,
                           nullptr,
                           &h16};
    ffn_block_products(o, h, a, op, layer_.act, branches, train, w.precision,
                       /*varying_rows=*/true);
  });
}

Tensor& ExpertStack::blocks_backward(const Tensor& dop, const std::vector<std::int64_t>& offsets,
                                     int first_expert, Precision precision) {
  const std::int64_t D = layer_.d_model, F = expert_.d_ff, P = in_width_;
  const Rows& c = rows_;
  const std::int64_t rows_here = c.xp.dim(0);
  Tensor& dhp = scratch(Scratch::moe_dhp, {rows_here, F});
  Tensor& dap = scratch(Scratch::moe_dap, {rows_here, P});
  Tensor& dxp = scratch(Scratch::moe_dxp, {rows_here, D});
  // The products read what the forward's did (its bf16 copies, if it made them: expert e at
  // e - first_expert); each gradient is converted once for its two products, into one scratch
  // slot: dop's copy is done with when dap's is made.
  const ProductOperands& op = operands_;
  const Tensor& xs = op.saved(c.xp16, c.xp);
  const Tensor& hs = op.saved(c.hp16, c.hp);
  auto w_in_of = [&](int e, int i) {
    return op.copies() ? slice(w_in16_, e - first_expert, P, D) : slice(w_in_, i, P, D);
  };
  auto w_out_of = [&](int e, int i) {
    return op.copies() ? slice(w_out16_, e - first_expert, D, F) : slice(w_out_, i, D, F);
  };
  {
    const Tensor& dops = op.gradient(dop);
    for_each_block(offsets, first_expert, [&](int e, auto rows) {
      const int i = e - held_.first;  // its place in the held experts' stacks
      Tensor dh = rows(dhp), dw = slice(dw_out_, i, D, F);
      linear_backward(&dh, dw, nullptr, rows(dops), rows(hs), w_out_of(e, i), precision,
                      /*varying_rows=*/true);
      if (layer_.bias) {
        Tensor db = dw_out_bias_.view(i * D, {D});
        bias_backward(db, rows(dop));
      }
    });
  }
  if (rows_here > 0) mix_backward(dap, dhp, c.ap, c.hp, layer_.act, expert_.gated_branches());
  const Tensor& daps = op.gradient(dap);
  for_each_block(offsets, first_expert, [&](int e, auto rows) {
    const int i = e - held_.first;
    Tensor dxe = rows(dxp), dw = slice(dw_in_, i, P, D);
    linear_backward(&dxe, dw, nullptr, rows(daps), rows(xs), w_in_of(e, i), precision,
                    /*varying_rows=*/true);
    if (layer_.bias) {
      Tensor db = dw_in_bias_.view(i * P, {P});
      bias_backward(db, rows(dap));
    }
  });
  return dxp;
}

}  // namespace ffnlab
