// Closed-form costs; docs/costs.md derives every term.
#include "ffnlab/analysis/costs.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "check.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/limits.hpp"

namespace ffnlab {

namespace {

constexpr const char* kParams = "[costs] parameter count";
std::int64_t mul(std::int64_t a, std::int64_t b) {
  return checked_mul(a, b, kParams);
}
std::int64_t add(std::int64_t a, std::int64_t b) {
  return checked_add(a, b, kParams);
}

// Every count below 2^53, so that the FLOPs and bytes computed in doubles from them are exact
// (their terms are products and sums of non-negative integers no larger than the totals).
void check_exact(double value, const char* what) {
  check(value < static_cast<double>(limits::kExact),
        "[costs] {} = {:.4g} is above 2^53 and cannot be computed exactly", what, value);
}

// Costs of one dense FFN (plain, glu, multi_branch), per token.
struct Dense {
  std::int64_t params;
  FlopCount fwd, bwd;
  double saved;  // floats saved for backward per token
};

Dense dense_cost(const FFNConfig& c) {
  const double D = static_cast<double>(c.d_model), F = static_cast<double>(c.d_ff);
  const int n = c.gated_branches();
  const std::int64_t Pi = c.in_width();  // width of the input projection
  const double P = static_cast<double>(Pi);
  Dense d{};
  d.params = checked_add(mul(Pi, c.d_model), mul(c.d_model, c.d_ff), kParams);
  if (c.bias) d.params = add(d.params, add(Pi, c.d_model));
  d.fwd.matmul = 2 * D * P + 2 * F * D;
  d.bwd.matmul = 2 * d.fwd.matmul;  // dX and dW of both products
  const double bias = c.bias ? P + D : 0;
  if (n == 0) {
    d.fwd.elementwise = bias + F;      // bias adds, one activation per hidden unit
    d.bwd.elementwise = bias + 2 * F;  // bias gradients; act'(a) and its product with dh
  } else {
    // n·F activations, n·F products, (n-1)·F sums; backward per branch: act'(g), act(g) and
    // three products (dh·u·act'(g), dh·act(g)).
    d.fwd.elementwise = bias + n * F + n * F + (n - 1) * F;
    d.bwd.elementwise = bias + 5.0 * n * F;
  }
  d.saved = D + P + F;  // x, the pre-activation a, the hidden h
  return d;
}

}  // namespace

std::int64_t count_params(const FFNConfig& c) {
  return ffn_cost(c, 1).params;
}

double experts_per_token(const FFNConfig& c, std::int64_t sequence) {
  if (c.kind != FFNKind::moe) return 0;
  const auto& m = c.moe;
  // top_k: an upper bound when zero-computation experts may take some choices (and top_p's
  // cap); ReLU routing: the mean its penalty holds, N·(1 - target sparsity); expert choice: the
  // mean its capacity gives, c·k (c = capacity_factor, 1 when 0; per sequence of S it is
  // ceil(c·k·S/N)·N/S, a little more when c·k·S/N is not whole); Soft MoE: E·p slots per
  // sequence of S tokens, E·p/S.
  const auto own = routing_family(m.routing).experts_per_token;
  return own ? own(m, sequence) : m.top_k;
}

FFNCost ffn_cost(const FFNConfig& c, std::int64_t tokens) {
  validate(c);
  check(tokens >= 0, "[costs] tokens = {} must not be negative", tokens);
  FFNCost out;
  if (c.kind != FFNKind::moe) {
    const Dense d = dense_cost(c);
    out.params = out.active_params = d.params;
    out.forward = d.fwd;
    out.backward = d.bwd;
    out.saved_floats_per_token = d.saved;
  } else {
    const auto& m = c.moe;
    // E: the router's columns (FFN experts, then MoE++'s zero-computation ones). K: FFN experts
    // a token runs (experts_per_token).
    const double D = static_cast<double>(c.d_model), E = m.routed_experts();
    const RoutingFamily& family = routing_family(m.routing);
    const bool soft = family.own_path;  // Soft MoE: slots instead of a router Linear
    const double K = experts_per_token(c, tokens);
    const Dense expert = dense_cost(expert_config(c));
    const Dense shared = dense_cost(expert_config(c, true));
    // Noisy top-k trains a second Linear(D, E) without bias for the noise scale.
    // The router scores the zero-computation experts too; the constant ones have [2, D] + [D].
    const int routed = m.routed_experts();
    // MoE++'s gating residual adds gate.gate_map.weight [E, E] and G·W_gᵀ to the logits (the
    // first MoE layer of a model has no G: counted as if it had, an upper bound of 2·E² FLOPs).
    const std::int64_t gate_map = m.gating_residual ? mul(routed, routed) : 0;
    // A routing without a router Linear (hash routing) has no router parameters or products.
    const bool linear = family.router_linear;
    const double RE = linear || soft ? E : 0;  // the router's columns it scores
    const std::int64_t router =
        soft      ? add(mul(mul(c.d_model, m.num_experts), m.slots), 1)  // gate.phi, gate.scale
        : !linear ? 0
                  : add(add(add(mul(mul(c.d_model, routed), m.noisy_topk ? 2 : 1),
                                m.router_bias ? routed : 0),
                            mul(m.constant_experts, mul(3, c.d_model))),
                        gate_map);
    const double G = static_cast<double>(gate_map);
    const std::int64_t gate = m.shared_gate ? c.d_model : 0;  // Linear(D, 1) without bias
    const bool has_shared = m.num_shared > 0;
    const std::int64_t shared_params = has_shared ? add(shared.params, gate) : 0;
    out.params = add(add(router, mul(m.num_experts, expert.params)), shared_params);
    const auto active_experts =
        family.experts_per_token
            ? static_cast<std::int64_t>(std::llround(K * static_cast<double>(expert.params)))
            : mul(m.top_k, expert.params);
    out.active_params = add(add(router, active_experts), shared_params);
    // Router: logits (product), bias, softmax (exp, sum, divide), top-k scan, renormalise.
    // Combine: K weighted sums of D-vectors.
    // (Soft MoE: the logits against E·p slots, and the dispatch and combine products, 2·E·p·D
    // each per token.)
    out.forward.matmul = soft ? 6 * D * m.num_experts * m.slots + K * expert.fwd.matmul
                              : 2 * D * RE + 2 * G + K * expert.fwd.matmul;
    out.forward.elementwise = (m.router_bias ? RE : 0) + (G > 0 ? E : 0) + 3 * RE + E + K +
                              K * expert.fwd.elementwise + 2 * K * D;
    out.backward.matmul = soft ? 12 * D * m.num_experts * m.slots + K * expert.bwd.matmul
                               : 2 * 2 * D * RE + 2 * 2 * G + K * expert.bwd.matmul;
    out.backward.elementwise = (m.router_bias ? RE : 0) + 3 * RE + K + K * expert.bwd.elementwise +
                               2 * K * D + 2 * K * D;  // dy·w_k into experts; <dy, y_k> for w_k
    // The shared experts are one dense FFN of width num_shared·shared_d_ff (expert_config).
    if (has_shared) {
      const bool g = m.shared_gate;
      out.forward.matmul += shared.fwd.matmul + (g ? 2 * D : 0);
      out.forward.elementwise += shared.fwd.elementwise + (g ? 1 + D : 0) + D;
      out.backward.matmul += shared.bwd.matmul + (g ? 4 * D : 0);
      out.backward.elementwise += shared.bwd.elementwise + (g ? 2 + 2 * D : 0);
    }
    // x, router probabilities, per assignment a permuted copy of x plus the expert's a, h and
    // output (for the gradient of its combine weight); shared experts' saved tensors.
    out.saved_floats_per_token = D + E + K * (expert.saved + D) +
                                 (has_shared ? shared.saved - D + (m.shared_gate ? 1 + D : 0) : 0);
  }
  check_exact(static_cast<double>(out.params), "the parameter count");
  check_exact(out.forward.total(), "forward FLOPs per token");
  check_exact(out.backward.total(), "backward FLOPs per token");
  const double P = static_cast<double>(out.params);
  const double act = out.saved_floats_per_token * static_cast<double>(tokens);
  check_exact(act, "the saved activations");
  out.f32 = MemoryBytes{4 * P, 4 * P, 8 * P, 4 * act};
  out.bf16 = MemoryBytes{2 * P, 2 * P, 8 * P, 2 * act};
  return out;
}

TransformerCost transformer_cost(const LMConfig& c, std::int64_t seq, bool with_embeddings) {
  validate(c);
  check(seq > 0 && seq <= c.context, "[costs] seq = {} must be in [1, context = {}]", seq,
        c.context);
  const std::int64_t D = c.d_model, L = c.layers, V = c.vocab;
  const double Dd = static_cast<double>(D), S = static_cast<double>(seq);
  const FFNCost ffn = ffn_cost(c.ffn, seq);  // (Soft MoE's compute a token depends on seq)
  const std::int64_t norm_params = c.norm == NormKind::layernorm ? 2 * D : D;
  const double norm_flops = c.norm == NormKind::layernorm ? 5 * Dd : 4 * Dd;
  TransformerCost t;
  t.ffn_params = mul(L, ffn.params);
  t.attention_params = mul(L, add(mul(4, mul(D, D)), c.attn_bias ? 4 * D : 0));
  t.norm_params = mul(2 * L + (c.final_norm ? 1 : 0), norm_params);
  if (with_embeddings)
    t.embedding_params =
        add(add(mul(V, D), c.positions == PositionKind::learned ? mul(c.context, D) : 0),
            c.tied_head ? 0 : mul(V, D));
  t.params = add(add(t.ffn_params, t.attention_params), add(t.norm_params, t.embedding_params));
  check_exact(static_cast<double>(t.params), "the parameter count");

  t.ffn_forward_flops = static_cast<double>(L) * ffn.forward.total();
  t.attention_forward_flops =
      static_cast<double>(L) * (8 * Dd * Dd + (c.attn_bias ? 4 * Dd : 0) + 4 * S * Dd +
                                3 * static_cast<double>(c.heads) * S);
  const double norms = (2.0 * L + (c.final_norm ? 1 : 0)) * norm_flops + 2.0 * L * Dd;
  t.head_forward_flops =
      with_embeddings ? 2 * Dd * static_cast<double>(V) + 3 * static_cast<double>(V) : 0;
  t.forward_flops = t.ffn_forward_flops + t.attention_forward_flops + norms + t.head_forward_flops;
  check_exact(t.forward_flops, "forward FLOPs per token");
  return t;
}

std::int64_t held_params(const LMConfig& c, int experts) {
  const std::int64_t all = transformer_cost(c, 1).params;
  if (c.ffn.kind != FFNKind::moe) return all;
  check(experts > 0 && experts <= c.ffn.moe.num_experts,
        "[costs] a layer of {} experts cannot hold {}", c.ffn.moe.num_experts, experts);
  const std::int64_t per_expert = count_params(expert_config(c.ffn));
  return all - mul(c.layers, mul(c.ffn.moe.num_experts - experts, per_expert));
}

}  // namespace ffnlab

namespace ffnlab {

nlohmann::ordered_json to_json(const FFNCost& k) {
  auto memory = [](const MemoryBytes& m) {
    return nlohmann::ordered_json{{"weights", m.weights},
                                  {"grads", m.grads},
                                  {"adam", m.adam},
                                  {"activations", m.activations},
                                  {"total", m.total()}};
  };
  return {{"params", k.params},
          {"active_params", k.active_params},
          {"flops_per_token",
           {{"forward_matmul", k.forward.matmul},
            {"forward_elementwise", k.forward.elementwise},
            {"backward_matmul", k.backward.matmul},
            {"backward_elementwise", k.backward.elementwise}}},
          {"saved_floats_per_token", k.saved_floats_per_token},
          {"memory_bytes", {{"f32", memory(k.f32)}, {"bf16", memory(k.bf16)}}}};
}

nlohmann::ordered_json to_json(const TransformerCost& t) {
  return {{"params", t.params},
          {"ffn_params", t.ffn_params},
          {"attention_params", t.attention_params},
          {"norm_params", t.norm_params},
          {"embedding_params", t.embedding_params},
          {"forward_flops_per_token", t.forward_flops},
          {"ffn_forward_flops_per_token", t.ffn_forward_flops},
          {"attention_forward_flops_per_token", t.attention_forward_flops},
          {"head_forward_flops_per_token", t.head_forward_flops},
          {"ffn_param_share", static_cast<double>(t.ffn_params) / static_cast<double>(t.params)},
          {"ffn_flop_share", t.ffn_forward_flops / t.forward_flops}};
}

FFNConfig match_params(FFNConfig c, std::int64_t target, bool active) {
  auto params = [&](std::int64_t f) {
    if (c.kind == FFNKind::moe)
      c.moe.expert_d_ff = f;
    else
      c.d_ff = f;
    const FFNCost k = ffn_cost(c, 1);
    return active ? k.active_params : k.params;
  };
  // Parameters are affine in the width (docs/costs.md): solve for it, then take the closer of
  // the two multiples of 8 around the solution (the narrower one on a tie).
  const double p8 = static_cast<double>(params(8)), slope = (params(16) - p8) / 8.0;
  const double exact = 8.0 + (static_cast<double>(target) - p8) / slope;
  const double widest = static_cast<double>(limits::kWidth / 8 * 8);
  const auto below =
      static_cast<std::int64_t>(std::clamp(std::floor(exact / 8.0) * 8.0, 8.0, widest));
  const std::int64_t above = std::min<std::int64_t>(below + 8, limits::kWidth / 8 * 8);
  const double gap_below = std::abs(static_cast<double>(params(below) - target));
  const double gap_above = std::abs(static_cast<double>(params(above) - target));
  params(gap_above < gap_below ? above : below);
  return c;
}

FFNConfig train_ffn(std::string_view variant, std::int64_t d_model, std::int64_t d_ff, bool bias) {
  FFNConfig c = variant_config(variant, d_model, 1, bias);
  c.d_ff = d_ff > 0 ? d_ff : default_d_ff(c);
  if (c.kind == FFNKind::moe) c.moe.aux_coef = kTrainAuxCoef;
  return c;
}

std::int64_t default_d_ff(const FFNConfig& c) {
  if (c.kind != FFNKind::glu) return 4 * c.d_model;
  FFNConfig plain = c;
  plain.kind = FFNKind::plain;
  plain.d_ff = 4 * c.d_model;
  return match_params(c, count_params(plain)).d_ff;
}

}  // namespace ffnlab
