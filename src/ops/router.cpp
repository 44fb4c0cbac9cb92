// Router: per-token scoring and selection (parallel over tokens), then the serial, cheap,
// deterministic reductions (loads, losses) and the counting sort into expert blocks.
#include "ffnlab/ops/router.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "activation_kernels.hpp"
#include "check.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"

namespace ffnlab {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// η_e·f_e of the load-balancing loss E·Σ_e η_e·f_e·P_e (docs/moe.md), from the counts of r;
// η_e = 1 for FFN experts, zc_balance_weight for zero-computation ones.
double balance_fraction(const Routing& r, const RouterConfig& m, int e) {
  const double inv_t = r.total_tokens > 0 ? 1.0 / static_cast<double>(r.total_tokens) : 0.0;
  const double eta = e < r.ffn_experts ? 1.0 : m.zc_balance_weight;
  switch (m.balance_loss) {
    case BalanceLoss::top1:
      return eta * r.first[e] * inv_t;
    case BalanceLoss::topk_normalized:
      return eta * r.load[e] * inv_t / r.k;
    case BalanceLoss::topk:
    case BalanceLoss::count:
      break;
  }
  return eta * r.load[e] * inv_t;
}

}  // namespace

std::int64_t RouterConfig::expert_choice_capacity(std::int64_t sequence) const {
  const double c = capacity_factor > 0 ? capacity_factor : 1.0;
  const double n = std::ceil(c * top_k * static_cast<double>(sequence) / num_experts);
  return static_cast<std::int64_t>(std::clamp(n, 1.0, static_cast<double>(sequence)));
}

bool RouterConfig::drops() const {
  return capacity_factor > 0 && routing_family(routing).capacity_drops;
}

void route(Routing& r, const Tensor& logits, const float* selection_bias, const RouterConfig& m,
           ProcessGroup* group, std::int64_t sequence) {
  const int E = m.routed_experts();
  check(logits.rank() == 2 && logits.dim(1) == E, "[router] logits {} must be [T, {}]",
        shape_string(logits.shape()), E);
  ChoiceInput in;
  in.tokens = logits.dim(0);
  in.logits = logits.f32();
  in.selection_bias = selection_bias;
  in.sequence = sequence;
  in.train = true;
  in.group = group;
  route(r, m, in);
}

void route(Routing& r, const RouterConfig& m, const ChoiceInput& in) {
  const RoutingFamily& family = routing_family(m.routing);
  const int E = m.routed_experts(), N = m.num_experts;
  const std::int64_t T = in.tokens;
  const int K = family.width ? family.width(m) : m.top_k;
  const bool scored = in.logits != nullptr;
  r.sequence = 0;
  r.tokens = T;
  r.experts = E;
  r.ffn_experts = N;
  r.k = K;
  r.probs.resize(scored ? T * E : 0);
  r.scores.resize(scored ? T * E : 0);
  r.lse.resize(scored ? T : 0);
  r.count.resize(T);
  r.expert.resize(T * K);
  r.raw.resize(T * K);
  r.weight.resize(T * K);
  std::vector<double> entropy(scored ? T : 0), top1(scored ? T : 0);
  const float* L = in.logits;

  if (scored) {
#pragma omp parallel for schedule(static)
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
    }
  }
  if (T > 0) family.choose(r, in, m);

  // Serial reductions, in token order: deterministic for any thread count. Then, over a group,
  // summed over its ranks: [load E | first E | Σ_t p_te E | Σ_t raw_te E | tokens by count K+1 |
  // Σ lse² | Σ entropy | Σ top-1 | T].
  std::vector<double> sums(4 * E + (K + 1) + 4, 0.0);
  double* load = sums.data();
  double* first = load + E;
  double* mean_p = first + E;
  double* mass = mean_p + E;
  double* per_token = mass + E;
  double* rest = per_token + K + 1;
  for (std::int64_t t = 0; t < T; ++t) {
    int ffn = 0;  // FFN experts chosen
    for (int j = 0; j < r.count[t]; ++j) {
      load[r.expert[t * K + j]] += 1;
      ffn += r.expert[t * K + j] < N;
      mass[r.expert[t * K + j]] += r.raw[t * K + j];
    }
    per_token[ffn] += 1;
    if (r.count[t] > 0) first[r.expert[t * K]] += 1;
    if (!scored) continue;
    for (int e = 0; e < E; ++e) mean_p[e] += r.probs[t * E + e];
    rest[0] += static_cast<double>(r.lse[t]) * r.lse[t];
    rest[1] += entropy[t];
    rest[2] += top1[t];
  }
  rest[3] = static_cast<double>(T);
  if (in.group) in.group->allreduce_sum(sums, "router statistics");
  r.total_tokens = static_cast<std::int64_t>(rest[3]);
  r.load.resize(E);
  r.first.resize(E);
  r.mass.assign(mass, mass + E);
  r.per_token.resize(K + 1);
  for (int n = 0; n <= K; ++n) r.per_token[n] = static_cast<std::int64_t>(per_token[n]);
  for (int e = 0; e < E; ++e) {
    r.load[e] = static_cast<std::int64_t>(load[e]);
    r.first[e] = static_cast<std::int64_t>(first[e]);
  }
  const double inv_t = r.total_tokens > 0 ? 1.0 / static_cast<double>(r.total_tokens) : 0.0;
  double balance = 0;
  for (int e = 0; e < E; ++e) balance += balance_fraction(r, m, e) * mean_p[e] * inv_t;
  r.balance_loss = E * balance;
  r.z_loss = rest[0] * inv_t;
  r.entropy = rest[1] * inv_t;
  r.top1_prob = rest[2] * inv_t;
  r.l1_loss = family.own_loss ? family.own_loss(r, m) : 0.0;
}

std::vector<std::int32_t> Routing::taken() const {
  std::vector<std::int32_t> out = expert;
  for (std::int64_t t = 0; t < tokens; ++t)
    for (int j = count[t]; j < k; ++j) out[t * k + j] = -1;
  return out;
}

void assign_rows(Routing& r, const RouterConfig& m, ProcessGroup* group) {
  const std::int64_t T = r.tokens;
  // Rows for the N FFN experts only: a zero-computation expert's choices keep slot -1.
  const int E = r.experts, N = r.ffn_experts, K = r.k;
  // No expert can receive more than T·K assignments: a larger capacity is that (the fuzzer found
  // a factor of 1e106, whose capacity did not fit in an int64).
  const double all = static_cast<double>(r.total_tokens) * K;
  r.capacity =
      m.drops() ? static_cast<std::int64_t>(std::min(all, std::ceil(m.capacity_factor * all / N)))
                : 0;
  // Assignments a = t·K + j of each expert, first choices before second choices (the
  // position order), then dropped down to capacity and put back in token order.
  std::vector<std::vector<std::int64_t>> of(N);
  for (int j = 0; j < K; ++j)
    for (std::int64_t t = 0; t < T; ++t)
      if (j < r.count[t] && r.expert[t * K + j] < N) of[r.expert[t * K + j]].push_back(t * K + j);
  r.slot.assign(T * K, -1);
  r.offsets.assign(N + 1, 0);
  r.kept_total.assign(N, 0);
  if (group && r.capacity > 0) {
    // The position order over the group: choice j of every rank's tokens (rank order) before
    // choice j + 1. An assignment's place in its expert's queue is what comes before it:
    // earlier choices on every rank, the same choice on lower ranks, then this rank's own.
    check(m.drop == DropPolicy::position,
          "[moe] capacity with drop = {} is not supported in data-parallel training (it needs "
          "every rank's scores); use drop = position, or capacity_factor = 0 (dropless)",
          enum_name(m.drop));
    std::vector<std::int64_t> mine(static_cast<std::size_t>(K) * N, 0);
    for (std::int64_t t = 0; t < T; ++t)
      for (int j = 0; j < r.count[t]; ++j)
        if (r.expert[t * K + j] < N) mine[j * N + r.expert[t * K + j]] += 1;
    std::vector<std::int64_t> total = mine, below = mine;
    group->allreduce_sum(total, "capacity counts");
    group->exscan_sum(below, "capacity counts");
    for (int e = 0; e < N; ++e) {
      std::vector<std::int64_t> kept;
      std::int64_t ahead = 0;  // earlier choices, every rank
      std::size_t i = 0;
      for (int j = 0; j < K; ++j) {
        std::int64_t place = ahead + below[j * N + e];
        for (; i < of[e].size() && of[e][i] % K == j; ++i, ++place)
          if (place < r.capacity) kept.push_back(of[e][i]);
        ahead += total[j * N + e];
      }
      of[e] = std::move(kept);
      r.kept_total[e] = std::min<std::int64_t>(r.capacity, r.load[e]);
    }
  } else {
    for (int e = 0; e < N; ++e) {
      auto& list = of[e];
      if (r.capacity > 0 && static_cast<std::int64_t>(list.size()) > r.capacity) {
        if (m.drop == DropPolicy::probability)
          std::stable_sort(list.begin(), list.end(), [&](std::int64_t a, std::int64_t b) {
            return rank_key(r.scores[(a / K) * E + e]) > rank_key(r.scores[(b / K) * E + e]);
          });
        list.resize(static_cast<std::size_t>(r.capacity));
      }
      // Over a group without capacity every assignment is kept.
      r.kept_total[e] = group ? r.load[e] : static_cast<std::int64_t>(list.size());
    }
  }
  for (int e = 0; e < N; ++e) {
    std::sort(of[e].begin(), of[e].end());
    r.offsets[e + 1] = r.offsets[e] + static_cast<std::int64_t>(of[e].size());
  }
  r.token_of_row.resize(r.offsets[N]);
  for (int e = 0; e < N; ++e) {
    std::int64_t row = r.offsets[e];
    for (std::int64_t a : of[e]) {
      r.slot[a] = row;
      r.token_of_row[row++] = a / K;
    }
  }
}

void route_backward(Tensor& dlogits, const Routing& r, const float* dweight, const RouterConfig& m,
                    float aux_scale, float loss_coef) {
  const std::int64_t T = r.tokens;
  const int E = r.experts, K = r.k, zero_from = m.first_zero_expert();
  check(dlogits.rank() == 2 && dlogits.dim(0) == T && dlogits.dim(1) == E,
        "[router] dlogits {} must be [{}, {}]", shape_string(dlogits.shape()), T, E);
  if (const auto own = routing_family(m.routing).backward) {  // before the shared terms
    own(dlogits.f32(), r, dweight, m, aux_scale, loss_coef);
    return;
  }
  // The losses are means over the group's tokens: each rank adds its tokens' part.
  const double inv_t = r.total_tokens > 0 ? 1.0 / static_cast<double>(r.total_tokens) : 0.0;
  // ∂(aux_coef·balance)/∂P_e and ∂(z_coef·z)/∂lse_t, both scaled.
  std::vector<float> dmean_p(E);
  for (int e = 0; e < E; ++e)
    dmean_p[e] = static_cast<float>(aux_scale * m.aux_coef * E * balance_fraction(r, m, e) * inv_t);
  const float z_scale = static_cast<float>(aux_scale * m.z_coef * 2.0 * inv_t);
  const double h_scale = aux_scale * m.entropy_coef * inv_t;
  const bool aux = m.aux_coef > 0, zl = m.z_coef > 0, ent = m.entropy_coef > 0;
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
      const int n = r.count[t];  // the token's choices; the padding after them weighs nothing

      // w_j = scaling·v_j/S (or scaling·v_j): back to dv.
      float total = 0;
      for (int j = 0; j < n; ++j) total += v[j];
      if (m.normalize) {
        float dot = 0;
        if (total > 0)
          for (int j = 0; j < n; ++j) dot += m.scaling * dw[j] * (v[j] / total);
        for (int j = 0; j < n; ++j) dv[j] = total > 0 ? (m.scaling * dw[j] - dot) / total : 0.0f;
      } else {
        for (int j = 0; j < n; ++j) dv[j] = m.scaling * dw[j];
      }
      for (int j = 0; j < n; ++j)  // a zero expert's weight is the constant 0
        if (chosen[j] >= zero_from) dv[j] = 0.0f;

      if (m.softmax_after_topk) {  // v = softmax over the chosen logits
        float dot = 0;
        for (int j = 0; j < n; ++j) dot += v[j] * dv[j];
        for (int j = 0; j < n; ++j) dl[chosen[j]] += v[j] * (dv[j] - dot);
      } else if (m.score == ScoreFunc::sigmoid) {
        for (int j = 0; j < n; ++j) {
          const float se = s[chosen[j]];
          dl[chosen[j]] += dv[j] * se * (1.0f - se);
        }
      } else {  // softmax scores: only the chosen entries of ds are non-zero
        float dot = 0;
        for (int j = 0; j < n; ++j) dot += dv[j] * p[chosen[j]];
        for (int e = 0; e < E; ++e) dl[e] -= p[e] * dot;
        for (int j = 0; j < n; ++j) dl[chosen[j]] += p[chosen[j]] * dv[j];
      }
      if (aux) {  // P_e is a mean of softmax(l) whatever the scores are
        float dot = 0;
        for (int e = 0; e < E; ++e) dot += dmean_p[e] * p[e];
        for (int e = 0; e < E; ++e) dl[e] += p[e] * (dmean_p[e] - dot);
      }
      if (zl)
        for (int e = 0; e < E; ++e) dl[e] += z_scale * r.lse[t] * p[e];
      if (ent) {  // H = -Σ p log p: ∂H/∂l_e = -p_e·(log p_e + H); p_e log p_e → 0 as p_e → 0
        double h = 0;
        for (int e = 0; e < E; ++e)
          if (p[e] > 0) h -= static_cast<double>(p[e]) * std::log(static_cast<double>(p[e]));
        for (int e = 0; e < E; ++e)
          if (p[e] > 0)
            dl[e] -= static_cast<float>(h_scale * p[e] * (std::log(static_cast<double>(p[e])) + h));
      }
    }
  }
}

}  // namespace ffnlab
