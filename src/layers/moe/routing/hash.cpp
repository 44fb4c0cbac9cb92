// Hash routing (Roller et al. 2021, "Hash Layers For Large Sparse Models"): a fixed hash of the
// token's id picks its expert; nothing is learned about the choice. ffnlab's hash ranks the
// experts by mix(id, e), a 64-bit mixer (splitmix64's finaliser) of the id and the expert, and a
// token takes the k first: with k = 1 a fixed random map of ids to experts, the paper's "Random
// Hash". Each chosen expert weighs 1 (1/k with normalize). No parameters, no losses.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "check.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"

namespace ffnlab {

namespace {

std::uint64_t mix(std::int32_t id, int expert) {
  std::uint64_t z = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(id)) << 32) |
                    static_cast<std::uint32_t>(expert);
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void choose(Routing& r, const ChoiceInput& in, const RouterConfig& m) {
  const int E = r.experts, K = r.k;
  const std::int64_t T = r.tokens;
  const float weight = m.scaling * (m.normalize ? 1.0f / static_cast<float>(K) : 1.0f);
#pragma omp parallel
  {
    std::vector<std::int32_t> order(E);
    std::vector<std::uint64_t> key(E);
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < T; ++t) {
      for (int e = 0; e < E; ++e) {
        order[e] = e;
        key[e] = mix(in.token_ids[t], e);
      }
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int a, int b) {
        return key[a] > key[b] || (key[a] == key[b] && a < b);
      });
      for (int j = 0; j < K; ++j) {
        r.expert[t * K + j] = order[j];
        r.raw[t * K + j] = 1.0f;
        r.weight[t * K + j] = weight;
      }
      r.count[t] = K;
    }
  }
}

}  // namespace

template <>
const RoutingFamily& family_of<RoutingKind::hash>() {
  static const RoutingFamily family{
      .title = "hash",
      .summary = "the experts a fixed hash of the token id ranks first",
      .top_k = "the experts a token takes",
      .capacity =
          "0: dropless; c: an expert keeps ceil(c·k·T/E) assignments, dropping the "
          "later ones",
      .capacity_drops = true,
      .router_linear = false,
      .needs_token_ids = true,
      .defaults = R"({"aux_coef": 0.0})",
      .unused =
          "top_p,slots,target_sparsity,l1_coef_init,l1_coef_rate,router_bias,score,"
          "softmax_after_topk,groups,topk_groups,jitter,noisy_topk,balance_bias,"
          "balance_rate,drop,balance_loss,aux_coef,z_coef,entropy_coef,gating_residual",
      .study = [](MoEConfig& m, std::int64_t) { m.z_coef = 0.0f; },  // k hashed experts a token
      .describe =
          [](const MoEConfig& m) {
            return fmt::format("hash routing: {} experts a token by a fixed hash of its id",
                               m.top_k);
          },
      .choose = choose,
  };
  return family;
}

}  // namespace ffnlab
