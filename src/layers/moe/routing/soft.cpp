// Soft MoE (Puigcerver et al. 2024, "From Sparse to Soft Mixtures of Experts"): no token
// chooses; every expert's slots are softmax-weighted mixtures of a sequence's tokens, and every
// token a softmax-weighted mixture of the slots' outputs. The layer runs it as its own part
// (layers/moe/soft_moe.hpp, with ops/router's soft_route); this file says what its keys mean.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "check.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"

namespace ffnlab {

namespace {

void validate(const MoEConfig& m) {
  // No router Linear and no choice; the slots' parameters are the layer's own.
  auto refuse = [](bool bad, std::string_view what, std::string_view why) {
    check(!bad, "[moe] routing 'soft' does not combine with {}: {}", what, why);
  };
  const char* nothing_chosen = "no token chooses, every token is mixed into every slot";
  refuse(m.capacity_factor > 0, "a capacity factor", "it is dropless");
  refuse(m.groups > 0 || m.balance_bias || m.noisy_topk || m.jitter > 0,
         "group-limited selection, the balancing bias, noisy top-k or jitter", nothing_chosen);
  refuse(m.aux_coef > 0 || m.z_coef > 0 || m.entropy_coef > 0, "aux_coef, z_coef or entropy_coef",
         nothing_chosen);
  refuse(m.zc_experts() > 0, "zero-computation experts", nothing_chosen);
  refuse(m.score != ScoreFunc::softmax || m.softmax_after_topk,
         "score 'sigmoid' or softmax_after_topk",
         "its dispatch and combine weights are softmaxes over tokens and slots, not router scores");
}

}  // namespace

template <>
const RoutingFamily& family_of<RoutingKind::soft>() {
  static const RoutingFamily family{
      .title = "Soft MoE",
      .summary = "every expert's --slots mix all of a sequence's tokens",
      .whole_sequence = true,
      .splits_experts = false,
      .router_linear = false,
      .own_path = true,
      .defaults = R"({"aux_coef": 0.0})",
      .unused =
          "top_k,top_p,target_sparsity,l1_coef_init,l1_coef_rate,router_bias,normalize,"
          "scaling,topk_groups,balance_rate,drop,balance_loss,aux_coef,z_coef,entropy_coef",
      .validate = validate,
      .study =
          [](MoEConfig& m, std::int64_t sequence) {
            // E·slots/S = k experts' compute a token; top_k itself is not read.
            m.slots = static_cast<int>(std::max<std::int64_t>(
                1, (m.top_k * sequence + m.num_experts / 2) / m.num_experts));
            m.top_k = MoEConfig{}.top_k;
            m.z_coef = 0.0f;
          },
      .describe =
          [](const MoEConfig& m) { return fmt::format("Soft MoE, {} slots an expert", m.slots); },
      .experts_per_token =
          [](const MoEConfig& m, std::int64_t sequence) {
            return static_cast<double>(m.num_experts) * m.slots /
                   static_cast<double>(std::max<std::int64_t>(1, sequence));
          },
  };
  return family;
}

}  // namespace ffnlab
