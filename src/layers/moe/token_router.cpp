// The token router: its parameters and state, the logits and their noise, routing, the
// backward, and the updates between steps (token_router.hpp).
#include "ffnlab/layers/moe/token_router.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "check.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/ops/dropout.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/scratch.hpp"

namespace ffnlab {

namespace {
float softplus(float v) {
  return v > 20.0f ? v : std::log1p(std::exp(v));
}
float sigmoid(float v) {
  return 1.0f / (1.0f + std::exp(-v));
}
}  // namespace

TokenRouter::TokenRouter(const FFNConfig& layer, std::uint64_t seed)
    : layer_(layer),
      linear_(routing_family(layer.moe.routing).router_linear),
      l1_penalty_(routing_family(layer.moe.routing).own_loss != nullptr),
      noise_seed_(seed ^ 0x6a09e667f3bcc909ull) {
  step_load_.assign(static_cast<std::size_t>(layer_.moe.num_experts), 0);
}

void TokenRouter::declare(ParameterSet& params) const {
  const MoEConfig& m = layer_.moe;
  const std::int64_t D = layer_.d_model, E = m.routed_experts();
  if (!linear_) return;  // (hash routing: no parameters)
  params.declare("gate.weight", {E, D});
  if (m.router_bias) params.declare("gate.bias", {E});
  if (m.noisy_topk) params.declare("gate.noise.weight", {E, D});
  if (m.balance_bias) params.declare("gate.e_score_correction_bias", {E}, /*trainable=*/false);
  if (l1_penalty_) params.declare("gate.l1_coef", {1}, /*trainable=*/false);
}

void TokenRouter::declare_gate_map(ParameterSet& params) const {
  const std::int64_t E = layer_.moe.routed_experts();
  if (layer_.moe.gating_residual) params.declare("gate.gate_map.weight", {E, E});
}

void TokenRouter::bind(ParameterSet& params) {
  const MoEConfig& m = layer_.moe;
  auto bind = [&params](const std::string& name, Tensor& value, Tensor& grad) {
    value = params.at(name).value;
    grad = params.at(name).grad;
  };
  if (!linear_) return;
  bind("gate.weight", router_, drouter_);
  if (m.router_bias) bind("gate.bias", router_bias_, drouter_bias_);
  if (m.noisy_topk) bind("gate.noise.weight", noise_, dnoise_);
  if (m.gating_residual) bind("gate.gate_map.weight", gate_map_, dgate_map_);
  if (m.balance_bias) balance_bias_ = params.at("gate.e_score_correction_bias").value;
  if (l1_penalty_) l1_coef_ = params.at("gate.l1_coef").value;
}

void TokenRouter::init(std::mt19937_64& rng) {
  const MoEConfig& m = layer_.moe;
  if (!linear_) return;
  const float in_bound = 1.0f / std::sqrt(static_cast<float>(layer_.d_model));
  init_uniform(router_, in_bound, rng);
  if (m.router_bias) init_uniform(router_bias_, in_bound, rng);
  if (m.noisy_topk) init_uniform(noise_, in_bound, rng);
  if (l1_penalty_) l1_coef_.f32()[0] = m.l1_coef_init;
}

void TokenRouter::init_gate_map(std::mt19937_64& rng) {
  if (layer_.moe.gating_residual)  // torch.nn.Linear(E, E), as MoE++'s gate_map
    init_uniform(gate_map_, 1.0f / std::sqrt(static_cast<float>(layer_.moe.routed_experts())), rng);
}

void TokenRouter::set_random_stream(std::uint64_t seed, std::uint64_t stream) {
  noise_seed_ = seed ^ 0x6a09e667f3bcc909ull;
  noise_stream_ = stream + 1;
}

void TokenRouter::forward(Routing& r, const Tensor& x, const FFNContext& context,
                          std::int64_t first_token, ProcessGroup* group, bool train) {
  const MoEConfig& m = layer_.moe;
  ChoiceInput choice;
  choice.tokens = x.dim(0);
  choice.token_ids = context.token_ids;
  choice.sequence = context.sequence;
  // Training-only routing (noise, jitter, BASE's assignment) and the counts the next optimizer
  // step follows, unless the caller evaluates.
  const bool stochastic = train && context.stochastic;
  choice.train = stochastic;
  choice.group = group;
  jittered_ = stochastic && m.jitter > 0;
  noised_ = stochastic && m.noisy_topk;
  if (!linear_) {  // the choice is given (hash routing)
    check(!routing_family(m.routing).needs_token_ids || choice.tokens == 0 ||
              choice.token_ids != nullptr,
          "[moe] routing '{}' chooses by token id: the layer's context needs the tokens' ids "
          "(a Transformer hands them over; a lone layer takes them with context().token_ids)",
          enum_name(m.routing));
    route(r, m, choice);
    assign_rows(r, m, group);
    if (stochastic)
      for (int e = 0; e < m.num_experts; ++e) step_load_[e] += r.load[e];
    return;
  }
  const Tensor* gate_residual = m.gating_residual ? context.previous_logits : nullptr;
  check(!m.gating_residual || context.first_layer ||
            (gate_residual != nullptr && gate_residual->defined()),
        "[moe] gating_residual: no gate residual (the previous MoE layer's logits) was given; a "
        "model's first MoE layer, which has none, says so (context().first_layer; Python: "
        "first=True; ffnlab run: --first-layer)");
  const std::int64_t T = x.dim(0), D = layer_.d_model, E = m.routed_experts();  // logits columns
  const Tensor* in = &x;
  if (jittered_) {
    jitter_.ensure({T, D});
    x_router_.ensure({T, D});
    // Uniform in [1 − jitter, 1 + jitter], a function of (seed, stream, the element's place in
    // the whole batch): the same draws for any thread count or number of ranks.
    float* j = jitter_.f32();
    const auto first = static_cast<std::uint64_t>(first_token * D);
#pragma omp parallel for schedule(static) if (T * D > 65536)
    for (std::int64_t i = 0; i < T * D; ++i)
      j[i] = 1.0f - m.jitter +
             2.0f * m.jitter * dropout_uniform(noise_seed_, noise_stream_, first + i);
    const float* xs = x.f32();
    float* xr = x_router_.f32();
    for (std::int64_t i = 0; i < T * D; ++i) xr[i] = xs[i] * j[i];
    in = &x_router_;
  }
  logits_.ensure({T, E});
  linear_forward(logits_, *in, router_, m.router_bias ? &router_bias_ : nullptr);
  residual_ = Tensor();
  if (m.gating_residual && gate_residual != nullptr && gate_residual->defined()) {
    // MoE++: logits += G·W_gᵀ, G the previous MoE layer's logits (kept for backward).
    const Tensor& g = *gate_residual;
    check(g.rank() == 2 && g.dim(0) == T && g.dim(1) == E,
          "[moe] the gate residual {} must be the previous MoE layer's logits [{}, {}]",
          shape_string(g.shape()), T, E);
    residual_ = g;
    mapped_.ensure({T, E});
    linear_forward(mapped_, g, gate_map_, nullptr);
    float* l = logits_.f32();
    const float* r = mapped_.f32();
    for (std::int64_t i = 0; i < T * E; ++i) l[i] += r[i];
  }
  if (noised_) {
    noise_pre_.ensure({T, E});
    noise_eps_.ensure({T, E});
    linear_forward(noise_pre_, *in, noise_, nullptr);
    float* eps = noise_eps_.f32();
    float* l = logits_.f32();
    const float* pre = noise_pre_.f32();
    // N(0, 1) by Box–Muller from two counter-based uniforms per element (stream + 2^32 keeps
    // them apart from the jitter's).
    const std::uint64_t stream = noise_stream_ + (std::uint64_t{1} << 32);
    const auto first = static_cast<std::uint64_t>(first_token * E);
    for (std::int64_t i = 0; i < T * E; ++i) {
      const std::uint64_t at = 2 * (first + static_cast<std::uint64_t>(i));
      const double u1 = dropout_uniform(noise_seed_, stream, at) + 0x1p-25;  // (0, 1)
      const double u2 = dropout_uniform(noise_seed_, stream, at + 1);
      eps[i] =
          static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
      l[i] += eps[i] * softplus(pre[i]);
    }
  }
  choice.logits = logits_.f32();
  choice.selection_bias = m.balance_bias ? balance_bias_.f32() : nullptr;
  route(r, m, choice);
  assign_rows(r, m, group);
  if (stochastic) {  // (an evaluation's tokens move no balancing bias nor λ)
    for (int e = 0; e < m.num_experts; ++e) step_load_[e] += r.load[e];
    if (l1_penalty_) {  // positive gates, of T·E
      std::int64_t active = 0;
      for (auto n : r.load) active += n;
      step_gates_ += {static_cast<double>(active), static_cast<double>(r.total_tokens) * r.experts};
    }
  }
}

// The combine weights and auxiliary losses back to the logits, then to W_r and x (dx += ...).
void TokenRouter::backward(Tensor& dx, const Routing& r, const float* dweight, const Tensor& x,
                           const Tensor* logits_grad, float aux_scale) {
  if (!linear_) return;  // nothing to learn (hash routing)
  const MoEConfig& m = layer_.moe;
  const std::int64_t T = x.dim(0), D = layer_.d_model, E = m.routed_experts();
  dlogits_.ensure({T, E});
  route_backward(dlogits_, r, dweight, m, aux_scale, l1_coef());
  if (logits_grad != nullptr && logits_grad->defined()) {
    // The next MoE layer's gating residual read these logits: its gradient joins theirs.
    const Tensor& g = *logits_grad;
    check(g.rank() == 2 && g.dim(0) == T && g.dim(1) == E,
          "[moe] the router logits' gradient {} must be [{}, {}]", shape_string(g.shape()), T, E);
    float* dl = dlogits_.f32();
    const float* dg = g.f32();
    for (std::int64_t i = 0; i < T * E; ++i) dl[i] += dg[i];
  }
  if (residual_.defined()) {  // logits += G·W_gᵀ: dW_g += dlogitsᵀ·G, dG = dlogits·W_g
    dresidual_.ensure({T, E});
    linear_backward(&dresidual_, dgate_map_, nullptr, dlogits_, residual_, gate_map_);
  } else {
    dresidual_ = Tensor();
  }
  const bool jitter = jittered_;  // what the forward did
  const Tensor& rin = jitter ? x_router_ : x;
  Tensor& dx_router = scratch(Scratch::moe_dx_router, {T, D});
  linear_backward(&dx_router, drouter_, m.router_bias ? &drouter_bias_ : nullptr, dlogits_, rin,
                  router_);
  float* dxr = dx_router.f32();
  if (noised_) {
    // logits = clean + ε·softplus(pre): ∂/∂pre = ε·σ(pre).
    dnoise_pre_.ensure({T, E});
    float* dpre = dnoise_pre_.f32();
    const float* dl = dlogits_.f32();
    const float* eps = noise_eps_.f32();
    const float* pre = noise_pre_.f32();
    for (std::int64_t i = 0; i < T * E; ++i) dpre[i] = dl[i] * eps[i] * sigmoid(pre[i]);
    Tensor& dx_noise = scratch(Scratch::moe_dx_extra, {T, D});
    linear_backward(&dx_noise, dnoise_, nullptr, dnoise_pre_, rin, noise_);
    const float* dxn = dx_noise.f32();
    for (std::int64_t i = 0; i < T * D; ++i) dxr[i] += dxn[i];
  }
  float* out = dx.f32();
  const float* j = jitter ? jitter_.f32() : nullptr;
#pragma omp parallel for simd schedule(static) if (T * D > 65536)
  for (std::int64_t i = 0; i < T * D; ++i) out[i] += j ? dxr[i] * j[i] : dxr[i];
}

ModelSums TokenRouter::model_sums() const {
  if (!l1_penalty_) return {};
  return {{"relu_gates", {step_gates_.active, step_gates_.gates}}};
}

void TokenRouter::after_optimizer_step(const ModelSums* model) {
  const MoEConfig& m = layer_.moe;
  if (l1_penalty_) {
    // ReMoE's controller: λ grows while the gates are less sparse than the target, shrinks
    // otherwise. No training forward since the last step: nothing to follow. λ stays a normal
    // float (whatever it came in as: a checkpoint's may be smaller): at the two smallest
    // subnormals a step of 1.2 either way rounds back, and a λ shrunk there by a long stretch
    // of gates sparser than the target could never grow again.
    GateActivity a = step_gates_;
    if (model) {
      const auto it = model->find("relu_gates");
      a = it != model->end() && it->second.size() == 2 ? GateActivity{it->second[0], it->second[1]}
                                                       : GateActivity{};
    }
    if (a.gates > 0) {
      float& lambda = l1_coef_.f32()[0];
      lambda = std::max(
          a.sparsity() < m.sparsity_target() ? lambda * m.l1_coef_rate : lambda / m.l1_coef_rate,
          std::numeric_limits<float>::min());
    }
    step_gates_ = {};
  }
  if (m.balance_bias) {
    double mean = 0;
    for (auto l : step_load_) mean += static_cast<double>(l);
    mean /= m.num_experts;
    float* b = balance_bias_.f32();
    for (int e = 0; e < m.num_experts; ++e) {
      const double gap = mean - static_cast<double>(step_load_[e]);
      b[e] += m.balance_rate * static_cast<float>((gap > 0) - (gap < 0));
    }
  }
  std::fill(step_load_.begin(), step_load_.end(), 0);
}

}  // namespace ffnlab
