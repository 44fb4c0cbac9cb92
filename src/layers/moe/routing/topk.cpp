// Top-k routing (Shazeer et al. 2017; Switch, GShard, Mixtral, Qwen-MoE, DeepSeek): a token takes
// the k experts of best score, optionally within its best groups (DeepSeek-V3) and with an
// aux-loss-free selection bias, weighted by their scores. Its choice by rank, choose_ranked, is
// top-p's too.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"

namespace ffnlab {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Keeps the `keep` best groups of `sel` (a group scored by the sum of its top two, or its
// best when it has one expert) and sets the others to -inf. Ties go to the lower index.
void limit_groups(float* sel, int E, int groups, int keep, float* group_score, bool* kept) {
  const int size = E / groups;
  for (int g = 0; g < groups; ++g) {
    float best = kNegInf, second = kNegInf;
    for (int e = g * size; e < (g + 1) * size; ++e) {
      if (sel[e] > best) {
        second = best;
        best = sel[e];
      } else if (sel[e] > second) {
        second = sel[e];
      }
    }
    group_score[g] = size >= 2 ? best + second : best;
    kept[g] = false;
  }
  for (int i = 0; i < keep; ++i) {
    int arg = -1;
    for (int g = 0; g < groups; ++g)
      if (!kept[g] && (arg < 0 || group_score[g] > group_score[arg])) arg = g;
    kept[arg] = true;
  }
  for (int g = 0; g < groups; ++g)
    if (!kept[g])
      for (int e = g * size; e < (g + 1) * size; ++e) sel[e] = kNegInf;
}

}  // namespace

void choose_ranked(Routing& r, const ChoiceInput& in, const RouterConfig& m, double reach) {
  const int E = r.experts, K = r.k, zero_from = m.first_zero_expert();
  const std::int64_t T = r.tokens;
  const float* L = in.logits;
#pragma omp parallel
  {
    std::vector<float> sel(E), group_score(std::max(m.groups, 1));
    std::vector<char> group_kept(std::max(m.groups, 1)), taken(E);
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < T; ++t) {
      const float* l = L + t * E;
      const float* p = r.probs.data() + t * E;
      const float* s = r.scores.data() + t * E;
      std::int32_t* chosen = r.expert.data() + t * K;
      float* v = r.raw.data() + t * K;
      float* w = r.weight.data() + t * K;
      for (int e = 0; e < E; ++e) sel[e] = s[e] + (in.selection_bias ? in.selection_bias[e] : 0.0f);
      if (m.groups > 0)
        limit_groups(sel.data(), E, m.groups, m.topk_groups, group_score.data(),
                     reinterpret_cast<bool*>(group_kept.data()));
      // top_p: the choices so far reach the mass once their probabilities, summed in order in
      // double, are at least top_p.
      int n = K;
      double sum = 0;
      std::fill(taken.begin(), taken.end(), 0);
      // k passes of argmax, best first (k and E are small), by rank_key: a NaN score (a diverged
      // run's) ranks last wherever it is, with the group-limited experts' -inf; ties go to the
      // lower index.
      for (int j = 0; j < K; ++j) {
        int arg = -1;
        for (int e = 0; e < E; ++e)
          if (!taken[e] && (arg < 0 || rank_key(sel[e]) > rank_key(sel[arg]))) arg = e;
        chosen[j] = arg;
        taken[arg] = 1;
        if (reach > 0 && n == K) {
          sum += p[arg];
          if (sum >= reach) n = j + 1;
        }
      }
      r.count[t] = n;

      if (n < K) {  // top_p: the token's own choices; the padding weighs nothing
        for (int j = 0; j < K; ++j) v[j] = j < n ? s[chosen[j]] : 0.0f;
      } else if (m.softmax_after_topk) {
        float top = kNegInf;
        for (int j = 0; j < K; ++j) top = std::max(top, l[chosen[j]]);
        double z = 0;
        for (int j = 0; j < K; ++j) z += std::exp(static_cast<double>(l[chosen[j]] - top));
        for (int j = 0; j < K; ++j)
          v[j] = static_cast<float>(std::exp(static_cast<double>(l[chosen[j]] - top)) / z);
      } else {
        for (int j = 0; j < K; ++j) v[j] = s[chosen[j]];
      }
      for (int j = 0; j < n; ++j)  // MoE++: a zero expert weighs nothing, before renormalising
        if (chosen[j] >= zero_from) v[j] = 0.0f;
      float total = 0;
      for (int j = 0; j < n; ++j) total += v[j];
      for (int j = 0; j < K; ++j)  // (only zero experts chosen: every weight 0)
        w[j] = m.scaling * (m.normalize ? (total > 0 ? v[j] / total : 0.0f) : v[j]);
    }
  }
}

template <>
const RoutingFamily& family_of<RoutingKind::topk>() {
  static const RoutingFamily family{
      .title = "top-k",
      .summary = "the k experts of best score",
      .top_k = "the experts a token takes",
      .capacity =
          "dropless at 0, else each expert keeps ceil(c·k·T/E) assignments and drops the "
          "rest by position or probability (the config key drop)",
      .capacity_drops = true,
      .unused = "top_p,slots,target_sparsity,l1_coef_init,l1_coef_rate",
      .study = [](MoEConfig&, std::int64_t) {},  // the layout itself: the reference
      .describe =
          [](const MoEConfig& m) {
            if (m.zc_experts() > 0)
              return fmt::format(
                  "top-{} of {} FFN and {} zero-computation experts, costed at {} "
                  "FFN",
                  m.top_k, m.num_experts, m.zc_experts(), m.top_k);
            return fmt::format("top-{}", m.top_k);
          },
      .choose = [](Routing& r, const ChoiceInput& in,
                   const RouterConfig& m) { choose_ranked(r, in, m, 0.0); },
  };
  return family;
}

}  // namespace ffnlab
