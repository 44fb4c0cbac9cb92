// Top-p routing (Huang et al. 2024, "Harder Tasks Need More Experts: Dynamic Routing in MoE
// Models"): a token takes its best experts, in order, until their softmax probabilities reach
// top_p, at most top_k of them, each weighted by its probability (no renormalisation, as the
// paper). The choice is top-k's (choose_ranked) with the mass as a stop.
#include <fmt/format.h>

#include <algorithm>

#include "check.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"

namespace ffnlab {

template <>
const RoutingFamily& family_of<RoutingKind::top_p>() {
  static const RoutingFamily family{
      .title = "top-p",
      .summary = "the fewest best experts whose probabilities reach --top-p",
      .top_k = "the most experts a token takes",
      .capacity = "as topk, k the cap",
      .capacity_drops = true,
      .defaults = R"({"normalize": false})",
      .unused = "slots,target_sparsity,l1_coef_init,l1_coef_rate,topk_groups,balance_rate",
      .validate =
          [](const MoEConfig& m) {
            // The mass is of softmax probabilities over every expert, taken best first. (top_p's
            // range is its key's, checked with the other keys': ffn_config.cpp.)
            check(m.score == ScoreFunc::softmax && !m.softmax_after_topk,
                  "[moe] routing 'top_p' sums softmax probabilities: it needs score 'softmax' "
                  "without softmax_after_topk");
            check(m.groups == 0,
                  "[moe] routing 'top_p' does not combine with group-limited selection");
            check(!m.balance_bias,
                  "[moe] routing 'top_p' does not combine with the balancing bias (the bias "
                  "shifts the choice, not the probabilities whose mass decides how many)");
          },
      .study =
          [](MoEConfig& m, std::int64_t) {
            m.top_p = 0.4f;  // Huang et al.'s released code (top_p_threshold)
            m.top_k = std::min(2 * m.top_k, m.num_experts);  // the cap on experts a token
            m.normalize = false;
            m.entropy_coef = 1e-4f;  // their dynamic (entropy) loss coefficient β
          },
      .describe =
          [](const MoEConfig& m) {
            return fmt::format("top-p {} with at most {} experts, costed at {}", m.top_p, m.top_k,
                               m.top_k);
          },
      .choose = [](Routing& r, const ChoiceInput& in,
                   const RouterConfig& m) { choose_ranked(r, in, m, m.top_p); },
  };
  return family;
}

}  // namespace ffnlab
