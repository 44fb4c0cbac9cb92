// MoEFFN: the fast layer against the sort-based double reference (output, routing, losses),
// its backward against central differences of the reference with the routing held, and the
// router options, capacity, statistics and the balancing-bias update on their own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/layers/moe_ffn.hpp"
#include "ffnlab/layers/ref/moe_ffn_ref.hpp"
#include "ffnlab/ops/few_rows.hpp"

using namespace ffnlab;

namespace {

struct Case {
  const char* name;
  FFNConfig config;
  std::int64_t tokens;
  std::int64_t sequence = 0;  // routings that look at the whole sequence: its tokens
};

FFNConfig base(int experts, int k, const char* expert_variant, bool bias) {
  FFNConfig c = variant_config("moe", 12, 10, bias);
  const FFNConfig e = variant_config(expert_variant, 12, 10, bias);
  c.act = e.act;
  c.moe.expert_kind = e.kind;
  c.moe.num_experts = experts;
  c.moe.top_k = k;
  c.moe.aux_coef = 0.05f;
  c.moe.z_coef = 0.01f;
  return c;
}

// BASE layers' settings, as routing_defaults gives them to a config file.
void base_layers(MoEConfig& m) {
  m.routing = RoutingKind::base;
  m.top_k = 1;
  m.score = ScoreFunc::sigmoid;
  m.normalize = false;
  m.router_bias = false;
  m.aux_coef = m.z_coef = 0.0f;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"seeds_relu_e8_k2", base(8, 2, "relu", true), 11});
  {
    Case c{"mixtral_like_e5_k2", base(5, 2, "swiglu", false), 9};
    c.config.moe.naming = MoENaming::mixtral;
    c.config.moe.router_bias = false;
    out.push_back(c);
  }
  {
    Case c{"qwen2_like_e7_k3_shared_gate", base(7, 3, "swiglu", false), 5};
    c.config.moe.normalize = false;
    c.config.moe.num_shared = 1;
    c.config.moe.shared_d_ff = 14;
    c.config.moe.shared_gate = true;
    c.config.moe.naming = MoENaming::qwen2_moe;
    c.config.moe.router_bias = false;
    out.push_back(c);
  }
  {
    Case c{"deepseek_like_groups_sigmoid", base(12, 3, "swiglu", false), 10};
    auto& m = c.config.moe;
    m.score = ScoreFunc::sigmoid;
    m.groups = 4;
    m.topk_groups = 2;
    m.scaling = 2.5f;
    m.balance_bias = true;
    m.num_shared = 2;
    m.shared_d_ff = 6;
    m.expert_d_ff = 7;
    m.router_bias = false;
    m.balance_loss = BalanceLoss::topk_normalized;
    out.push_back(c);
  }
  {
    Case c{"switch_top1_capacity_position", base(5, 1, "relu", true), 16};
    c.config.moe.capacity_factor = 1.0;
    c.config.moe.balance_loss = BalanceLoss::top1;
    c.config.moe.normalize = false;
    out.push_back(c);
  }
  {
    Case c{"capacity_probability_k2", base(6, 2, "gelu", true), 13};
    c.config.moe.capacity_factor = 0.75;
    c.config.moe.drop = DropPolicy::probability;
    out.push_back(c);
  }
  {
    Case c{"capacity_position_k2", base(4, 2, "relu", false), 15};
    c.config.moe.capacity_factor = 0.6;
    out.push_back(c);
  }
  {
    Case c{"softmax_after_topk_k3", base(6, 3, "geglu", true), 7};
    c.config.moe.softmax_after_topk = true;
    out.push_back(c);
  }
  {
    Case c{"k_equals_e_shared_ungated", base(3, 3, "relu", false), 4};
    c.config.moe.num_shared = 1;
    out.push_back(c);
  }
  {
    Case c{"tokens_fewer_than_experts", base(9, 2, "reglu", true), 3};
    c.config.moe.score = ScoreFunc::sigmoid;
    out.push_back(c);
  }
  {  // Huang et al. 2024: the probabilities themselves as weights, the dynamic (entropy) loss
    Case c{"top_p_e6_cap4_dynamic_loss", base(6, 4, "relu", true), 14};
    c.config.moe.routing = RoutingKind::top_p;
    c.config.moe.top_p = 0.45f;
    c.config.moe.normalize = false;
    c.config.moe.entropy_coef = 0.02f;
    out.push_back(c);
  }
  {
    Case c{"top_p_normalized_capacity", base(5, 3, "swiglu", false), 12};
    c.config.moe.routing = RoutingKind::top_p;
    c.config.moe.top_p = 0.5f;
    c.config.moe.capacity_factor = 0.7;
    out.push_back(c);
  }
  {  // MoE++: two constant, one copy and one zero expert beside the FFN experts
    Case c{"moepp_zero_copy_constant_e4_k2", base(4, 2, "swiglu", false), 16};
    auto& m = c.config.moe;
    m.constant_experts = 2;
    m.copy_experts = m.zero_experts = 1;
    m.zc_balance_weight = 0.75f;
    m.router_bias = false;
    out.push_back(c);
  }
  {  // no constant expert: no constant-expert parameters
    Case c{"moepp_copy_and_zero_only", base(4, 2, "gelu", true), 15};
    c.config.moe.copy_experts = c.config.moe.zero_experts = 1;
    out.push_back(c);
  }
  {
    Case c{"moepp_unnormalized_k3", base(5, 3, "relu", true), 13};
    auto& m = c.config.moe;
    m.constant_experts = m.copy_experts = m.zero_experts = 1;
    m.normalize = false;
    out.push_back(c);
  }
  for (auto [name, experts, k, variant, bias] :
       {std::tuple{"relu_routing_e6_k2_l1", 6, 2, "relu", true},
        std::tuple{"relu_routing_swiglu_scaled_sparsity", 8, 3, "swiglu", false}}) {
    // ReMoE: gates ReLU(logits), held sparse by the L1 penalty (a coefficient large enough to
    // show in the gradients).
    Case c{name, base(experts, k, variant, bias), 14};
    auto& m = c.config.moe;
    m.routing = RoutingKind::relu;
    m.normalize = false;
    m.aux_coef = m.z_coef = 0.0f;
    m.l1_coef_init = 0.3f;
    if (!bias) {
      m.router_bias = false;
      m.scaling = 1.5f;
      m.target_sparsity = 0.5f;
    }
    out.push_back(c);
  }
  {  // Zhou et al.: two sequences of 6, each expert taking ceil(2·6/4) = 3 tokens of each
    Case c{"expert_choice_e4_k2_two_sequences", base(4, 2, "relu", true), 12, 6};
    auto& m = c.config.moe;
    m.routing = RoutingKind::expert_choice;
    m.normalize = false;
    m.aux_coef = 0.0f;
    out.push_back(c);
  }
  {  // one sequence of 10, capacity factor 1.5: ceil(1.5·2·10/6) = 5 tokens an expert
    Case c{"expert_choice_swiglu_c1.5_scaled", base(6, 2, "swiglu", false), 10};
    auto& m = c.config.moe;
    m.routing = RoutingKind::expert_choice;
    m.normalize = false;
    m.aux_coef = 0.0f;
    m.capacity_factor = 1.5;
    m.scaling = 1.3f;
    m.entropy_coef = 0.02f;
    m.router_bias = false;
    out.push_back(c);
  }
  {  // Puigcerver et al.: two sequences of 5, 3 experts of 2 slots, a shared expert beside
    Case c{"soft_moe_e3_p2_two_sequences_shared", base(3, 1, "swiglu", true), 10, 5};
    auto& m = c.config.moe;
    m.routing = RoutingKind::soft;
    m.top_k = MoEConfig{}.top_k;  // (not read: the slots set the compute)
    m.slots = 2;
    m.aux_coef = m.z_coef = 0.0f;
    m.num_shared = 1;
    out.push_back(c);
  }
  {  // one sequence of 7 tokens, 4 experts of one slot each
    Case c{"soft_moe_e4_p1_relu", base(4, 1, "relu", false), 7};
    auto& m = c.config.moe;
    m.routing = RoutingKind::soft;
    m.top_k = MoEConfig{}.top_k;
    m.aux_coef = m.z_coef = 0.0f;
    out.push_back(c);
  }
  {  // Roller et al.'s hash layer: one expert a token, by a fixed hash of its id
    Case c{"hash_e4_k1_swiglu", base(4, 1, "swiglu", true), 12};
    c.config.moe.routing = RoutingKind::hash;
    c.config.moe.aux_coef = c.config.moe.z_coef = 0.0f;
    out.push_back(c);
  }
  {  // two hashed experts a token, each 1/2, and a capacity that drops some
    Case c{"hash_e5_k2_capacity", base(5, 2, "relu", false), 15};
    c.config.moe.routing = RoutingKind::hash;
    c.config.moe.aux_coef = c.config.moe.z_coef = 0.0f;
    c.config.moe.capacity_factor = 1.0;
    out.push_back(c);
  }
  {  // BASE layers (Lewis et al. 2021): top-1 by affinity at inference, a balanced assignment
     // in training (3 tokens an expert), weighted by σ(affinity)
    Case c{"base_e4_swiglu", base(4, 1, "swiglu", true), 12};
    base_layers(c.config.moe);
    out.push_back(c);
  }
  {  // 10 tokens over 3 experts: 4, 3 and 3; with a router bias and the z-loss
    Case c{"base_e3_uneven_bias", base(3, 1, "relu", false), 10};
    base_layers(c.config.moe);
    c.config.moe.router_bias = true;
    c.config.moe.z_coef = 0.01f;
    out.push_back(c);
  }
  {  // MoE++'s gating residual: the previous layer's logits through gate.gate_map.weight
    Case c{"moepp_gating_residual_e4_k2", base(4, 2, "swiglu", true), 12};
    auto& m = c.config.moe;
    m.constant_experts = m.copy_experts = m.zero_experts = 1;
    m.gating_residual = true;
    out.push_back(c);
  }
  {  // the residual with plain top-k and renormalised weights, no zero-computation experts
    Case c{"topk_gating_residual_e5_k2", base(5, 2, "relu", false), 10};
    c.config.moe.gating_residual = true;
    out.push_back(c);
  }
  return out;
}

bool top_p(const FFNConfig& c) {
  return c.moe.routing == RoutingKind::top_p;
}
bool relu(const FFNConfig& c) {
  return c.moe.routing == RoutingKind::relu;
}

// The reference with the layer's parameters, by name.
ref::MoEFFN<double> reference_of(MoEFFN& moe) {
  ref::MoEFFN<double> r;
  r.config = moe.config();
  r.sequence = moe.context().sequence;
  for (const auto& p : moe.parameters().list())
    r.params[p.name] = std::vector<double>(p.value.f32(), p.value.f32() + p.value.numel());
  return r;
}

// Some parameters get random values that the initialisation leaves at zero.
void randomize_state(MoEFFN& moe, std::uint64_t seed) {
  if (moe.config().moe.routing == RoutingKind::soft)  // sharper dispatch and combine weights
    moe.parameters().at("gate.scale").value.f32()[0] = 2.5f;
  if (top_p(moe.config())) {  // sharper router probabilities: tokens take 1 to k experts
    Tensor& w = moe.parameters().at("gate.weight").value;
    for (std::int64_t i = 0; i < w.numel(); ++i) w.f32()[i] *= 6.0f;
  }
  if (moe.config().moe.balance_bias) {
    Tensor& b = moe.parameters().at("gate.e_score_correction_bias").value;
    const Tensor r = test::random_tensor(b.shape(), seed, 0.05f);
    std::copy(r.f32(), r.f32() + r.numel(), b.f32());
  }
}

// Random token ids [T] (hash routing chooses by them; the other routings ignore them).
std::vector<std::int32_t> token_ids(std::int64_t T, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(T));
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % 256);
  return ids;
}

// Case c's layer (its state randomised) after an inference forward of a random x.
// With MoE++'s gating residual, a random stand-in for the previous layer's logits.
struct Routed {
  std::unique_ptr<MoEFFN> moe;
  Tensor x, y;
  Tensor residual;                // [T, E] (gating residual only)
  std::vector<std::int32_t> ids;  // [T] the tokens' ids
};
// The previous layer's logits for a layer with the gating residual (an empty tensor otherwise).
Tensor gate_residual_for(const Case& c, std::uint64_t seed) {
  if (!c.config.moe.gating_residual) return Tensor();
  return test::random_tensor({c.tokens, c.config.moe.routed_experts()}, seed, 2.0f);
}
Routed routed(const Case& c, std::uint64_t& seed) {
  Routed r{
      std::make_unique<MoEFFN>(c.config, ++seed), {}, {}, {}, token_ids(c.tokens, seed ^ 0x1d5)};
  r.moe->context().sequence = c.sequence;
  r.moe->context().token_ids = r.ids.data();
  randomize_state(*r.moe, ++seed);
  r.x = test::random_tensor({c.tokens, c.config.d_model}, ++seed);
  r.residual = gate_residual_for(c, ++seed);
  r.moe->context().previous_logits = r.residual.defined() ? &r.residual : nullptr;
  r.moe->forward(r.y, r.x, /*train=*/false);
  r.moe->context().previous_logits = nullptr;  // r moves: no pointer into it stays behind
  r.moe->context().token_ids = nullptr;
  return r;
}

}  // namespace

TEST(MoEFFN, MatchesReference) {
  std::uint64_t seed = 100;
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto [layer, x, y, residual, ids] = routed(c, seed);
    MoEFFN& moe = *layer;
    auto r = reference_of(moe);
    r.token_ids = ids;
    if (residual.defined()) r.gate_residual = test::to_vector<double>(residual);
    std::vector<double> yr;
    r.forward(yr, test::to_vector<double>(x), c.tokens);
    EXPECT_LT(test::scaled_error(y.f32(), yr.data(), y.numel()), 2e-6);
    if (routing_family(c.config.moe.routing).router_linear) {  // the logits the next layer takes
      const Tensor& logits = moe.router_logits();
      ASSERT_EQ(static_cast<std::size_t>(logits.numel()), r.logits.size());
      EXPECT_LT(test::scaled_error(logits.f32(), r.logits.data(), logits.numel()), 2e-6);
    }

    const Routing& routing = moe.routing();
    const int K = r.choices();
    ASSERT_EQ(routing.k, K);
    if (c.config.moe.routing == RoutingKind::soft) continue;  // nothing is chosen
    for (std::int64_t t = 0; t < c.tokens; ++t) EXPECT_EQ(routing.count[t], r.count[t]) << t;
    for (std::int64_t a = 0; a < c.tokens * K; ++a) {
      EXPECT_EQ(routing.expert[a], r.chosen[a]) << "assignment " << a;
      EXPECT_EQ(routing.slot[a] >= 0, r.kept[a] != 0) << "assignment " << a;
      EXPECT_NEAR(routing.weight[a], r.weight[a], 2e-6) << "assignment " << a;
    }
    EXPECT_NEAR(routing.balance_loss, r.balance, 1e-5 * std::max(1.0, r.balance));
    EXPECT_NEAR(routing.z_loss, r.z, 1e-5 * std::max(1.0, r.z));
    EXPECT_NEAR(routing.entropy, r.entropy, 1e-5);
    EXPECT_NEAR(routing.l1_loss, r.l1, 1e-5 * std::max(1.0, r.l1));
    if (relu(c.config)) {
      EXPECT_GT(r.l1, 0.0);
    }
  }
}

// ReLU routing: a token takes exactly the experts whose logit is positive, best first, weighted
// by scaling·logit; some tokens take none and some several, and the statistics count them.
TEST(MoEFFN, ReluRoutingTakesThePositiveLogits) {
  std::uint64_t seed = 1300;
  for (const auto& c : cases()) {
    if (!relu(c.config)) continue;
    SCOPED_TRACE(c.name);
    const auto [layer, x, y, residual, ids] = routed(c, seed);
    const Routing& r = layer->routing();
    const int E = c.config.moe.num_experts;
    ASSERT_EQ(r.k, E);
    // The router's logits, recomputed: x·W_rᵀ + b.
    const Tensor& w = layer->parameters().at("gate.weight").value;
    const std::vector<std::int32_t> took = r.taken();
    std::vector<std::int64_t> by_count(E + 1, 0);
    for (std::int64_t t = 0; t < c.tokens; ++t) {
      int positive = 0;
      const auto first = took.begin() + t * E, last = first + E;
      for (int e = 0; e < E; ++e) {
        double l =
            c.config.moe.router_bias ? layer->parameters().at("gate.bias").value.f32()[e] : 0.0;
        for (int d = 0; d < 12; ++d) l += double{w.f32()[e * 12 + d]} * x.f32()[t * 12 + d];
        const bool taken = std::find(first, last, e) != last;
        EXPECT_EQ(taken, l > 0) << "token " << t << " expert " << e << " logit " << l;
        positive += l > 0;
        for (int j = 0; j < r.count[t]; ++j)
          if (r.expert[t * E + j] == e) {
            EXPECT_NEAR(r.weight[t * E + j], c.config.moe.scaling * l, 1e-5);
          }
      }
      EXPECT_EQ(r.count[t], positive);
      for (int j = r.count[t]; j < E; ++j) {
        EXPECT_EQ(r.weight[t * E + j], 0.0f);
        EXPECT_EQ(r.slot[t * E + j], -1);
      }
      ++by_count[positive];
    }
    // At initialisation about half the logits are positive: some tokens take fewer than top_k
    // experts, some more.
    const int K = c.config.moe.top_k;
    std::int64_t fewer = 0, more = 0;
    for (int n = 0; n < K; ++n) fewer += by_count[n];
    for (int n = K + 1; n <= E; ++n) more += by_count[n];
    EXPECT_GT(fewer, 0);
    EXPECT_GT(more, 0);
    EXPECT_EQ(layer->stats().tokens_by_experts, by_count);
    EXPECT_EQ(layer->stats().dropped, 0);
  }
}

// Expert choice: in every sequence each expert takes exactly its C tokens of best probability
// (recomputed here from the logits), weighted by scaling·probability; a token gets the experts
// that took it, 0 to E of them; the load is even and nothing drops.
TEST(MoEFFN, ExpertChoiceTakesEachExpertsBestTokens) {
  std::uint64_t seed = 1700;
  for (const auto& c : cases()) {
    const MoEConfig& m = c.config.moe;
    if (m.routing != RoutingKind::expert_choice) continue;
    SCOPED_TRACE(c.name);
    const auto [layer, x, y, residual, ids] = routed(c, seed);
    const Routing& r = layer->routing();
    const int E = m.num_experts;
    const std::int64_t T = c.tokens, S = c.sequence > 0 ? c.sequence : T, D = c.config.d_model;
    const std::int64_t C = m.expert_choice_capacity(S);
    ASSERT_EQ(r.k, E);
    // Probabilities from the logits x·W_rᵀ + b, in double.
    const float* w = layer->parameters().at("gate.weight").value.f32();
    std::vector<double> prob(T * E);
    for (std::int64_t t = 0; t < T; ++t) {
      double sum = 0;
      for (int e = 0; e < E; ++e) {
        double l = m.router_bias ? layer->parameters().at("gate.bias").value.f32()[e] : 0.0;
        for (std::int64_t d = 0; d < D; ++d) l += double{w[e * D + d]} * x.f32()[t * D + d];
        prob[t * E + e] = std::exp(l);
        sum += prob[t * E + e];
      }
      for (int e = 0; e < E; ++e) prob[t * E + e] /= sum;
    }
    const std::vector<std::int32_t> took = r.taken();
    auto has = [&](std::int64_t t, int e) {
      return std::find(took.begin() + t * E, took.begin() + (t + 1) * E, e) !=
             took.begin() + (t + 1) * E;
    };
    for (std::int64_t b = 0; b < T; b += S)
      for (int e = 0; e < E; ++e) {
        std::int64_t taken = 0;
        double worst_taken = 1, best_left = 0;
        for (std::int64_t t = b; t < b + S; ++t) {
          if (has(t, e)) {
            ++taken;
            worst_taken = std::min(worst_taken, prob[t * E + e]);
          } else {
            best_left = std::max(best_left, prob[t * E + e]);
          }
        }
        EXPECT_EQ(taken, C) << "expert " << e << " sequence at " << b;
        EXPECT_GE(worst_taken, best_left - 1e-6) << "expert " << e;
      }
    std::vector<std::int64_t> by_count(E + 1, 0);
    for (std::int64_t t = 0; t < T; ++t) {
      ++by_count[r.count[t]];
      for (int j = 0; j < r.count[t]; ++j) {
        const int e = r.expert[t * E + j];
        EXPECT_NEAR(r.weight[t * E + j], m.scaling * prob[t * E + e], 1e-5);
        EXPECT_GE(r.slot[t * E + j], 0);
        if (j > 0) {
          EXPECT_LE(prob[t * E + e], prob[t * E + r.expert[t * E + j - 1]] + 1e-6);  // best first
        }
      }
    }
    const FFNStats s = layer->stats();
    EXPECT_EQ(s.tokens_by_experts, by_count);
    EXPECT_EQ(s.dropped, 0);
    EXPECT_EQ(s.load_cv, 0.0);
    EXPECT_NEAR(s.experts_per_token, static_cast<double>(C * E) / S, 1e-12);
    // (the tokens do not all get the same number: the experts chose)
    EXPECT_LT(*std::max_element(by_count.begin(), by_count.end()), T);
  }
  // One token is not a sequence: decode is refused, as is a batch of partial sequences; no
  // tokens at all is an empty output (for Soft MoE too).
  for (const auto& c : cases()) {
    if (!looks_at_whole_sequence(c.config.moe.routing)) continue;
    MoEFFN moe(c.config, 1);
    Tensor y, dx;
    moe.forward(y, Tensor({0, c.config.d_model}), true);
    moe.backward(dx, Tensor({0, c.config.d_model}));
    EXPECT_EQ(y.dim(0), 0) << c.name;
    EXPECT_EQ(moe.stats().tokens, 0) << c.name;
    EXPECT_THROW(moe.forward(y, test::random_tensor({1, c.config.d_model}, 2), false), Error);
    moe.context().sequence = 4;
    EXPECT_THROW(moe.forward(y, test::random_tensor({6, c.config.d_model}, 2), false), Error);
  }
}

// MoE++: a choice of a zero-computation expert runs no row; a zero expert weighs nothing (the
// other choices are renormalised without it), a copy expert adds w·x; the statistics count FFN
// experts and report the zero-computation share.
TEST(MoEFFN, ZeroComputationExpertsTakeNoRows) {
  std::uint64_t seed = 1500;
  for (const auto& c : cases()) {
    const MoEConfig& m = c.config.moe;
    if (m.zc_experts() == 0) continue;
    SCOPED_TRACE(c.name);
    const auto [layer, x, y, residual, ids] = routed(c, seed);
    const Routing& r = layer->routing();
    const int N = m.num_experts, K = m.top_k, zero = m.routed_experts() - 1;
    std::int64_t ffn = 0, zc = 0, zero_picks = 0;
    for (std::int64_t t = 0; t < c.tokens; ++t) {
      float others = 0;
      for (int j = 0; j < K; ++j) {
        const int e = r.expert[t * K + j];
        EXPECT_EQ(r.slot[t * K + j] >= 0, e < N);
        (e < N ? ffn : zc) += 1;
        if (e == zero) {
          ++zero_picks;
          EXPECT_EQ(r.weight[t * K + j], 0.0f);
        } else {
          others += r.weight[t * K + j];
        }
      }
      if (m.normalize) {
        EXPECT_NEAR(others, 1.0f, 1e-6);
      }
    }
    EXPECT_GT(zc, 0);
    EXPECT_GT(zero_picks, 0);
    const FFNStats s = layer->stats();
    EXPECT_EQ(s.num_experts, N);
    std::int64_t rows = 0;
    for (auto n : s.tokens_per_expert) rows += n;
    EXPECT_EQ(rows, ffn);
    EXPECT_EQ(rows, r.kept());
    EXPECT_NEAR(s.experts_per_token, static_cast<double>(ffn) / c.tokens, 1e-12);
    EXPECT_NEAR(s.zero_computation_fraction, static_cast<double>(zc) / (ffn + zc), 1e-12);
    EXPECT_EQ(s.tokens_by_experts.size(), static_cast<std::size_t>(K + 1));
  }
}

// ReMoE's controller: after an optimizer step the L1 coefficient is multiplied by the rate
// while the zero gates since the previous step fall short of the target sparsity, divided
// otherwise; inference forwards do not count.
TEST(MoEFFN, ReluRoutingCoefficientFollowsTheSparsity) {
  FFNConfig c = base(6, 2, "relu", true);
  c.moe.routing = RoutingKind::relu;
  c.moe.normalize = false;
  c.moe.aux_coef = c.moe.z_coef = 0.0f;
  c.moe.l1_coef_init = 1e-3f;
  MoEFFN moe(c, 61);
  EXPECT_FALSE(moe.parameters().at("gate.l1_coef").trainable);
  EXPECT_FLOAT_EQ(moe.l1_coef(), 1e-3f);
  const Tensor x = test::random_tensor({40, 12}, 62);
  Tensor y;
  std::int64_t active = 0;
  for (int micro = 0; micro < 2; ++micro) {
    moe.forward(y, x, true);
    for (auto n : moe.routing().load) active += n;
  }
  moe.forward(y, x, false);
  const std::vector<double> a = moe.model_sums().at("relu_gates");  // {active, gates}
  EXPECT_EQ(a[0], static_cast<double>(active));
  EXPECT_EQ(a[1], 2.0 * 40 * 6);
  // At initialisation about half the gates are open: less sparse than 1 - 2/6.
  ASSERT_LT(1.0 - a[0] / a[1], c.moe.sparsity_target());
  moe.after_optimizer_step();
  EXPECT_FLOAT_EQ(moe.l1_coef(), 1e-3f * 1.2f);
  EXPECT_EQ(moe.model_sums().at("relu_gates")[1], 0.0);
  // A model's sparsity (every ReLU-routed layer's) decides when given.
  const ModelSums sparse{{"relu_gates", {10, 100}}};
  moe.after_optimizer_step(&sparse);
  EXPECT_FLOAT_EQ(moe.l1_coef(), 1e-3f);
  moe.after_optimizer_step();  // no training forward since: unchanged
  EXPECT_FLOAT_EQ(moe.l1_coef(), 1e-3f);
  // A long stretch of gates sparser than the target (a short run whose gates closed past it)
  // shrinks λ to the smallest normal float and no further; then it grows again at the first
  // step whose gates are denser.
  for (int step = 0; step < 600; ++step) moe.after_optimizer_step(&sparse);
  EXPECT_EQ(moe.l1_coef(), std::numeric_limits<float>::min());
  const ModelSums dense{{"relu_gates", {90, 100}}};
  moe.after_optimizer_step(&dense);
  EXPECT_FLOAT_EQ(moe.l1_coef(), std::numeric_limits<float>::min() * 1.2f);
}

// Top-p routing: each token takes its best experts, in order, until their probabilities reach
// top_p (the last one taken is the one that reaches it), at most k; the statistics count what
// the tokens took.
TEST(MoEFFN, TopPTakesTheFewestBestExpertsThatReachTheMass) {
  std::uint64_t seed = 900;
  for (const auto& c : cases()) {
    if (!top_p(c.config)) continue;
    SCOPED_TRACE(c.name);
    const auto [layer, x, y, residual, ids] = routed(c, seed);
    const MoEFFN& moe = *layer;
    const Routing& r = moe.routing();
    const int E = c.config.moe.num_experts, K = c.config.moe.top_k;
    std::vector<std::int64_t> by_count(K + 1, 0);
    std::int64_t taken = 0;
    for (std::int64_t t = 0; t < c.tokens; ++t) {
      const int n = r.count[t];
      ASSERT_GE(n, 1);
      ASSERT_LE(n, K);
      double mass = 0;
      for (int j = 0; j < n; ++j) {
        const float pj = r.probs[t * E + r.expert[t * K + j]];
        if (j > 0) {
          EXPECT_LE(pj, r.probs[t * E + r.expert[t * K + j - 1]]);  // best first
        }
        if (j == n - 1 && n < K) {
          EXPECT_LT(mass, c.config.moe.top_p) << "took one too many";
        }
        mass += pj;
      }
      if (n < K) {
        EXPECT_GE(mass, c.config.moe.top_p - 1e-6);
      }
      const std::vector<std::int32_t> took = r.taken();
      for (int j = 0; j < K; ++j) EXPECT_EQ(took[t * K + j], j < n ? r.expert[t * K + j] : -1);
      for (int j = n; j < K; ++j) {
        EXPECT_EQ(r.weight[t * K + j], 0.0f);
        EXPECT_EQ(r.slot[t * K + j], -1);
      }
      ++by_count[n];
      taken += n;
    }
    // Sharpened routers: some tokens stop early, some run to the cap, at these sizes.
    EXPECT_GT(by_count[1] + by_count[2], 0);
    const FFNStats s = moe.stats();
    EXPECT_EQ(s.tokens_by_experts, by_count);
    EXPECT_NEAR(s.experts_per_token, static_cast<double>(taken) / c.tokens, 1e-12);
    std::int64_t kept = 0;
    for (auto n : s.tokens_per_expert) kept += n;
    EXPECT_EQ(s.dropped, taken - kept);
    if (c.config.moe.capacity_factor == 0) {
      EXPECT_EQ(s.dropped, 0);
    }
  }
}

// Blocks of more than kFewRowsMax rows take oneDNN products; in inference, plain experts
// get their activation as the up projection's post-op and GLU experts the separate mix.
TEST(MoEFFN, LargeBlocksMatchReferenceInInferenceAndTraining) {
  std::uint64_t seed = 700;
  for (const char* variant : {"relu", "gelu", "swiglu"}) {
    SCOPED_TRACE(variant);
    MoEFFN moe(base(4, 2, variant, true), ++seed);
    const std::int64_t T = 96;  // about 48 rows per expert
    const Tensor x = test::random_tensor({T, 12}, ++seed);
    Tensor y_infer, y_train;
    moe.forward(y_infer, x, /*train=*/false);
    for (auto n : moe.stats().tokens_per_expert) EXPECT_GT(n, kFewRowsMax);
    moe.forward(y_train, x, /*train=*/true);
    auto r = reference_of(moe);
    std::vector<double> yr;
    r.forward(yr, test::to_vector<double>(x), T);
    EXPECT_LT(test::scaled_error(y_infer.f32(), yr.data(), y_infer.numel()), 2e-6);
    EXPECT_LT(test::scaled_error(y_train.f32(), yr.data(), y_train.numel()), 2e-6);
  }
}

TEST(MoEFFN, GradientsMatchCentralDifferences) {
  std::uint64_t seed = 200;
  auto all = cases();
  {  // the training noise, held fixed like the routing
    Case c{"jitter_and_noisy_topk", base(5, 2, "swiglu", true), 8};
    c.config.moe.jitter = 0.1f;
    c.config.moe.noisy_topk = true;
    all.push_back(c);
  }
  // Blocks of ~32 rows take oneDNN products with the activation as the up projection's
  // epilogue, and the backward reads the derivative from h (ReLU, tanh).
  all.push_back({"large_blocks_relu", base(4, 2, "relu", true), 64});
  {
    Case c{"large_blocks_tanh", base(4, 2, "relu", false), 64};
    c.config.act = Act{Activation::tanh};
    all.push_back(c);
  }
  for (const auto& c : all) {
    SCOPED_TRACE(c.name);
    MoEFFN moe(c.config, ++seed);
    moe.context().sequence = c.sequence;
    randomize_state(moe, ++seed);
    const std::int64_t T = c.tokens, D = c.config.d_model;
    const Tensor x = test::random_tensor({T, D}, ++seed);
    const Tensor dy = test::random_tensor({T, D}, ++seed);
    // Gating residual: the previous layer's logits, and the gradient the next layer hands back
    // for this layer's logits (the loss gains Σ logits·dlogits_next).
    const Tensor residual = gate_residual_for(c, ++seed);
    const Tensor dlogits_next =
        residual.defined() ? test::random_tensor(residual.shape(), ++seed) : Tensor();
    moe.context().previous_logits = residual.defined() ? &residual : nullptr;
    moe.context().logits_grad = residual.defined() ? &dlogits_next : nullptr;
    const std::vector<std::int32_t> ids = token_ids(T, seed ^ 0x1d5);
    moe.context().token_ids = ids.data();
    Tensor y, dx;
    moe.parameters().zero_grad();
    moe.forward(y, x, /*train=*/true);
    moe.backward(dx, dy);

    auto r = reference_of(moe);
    r.token_ids = ids;
    r.train = true;  // (BASE layers: the balanced assignment of a training forward)
    if (residual.defined()) r.gate_residual = test::to_vector<double>(residual);
    if (c.config.moe.jitter > 0) r.jitter = test::to_vector<double>(moe.jitter_noise());
    if (c.config.moe.noisy_topk) r.noise = test::to_vector<double>(moe.gate_noise());
    std::vector<double> xs = test::to_vector<double>(x), ys;
    r.forward(ys, xs, T);  // routing from unperturbed parameters...
    const Routing& routing = moe.routing();
    for (std::int64_t a = 0; a < T * r.choices(); ++a)
      ASSERT_EQ(routing.expert[a], r.chosen[a]) << "the noise was not reproduced";
    r.hold_routing = true;  // ...then held
    const std::vector<double> g = test::to_vector<double>(dy);
    const double aux = c.config.moe.aux_coef, zc = c.config.moe.z_coef;
    const double ec = c.config.moe.entropy_coef, lc = moe.l1_coef();
    const std::vector<double> gl =
        residual.defined() ? test::to_vector<double>(dlogits_next) : std::vector<double>();
    auto loss = [&] {
      r.forward(ys, xs, T);
      double l = aux * r.balance + zc * r.z + ec * r.entropy + lc * r.l1;
      for (std::size_t i = 0; i < ys.size(); ++i) l += ys[i] * g[i];
      for (std::size_t i = 0; i < gl.size(); ++i) l += r.logits[i] * gl[i];
      return l;
    };
    EXPECT_NEAR(moe.aux_loss(), aux * r.balance + zc * r.z + ec * r.entropy + lc * r.l1, 1e-6);
    const double atol = 2e-4, rtol = 2e-3;
    test::expect_gradient(xs, test::to_vector<double>(dx), loss,
                          test::sample_indices(xs.size(), 20), atol, rtol, "dx");
    if (residual.defined()) {  // the previous layer's logits
      ASSERT_EQ(moe.previous_logits_grad().numel(), residual.numel());
      test::expect_gradient(r.gate_residual, test::to_vector<double>(moe.previous_logits_grad()),
                            loss, test::sample_indices(r.gate_residual.size(), 20), atol, rtol,
                            "gate residual");
    } else {
      EXPECT_FALSE(moe.previous_logits_grad().defined());
    }
    for (const auto& p : moe.parameters().list()) {
      if (!p.trainable) continue;  // state (balancing bias, L1 coefficient): no gradient
      auto& theta = r.params[p.name];
      const std::vector<double> analytic(p.grad.f32(), p.grad.f32() + p.grad.numel());
      test::expect_gradient(theta, analytic, loss, test::sample_indices(theta.size(), 6), atol,
                            rtol, p.name.c_str());
    }
  }
}

TEST(MoEFFN, ExpertsWithoutTokensCostNothingAndLoadIsReported) {
  FFNConfig c = base(9, 1, "relu", true);
  MoEFFN moe(c, 3);
  const Tensor x = test::random_tensor({2, 12}, 4);
  Tensor y, dx;
  moe.forward(y, x, true);
  moe.backward(dx, test::random_tensor({2, 12}, 5));
  const FFNStats s = moe.stats();
  EXPECT_EQ(s.num_experts, 9);
  std::int64_t total = 0;
  int unused = 0;
  for (auto n : s.tokens_per_expert) {
    total += n;
    unused += n == 0;
  }
  EXPECT_EQ(total, 2);
  EXPECT_GE(unused, 7);
  EXPECT_DOUBLE_EQ(s.unused_fraction, unused / 9.0);
  EXPECT_EQ(s.dropped, 0);
  // Unused experts get exactly zero gradient.
  for (int e = 0; e < 9; ++e)
    if (s.tokens_per_expert[e] == 0) {
      const Tensor& g =
          moe.parameters().at("experts." + std::to_string(e) + ".up_proj.weight").grad;
      for (std::int64_t i = 0; i < g.numel(); ++i) ASSERT_EQ(g.f32()[i], 0.0f);
    }
}

TEST(MoEFFN, CapacityDropsAndReports) {
  FFNConfig c = base(4, 2, "relu", true);
  c.moe.capacity_factor = 0.5;  // capacity = ceil(0.5·2·T/4) = T/4 per expert: half dropped
  MoEFFN moe(c, 7);
  const std::int64_t T = 40;
  Tensor y;
  moe.forward(y, test::random_tensor({T, 12}, 8), false);
  const Routing& r = moe.routing();
  EXPECT_EQ(r.capacity, 10);
  const FFNStats s = moe.stats();
  for (auto n : s.tokens_per_expert) EXPECT_LE(n, 10);
  EXPECT_EQ(s.dropped, T * 2 - r.kept());
  EXPECT_GE(s.dropped, T * 2 - 40);
  EXPECT_DOUBLE_EQ(s.dropped_fraction, static_cast<double>(s.dropped) / (T * 2));
  // A dropped token-assignment contributes nothing: with every assignment dropped, y is 0.
  for (std::int64_t t = 0; t < T; ++t) {
    bool any = false;
    for (int j = 0; j < 2; ++j) any |= r.slot[t * 2 + j] >= 0;
    if (any) continue;
    for (int d = 0; d < 12; ++d) EXPECT_EQ(y.f32()[t * 12 + d], 0.0f);
  }
}

// drop = probability between equal scores: the position order decides, first choices before
// second ones, in the layer and its reference alike. Token 0 chooses expert 0 second and token 1
// first, both with score σ(1); expert 0 keeps one assignment: token 1's.
TEST(MoEFFN, DropByProbabilityBreaksTiesInThePositionOrder) {
  FFNConfig c = base(4, 2, "relu", false);
  c.moe.score = ScoreFunc::sigmoid;
  c.moe.router_bias = false;
  c.moe.capacity_factor = 1.0;  // ceil(1·2·2/4) = 1 assignment an expert
  c.moe.drop = DropPolicy::probability;
  MoEFFN moe(c, 3);
  Tensor w = moe.parameters().at("gate.weight").value;  // [4, 12]: logits = x[:, :4]
  w.fill(0.0f);
  for (int e = 0; e < 4; ++e) w.f32()[e * 12 + e] = 1.0f;
  Tensor x({2, 12});
  x.fill(0.0f);
  const float rows[2][4] = {{1.0f, 2.0f, -5.0f, -6.0f}, {1.0f, -5.0f, -6.0f, -7.0f}};
  for (int t = 0; t < 2; ++t)
    for (int e = 0; e < 4; ++e) x.f32()[t * 12 + e] = rows[t][e];
  Tensor y;
  moe.forward(y, x, false);
  const Routing& r = moe.routing();
  ASSERT_EQ(r.capacity, 1);
  ASSERT_EQ(r.expert[0 * 2 + 1], 0);  // token 0's second choice
  ASSERT_EQ(r.expert[1 * 2 + 0], 0);  // token 1's first
  EXPECT_LT(r.slot[0 * 2 + 1], 0);
  EXPECT_GE(r.slot[1 * 2 + 0], 0);
  auto ref = reference_of(moe);
  std::vector<double> yr;
  ref.forward(yr, test::to_vector<double>(x), 2);
  for (int a = 0; a < 4; ++a) EXPECT_EQ(ref.kept[a] != 0, r.slot[a] >= 0) << "assignment " << a;
  EXPECT_LT(test::scaled_error(y.f32(), yr.data(), y.numel()), 2e-6);
}

// A capacity factor beyond its key's range (the fuzzer's 1e106, whose ceil(factor·T·K/E) would
// not fit in an int64) is refused; the largest it takes is a capacity of every assignment:
// nothing dropped, the same output as dropless.
TEST(MoEFFN, HugeCapacityFactorIsDropless) {
  FFNConfig c = base(4, 2, "relu", true);
  MoEFFN dropless(c, 7);
  c.moe.capacity_factor = 1e300;  // beyond its key's range
  EXPECT_NE(test::error_of([&] {
              MoEFFN(c, 7);
            }).find("capacity_factor = 1e+300 must be in [0, 1000000]"),
            std::string::npos);
  c.moe.capacity_factor = 1e6;  // the largest it takes: a capacity past every token's choices
  MoEFFN huge(c, 7);
  const Tensor x = test::random_tensor({9, 12}, 8);
  Tensor a, b;
  dropless.forward(a, x, false);
  huge.forward(b, x, false);
  EXPECT_EQ(huge.routing().capacity, 9 * 2);
  EXPECT_EQ(huge.stats().dropped, 0);
  for (std::int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.f32()[i], b.f32()[i]);
}

TEST(MoEFFN, StatisticsAreConsistent) {
  FFNConfig c = base(6, 2, "relu", true);
  MoEFFN moe(c, 11);
  Tensor y;
  moe.forward(y, test::random_tensor({50, 12}, 12), true);
  const FFNStats s = moe.stats();
  const Routing& r = moe.routing();
  double mean = 100.0 / 6, sq = 0, mx = 0;
  for (auto n : s.tokens_per_expert) {
    sq += (n - mean) * (n - mean);
    mx = std::max(mx, static_cast<double>(n));
  }
  EXPECT_NEAR(s.load_cv, std::sqrt(sq / 6) / mean, 1e-12);
  EXPECT_NEAR(s.max_over_mean, mx / mean, 1e-12);
  EXPECT_GT(s.router_entropy, 0.0);
  EXPECT_LE(s.router_entropy, std::log(6.0) + 1e-9);
  EXPECT_GE(s.top1_prob, 1.0 / 6 - 1e-9);
  double top1 = 0;
  for (std::int64_t t = 0; t < 50; ++t)
    top1 += *std::max_element(r.probs.begin() + t * 6, r.probs.begin() + (t + 1) * 6) / 50.0;
  EXPECT_NEAR(s.top1_prob, top1, 1e-6);
  EXPECT_GT(s.zero_fraction, 0.2);  // ReLU experts at initialisation
  EXPECT_LT(s.zero_fraction, 0.8);
}

TEST(MoEFFN, BalanceBiasFollowsTheUpdateRule) {
  FFNConfig c = base(4, 1, "relu", false);
  c.moe.balance_bias = true;
  c.moe.balance_rate = 0.01f;
  MoEFFN moe(c, 21);
  const Tensor x = test::random_tensor({64, 12}, 22);
  Tensor y;
  std::vector<std::int64_t> load(4, 0);
  for (int step = 0; step < 2; ++step) {  // two forwards (accumulation), one update
    moe.forward(y, x, true);
    for (int e = 0; e < 4; ++e) load[e] += moe.routing().load[e];
  }
  const Tensor& b = moe.parameters().at("gate.e_score_correction_bias").value;
  EXPECT_FALSE(moe.parameters().at("gate.e_score_correction_bias").trainable);
  moe.after_optimizer_step();
  const double mean = (load[0] + load[1] + load[2] + load[3]) / 4.0;
  for (int e = 0; e < 4; ++e) {
    const float expect = load[e] < mean ? 0.01f : load[e] > mean ? -0.01f : 0.0f;
    EXPECT_FLOAT_EQ(b.f32()[e], expect) << "expert " << e << " load " << load[e];
  }
  // Inference forwards do not count towards the next update.
  moe.forward(y, x, false);
  moe.after_optimizer_step();
  for (int e = 0; e < 4; ++e)
    EXPECT_FLOAT_EQ(b.f32()[e], load[e] < mean ? 0.01f : load[e] > mean ? -0.01f : 0.0f);
}

TEST(MoEFFN, NoiseOnlyInTraining) {
  FFNConfig c = base(6, 2, "relu", true);
  c.moe.jitter = 0.5f;
  c.moe.noisy_topk = true;
  MoEFFN moe(c, 31);
  const Tensor x = test::random_tensor({64, 12}, 32);
  Tensor y1, y2, y3;
  moe.forward(y1, x, false);
  const auto chosen = moe.routing().expert;
  moe.forward(y2, x, false);
  EXPECT_EQ(test::scaled_error(y1.f32(), y2.f32(), y1.numel()), 0.0);
  moe.forward(y3, x, true);
  EXPECT_NE(moe.routing().expert, chosen);  // the noise moved some tokens

  // A training forward of a caller that evaluates (FFNContext::stochastic false) keeps what
  // backward needs but routes as at inference: the same choice and output, and a backward
  // that gives the unused noise weight no gradient.
  moe.context().stochastic = false;
  Tensor y4, dx;
  moe.forward(y4, x, true);
  EXPECT_EQ(moe.routing().expert, chosen);
  EXPECT_LT(test::scaled_error(y4.f32(), y1.f32(), y1.numel()), 1e-6);
  moe.parameters().zero_grad();
  moe.backward(dx, test::random_tensor({64, 12}, 33));
  const Tensor& noise = moe.parameters().at("gate.noise.weight").grad;
  for (std::int64_t i = 0; i < noise.numel(); ++i) ASSERT_EQ(noise.f32()[i], 0.0f) << i;
  double router = 0;
  const Tensor& gate = moe.parameters().at("gate.weight").grad;
  for (std::int64_t i = 0; i < gate.numel(); ++i) router += std::fabs(gate.f32()[i]);
  EXPECT_GT(router, 0.0);
  EXPECT_FALSE(moe.jitter_noise().defined());  // it drew none
  EXPECT_FALSE(moe.gate_noise().defined());
}

// An evaluating training forward (stochastic false): its dx is the gradient of the inference
// forward it computed (a directional derivative by central differences, the routing held by
// a small step), its load moves no balancing bias, and BASE layers route greedily in it.
TEST(MoEFFN, AnEvaluatingTrainingForwardIsTheInferenceForwardWithItsGradient) {
  FFNConfig c = base(6, 2, "relu", true);
  c.moe.jitter = 0.5f;
  c.moe.noisy_topk = true;
  c.moe.balance_bias = true;
  c.moe.balance_rate = 0.01f;
  MoEFFN moe(c, 51);
  moe.context().stochastic = false;
  const Tensor x = test::random_tensor({32, 12}, 52), dy = test::random_tensor({32, 12}, 53);
  const Tensor v = test::random_tensor({32, 12}, 54);
  Tensor y, dx;
  moe.forward(y, x, true);
  moe.backward(dx, dy);
  const auto loss = [&](float h) {
    Tensor xs = x.clone(), ys;
    for (std::int64_t i = 0; i < xs.numel(); ++i) xs.f32()[i] += h * v.f32()[i];
    moe.forward(ys, xs, false);
    double s = 0;
    for (std::int64_t i = 0; i < ys.numel(); ++i) s += double(ys.f32()[i]) * dy.f32()[i];
    return s;
  };
  const double h = 1e-3, numeric = (loss(h) - loss(-h)) / (2 * h);
  double analytic = 0;
  for (std::int64_t i = 0; i < dx.numel(); ++i) analytic += double(dx.f32()[i]) * v.f32()[i];
  EXPECT_NEAR(analytic, numeric, 2e-3 * std::max(1.0, std::fabs(numeric)));
  moe.after_optimizer_step();
  const Tensor& b = moe.parameters().at("gate.e_score_correction_bias").value;
  for (int e = 0; e < 6; ++e) EXPECT_EQ(b.f32()[e], 0.0f) << e;

  FFNConfig bc = base(4, 1, "relu", false);
  base_layers(bc.moe);
  MoEFFN layers(bc, 55);
  const Tensor xb = test::random_tensor({16, 12}, 56);
  Tensor yb;
  layers.forward(yb, xb, false);
  const auto greedy = layers.routing().expert;
  layers.forward(yb, xb, true);  // in training: the balanced assignment
  const auto balanced = layers.routing().expert;
  layers.context().stochastic = false;
  layers.forward(yb, xb, true);
  EXPECT_EQ(layers.routing().expert, greedy);
  EXPECT_NE(balanced, greedy);  // (else the case would not tell them apart)
}

TEST(MoEFFN, AuxLossGradientScales) {
  FFNConfig c = base(5, 2, "relu", true);
  c.moe.aux_coef = 1.0f;
  c.moe.z_coef = 0.0f;
  MoEFFN moe(c, 41);
  const Tensor x = test::random_tensor({20, 12}, 42);
  const Tensor zero({20, 12});
  Tensor y, dx;
  moe.forward(y, x, true);
  moe.backward(dx, zero);  // only the aux loss reaches the router
  const Tensor g1 = moe.parameters().at("gate.weight").grad.clone();
  double norm = 0;
  for (std::int64_t i = 0; i < g1.numel(); ++i) norm += std::fabs(g1.f32()[i]);
  EXPECT_GT(norm, 0.0);
  moe.parameters().zero_grad();
  moe.set_aux_loss_scale(0.25f);
  moe.forward(y, x, true);
  moe.backward(dx, zero);
  const Tensor& g2 = moe.parameters().at("gate.weight").grad;
  for (std::int64_t i = 0; i < g1.numel(); ++i) EXPECT_NEAR(g2.f32()[i], 0.25f * g1.f32()[i], 1e-7);
}

TEST(MoEFFN, InvalidConfigsAreRejected) {
  auto expect_error = [](FFNConfig c, const char* text) {
    try {
      MoEFFN moe(c, 0);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  // Each change to a valid config, and what its error says.
  auto top_p = [](MoEConfig& m) {
    m.routing = RoutingKind::top_p;
    m.top_p = 0.5f;
  };
  auto relu = [](MoEConfig& m) {
    m.routing = RoutingKind::relu;
    m.normalize = false;
    m.aux_coef = m.z_coef = 0.0f;
  };
  const std::vector<std::pair<std::function<void(MoEConfig&)>, const char*>> bad = {
      {[](MoEConfig& m) { m.top_k = 7; }, "exceeds num_experts"},
      {[](MoEConfig& m) {
         m.groups = 4;
         m.topk_groups = 1;
       },
       "not divisible"},
      {[](MoEConfig& m) {
         m.groups = 3;
         m.topk_groups = 4;
       },
       "topk_group = 4"},
      {[](MoEConfig& m) { m.capacity_factor = -1; },
       "capacity_factor = -1 must be in [0, 1000000]"},
      {[](MoEConfig& m) { m.expert_kind = FFNKind::multi_branch; }, "must be plain or glu"},
      {[](MoEConfig& m) { m.naming = MoENaming::mixtral; }, "needs glu experts"},
      {[&](MoEConfig& m) {
         top_p(m);
         m.top_p = 0.0f;
       },
       "top_p = 0 must be in [1e-06, 1]"},
      {[&](MoEConfig& m) {
         top_p(m);
         m.score = ScoreFunc::sigmoid;
       },
       "needs score 'softmax'"},
      {[&](MoEConfig& m) {
         top_p(m);
         m.balance_bias = true;
       },
       "balancing bias"},
      {[](MoEConfig& m) { m.entropy_coef = -1.0f; }, "entropy_coef = -1"},
      {[&](MoEConfig& m) {
         relu(m);
         m.normalize = true;
       },
       "normalize: true"},
      {[&](MoEConfig& m) {
         relu(m);
         m.aux_coef = 0.01f;
       },
       "aux_coef, z_coef or entropy_coef"},
      {[&](MoEConfig& m) {
         relu(m);
         m.capacity_factor = 1.0;
       },
       "it is dropless"},
      {[&](MoEConfig& m) {
         relu(m);
         m.top_k = 6;
       },
       "fewer than num_experts = 6"},
      {[&](MoEConfig& m) {
         relu(m);
         m.l1_coef_rate = 1.0f;
       },
       "l1_coef_rate = 1 must be greater"},
      {[&](MoEConfig& m) {
         top_p(m);
         m.zero_experts = 1;
       },
       "chosen by top-k routing"},
      {[](MoEConfig& m) {
         m.copy_experts = 1;
         m.capacity_factor = 1.0;
       },
       "dropless layer"},
      {[](MoEConfig& m) { m.zc_balance_weight = -1.0f; }, "zc_balance_weight = -1"},
      {[](MoEConfig& m) { m.zc_balance_weight = 0.5f; }, "zc_balance_weight = 0.5 weighs"},
      {[](MoEConfig& m) { m.balance_rate = 0.01f; }, "balance_rate = 0.01 is the balancing"},
      {[](MoEConfig& m) { m.shared_d_ff = 7; }, "shared_d_ff = 7 sizes the shared experts"},
      {[](MoEConfig& m) {
         m.zero_experts = 1;
         m.balance_bias = true;
       },
       "the balancing bias (it"},
      {[](MoEConfig& m) {
         m.routing = RoutingKind::expert_choice;
         m.aux_coef = 0.0f;
       },
       "routing 'expert_choice' does not combine with normalize: true"},
      {[](MoEConfig& m) {
         m.routing = RoutingKind::expert_choice;
         m.normalize = false;
       },
       "every expert takes the same number of tokens"},
      {[](MoEConfig& m) {
         m.routing = RoutingKind::expert_choice;
         m.normalize = false;
         m.aux_coef = 0.0f;
         m.score = ScoreFunc::sigmoid;
       },
       "softmax probabilities"},
      {[](MoEConfig& m) {
         m.gating_residual = true;
         m.noisy_topk = true;
       },
       "gating_residual does not combine with noisy top-k or jitter"},
      {[](MoEConfig& m) {
         m.gating_residual = true;
         m.jitter = 0.1f;
       },
       "gating_residual does not combine with noisy top-k or jitter"},
      {[](MoEConfig& m) {
         m.gating_residual = true;
         m.routing = RoutingKind::soft;
         m.aux_coef = m.z_coef = 0.0f;
       },
       "routing 'soft' has no router logits"},
  };
  for (const auto& [change, text] : bad) {
    FFNConfig c = base(6, 2, "relu", true);
    change(c.moe);
    expect_error(c, text);
  }
}

// MoE++'s gating residual: a first layer (no previous logits, marked first) is the layer without
// the option, its gate_map untouched; a layer neither given logits nor marked first, and logits
// of another shape, are refused by name.
TEST(MoEFFN, GatingResidualIsOptionalAndChecked) {
  FFNConfig c = base(4, 2, "relu", true);
  c.moe.copy_experts = 1;
  FFNConfig plain = c;
  c.moe.gating_residual = true;
  MoEFFN with(c, 61), without(plain, 61);
  for (const auto& p : without.parameters().list())  // the same draws for the shared parameters
    EXPECT_EQ(test::to_vector<double>(with.parameters().at(p.name).value),
              test::to_vector<double>(p.value))
        << p.name;
  const Tensor x = test::random_tensor({7, 12}, 62), dy = test::random_tensor({7, 12}, 63);
  Tensor y1, y2, dx1, dx2;
  EXPECT_NE(test::error_of([&] { with.forward(y1, x, true); }).find("no gate residual"),
            std::string::npos);
  with.context().first_layer = true;
  with.parameters().zero_grad();
  with.forward(y1, x, true);
  with.backward(dx1, dy);
  without.forward(y2, x, true);
  without.backward(dx2, dy);
  EXPECT_EQ(test::to_vector<double>(y1), test::to_vector<double>(y2));
  EXPECT_EQ(test::to_vector<double>(dx1), test::to_vector<double>(dx2));
  EXPECT_FALSE(with.previous_logits_grad().defined());
  const Tensor& dmap = with.parameters().at("gate.gate_map.weight").grad;
  EXPECT_EQ(dmap.shape(), (Shape{5, 5}));
  for (std::int64_t i = 0; i < dmap.numel(); ++i) EXPECT_EQ(dmap.f32()[i], 0.0f);

  const Tensor wrong = test::random_tensor({7, 4}, 64);
  with.context().previous_logits = &wrong;
  EXPECT_NE(test::error_of([&] {
              with.forward(y1, x, false);
            }).find("the gate residual [7, 4] must be the previous MoE layer's logits [7, 5]"),
            std::string::npos);
}

TEST(MoEFFN, ParametersMoveWithTheirBuffer) {
  FFNConfig c = base(4, 2, "swiglu", true);
  c.moe.num_shared = 1;
  c.moe.shared_gate = true;
  MoEFFN moe(c, 51);
  const Tensor x = test::random_tensor({6, 12}, 52);
  Tensor y1, y2;
  moe.forward(y1, x, false);
  const std::int64_t n = moe.parameters().count();
  Tensor big({n + 10}), grads({n + 10});
  moe.move_parameters(big.view(5, {n}), grads.view(5, {n}));
  EXPECT_EQ(moe.parameters().values().f32(), big.f32() + 5);
  moe.forward(y2, x, false);
  EXPECT_EQ(test::scaled_error(y1.f32(), y2.f32(), y1.numel()), 0.0);
  big.f32()[5 + moe.parameters().at("shared_experts.down_proj.weight").offset] += 1.0f;
  moe.forward(y2, x, false);
  EXPECT_GT(test::scaled_error(y2.f32(), y1.f32(), y1.numel()),
            0.0);  // the shared expert moved too
}

TEST(MoEFFN, Bf16TrainingConvertsOnceWithTheSameValues) {
  // A bf16 training forward converts the permuted rows and the expert stacks once (for its
  // backward too); inference converts in each product. The same values either way, bit for bit
  // (ReLU and SwiGLU experts: their activation runs the same way in both). The backward that
  // reads the converted stacks agrees with central differences of the double reference to bf16's
  // precision, checked for SwiGLU only: with ReLU experts a pre-activation near 0 may take the
  // other side of the mask in bf16, a whole unit's gradient at this small width.
  std::uint64_t seed = 1700;
  for (const char* variant : {"relu", "swiglu"}) {
    SCOPED_TRACE(variant);
    const FFNConfig c = base(4, 2, variant, true);
    MoEFFN moe(c, ++seed);
    moe.set_precision(Precision::bf16);
    const std::int64_t T = 160, D = c.d_model;  // ~80 rows per expert: oneDNN products
    const Tensor x = test::random_tensor({T, D}, ++seed), dy = test::random_tensor({T, D}, ++seed);
    Tensor y_infer, y_train, dx;
    moe.forward(y_infer, x, /*train=*/false);
    for (auto n : moe.stats().tokens_per_expert) EXPECT_GT(n, kFewRowsMax);
    moe.parameters().zero_grad();
    moe.forward(y_train, x, /*train=*/true);
    ASSERT_EQ(y_train.numel(), y_infer.numel());
    EXPECT_EQ(0, std::memcmp(y_train.raw(), y_infer.raw(), y_train.nbytes()));
    if (std::string(variant) == "relu") continue;
    moe.backward(dx, dy);

    auto r = reference_of(moe);
    std::vector<double> xs = test::to_vector<double>(x), ys;
    r.forward(ys, xs, T);
    r.hold_routing = true;
    const std::vector<double> g = test::to_vector<double>(dy);
    const double aux = c.moe.aux_coef, zc = c.moe.z_coef;
    auto loss = [&] {
      r.forward(ys, xs, T);
      double l = aux * r.balance + zc * r.z;
      for (std::size_t i = 0; i < ys.size(); ++i) l += ys[i] * g[i];
      return l;
    };
    auto check = [&](std::vector<double>& theta, const Tensor& grad, const char* what) {
      double largest = 0;
      for (std::int64_t i = 0; i < grad.numel(); ++i)
        largest = std::max(largest, std::fabs(static_cast<double>(grad.f32()[i])));
      const std::vector<double> analytic(grad.f32(), grad.f32() + grad.numel());
      test::expect_gradient(theta, analytic, loss, test::sample_indices(theta.size(), 12),
                            3e-2 * largest, 3e-2, what, 1e-4);
    };
    check(xs, dx, "dx");
    for (const auto& p : moe.parameters().list())
      if (p.trainable) check(r.params[p.name], p.grad, p.name.c_str());
  }
}

// Soft MoE's experts cannot be split over ranks (every expert's slots mix every token of a
// sequence): one rule (splits_experts), refused where a layer would hold part of its experts.
TEST(MoEFFN, SoftMoEDoesNotSplitItsExperts) {
  for (int k = 0; k < static_cast<int>(RoutingKind::count); ++k) {
    const auto routing = static_cast<RoutingKind>(k);
    EXPECT_EQ(splits_experts(routing), routing != RoutingKind::soft) << enum_name(routing);
  }
  const FFNConfig c = config_from_json(nlohmann::json::parse(
      R"({"variant":"moe","d_model":16,"d_ff":24,"moe":{"num_experts":4,"routing":"soft"}})"));
  EXPECT_NE(test::error_of([&] {
              MoEFFN part(c, 1, HeldExperts{0, 2});
            }).find("[moe] routing 'soft' does not split its experts over ranks"),
            std::string::npos);
  EXPECT_NO_THROW(MoEFFN(c, 1, HeldExperts{0, 4}));
}

// Hash routing (Roller et al. 2021): a token's experts are a function of its id alone, every id
// maps to k distinct experts, the map spreads the ids over every expert, and the layer has no
// router parameters. Without ids it refuses to route.
TEST(MoEFFN, HashRoutingChoosesByTheTokenIdAlone) {
  FFNConfig c = base(4, 2, "relu", true);
  c.moe.routing = RoutingKind::hash;
  c.moe.aux_coef = c.moe.z_coef = 0.0f;
  MoEFFN moe(c, 5);
  for (const auto& p : moe.parameters().list())
    EXPECT_EQ(p.name.rfind("gate.", 0), std::string::npos) << p.name;
  const std::int64_t T = 512;
  std::vector<std::int32_t> ids(T);
  for (std::int64_t t = 0; t < T; ++t) ids[t] = static_cast<std::int32_t>(t % 256);
  moe.context().token_ids = ids.data();
  Tensor y;
  moe.forward(y, test::random_tensor({T, 12}, 6), false);
  const Routing r = moe.routing();
  std::vector<std::int64_t> load(4, 0);
  for (std::int64_t t = 0; t < T; ++t) {
    ASSERT_EQ(r.count[t], 2);
    EXPECT_NE(r.expert[t * 2], r.expert[t * 2 + 1]);
    if (t >= 256) {  // the same id (t and t - 256), another input row: the same experts
      EXPECT_EQ(r.expert[t * 2], r.expert[(t - 256) * 2]);
      EXPECT_EQ(r.expert[t * 2 + 1], r.expert[(t - 256) * 2 + 1]);
    }
    EXPECT_EQ(r.weight[t * 2], 0.5f);  // normalize: 1/k each
    for (int j = 0; j < 2; ++j) ++load[r.expert[t * 2 + j]];
  }
  for (int e = 0; e < 4; ++e) {  // 1,024 assignments: 256 each if uniform
    EXPECT_GT(load[e], 180) << e;
    EXPECT_LT(load[e], 330) << e;
  }
  EXPECT_EQ(r.balance_loss, 0.0);
  moe.context().token_ids = nullptr;
  EXPECT_NE(test::error_of([&] {
              moe.forward(y, test::random_tensor({T, 12}, 7), false);
            }).find("routing 'hash' chooses by token id"),
            std::string::npos);
}

// BASE layers (Lewis et al. 2021): a training forward assigns the batch in balance, T/E tokens
// an expert, as the exact optimum of the affinities' sum (the reference solves it by min-cost
// flow); an inference forward gives each token its best expert; weights are σ(affinity).
TEST(MoEFFN, BaseLayersAssignTheBatchInBalanceAndEachTokenItsBestAtInference) {
  for (const auto& [E, T] : {std::pair{4, 64}, {5, 33}}) {
    SCOPED_TRACE(T);
    FFNConfig c = base(E, 1, "relu", true);
    base_layers(c.moe);
    MoEFFN moe(c, 21);
    const Tensor x = test::random_tensor({T, 12}, 22);
    Tensor y;
    moe.forward(y, x, true);
    const Routing trained = moe.routing();
    auto r = reference_of(moe);
    r.train = true;
    std::vector<double> yr;
    r.forward(yr, test::to_vector<double>(x), T);
    std::vector<std::int64_t> load(E, 0);
    double got = 0, best = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      ++load[trained.expert[t]];
      got += r.logits[t * E + trained.expert[t]];
      best += r.logits[t * E + r.chosen[t]];
      EXPECT_EQ(trained.expert[t], r.chosen[t]) << t;
      EXPECT_NEAR(trained.weight[t], 1.0 / (1.0 + std::exp(-r.logits[t * E + trained.expert[t]])),
                  1e-6);
    }
    for (int e = 0; e < E; ++e) EXPECT_EQ(load[e], T / E + (e < T % E)) << e;
    EXPECT_NEAR(got, best, 1e-5 * std::abs(best));
    EXPECT_LT(test::scaled_error(y.f32(), yr.data(), y.numel()), 2e-6);
    moe.forward(y, x, false);  // inference: greedy top-1, whatever the balance
    const Routing& greedy = moe.routing();
    for (std::int64_t t = 0; t < T; ++t) {
      const float* l = moe.router_logits().f32() + t * E;
      EXPECT_EQ(greedy.expert[t], std::max_element(l, l + E) - l) << t;
    }
  }
}

// A token whose input is NaN or infinite makes NaN or infinite router logits. Every routing
// family still chooses valid experts for every token, in training and at inference, without a
// crash or a hang; the non-finite values reach the output, which the trainer reports.
TEST(MoEFFN, NonFiniteInputsStillChooseValidExperts) {
  std::uint64_t seed = 900;
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    auto [layer, x, y, residual, ids] = routed(c, seed);
    MoEFFN& moe = *layer;
    moe.context().sequence = c.sequence;
    moe.context().token_ids = ids.data();
    moe.context().previous_logits = residual.defined() ? &residual : nullptr;
    float* xs = x.f32();
    const std::int64_t D = c.config.d_model;
    xs[0] = std::numeric_limits<float>::quiet_NaN();
    if (c.tokens > 2) xs[2 * D] = std::numeric_limits<float>::infinity();
    if (c.tokens > 3) xs[3 * D + 1] = -std::numeric_limits<float>::infinity();
    for (const bool train : {true, false}) {
      SCOPED_TRACE(train ? "training" : "inference");
      moe.forward(y, x, train);
      const Routing& r = moe.routing();
      if (c.config.moe.routing == RoutingKind::soft) continue;  // nothing is chosen
      const int E = r.experts;
      for (std::int64_t t = 0; t < c.tokens; ++t) {
        ASSERT_GE(r.count[t], 0) << t;
        ASSERT_LE(r.count[t], r.k) << t;
        for (int j = 0; j < r.count[t]; ++j) {
          const std::int32_t e = r.expert[t * r.k + j];
          EXPECT_TRUE(e >= 0 && e < E) << "token " << t << " choice " << j << ": " << e;
        }
      }
    }
    // One expert's router row NaN: its logit is NaN for every token, the others finite. A ReLU
    // routing token still takes exactly its experts of positive logit.
    if (!routing_family(c.config.moe.routing).router_linear) continue;
    Tensor w = moe.parameters().at("gate.weight").value;
    std::fill(w.f32() + D, w.f32() + 2 * D, std::numeric_limits<float>::quiet_NaN());
    const Tensor clean = test::random_tensor({c.tokens, D}, ++seed);
    for (const bool train : {true, false}) {
      SCOPED_TRACE(train ? "training, NaN router row" : "inference, NaN router row");
      moe.forward(y, clean, train);
      const Routing& r = moe.routing();
      if (c.config.moe.routing == RoutingKind::soft) continue;
      for (std::int64_t t = 0; t < c.tokens; ++t) {
        for (int j = 0; j < r.count[t]; ++j) {
          const std::int32_t e = r.expert[t * r.k + j];
          EXPECT_TRUE(e >= 0 && e < r.experts) << "token " << t << " choice " << j << ": " << e;
        }
        if (!relu(c.config)) continue;
        const float* l = moe.router_logits().f32() + t * r.experts;
        int positive = 0;
        for (int e = 0; e < r.experts; ++e) positive += l[e] > 0;
        EXPECT_EQ(r.count[t], positive) << t;
        for (int j = 0; j < r.count[t]; ++j) EXPECT_GT(l[r.expert[t * r.k + j]], 0.0f) << t;
      }
    }
    moe.context().previous_logits = nullptr;
    moe.context().token_ids = nullptr;
  }
}

// The functions a family's callers call without a check: the study's configuration, the few
// words of the cost table, and (unless the layer runs it as its own part) the choice. A family
// that left one null would crash its caller instead of failing here, by name.
TEST(MoEFFN, EveryRoutingFamilyDefinesWhatItsCallersCall) {
  for (const auto& name : routing_names()) {
    const RoutingFamily& f = routing_family(parse_enum<RoutingKind>(name));
    EXPECT_NE(f.study, nullptr) << name << ": study";
    EXPECT_NE(f.describe, nullptr) << name << ": describe";
    EXPECT_TRUE(f.own_path || f.choose != nullptr) << name << ": choose";
    ASSERT_NE(f.summary, nullptr) << name;
    EXPECT_STRNE(f.summary, "") << name << ": summary (--routing's help)";
    EXPECT_STRNE(f.title, "") << name << ": title (the routing figure's words)";
  }
  // The study's families, MoE++ among them, each with its words; an unknown one is refused.
  std::set<std::string> titles;
  for (const auto& name : routing_family_names()) titles.insert(routing_family_title(name));
  EXPECT_EQ(titles.size(), routing_family_names().size());
  EXPECT_EQ(routing_family_title("moe_pp"), "MoE++");
  EXPECT_EQ(routing_family_title("relu"), "ReLU routing");
  EXPECT_THROW(routing_family_title("nope"), Error);
}

// A key that a routing does not read is refused unless it holds its default, naming the
// routing; the defaults themselves (which checkpoints print) pass.
TEST(MoEFFN, KeysARoutingDoesNotReadAreRefused) {
  const std::vector<std::pair<std::function<void(MoEConfig&)>, std::string>> bad = {
      {[](MoEConfig& m) { m.top_p = 0.9f; }, "routing 'topk' does not read top_p (given"},
      {[](MoEConfig& m) {
         m.routing = RoutingKind::hash;
         m.z_coef = 0.0f;
       },
       "routing 'hash' does not read aux_coef"},
      {[](MoEConfig& m) {
         base_layers(m);
         m.top_k = 2;
       },
       "routing 'base' assigns one expert a token: top_k = 2 must be 1"},
      {[](MoEConfig& m) {
         base_layers(m);
         m.score = ScoreFunc::softmax;
       },
       "routing 'base' does not read score (given \"softmax\")"},
      {[](MoEConfig& m) {
         m.routing = RoutingKind::hash;
         m.aux_coef = m.z_coef = 0.0f;
         m.noisy_topk = true;
       },
       "routing 'hash' does not read noisy_topk"},
      {[](MoEConfig& m) {
         m.routing = RoutingKind::soft;
         m.aux_coef = m.z_coef = 0.0f;
         m.router_bias = false;
       },
       "routing 'soft' does not read router_bias (given false)"},
      {[](MoEConfig& m) {
         m.routing = RoutingKind::soft;
         m.aux_coef = m.z_coef = 0.0f;
         m.top_k = 1;
       },
       "routing 'soft' does not read top_k (given 1)"},
  };
  for (const auto& [change, text] : bad) {
    FFNConfig c = base(6, 2, "relu", true);
    change(c.moe);
    EXPECT_NE(test::error_of([&] { validate(c); }).find(text), std::string::npos) << text;
  }
  for (const auto& routing : routing_names()) {
    SCOPED_TRACE(routing);
    nlohmann::json j = {{"variant", "moe"}, {"d_model", 8}, {"moe", {{"routing", routing}}}};
    const FFNConfig c = config_from_json(j);  // the routing's defaults
    EXPECT_EQ(config_to_json(config_from_json(config_to_json(c))), config_to_json(c));
  }
  // A family's list of keys it does not read names keys (a misspelt one would be skipped, and
  // the key it meant taken and ignored).
  const std::vector<std::string> names = moe_key_names();
  const std::set<std::string> keys(names.begin(), names.end());
  for (const auto& routing : routing_names())
    for (const std::string& key : unused_keys(parse_enum<RoutingKind>(routing)))
      EXPECT_EQ(keys.count(key), 1u) << "routing '" << routing << "' lists '" << key
                                     << "' as a key it does not read, but it is no MoE key";
}

// A forward that throws part way (here hash routing without the tokens' ids, after the checks
// of the input) leaves no backward: the last training forward's routing and rows are gone.
TEST(MoEFFN, AFailedForwardLeavesNoBackward) {
  FFNConfig c = base(4, 2, "relu", true);
  c.moe.routing = RoutingKind::hash;
  c.moe.aux_coef = c.moe.z_coef = 0.0f;
  MoEFFN moe(c, 5);
  const std::int64_t T = 8;
  std::vector<std::int32_t> ids(T);
  for (std::int64_t t = 0; t < T; ++t) ids[t] = static_cast<std::int32_t>(t);
  moe.context().token_ids = ids.data();
  Tensor y, dx;
  const Tensor dy = test::random_tensor({T, 12}, 8);
  moe.forward(y, test::random_tensor({T, 12}, 6), true);
  moe.backward(dx, dy);  // the training forward's backward runs
  moe.context().token_ids = nullptr;
  EXPECT_THROW(moe.forward(y, test::random_tensor({T, 12}, 7), true), Error);
  EXPECT_NE(test::error_of([&] { moe.backward(dx, dy); }).find("backward needs a forward"),
            std::string::npos);

  // MoE++'s gate residual of the wrong width, found after the router has written this forward's
  // logits over the last one's (and let go of the last residual): no backward either.
  FFNConfig g = base(4, 2, "relu", true);
  g.moe.gating_residual = true;
  MoEFFN gated(g, 6);
  const Tensor residual = test::random_tensor({T, 4}, 9), wrong = test::random_tensor({T, 5}, 10);
  gated.context().previous_logits = &residual;
  gated.forward(y, test::random_tensor({T, 12}, 6), true);
  gated.backward(dx, dy);
  gated.context().previous_logits = &wrong;
  EXPECT_NE(test::error_of([&] {
              gated.forward(y, test::random_tensor({T, 12}, 7), true);
            }).find("the gate residual [8, 5] must be"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { gated.backward(dx, dy); }).find("backward needs a forward"),
            std::string::npos);
  gated.context().previous_logits = nullptr;
}

// A NaN score ranks last whichever expert has it: with sigmoid scores (one per expert), a NaN
// router row for expert 0 or for expert 2 alike leaves every token its best finite experts.
TEST(MoEFFN, ANaNScoreRanksLastWhereverItIs) {
  for (const int nan_expert : {0, 2}) {
    SCOPED_TRACE(nan_expert);
    FFNConfig c = base(4, 2, "relu", true);
    c.moe.score = ScoreFunc::sigmoid;
    MoEFFN moe(c, 11);
    const std::int64_t D = c.d_model, T = 16;
    Tensor w = moe.parameters().at("gate.weight").value;
    std::fill(w.f32() + nan_expert * D, w.f32() + (nan_expert + 1) * D,
              std::numeric_limits<float>::quiet_NaN());
    Tensor y;
    moe.forward(y, test::random_tensor({T, D}, 12), false);
    const Routing& r = moe.routing();
    for (std::int64_t t = 0; t < T; ++t) {
      const float* l = moe.router_logits().f32() + t * 4;
      float best = -std::numeric_limits<float>::infinity();  // the best finite logit
      for (int e = 0; e < 4; ++e)
        if (e != nan_expert) best = std::max(best, l[e]);
      EXPECT_EQ(l[r.expert[t * 2]], best) << t;
      for (int j = 0; j < 2; ++j) EXPECT_NE(r.expert[t * 2 + j], nan_expert) << t;
      for (int j = 0; j < 2; ++j) EXPECT_TRUE(std::isfinite(r.weight[t * 2 + j])) << t;
    }
    for (std::int64_t i = 0; i < y.numel(); ++i) ASSERT_TRUE(std::isfinite(y.f32()[i])) << i;
  }
}
