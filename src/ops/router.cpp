// Router: per-token scoring and selection (parallel over tokens), then the serial, cheap,
// deterministic reductions (loads, losses) and the counting sort into expert blocks.
#include "ffnlab/ops/router.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "check.hpp"

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

// f_e of the load-balancing loss E·Σ_e f_e·P_e (docs/moe.md), from the counts of r.
double balance_fraction(const Routing& r, BalanceLoss kind, int e) {
  const double inv_t = r.tokens > 0 ? 1.0 / static_cast<double>(r.tokens) : 0.0;
  switch (kind) {
    case BalanceLoss::top1:
      return r.first[e] * inv_t;
    case BalanceLoss::topk_normalized:
      return r.load[e] * inv_t / r.k;
    case BalanceLoss::topk:
    case BalanceLoss::count:
      break;
  }
  return r.load[e] * inv_t;
}

}  // namespace

void route(Routing& r, const Tensor& logits, const float* selection_bias, const RouterConfig& m) {
  check(logits.rank() == 2 && logits.dim(1) == m.num_experts, "[router] logits {} must be [T, {}]",
        shape_string(logits.shape()), m.num_experts);
  const std::int64_t T = logits.dim(0);
  const int E = m.num_experts, K = m.top_k;
  r.tokens = T;
  r.experts = E;
  r.k = K;
  r.probs.resize(T * E);
  r.scores.resize(T * E);
  r.lse.resize(T);
  r.expert.resize(T * K);
  r.raw.resize(T * K);
  r.weight.resize(T * K);
  std::vector<double> entropy(T), top1(T);
  const float* L = logits.f32();

#pragma omp parallel
  {
    std::vector<float> sel(E), group_score(std::max(m.groups, 1));
    std::vector<char> group_kept(std::max(m.groups, 1));
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < T; ++t) {
      const float* l = L + t * E;
      float* p = r.probs.data() + t * E;
      float* s = r.scores.data() + t * E;
      float mx = kNegInf;
      for (int e = 0; e < E; ++e) mx = std::max(mx, l[e]);
      double sum = 0;
      for (int e = 0; e < E; ++e) {
        p[e] = std::exp(l[e] - mx);
        sum += p[e];
      }
      r.lse[t] = mx + static_cast<float>(std::log(sum));
      double h = 0, best = 0;
      for (int e = 0; e < E; ++e) {
        p[e] = static_cast<float>(p[e] / sum);
        if (p[e] > 0) h -= static_cast<double>(p[e]) * std::log(static_cast<double>(p[e]));
        best = std::max(best, static_cast<double>(p[e]));
      }
      entropy[t] = h;
      top1[t] = best;
      for (int e = 0; e < E; ++e)
        s[e] = m.score == ScoreFunc::softmax ? p[e] : 1.0f / (1.0f + std::exp(-l[e]));

      for (int e = 0; e < E; ++e) sel[e] = s[e] + (selection_bias ? selection_bias[e] : 0.0f);
      if (m.groups > 0)
        limit_groups(sel.data(), E, m.groups, m.topk_groups, group_score.data(),
                     reinterpret_cast<bool*>(group_kept.data()));
      std::int32_t* chosen = r.expert.data() + t * K;
      for (int j = 0; j < K; ++j) {  // k passes of argmax: k and E are small
        int arg = -1;
        for (int e = 0; e < E; ++e)
          if (sel[e] != kNegInf && (arg < 0 || sel[e] > sel[arg])) arg = e;
        if (arg < 0) arg = 0;  // only with NaN scores; the layer reports non-finite output
        chosen[j] = arg;
        sel[arg] = kNegInf;
      }

      float* v = r.raw.data() + t * K;
      float* w = r.weight.data() + t * K;
      if (m.softmax_after_topk) {
        float top = kNegInf;
        for (int j = 0; j < K; ++j) top = std::max(top, l[chosen[j]]);
        double z = 0;
        for (int j = 0; j < K; ++j) z += std::exp(static_cast<double>(l[chosen[j]] - top));
        for (int j = 0; j < K; ++j)
          v[j] = static_cast<float>(std::exp(static_cast<double>(l[chosen[j]] - top)) / z);
      } else {
        for (int j = 0; j < K; ++j) v[j] = s[chosen[j]];
      }
      float total = 0;
      for (int j = 0; j < K; ++j) total += v[j];
      for (int j = 0; j < K; ++j) w[j] = m.scaling * (m.normalize ? v[j] / total : v[j]);
    }
  }

  // Serial reductions, in token order: deterministic for any thread count.
  r.load.assign(E, 0);
  r.first.assign(E, 0);
  std::vector<double> mean_p(E, 0.0);
  double z = 0, h = 0, t1 = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < K; ++j) ++r.load[r.expert[t * K + j]];
    ++r.first[r.expert[t * K]];
    for (int e = 0; e < E; ++e) mean_p[e] += r.probs[t * E + e];
    z += static_cast<double>(r.lse[t]) * r.lse[t];
    h += entropy[t];
    t1 += top1[t];
  }
  const double inv_t = T > 0 ? 1.0 / static_cast<double>(T) : 0.0;
  double balance = 0;
  for (int e = 0; e < E; ++e) balance += balance_fraction(r, m.balance_loss, e) * mean_p[e] * inv_t;
  r.balance_loss = E * balance;
  r.z_loss = z * inv_t;
  r.entropy = h * inv_t;
  r.top1_prob = t1 * inv_t;
}

void assign_rows(Routing& r, const RouterConfig& m) {
  const std::int64_t T = r.tokens;
  const int E = r.experts, K = r.k;
  // No expert can receive more than T·K assignments: a larger capacity is that (the fuzzer found
  // a factor of 1e106, whose capacity did not fit in an int64).
  const double all = static_cast<double>(T) * K;
  r.capacity =
      m.capacity_factor > 0
          ? static_cast<std::int64_t>(std::min(all, std::ceil(m.capacity_factor * all / E)))
          : 0;
  // Assignments a = t·K + j of each expert, first choices before second choices (the
  // position order), then dropped down to capacity and put back in token order.
  std::vector<std::vector<std::int64_t>> of(E);
  for (int e = 0; e < E; ++e) of[e].reserve(static_cast<std::size_t>(r.load[e]));
  for (int j = 0; j < K; ++j)
    for (std::int64_t t = 0; t < T; ++t) of[r.expert[t * K + j]].push_back(t * K + j);
  r.slot.assign(T * K, -1);
  r.offsets.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) {
    auto& list = of[e];
    if (r.capacity > 0 && static_cast<std::int64_t>(list.size()) > r.capacity) {
      if (m.drop == DropPolicy::probability)
        std::stable_sort(list.begin(), list.end(), [&](std::int64_t a, std::int64_t b) {
          return r.scores[(a / K) * E + e] > r.scores[(b / K) * E + e];
        });
      list.resize(static_cast<std::size_t>(r.capacity));
    }
    std::sort(list.begin(), list.end());
    r.offsets[e + 1] = r.offsets[e] + static_cast<std::int64_t>(list.size());
  }
  r.token_of_row.resize(r.offsets[E]);
  for (int e = 0; e < E; ++e) {
    std::int64_t row = r.offsets[e];
    for (std::int64_t a : of[e]) {
      r.slot[a] = row;
      r.token_of_row[row++] = a / K;
    }
  }
}

void route_backward(Tensor& dlogits, const Routing& r, const float* dweight, const RouterConfig& m,
                    float aux_scale) {
  const std::int64_t T = r.tokens;
  const int E = r.experts, K = r.k;
  check(dlogits.rank() == 2 && dlogits.dim(0) == T && dlogits.dim(1) == E,
        "[router] dlogits {} must be [{}, {}]", shape_string(dlogits.shape()), T, E);
  const double inv_t = T > 0 ? 1.0 / static_cast<double>(T) : 0.0;
  // ∂(aux_coef·balance)/∂P_e and ∂(z_coef·z)/∂lse_t, both scaled.
  std::vector<float> dmean_p(E);
  for (int e = 0; e < E; ++e)
    dmean_p[e] = static_cast<float>(aux_scale * m.aux_coef * E *
                                    balance_fraction(r, m.balance_loss, e) * inv_t);
  const float z_scale = static_cast<float>(aux_scale * m.z_coef * 2.0 * inv_t);
  const bool aux = m.aux_coef > 0, zl = m.z_coef > 0;
  float* DL = dlogits.f32();

#pragma omp parallel
  {
    std::vector<float> dv(K);
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < T; ++t) {
      const float* p = r.probs.data() + t * E;
      const float* s = r.scores.data() + t * E;
      const std::int32_t* chosen = r.expert.data() + t * K;
      const float* v = r.raw.data() + t * K;
      const float* dw = dweight + t * K;
      float* dl = DL + t * E;
      std::fill(dl, dl + E, 0.0f);

      // w_j = scaling·v_j/S (or scaling·v_j): back to dv.
      float total = 0;
      for (int j = 0; j < K; ++j) total += v[j];
      if (m.normalize) {
        float dot = 0;
        for (int j = 0; j < K; ++j) dot += m.scaling * dw[j] * (v[j] / total);
        for (int j = 0; j < K; ++j) dv[j] = (m.scaling * dw[j] - dot) / total;
      } else {
        for (int j = 0; j < K; ++j) dv[j] = m.scaling * dw[j];
      }

      if (m.softmax_after_topk) {  // v = softmax over the chosen logits
        float dot = 0;
        for (int j = 0; j < K; ++j) dot += v[j] * dv[j];
        for (int j = 0; j < K; ++j) dl[chosen[j]] += v[j] * (dv[j] - dot);
      } else if (m.score == ScoreFunc::sigmoid) {
        for (int j = 0; j < K; ++j) {
          const float se = s[chosen[j]];
          dl[chosen[j]] += dv[j] * se * (1.0f - se);
        }
      } else {  // softmax scores: only the chosen entries of ds are non-zero
        float dot = 0;
        for (int j = 0; j < K; ++j) dot += dv[j] * p[chosen[j]];
        for (int e = 0; e < E; ++e) dl[e] -= p[e] * dot;
        for (int j = 0; j < K; ++j) dl[chosen[j]] += p[chosen[j]] * dv[j];
      }
      if (aux) {  // P_e is a mean of softmax(l) whatever the scores are
        float dot = 0;
        for (int e = 0; e < E; ++e) dot += dmean_p[e] * p[e];
        for (int e = 0; e < E; ++e) dl[e] += p[e] * (dmean_p[e] - dot);
      }
      if (zl)
        for (int e = 0; e < E; ++e) dl[e] += z_scale * r.lse[t] * p[e];
    }
  }
}

}  // namespace ffnlab
