// MoEFFN: parameter layout, routing, grouped expert products, shared experts, backward.
#include "ffnlab/layers/moe_ffn.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "check.hpp"
#include "ffnlab/ops/dropout.hpp"
#include "ffnlab/ops/glu.hpp"
#include "ffnlab/ops/l2_normalize.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/matmul.hpp"
#include "ffnlab/ops/permute.hpp"
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

MoEFFN::MoEFFN(const FFNConfig& config, std::uint64_t seed, HeldExperts held)
    : config_(config), held_(held) {
  validate(config_);
  check(config_.kind == FFNKind::moe, "[moe] MoEFFN needs kind 'moe', got '{}'",
        enum_name(config_.kind));
  const MoEConfig& m = config_.moe;
  const std::int64_t D = config_.d_model, E = m.num_experts, routed = m.routed_experts();
  if (held_.count == 0) held_ = {0, static_cast<int>(E)};
  check(held_.first >= 0 && held_.count > 0 && held_.first + held_.count <= E,
        "[moe] experts [{}, {}) are not experts of a layer of {}", held_.first,
        held_.first + held_.count, E);
  check(held_.count == E || m.routing != RoutingKind::soft,
        "[moe] Soft MoE does not split its experts (its slots mix every token of a sequence)");
  experts_.emplace(config_, held_);

  // The router scores the FFN experts and then the zero-computation ones; Soft MoE has slots'
  // parameters instead (E·p rows) and their scale.
  const bool soft = m.routing == RoutingKind::soft;
  if (soft) {
    soft_.emplace(config_);
    soft_->declare(params_);
  } else {
    params_.declare("gate.weight", {routed, D});
    if (m.router_bias) params_.declare("gate.bias", {routed});
  }
  if (m.noisy_topk) params_.declare("gate.noise.weight", {routed, D});
  if (m.balance_bias)
    params_.declare("gate.e_score_correction_bias", {routed}, /*trainable=*/false);
  if (m.routing == RoutingKind::relu) params_.declare("gate.l1_coef", {1}, /*trainable=*/false);
  experts_->declare(params_);
  if (m.num_shared > 0) {
    shared_.emplace(config_, seed);
    shared_->declare(params_);
  }
  if (m.zc_experts() > 0) {
    zc_.emplace(config_);
    zc_->declare(params_);
  }
  if (m.gating_residual) params_.declare("gate.gate_map.weight", {routed, routed});
  params_.allocate();
  bind_parameters();

  // torch.nn.Linear's initialisation for every Linear, expert by expert.
  std::mt19937_64 rng(seed);
  const float in_bound = 1.0f / std::sqrt(static_cast<float>(D));
  if (soft) {
    soft_->init(rng);
  } else {
    init_uniform(w_.router, in_bound, rng);
    if (m.router_bias) init_uniform(w_.router_bias, in_bound, rng);
  }
  if (m.noisy_topk) init_uniform(w_.noise, in_bound, rng);
  experts_->init(rng);  // every expert's values drawn, the held ones kept
  if (shared_) shared_->init(rng);
  if (m.routing == RoutingKind::relu) w_.l1_coef.f32()[0] = m.l1_coef_init;
  if (zc_) zc_->init(rng);  // MoE++: v_i ~ N(0, 1), W_c,i as torch.nn.Linear
  // Drawn last, so that a config without it keeps the initialisation it had.
  if (m.gating_residual)  // torch.nn.Linear(E, E), as MoE++'s gate_map
    init_uniform(w_.gate_map, 1.0f / std::sqrt(static_cast<float>(routed)), rng);
  noise_seed_ = seed ^ 0x6a09e667f3bcc909ull;
  step_load_.assign(E, 0);
}

void MoEFFN::set_random_stream(std::uint64_t seed, std::uint64_t stream) {
  noise_seed_ = seed ^ 0x6a09e667f3bcc909ull;
  noise_stream_ = stream + 1;
}

void MoEFFN::bind_parameters() {
  const MoEConfig& m = config_.moe;
  auto bind = [this](const std::string& name, Tensor& value, Tensor& grad) {
    value = params_.at(name).value;
    grad = params_.at(name).grad;
  };
  if (soft_) {
    soft_->bind(params_);
  } else {
    bind("gate.weight", w_.router, dw_.router);
    if (m.router_bias) bind("gate.bias", w_.router_bias, dw_.router_bias);
  }
  if (m.noisy_topk) bind("gate.noise.weight", w_.noise, dw_.noise);
  if (m.gating_residual) bind("gate.gate_map.weight", w_.gate_map, dw_.gate_map);
  if (m.balance_bias) w_.balance_bias = params_.at("gate.e_score_correction_bias").value;
  if (m.routing == RoutingKind::relu) w_.l1_coef = params_.at("gate.l1_coef").value;
  experts_->bind(params_);
  if (shared_) shared_->bind(params_);
  if (zc_) zc_->bind(params_);
}

void MoEFFN::router_forward(const Tensor& x, bool train) {
  const MoEConfig& m = config_.moe;
  const std::int64_t T = x.dim(0), D = config_.d_model, E = m.routed_experts();  // logits columns
  RouterCache& c = router_;
  const Tensor* in = &x;
  if (train && m.jitter > 0) {
    c.jitter.ensure({T, D});
    c.x_router.ensure({T, D});
    // Uniform in [1 − jitter, 1 + jitter], a function of (seed, stream, the element's place in
    // the whole batch): the same draws for any thread count or number of ranks.
    float* j = c.jitter.f32();
    const auto first = static_cast<std::uint64_t>(first_token_ * D);
#pragma omp parallel for schedule(static) if (T * D > 65536)
    for (std::int64_t i = 0; i < T * D; ++i)
      j[i] = 1.0f - m.jitter +
             2.0f * m.jitter * dropout_uniform(noise_seed_, noise_stream_, first + i);
    const float* xs = x.f32();
    float* xr = c.x_router.f32();
    for (std::int64_t i = 0; i < T * D; ++i) xr[i] = xs[i] * j[i];
    in = &c.x_router;
  }
  c.logits.ensure({T, E});
  linear_forward(c.logits, *in, w_.router, m.router_bias ? &w_.router_bias : nullptr);
  c.residual = Tensor();
  if (m.gating_residual && gate_residual_ != nullptr) {
    // MoE++: logits += G·W_gᵀ, G the previous MoE layer's logits (kept for backward).
    const Tensor& g = *gate_residual_;
    check(g.rank() == 2 && g.dim(0) == T && g.dim(1) == E,
          "[moe] the gate residual {} must be the previous MoE layer's logits [{}, {}]",
          shape_string(g.shape()), T, E);
    c.residual = g;
    c.mapped.ensure({T, E});
    linear_forward(c.mapped, g, w_.gate_map, nullptr);
    float* l = c.logits.f32();
    const float* r = c.mapped.f32();
    for (std::int64_t i = 0; i < T * E; ++i) l[i] += r[i];
  }
  if (train && m.noisy_topk) {
    c.noise_pre.ensure({T, E});
    c.noise_eps.ensure({T, E});
    linear_forward(c.noise_pre, *in, w_.noise, nullptr);
    float* eps = c.noise_eps.f32();
    float* l = c.logits.f32();
    const float* pre = c.noise_pre.f32();
    // N(0, 1) by Box–Muller from two counter-based uniforms per element (stream + 2^32 keeps
    // them apart from the jitter's).
    const std::uint64_t stream = noise_stream_ + (std::uint64_t{1} << 32);
    const auto first = static_cast<std::uint64_t>(first_token_ * E);
    for (std::int64_t i = 0; i < T * E; ++i) {
      const std::uint64_t at = 2 * (first + static_cast<std::uint64_t>(i));
      const double u1 = dropout_uniform(noise_seed_, stream, at) + 0x1p-25;  // (0, 1)
      const double u2 = dropout_uniform(noise_seed_, stream, at + 1);
      eps[i] =
          static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
      l[i] += eps[i] * softplus(pre[i]);
    }
  }
  ProcessGroup* group = train ? group_ : nullptr;  // inference forwards route their own tokens
  route(routing_, c.logits, m.balance_bias ? w_.balance_bias.f32() : nullptr, m, group, sequence_);
  assign_rows(routing_, m, group);
}

void MoEFFN::experts_forward(Tensor& y, const Tensor& x, bool train) {
  const std::int64_t T = x.dim(0), D = config_.d_model;
  const Routing& r = routing_;
  // Expert parallel: the rows go to the ranks that own their experts, and this rank's experts
  // get theirs from every rank.
  // A layer holding only its share of the experts exchanges in inference too (every rank of
  // the expert group then makes the same forwards).
  const bool exchanged = expert_parallel_ && (train || held_.count < config_.moe.num_experts);
  check(exchanged || held_.count == config_.moe.num_experts,
        "[moe] this layer holds experts [{}, {}) of {}: it runs in an expert-parallel run, whose "
        "other ranks hold the rest",
        held_.first, held_.first + held_.count, config_.moe.num_experts);
  permute_rows(experts_->input(exchanged), x, r.token_of_row.data(), r.kept());
  const Tensor& out =
      experts_->forward(r.offsets, exchanged ? expert_group_ : nullptr, train, precision_);
  y.ensure({T, D});
  unpermute_rows(y, out, r.slot.data(), r.weight.data(), r.k, /*accumulate=*/false);
}

void MoEFFN::forward(Tensor& y, const Tensor& x, bool train) {
  const std::int64_t D = config_.d_model;
  check(x.rank() == 2 && x.dim(1) == D, "[moe] input {} must be [T, {}]", shape_string(x.shape()),
        D);
  if (looks_at_whole_sequence(config_.moe.routing)) {
    const std::int64_t S = sequence_ > 0 ? sequence_ : x.dim(0);
    check(S > 1 || x.dim(0) == 0,
          "[moe] {} routing looks at the whole sequence: one token at a time (decode) is not a "
          "sequence; run it on whole sequences",
          enum_name(config_.moe.routing));
    check(x.dim(0) == 0 || x.dim(0) % S == 0, "[moe] {} tokens are not whole sequences of {}",
          x.dim(0), S);
  }
  if (train && experts_->has_inference_copy()) set_inference_weights(DType::f32);
  if (soft_) {
    check(!(train && expert_parallel_),
          "[moe] Soft MoE does not split its experts over ranks (expert parallelism): train it "
          "with data parallelism alone");
    soft_->forward(y, routing_, x, sequence_, *experts_, train, precision_, group_);
  } else {
    router_forward(x, train);
    experts_forward(y, x, train);
  }
  if (zc_) zc_->forward(y, x, routing_);
  if (shared_) shared_->forward(y, x, train, precision_);
  if (train) {
    for (int e = 0; e < config_.moe.num_experts; ++e) step_load_[e] += routing_.load[e];
    if (config_.moe.routing == RoutingKind::relu) {  // positive gates, of T·E
      std::int64_t active = 0;
      for (auto n : routing_.load) active += n;
      step_gates_ += {static_cast<double>(active),
                      static_cast<double>(routing_.total_tokens) * routing_.experts};
    }
  }
  saved_ = train;
  router_.x = train ? x : Tensor();
}

void MoEFFN::backward(Tensor& dx, const Tensor& dy) {
  check(saved_, "[moe] backward needs a forward with train = true first");
  experts_->check_unchanged(precision_);
  const std::int64_t T = router_.x.dim(0), D = config_.d_model;
  check(dy.rank() == 2 && dy.dim(0) == T && dy.dim(1) == D,
        "[moe] dy {} must match the forward's output [{}, {}]", shape_string(dy.shape()), T, D);
  if (soft_) {
    soft_->backward(dx, dy, router_.x, *experts_, precision_);
  } else {
    combine_backward(dy);
    experts_backward(dx);
    if (zc_) zc_->backward(dx, ws_.dweight.data(), dy, router_.x, routing_);
    router_backward(dx);
  }
  if (shared_) shared_->backward(dx, dy, router_.x);
}

// y = Σ_j w_j·O[slot_j]: the rows' gradients and the combine weights' gradients.
void MoEFFN::combine_backward(const Tensor& dy) {
  const Routing& r = routing_;
  ws_.dweight.resize(static_cast<std::size_t>(r.tokens * r.k));
  Tensor& dop = scratch(Scratch::moe_dop, {r.kept(), config_.d_model});
  unpermute_rows_backward(dop, ws_.dweight.data(), dy, experts_->output(), r.slot.data(),
                          r.weight.data(), r.k);
}

// The experts, block by block; dx (overwritten) gets the permuted rows' input gradients.
void MoEFFN::experts_backward(Tensor& dx) {
  const std::int64_t T = router_.x.dim(0), D = config_.d_model;
  const Routing& r = routing_;
  const Tensor& dop = scratch(Scratch::moe_dop, {r.kept(), D});  // from combine_backward
  const Tensor& dxp = experts_->backward(dop, r.offsets, precision_);
  dx.ensure({T, D});
  permute_rows_backward(dx, dxp, r.slot.data(), r.k, /*accumulate=*/false);
}

std::vector<Tensor> MoEFFN::expert_grads() {
  return experts_->grads();
}

// The combine weights and auxiliary losses back to the logits, then to W_r and x (dx += ...).
void MoEFFN::router_backward(Tensor& dx) {
  const MoEConfig& m = config_.moe;
  const std::int64_t T = router_.x.dim(0), D = config_.d_model, E = m.routed_experts();
  const RouterCache& c = router_;
  Workspace& w = ws_;
  w.dlogits.ensure({T, E});
  route_backward(w.dlogits, routing_, w.dweight.data(), m, aux_loss_scale_, l1_coef());
  if (router_logits_grad_ != nullptr && router_logits_grad_->defined()) {
    // The next MoE layer's gating residual read these logits: its gradient joins theirs.
    const Tensor& g = *router_logits_grad_;
    check(g.rank() == 2 && g.dim(0) == T && g.dim(1) == E,
          "[moe] the router logits' gradient {} must be [{}, {}]", shape_string(g.shape()), T, E);
    float* dl = w.dlogits.f32();
    const float* dg = g.f32();
    for (std::int64_t i = 0; i < T * E; ++i) dl[i] += dg[i];
  }
  if (c.residual.defined()) {  // logits += G·W_gᵀ: dW_g += dlogitsᵀ·G, dG = dlogits·W_g
    w.dresidual.ensure({T, E});
    linear_backward(&w.dresidual, dw_.gate_map, nullptr, w.dlogits, c.residual, w_.gate_map);
  } else {
    w.dresidual = Tensor();
  }
  const bool jitter = m.jitter > 0;
  const Tensor& rin = jitter ? c.x_router : c.x;
  Tensor& dx_router = scratch(Scratch::moe_dx_router, {T, D});
  linear_backward(&dx_router, dw_.router, m.router_bias ? &dw_.router_bias : nullptr, w.dlogits,
                  rin, w_.router);
  float* dxr = dx_router.f32();
  if (m.noisy_topk) {
    // logits = clean + ε·softplus(pre): ∂/∂pre = ε·σ(pre).
    w.dnoise_pre.ensure({T, E});
    float* dpre = w.dnoise_pre.f32();
    const float* dl = w.dlogits.f32();
    const float* eps = c.noise_eps.f32();
    const float* pre = c.noise_pre.f32();
    for (std::int64_t i = 0; i < T * E; ++i) dpre[i] = dl[i] * eps[i] * sigmoid(pre[i]);
    Tensor& dx_noise = scratch(Scratch::moe_dx_extra, {T, D});
    linear_backward(&dx_noise, dw_.noise, nullptr, w.dnoise_pre, rin, w_.noise);
    const float* dxn = dx_noise.f32();
    for (std::int64_t i = 0; i < T * D; ++i) dxr[i] += dxn[i];
  }
  float* out = dx.f32();
  const float* j = jitter ? c.jitter.f32() : nullptr;
#pragma omp parallel for simd schedule(static) if (T * D > 65536)
  for (std::int64_t i = 0; i < T * D; ++i) out[i] += j ? dxr[i] * j[i] : dxr[i];
}

void MoEFFN::set_inference_weights(DType dtype) {
  inference_weights_ = dtype;
  experts_->set_inference_weights(dtype);
  if (shared_) shared_->set_inference_weights(dtype);
}

double MoEFFN::aux_loss() const {
  const MoEConfig& m = config_.moe;
  return m.aux_coef * routing_.balance_loss + m.z_coef * routing_.z_loss +
         m.entropy_coef * routing_.entropy + l1_coef() * routing_.l1_loss;
}

float MoEFFN::l1_coef() const {
  return w_.l1_coef.defined() ? w_.l1_coef.f32()[0] : 0.0f;
}

void MoEFFN::after_optimizer_step(const GateActivity* activity) {
  const MoEConfig& m = config_.moe;
  if (m.routing == RoutingKind::relu) {
    // ReMoE's controller: λ grows while the gates are less sparse than the target, shrinks
    // otherwise. No training forward since the last step: nothing to follow.
    const GateActivity& a = activity ? *activity : step_gates_;
    if (a.gates > 0) {
      float& lambda = w_.l1_coef.f32()[0];
      lambda =
          a.sparsity() < m.sparsity_target() ? lambda * m.l1_coef_rate : lambda / m.l1_coef_rate;
    }
    step_gates_ = {};
  }
  if (m.balance_bias) {
    double mean = 0;
    for (auto l : step_load_) mean += static_cast<double>(l);
    mean /= m.num_experts;
    float* b = w_.balance_bias.f32();
    for (int e = 0; e < m.num_experts; ++e) {
      const double gap = mean - static_cast<double>(step_load_[e]);
      b[e] += m.balance_rate * static_cast<float>((gap > 0) - (gap < 0));
    }
  }
  std::fill(step_load_.begin(), step_load_.end(), 0);
}

FFNStats MoEFFN::stats() const {
  FFNStats s;
  const Routing& r = routing_;
  // Over the group's whole batch in data-parallel training (Routing's counts are).
  s.tokens = r.total_tokens;
  const int N = r.ffn_experts;  // the statistics of load are the FFN experts'
  s.num_experts = N;
  if (r.total_tokens == 0) return s;
  s.tokens_per_expert.resize(N);
  double sum = 0, sq = 0, mx = 0;
  int unused = 0;
  std::int64_t kept = 0;
  for (int e = 0; e < N; ++e) {
    const auto n = r.kept_total[e];
    kept += n;
    s.tokens_per_expert[e] = n;
    sum += static_cast<double>(n);
    sq += static_cast<double>(n) * static_cast<double>(n);
    mx = std::max(mx, static_cast<double>(n));
    unused += n == 0;
  }
  const double mean = sum / N;
  s.load_cv = mean > 0 ? std::sqrt(std::max(0.0, sq / N - mean * mean)) / mean : 0.0;
  s.max_over_mean = mean > 0 ? mx / mean : 0.0;
  s.unused_fraction = static_cast<double>(unused) / N;
  std::int64_t assigned = 0, zero_computation = 0;  // FFN assignments, and the others
  for (int e = 0; e < r.experts; ++e) (e < N ? assigned : zero_computation) += r.load[e];
  if (assigned + zero_computation > 0)
    s.zero_computation_fraction =
        static_cast<double>(zero_computation) / static_cast<double>(assigned + zero_computation);
  s.dropped = assigned - kept;
  s.dropped_fraction =
      assigned ? static_cast<double>(s.dropped) / static_cast<double>(assigned) : 0;
  s.experts_per_token = static_cast<double>(assigned) / static_cast<double>(r.total_tokens);
  s.tokens_by_experts = r.per_token;
  s.router_entropy = r.entropy;
  s.top1_prob = r.top1_prob;
  s.l1_coef = l1_coef();
  s.balance_loss = r.balance_loss;
  s.z_loss = r.z_loss;
  const Tensor& hp = experts_->rows().hp;  // (this rank's experts' rows)
  if (saved_ && hp.defined() && hp.numel() > 0)
    s.zero_fraction = zero_fraction(hp.f32(), hp.numel());
  return s;
}

FFNStats MoEFFN::diagnostic_stats() const {
  FFNStats s = stats();
  const Routing& r = routing_;
  if (saved_ && router_.logits.defined() && router_.logits.numel() > 0) {
    const float* z = router_.logits.f32();
    const std::int64_t n = router_.logits.numel();
    double m = 0, q = 0;
    for (std::int64_t i = 0; i < n; ++i) m += z[i];
    m /= static_cast<double>(n);
    for (std::int64_t i = 0; i < n; ++i) q += (z[i] - m) * (z[i] - m);
    s.router_logit_std = std::sqrt(q / static_cast<double>(n));
  }
  const Tensor& op = experts_->rows().op;
  if (saved_ && !experts_->exchanged() && op.defined() &&
      static_cast<int>(r.offsets.size()) == r.ffn_experts + 1) {
    const float* o = op.f32();
    const std::int64_t D = config_.d_model;
    s.expert_output_rms.assign(r.ffn_experts, std::nan(""));
    for (int e = 0; e < r.ffn_experts; ++e) {
      const std::int64_t b = r.offsets[e], end = r.offsets[e + 1];
      if (end <= b || end * D > op.numel()) continue;
      double q = 0;
      for (std::int64_t i = b * D; i < end * D; ++i) q += static_cast<double>(o[i]) * o[i];
      s.expert_output_rms[e] = std::sqrt(q / static_cast<double>((end - b) * D));
    }
  }
  return s;
}

}  // namespace ffnlab
