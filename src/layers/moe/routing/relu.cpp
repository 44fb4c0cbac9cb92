// ReLU routing (ReMoE, Wang et al. 2025, "ReMoE: Fully Differentiable Mixture-of-Experts with
// ReLU Routing"): a token takes every expert whose router logit is positive, weighted by it. An
// L1 penalty on the gates, whose coefficient λ adapts between steps (TokenRouter), holds the
// mean at top_k experts a token and balances the load.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "check.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"

namespace ffnlab {

namespace {

// Every expert, best logit first (ties to the lower index; NaN last); those with a positive logit
// are the token's, weighted by scaling·logit.
void choose(Routing& r, const ChoiceInput& in, const RouterConfig& m) {
  const int E = r.experts;
  const std::int64_t T = r.tokens;
#pragma omp parallel
  {
    std::vector<std::int32_t> order(E);
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < T; ++t) {
      const float* l = in.logits + t * E;
      std::int32_t* chosen = r.expert.data() + t * E;
      float* v = r.raw.data() + t * E;
      float* w = r.weight.data() + t * E;
      for (int e = 0; e < E; ++e) order[e] = e;
      std::stable_sort(order.begin(), order.end(),
                       [l](int a, int b) { return rank_key(l[a]) > rank_key(l[b]); });
      int n = 0;
      for (int j = 0; j < E; ++j) {
        chosen[j] = order[j];
        const float gate = l[order[j]];
        n += gate > 0;
        v[j] = gate > 0 ? gate : 0.0f;
        w[j] = m.scaling * v[j];
      }
      r.count[t] = n;
    }
  }
}

// gate = max(l, 0), w = scaling·gate: a positive logit gets scaling·dw plus the L1 term
// ∂/∂gate_te of l1_coef·E/(top_k·T²)·Σ_e n_e·Σ_t gate_te (n_e held); the others nothing.
void backward(float* DL, const Routing& r, const float* dweight, const RouterConfig& m,
              float aux_scale, float l1_coef) {
  const std::int64_t T = r.tokens;
  const int E = r.experts, K = r.k;
  const double inv_t = r.total_tokens > 0 ? 1.0 / static_cast<double>(r.total_tokens) : 0.0;
  std::vector<float> dl1(E);
  for (int e = 0; e < E; ++e)
    dl1[e] = static_cast<float>(aux_scale * static_cast<double>(l1_coef) * E * r.load[e] * inv_t *
                                inv_t / m.top_k);
#pragma omp parallel for schedule(static) if (T * E > 65536)
  for (std::int64_t t = 0; t < T; ++t) {
    float* dl = DL + t * E;
    std::fill(dl, dl + E, 0.0f);
    for (int j = 0; j < r.count[t]; ++j) {
      const int e = r.expert[t * K + j];
      dl[e] = m.scaling * dweight[t * K + j] + dl1[e];
    }
  }
}

// The L1 penalty without its coefficient, E/(top_k·T²)·Σ_e n_e·Σ_t gate_te (n_e: tokens with a
// positive gate for e), over the group's tokens.
double l1_loss(const Routing& r, const RouterConfig& m) {
  const int E = r.experts;
  const double inv_t = r.total_tokens > 0 ? 1.0 / static_cast<double>(r.total_tokens) : 0.0;
  double l1 = 0;
  for (int e = 0; e < E; ++e) l1 += static_cast<double>(r.load[e]) * r.mass[e];
  return E * l1 * inv_t * inv_t / m.top_k;
}

void validate(const MoEConfig& m) {
  // The gates are the ReLU of the logits, every token's own, held sparse by the L1 penalty alone.
  auto refuse = [](bool bad, std::string_view what, std::string_view why) {
    check(!bad, "[moe] routing 'relu' does not combine with {}: {}", what, why);
  };
  const char* gates = "the gates are the positive logits themselves";
  refuse(m.score != ScoreFunc::softmax || m.softmax_after_topk, "other scoring functions", gates);
  refuse(m.normalize, "normalize: true",
         "dividing the gates by their sum would undo the L1 penalty (set normalize false)");
  refuse(m.groups > 0, "group-limited selection", gates);
  refuse(m.balance_bias || m.noisy_topk, "the balancing bias or noisy top-k",
         "they change a top-k choice, and nothing here is chosen by rank");
  refuse(m.capacity_factor > 0, "a capacity factor", "it is dropless");
  refuse(m.aux_coef > 0 || m.z_coef > 0 || m.entropy_coef > 0, "aux_coef, z_coef or entropy_coef",
         "its one loss is the L1 penalty, which balances the load too (l1_coef_*)");
  check(m.top_k < m.num_experts,
        "[moe] routing 'relu' holds top_k = {} experts per token on average: it must be fewer "
        "than num_experts = {}",
        m.top_k, m.num_experts);
  check(std::isfinite(m.l1_coef_rate) && m.l1_coef_rate > 1,
        "[moe] l1_coef_rate = {} must be greater than 1", m.l1_coef_rate);
}

}  // namespace

template <>
const RoutingFamily& family_of<RoutingKind::relu>() {
  static const RoutingFamily family{
      .title = "ReLU routing",
      .summary = "every expert whose router logit is positive",
      .top_k = "the mean a token takes, held by the L1 penalty",
      .defaults = R"({"normalize": false, "aux_coef": 0.0})",
      .unused =
          "top_p,slots,topk_groups,balance_rate,drop,balance_loss,aux_coef,z_coef,"
          "entropy_coef",
      .validate = validate,
      .study = [](MoEConfig& m, std::int64_t) { m.z_coef = 0.0f; },
      .describe =
          [](const MoEConfig& m) {
            return fmt::format(
                "ReLU routing held at {:.3g} experts a token (sparsity {:.3g}), costed at that",
                m.num_experts * (1.0 - m.sparsity_target()), m.sparsity_target());
          },
      .experts_per_token = [](const MoEConfig& m,
                              std::int64_t) { return m.num_experts * (1.0 - m.sparsity_target()); },
      .width = [](const RouterConfig& m) { return m.routed_experts(); },
      .choose = choose,
      .backward = backward,
      .own_loss = l1_loss,
  };
  return family;
}

}  // namespace ffnlab
