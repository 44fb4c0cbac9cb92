// MoEFFN: composes the MoE layer's parts (layers/moe/) and orders their calls: the parameter
// layout and draws, forward, backward, the statistics.
#include "ffnlab/layers/moe_ffn.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "check.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/ops/activation.hpp"
#include "ffnlab/ops/permute.hpp"
#include "ffnlab/scratch.hpp"

namespace ffnlab {

MoEFFN::MoEFFN(const FFNConfig& config, std::uint64_t seed, HeldExperts held)
    : config_(config), held_(held) {
  validate(config_);
  check(config_.kind == FFNKind::moe, "[moe] MoEFFN needs kind 'moe', got '{}'",
        enum_name(config_.kind));
  const MoEConfig& m = config_.moe;
  const std::int64_t E = m.num_experts;
  if (held_.count == 0) held_ = {0, static_cast<int>(E)};
  check(held_.first >= 0 && held_.count > 0 && held_.first + held_.count <= E,
        "[moe] experts [{}, {}) are not experts of a layer of {}", held_.first,
        held_.first + held_.count, E);
  check(held_.count == E || splits_experts(m.routing), "[moe] routing '{}' {}",
        enum_name(m.routing), kSplitsExpertsRefusal);
  experts_.emplace(config_, held_);

  // The router scores the FFN experts and then the zero-computation ones; Soft MoE has slots'
  // parameters instead (E·p rows) and their scale.
  if (routing_family(m.routing).own_path) {
    soft_.emplace(config_);
    soft_->declare(params_);
  } else {
    router_.emplace(config_, seed);
    router_->declare(params_);
  }
  experts_->declare(params_);
  if (m.num_shared > 0) {
    shared_.emplace(config_, seed);
    shared_->declare(params_);
  }
  if (m.zc_experts() > 0) {
    zc_.emplace(config_);
    zc_->declare(params_);
  }
  if (router_) router_->declare_gate_map(params_);
  params_.allocate();
  bind_parameters();

  // torch.nn.Linear's initialisation for every Linear, expert by expert.
  std::mt19937_64 rng(seed);
  if (soft_) soft_->init(rng);
  if (router_) router_->init(rng);
  experts_->init(rng);  // every expert's values drawn, the held ones kept
  if (shared_) shared_->init(rng);
  if (zc_) zc_->init(rng);  // MoE++: v_i ~ N(0, 1), W_c,i as torch.nn.Linear
  // Drawn last, so that a config without it keeps the initialisation it had.
  if (router_) router_->init_gate_map(rng);
}

void MoEFFN::set_random_stream(std::uint64_t seed, std::uint64_t stream) {
  if (router_) router_->set_random_stream(seed, stream);
}

void MoEFFN::bind_parameters() {
  if (soft_) soft_->bind(params_);
  if (router_) router_->bind(params_);
  experts_->bind(params_);
  if (shared_) shared_->bind(params_);
  if (zc_) zc_->bind(params_);
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
  // What backward reads is this forward's only once it has finished: a forward that throws (bad
  // input, out of memory) leaves no backward to run on another batch's routing.
  saved_ = false;
  x_ = Tensor();
  const std::int64_t D = config_.d_model;
  check(x.rank() == 2 && x.dim(1) == D, "[moe] input {} must be [T, {}]", shape_string(x.shape()),
        D);
  if (looks_at_whole_sequence(config_.moe.routing)) {
    const std::int64_t S = context_.sequence > 0 ? context_.sequence : x.dim(0);
    check(S > 1 || x.dim(0) == 0,
          "[moe] {} routing looks at the whole sequence: one token at a time (decode) is not a "
          "sequence; run it on whole sequences",
          enum_name(config_.moe.routing));
    check(x.dim(0) == 0 || x.dim(0) % S == 0, "[moe] {} tokens are not whole sequences of {}",
          x.dim(0), S);
  }
  if (train && experts_->has_inference_copy()) set_inference_weights(DType::f32);
  check(!(train && expert_parallel_) || splits_experts(config_.moe.routing),
        "[moe] routing '{}' {}: train it with data parallelism alone",
        enum_name(config_.moe.routing), kSplitsExpertsRefusal);
  if (soft_) {
    soft_->forward(y, routing_, x, context_.sequence, *experts_, train, precision_, group_);
  } else {
    // Inference forwards route their own tokens.
    router_->forward(routing_, x, context_, first_token_, train ? group_ : nullptr, train);
    experts_forward(y, x, train);
  }
  if (zc_) zc_->forward(y, x, routing_);
  if (shared_) shared_->forward(y, x, train, precision_);
  saved_ = train;
  x_ = train ? x : Tensor();
}

void MoEFFN::backward(Tensor& dx, const Tensor& dy) {
  check(saved_, "[moe] backward needs a forward with train = true first");
  experts_->check_unchanged(precision_);
  const std::int64_t T = x_.dim(0), D = config_.d_model;
  check(dy.rank() == 2 && dy.dim(0) == T && dy.dim(1) == D,
        "[moe] dy {} must match the forward's output [{}, {}]", shape_string(dy.shape()), T, D);
  if (soft_) {
    soft_->backward(dx, dy, x_, *experts_, precision_);
  } else {
    combine_backward(dy);
    experts_backward(dx);
    if (zc_) zc_->backward(dx, dweight_.data(), dy, x_, routing_);
    router_->backward(dx, routing_, dweight_.data(), x_, context_.logits_grad, aux_loss_scale_);
  }
  if (shared_) shared_->backward(dx, dy, x_);
}

// y = Σ_j w_j·O[slot_j]: the rows' gradients and the combine weights' gradients.
void MoEFFN::combine_backward(const Tensor& dy) {
  const Routing& r = routing_;
  dweight_.resize(static_cast<std::size_t>(r.tokens * r.k));
  Tensor& dop = scratch(Scratch::moe_dop, {r.kept(), config_.d_model});
  unpermute_rows_backward(dop, dweight_.data(), dy, experts_->output(), r.slot.data(),
                          r.weight.data(), r.k);
}

// The experts, block by block; dx (overwritten) gets the permuted rows' input gradients.
void MoEFFN::experts_backward(Tensor& dx) {
  const std::int64_t T = x_.dim(0), D = config_.d_model;
  const Routing& r = routing_;
  const Tensor& dop = scratch(Scratch::moe_dop, {r.kept(), D});  // from combine_backward
  const Tensor& dxp = experts_->backward(dop, r.offsets, precision_);
  dx.ensure({T, D});
  permute_rows_backward(dx, dxp, r.slot.data(), r.k, /*accumulate=*/false);
}

std::vector<Tensor> MoEFFN::expert_grads() {
  return experts_->grads();
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
  return router_ ? router_->l1_coef() : 0.0f;
}

void MoEFFN::after_optimizer_step(const ModelSums* model) {
  if (router_) router_->after_optimizer_step(model);
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
  const Tensor& logits = router_logits();
  if (saved_ && logits.defined() && logits.numel() > 0) {
    const float* z = logits.f32();
    const std::int64_t n = logits.numel();
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
