// Expert-choice routing (Zhou et al. 2022, "Mixture-of-Experts with Expert Choice Routing"): in
// every sequence, each expert takes its best ceil(c·k·S/E) tokens by softmax probability; a
// token gets 0 to E experts, each weighted by its probability. It compares a sequence's tokens,
// so a causal model cannot use it (the masked objective can).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "check.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"

namespace ffnlab {

namespace {

// Expert choice (Zhou et al. 2022): in every sequence of S tokens, expert e takes the C tokens of
// best score s_te (ties to the earlier token). Then each token's choices are the experts that
// took it, best score first (ties to the lower expert), followed by the others as padding.
void choose(Routing& r, const ChoiceInput& in, const RouterConfig& m) {
  const std::int64_t T = r.tokens;
  const std::int64_t S = in.sequence > 0 ? in.sequence : T;
  r.sequence = S;
  const int E = r.experts;
  check(S > 0 && T % S == 0,
        "[router] expert-choice routing takes whole sequences: {} tokens are not sequences of {}",
        T, S);
  const std::int64_t C = m.expert_choice_capacity(S), jobs = (T / S) * E;
  std::vector<char> taken(static_cast<std::size_t>(T * E), 0);
  const float* sc = r.scores.data();
#pragma omp parallel
  {
    std::vector<std::int64_t> order(static_cast<std::size_t>(S));
#pragma omp for schedule(static)
    for (std::int64_t job = 0; job < jobs; ++job) {
      const std::int64_t base = (job / E) * S;
      const int e = static_cast<int>(job % E);
      for (std::int64_t i = 0; i < S; ++i) order[i] = base + i;
      std::partial_sort(order.begin(), order.begin() + C, order.end(),
                        [&](std::int64_t a, std::int64_t b) {
                          const float ka = rank_key(sc[a * E + e]), kb = rank_key(sc[b * E + e]);
                          return ka > kb || (ka == kb && a < b);
                        });
      for (std::int64_t i = 0; i < C; ++i) taken[order[i] * E + e] = 1;
    }
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < T; ++t) {
      std::int32_t* chosen = r.expert.data() + t * E;
      for (int e = 0; e < E; ++e) chosen[e] = e;
      const float* st = sc + t * E;
      const char* took = taken.data() + t * E;
      std::stable_sort(chosen, chosen + E, [&](std::int32_t a, std::int32_t b) {
        if (took[a] != took[b]) return took[a] > took[b];
        return rank_key(st[a]) > rank_key(st[b]);
      });
      int n = 0;
      for (int j = 0; j < E; ++j) {
        const bool mine = took[chosen[j]] != 0;
        n += mine;
        r.raw[t * E + j] = mine ? st[chosen[j]] : 0.0f;
        r.weight[t * E + j] = m.scaling * r.raw[t * E + j];
      }
      r.count[t] = n;
    }
  }
}

void validate(const MoEConfig& m) {
  // Softmax probabilities over the experts, each expert taking its best tokens.
  auto refuse = [](bool bad, std::string_view what, std::string_view why) {
    check(!bad, "[moe] routing 'expert_choice' does not combine with {}: {}", what, why);
  };
  refuse(m.score != ScoreFunc::softmax || m.softmax_after_topk, "other scoring functions",
         "the experts rank tokens by their softmax probabilities");
  refuse(m.normalize, "normalize: true",
         "a token's weights are its probabilities of the experts that took it (set normalize "
         "false)");
  refuse(m.groups > 0 || m.balance_bias, "group-limited selection or the balancing bias",
         "they steer a token's choice, and here the experts choose");
  refuse(m.aux_coef > 0, "aux_coef", "every expert takes the same number of tokens");
  refuse(m.drop == DropPolicy::probability, "drop: probability",
         "each expert keeps its best tokens; no token is dropped by its position or its "
         "probability");
}

}  // namespace

template <>
const RoutingFamily& family_of<RoutingKind::expert_choice>() {
  static const RoutingFamily family{
      .title = "expert choice",
      .summary = "each expert takes its best ceil(capacity·k·S/E) tokens of a sequence",
      .top_k = "the experts a token gets on average (times the capacity factor)",
      .capacity =
          "each expert takes ceil(c·k·S/E) tokens of a sequence of S (c = 1 at 0); "
          "nothing drops",
      .whole_sequence = true,
      .defaults = R"({"normalize": false, "aux_coef": 0.0})",
      .unused =
          "top_p,slots,target_sparsity,l1_coef_init,l1_coef_rate,topk_groups,"
          "balance_rate,balance_loss,aux_coef",
      .validate = validate,
      .study = [](MoEConfig&, std::int64_t) {},  // capacity factor 1: k experts a token
      .describe =
          [](const MoEConfig& m) {
            return fmt::format(
                "expert choice at {:.3g} experts a token",
                std::min<double>(m.num_experts,
                                 (m.capacity_factor > 0 ? m.capacity_factor : 1.0) * m.top_k));
          },
      .experts_per_token =
          [](const MoEConfig& m, std::int64_t) {
            return std::min<double>(m.num_experts,
                                    (m.capacity_factor > 0 ? m.capacity_factor : 1.0) * m.top_k);
          },
      .width = [](const RouterConfig& m) { return m.routed_experts(); },
      .choose = choose,
  };
  return family;
}

}  // namespace ffnlab
