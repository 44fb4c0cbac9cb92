// MoEFFN: parameter layout, routing, grouped expert products, shared experts, backward.
#include "ffnlab/layers/moe_ffn.hpp"

#include <cmath>
#include <string>

#include "check.hpp"
#include "ffnlab/ops/glu.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/permute.hpp"

namespace ffnlab {

namespace {

// Calls f(e, rows) for every expert with tokens, with `rows(t)` the expert's block of the
// permuted buffer t. Experts without tokens are skipped: they cost nothing.
template <typename Fn>
void for_each_block(const Routing& r, Fn f) {
  for (int e = 0; e < r.experts; ++e) {
    const std::int64_t begin = r.offsets[e], end = r.offsets[e + 1];
    if (begin == end) continue;
    f(e, [begin, end](const Tensor& t) { return t.rows(begin, end); });
  }
}

// Matrix e of a stack [E, rows, cols].
Tensor slice(const Tensor& stack, int e, std::int64_t rows, std::int64_t cols) {
  return stack.view(e * rows * cols, {rows, cols});
}

float softplus(float v) {
  return v > 20.0f ? v : std::log1p(std::exp(v));
}
float sigmoid(float v) {
  return 1.0f / (1.0f + std::exp(-v));
}

}  // namespace

std::vector<std::string> MoEFFN::expert_in_names(const FFNConfig& c, int e) {
  const std::string p = "experts." + std::to_string(e) + ".";
  if (c.moe.naming == MoENaming::mixtral) return {p + "w1", p + "w3"};
  if (c.moe.expert_kind == FFNKind::glu) return {p + "gate_proj", p + "up_proj"};
  return {p + "up_proj"};
}

std::string MoEFFN::expert_out_name(const FFNConfig& c, int e) {
  const std::string p = "experts." + std::to_string(e) + ".";
  return c.moe.naming == MoENaming::mixtral ? p + "w2" : p + "down_proj";
}

std::string MoEFFN::shared_prefix(const FFNConfig& c) {
  return c.moe.naming == MoENaming::qwen2_moe ? "shared_expert." : "shared_experts.";
}

MoEFFN::MoEFFN(const FFNConfig& config, std::uint64_t seed) : config_(config) {
  validate(config_);
  check(config_.kind == FFNKind::moe, "[moe] MoEFFN needs kind 'moe', got '{}'",
        kind_name(config_.kind));
  const MoEConfig& m = config_.moe;
  const std::int64_t D = config_.d_model, E = m.num_experts;
  expert_ = expert_config(config_);
  const std::int64_t F = expert_.d_ff;
  in_width_ = expert_.kind == FFNKind::glu ? 2 * F : F;

  params_.declare("gate.weight", {E, D});
  if (m.router_bias) params_.declare("gate.bias", {E});
  if (m.noisy_topk) params_.declare("gate.noise.weight", {E, D});
  if (m.balance_bias) params_.declare("gate.e_score_correction_bias", {E}, /*trainable=*/false);
  for (int e = 0; e < E; ++e)
    for (const auto& n : expert_in_names(config_, e)) params_.declare(n + ".weight", {F, D});
  if (config_.bias)
    for (int e = 0; e < E; ++e)
      for (const auto& n : expert_in_names(config_, e)) params_.declare(n + ".bias", {F});
  for (int e = 0; e < E; ++e) params_.declare(expert_out_name(config_, e) + ".weight", {D, F});
  if (config_.bias)
    for (int e = 0; e < E; ++e) params_.declare(expert_out_name(config_, e) + ".bias", {D});
  if (m.num_shared > 0) {
    FFNConfig sc = expert_config(config_, /*shared=*/true);
    sc.d_ff = m.num_shared * config_.shared_d_ff();  // n shared experts = one of n times the width
    shared_ = std::make_unique<DenseFFN>(sc, seed ^ 0x9e3779b97f4a7c15ull);
    params_.declare_all(shared_->parameters(), shared_prefix(config_));
    if (m.shared_gate) params_.declare("shared_expert_gate.weight", {1, D});
  }
  params_.allocate();
  bind_parameters();

  // torch.nn.Linear's initialisation for every Linear, expert by expert.
  std::mt19937_64 rng(seed);
  const float in_bound = 1.0f / std::sqrt(static_cast<float>(D));
  const float out_bound = 1.0f / std::sqrt(static_cast<float>(F));
  init_uniform(w_router_, in_bound, rng);
  if (m.router_bias) init_uniform(b_router_, in_bound, rng);
  if (m.noisy_topk) init_uniform(w_noise_, in_bound, rng);
  init_uniform(w_in_, in_bound, rng);
  init_uniform(w_out_, out_bound, rng);
  if (config_.bias) {
    init_uniform(b_in_, in_bound, rng);
    init_uniform(b_out_, out_bound, rng);
  }
  if (m.shared_gate) init_uniform(w_gate_, in_bound, rng);
  rng_.seed(seed ^ 0x6a09e667f3bcc909ull);
  step_load_.assign(E, 0);
}

void MoEFFN::set_random_stream(std::uint64_t seed, std::uint64_t stream) {
  rng_.seed((seed ^ 0x6a09e667f3bcc909ull) + (stream + 1) * 0x9e3779b97f4a7c15ull);
}

void MoEFFN::bind_parameters() {
  const MoEConfig& m = config_.moe;
  const std::int64_t D = config_.d_model, E = m.num_experts, F = expert_.d_ff;
  auto bind = [this](const std::string& name, Tensor& value, Tensor& grad) {
    value = params_.at(name).value;
    grad = params_.at(name).grad;
  };
  bind("gate.weight", w_router_, dw_router_);
  if (m.router_bias) bind("gate.bias", b_router_, db_router_);
  if (m.noisy_topk) bind("gate.noise.weight", w_noise_, dw_noise_);
  if (m.balance_bias) balance_bias_ = params_.at("gate.e_score_correction_bias").value;
  if (m.shared_gate) bind("shared_expert_gate.weight", w_gate_, dw_gate_);
  const std::string in0 = expert_in_names(config_, 0)[0], out0 = expert_out_name(config_, 0);
  w_in_ = params_.value_span(in0 + ".weight", {E, in_width_, D});
  dw_in_ = params_.grad_span(in0 + ".weight", {E, in_width_, D});
  w_out_ = params_.value_span(out0 + ".weight", {E, D, F});
  dw_out_ = params_.grad_span(out0 + ".weight", {E, D, F});
  if (config_.bias) {
    b_in_ = params_.value_span(in0 + ".bias", {E, in_width_});
    db_in_ = params_.grad_span(in0 + ".bias", {E, in_width_});
    b_out_ = params_.value_span(out0 + ".bias", {E, D});
    db_out_ = params_.grad_span(out0 + ".bias", {E, D});
  }
  if (shared_) {  // the shared expert's parameters follow this set's buffer
    const std::string prefix = shared_prefix(config_);
    shared_->move_parameters(params_.child_values(shared_->parameters(), prefix),
                             params_.child_grads(shared_->parameters(), prefix));
  }
}

void MoEFFN::router_forward(const Tensor& x, bool train) {
  const MoEConfig& m = config_.moe;
  const std::int64_t T = x.dim(0), D = config_.d_model, E = m.num_experts;
  const Tensor* in = &x;
  if (train && m.jitter > 0) {
    jitter_.ensure({T, D});
    x_router_.ensure({T, D});
    std::uniform_real_distribution<float> u(1.0f - m.jitter, 1.0f + m.jitter);
    float* j = jitter_.f32();
    for (std::int64_t i = 0; i < T * D; ++i) j[i] = u(rng_);
    const float* xs = x.f32();
    float* xr = x_router_.f32();
    for (std::int64_t i = 0; i < T * D; ++i) xr[i] = xs[i] * j[i];
    in = &x_router_;
  }
  logits_.ensure({T, E});
  linear_forward(logits_, *in, w_router_, m.router_bias ? &b_router_ : nullptr);
  if (train && m.noisy_topk) {
    noise_pre_.ensure({T, E});
    noise_eps_.ensure({T, E});
    linear_forward(noise_pre_, *in, w_noise_, nullptr);
    std::normal_distribution<float> n(0.0f, 1.0f);
    float* eps = noise_eps_.f32();
    float* l = logits_.f32();
    const float* pre = noise_pre_.f32();
    for (std::int64_t i = 0; i < T * E; ++i) {
      eps[i] = n(rng_);
      l[i] += eps[i] * softplus(pre[i]);
    }
  }
  route(routing_, logits_, m.balance_bias ? balance_bias_.f32() : nullptr, m);
  assign_rows(routing_, m);
}

void MoEFFN::forward(Tensor& y, const Tensor& x, bool train) {
  const MoEConfig& m = config_.moe;
  const std::int64_t D = config_.d_model, F = expert_.d_ff, P = in_width_;
  check(x.rank() == 2 && x.dim(1) == D, "[moe] input {} must be [T, {}]", shape_string(x.shape()),
        D);
  const std::int64_t T = x.dim(0);
  router_forward(x, train);
  const Routing& r = routing_;
  const std::int64_t R = r.kept();

  permute_rows(xp_, x, r.token_of_row.data(), R);
  ap_.ensure({R, P});
  hp_.ensure({R, F});
  op_.ensure({R, D});
  MatmulOptions opt{nullptr, nullptr, false, precision_, /*dynamic_m=*/true, false};
  for_each_block(r, [&](int e, auto rows) {
    Tensor a = rows(ap_);
    const Tensor b = config_.bias ? b_in_.view(e * P, {P}) : Tensor();
    opt.bias = config_.bias ? &b : nullptr;
    matmul(a, rows(xp_), Trans::no, slice(w_in_, e, P, D), Trans::yes, opt);
  });
  if (R > 0) {
    if (expert_.kind == FFNKind::glu)
      glu_forward(hp_, ap_, config_.act, 1);
    else
      activation_forward(hp_, ap_, config_.act);
  }
  for_each_block(r, [&](int e, auto rows) {
    Tensor o = rows(op_);
    const Tensor b = config_.bias ? b_out_.view(e * D, {D}) : Tensor();
    opt.bias = config_.bias ? &b : nullptr;
    matmul(o, rows(hp_), Trans::no, slice(w_out_, e, D, F), Trans::yes, opt);
  });
  y.ensure({T, D});
  unpermute_rows(y, op_, r.slot.data(), r.weight.data(), r.k, /*accumulate=*/false);

  if (shared_) {
    shared_->set_precision(precision_);
    shared_->forward(shared_y_, x, train);
    float* out = y.f32();
    const float* s = shared_y_.f32();
    if (m.shared_gate) {
      gate_pre_.ensure({T, 1});
      gate_.ensure({T, 1});
      linear_forward(gate_pre_, x, w_gate_, nullptr);
      for (std::int64_t t = 0; t < T; ++t) gate_.f32()[t] = sigmoid(gate_pre_.f32()[t]);
    }
    const float* g = m.shared_gate ? gate_.f32() : nullptr;
#pragma omp parallel for schedule(static) if (T > 64)
    for (std::int64_t t = 0; t < T; ++t) {
      const float scale = g ? g[t] : 1.0f;
      for (std::int64_t d = 0; d < D; ++d) out[t * D + d] += scale * s[t * D + d];
    }
  }
  if (train)
    for (int e = 0; e < m.num_experts; ++e) step_load_[e] += r.load[e];
  saved_ = train;
  x_ = train ? x : Tensor();
}

void MoEFFN::backward(Tensor& dx, const Tensor& dy) {
  check(saved_, "[moe] backward needs a forward with train = true first");
  const MoEConfig& m = config_.moe;
  const std::int64_t T = x_.dim(0), D = config_.d_model, E = m.num_experts, F = expert_.d_ff,
                     P = in_width_;
  check(dy.rank() == 2 && dy.dim(0) == T && dy.dim(1) == D,
        "[moe] dy {} must match the forward's output [{}, {}]", shape_string(dy.shape()), T, D);
  const Routing& r = routing_;
  const std::int64_t R = r.kept();

  // Combine: the rows' gradients and the combine weights' gradients.
  dweight_.resize(static_cast<std::size_t>(T * r.k));
  unpermute_rows_backward(dop_, dweight_.data(), dy, op_, r.slot.data(), r.weight.data(), r.k);

  // Experts, block by block.
  dhp_.ensure({R, F});
  dap_.ensure({R, P});
  dxp_.ensure({R, D});
  const MatmulOptions rows_opt{nullptr, nullptr, false, precision_, /*dynamic_m=*/true, false};
  const MatmulOptions grad_opt{nullptr,           nullptr, /*accumulate=*/true, precision_, false,
                               /*dynamic_k=*/true};
  for_each_block(r, [&](int e, auto rows) {
    Tensor dh = rows(dhp_);
    const Tensor dout = rows(dop_);
    matmul(dh, dout, Trans::no, slice(w_out_, e, D, F), Trans::no, rows_opt);
    Tensor dw = slice(dw_out_, e, D, F);
    matmul(dw, dout, Trans::yes, rows(hp_), Trans::no, grad_opt);
    if (config_.bias) {
      Tensor db = db_out_.view(e * D, {D});
      bias_backward(db, dout);
    }
  });
  if (R > 0) {
    if (expert_.kind == FFNKind::glu)
      glu_backward(dap_, dhp_, ap_, config_.act, 1);
    else
      activation_backward(dap_, dhp_, ap_, config_.act);
  }
  for_each_block(r, [&](int e, auto rows) {
    const Tensor da = rows(dap_);
    Tensor dw = slice(dw_in_, e, P, D);
    matmul(dw, da, Trans::yes, rows(xp_), Trans::no, grad_opt);
    if (config_.bias) {
      Tensor db = db_in_.view(e * P, {P});
      bias_backward(db, da);
    }
    Tensor dxe = rows(dxp_);
    matmul(dxe, da, Trans::no, slice(w_in_, e, P, D), Trans::no, rows_opt);
  });
  dx.ensure({T, D});
  permute_rows_backward(dx, dxp_, r.slot.data(), r.k, /*accumulate=*/false);

  // Router: combine weights and auxiliary losses back to the logits, then to W_r and x.
  dlogits_.ensure({T, E});
  route_backward(dlogits_, r, dweight_.data(), m, aux_loss_scale_);
  const bool jitter = m.jitter > 0;
  const Tensor& rin = jitter ? x_router_ : x_;
  dx_router_.ensure({T, D});
  linear_backward(&dx_router_, dw_router_, m.router_bias ? &db_router_ : nullptr, dlogits_, rin,
                  w_router_);
  float* dxr = dx_router_.f32();
  if (m.noisy_topk) {
    // logits = clean + ε·softplus(pre): ∂/∂pre = ε·σ(pre).
    Tensor& dpre = dnoise_pre_;
    dpre.ensure({T, E});
    const float* dl = dlogits_.f32();
    const float* eps = noise_eps_.f32();
    const float* pre = noise_pre_.f32();
    for (std::int64_t i = 0; i < T * E; ++i) dpre.f32()[i] = dl[i] * eps[i] * sigmoid(pre[i]);
    Tensor& dxn = dx_extra_;
    dxn.ensure({T, D});
    linear_backward(&dxn, dw_noise_, nullptr, dpre, rin, w_noise_);
    for (std::int64_t i = 0; i < T * D; ++i) dxr[i] += dxn.f32()[i];
  }
  float* out = dx.f32();
  const float* j = jitter ? jitter_.f32() : nullptr;
#pragma omp parallel for simd schedule(static) if (T * D > 65536)
  for (std::int64_t i = 0; i < T * D; ++i) out[i] += j ? dxr[i] * j[i] : dxr[i];

  // Shared experts: y += g·S(x) with g = σ(x·w_g) or 1.
  if (shared_) {
    dshared_.ensure({T, D});
    const float* g = dy.f32();
    const float* s = shared_y_.f32();
    float* ds = dshared_.f32();
    if (m.shared_gate) {
      dgate_.ensure({T, 1});
      const float* gate = gate_.f32();
      for (std::int64_t t = 0; t < T; ++t) {
        float dot = 0.0f;
        for (std::int64_t d = 0; d < D; ++d) {
          dot += g[t * D + d] * s[t * D + d];
          ds[t * D + d] = gate[t] * g[t * D + d];
        }
        dgate_.f32()[t] = dot * gate[t] * (1.0f - gate[t]);
      }
      Tensor& dxg = dx_extra_;
      dxg.ensure({T, D});
      linear_backward(&dxg, dw_gate_, nullptr, dgate_, x_, w_gate_);
      for (std::int64_t i = 0; i < T * D; ++i) out[i] += dxg.f32()[i];
    } else {
      std::copy(g, g + T * D, ds);
    }
    shared_->backward(dx_shared_, dshared_);
    const float* dxs = dx_shared_.f32();
#pragma omp parallel for simd schedule(static) if (T * D > 65536)
    for (std::int64_t i = 0; i < T * D; ++i) out[i] += dxs[i];
  }
}

double MoEFFN::aux_loss() const {
  return config_.moe.aux_coef * routing_.balance_loss + config_.moe.z_coef * routing_.z_loss;
}

void MoEFFN::after_optimizer_step() {
  const MoEConfig& m = config_.moe;
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

FFNStats MoEFFN::stats() const {
  FFNStats s;
  const Routing& r = routing_;
  s.tokens = r.tokens;
  s.num_experts = r.experts;
  if (r.tokens == 0) return s;
  s.tokens_per_expert.resize(r.experts);
  double sum = 0, sq = 0, mx = 0;
  int unused = 0;
  for (int e = 0; e < r.experts; ++e) {
    const auto n = r.rows_of(e);
    s.tokens_per_expert[e] = n;
    sum += static_cast<double>(n);
    sq += static_cast<double>(n) * static_cast<double>(n);
    mx = std::max(mx, static_cast<double>(n));
    unused += n == 0;
  }
  const double mean = sum / r.experts;
  s.load_cv = mean > 0 ? std::sqrt(std::max(0.0, sq / r.experts - mean * mean)) / mean : 0.0;
  s.max_over_mean = mean > 0 ? mx / mean : 0.0;
  s.unused_fraction = static_cast<double>(unused) / r.experts;
  s.dropped = r.tokens * r.k - r.kept();
  s.dropped_fraction = static_cast<double>(s.dropped) / static_cast<double>(r.tokens * r.k);
  s.router_entropy = r.entropy;
  s.top1_prob = r.top1_prob;
  s.balance_loss = r.balance_loss;
  s.z_loss = r.z_loss;
  if (saved_ && hp_.defined() && r.kept() > 0) {
    const float* h = hp_.f32();
    const std::int64_t n = r.kept() * expert_.d_ff;
    std::int64_t zeros = 0;
#pragma omp parallel for simd reduction(+ : zeros) if (n > 65536)
    for (std::int64_t i = 0; i < n; ++i) zeros += h[i] == 0.0f;
    s.zero_fraction = static_cast<double>(zeros) / static_cast<double>(n);
  }
  return s;
}

}  // namespace ffnlab
