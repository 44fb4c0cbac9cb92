// Router: per-token scoring and selection (parallel over tokens), then the serial, cheap,
// deterministic reductions (loads, losses) and the counting sort into expert blocks.
#include "ffnlab/ops/router.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "activation_kernels.hpp"
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

// A score as a sort key: NaN (from non-finite logits; the layer reports its non-finite output)
// ranks last, so that the orderings below stay strict weak orders.
float rank_key(float v) {
  return std::isnan(v) ? kNegInf : v;
}

// Expert choice (Zhou et al. 2022): in every sequence of S tokens, expert e takes the C tokens of
// best score s_te (ties to the earlier token). Then each token's choices are the experts that
// took it, best score first (ties to the lower expert), followed by the others as padding.
void choose_by_experts(Routing& r, const RouterConfig& m, std::int64_t S) {
  const std::int64_t T = r.tokens;
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

}  // namespace

std::int64_t RouterConfig::expert_choice_capacity(std::int64_t sequence) const {
  const double c = capacity_factor > 0 ? capacity_factor : 1.0;
  const double n = std::ceil(c * top_k * static_cast<double>(sequence) / num_experts);
  return static_cast<std::int64_t>(std::clamp(n, 1.0, static_cast<double>(sequence)));
}

void route(Routing& r, const Tensor& logits, const float* selection_bias, const RouterConfig& m,
           ProcessGroup* group, std::int64_t sequence) {
  const int E = m.routed_experts(), N = m.num_experts;
  check(logits.rank() == 2 && logits.dim(1) == E, "[router] logits {} must be [T, {}]",
        shape_string(logits.shape()), E);
  const std::int64_t T = logits.dim(0);
  const bool relu = m.routing == RoutingKind::relu;
  const bool by_experts = m.routing == RoutingKind::expert_choice;
  const int K = relu || by_experts ? E : m.top_k;
  const int zero_from = m.first_zero_expert();
  r.sequence = by_experts ? (sequence > 0 ? sequence : T) : 0;
  r.tokens = T;
  r.experts = E;
  r.ffn_experts = N;
  r.k = K;
  r.probs.resize(T * E);
  r.scores.resize(T * E);
  r.lse.resize(T);
  r.count.resize(T);
  r.expert.resize(T * K);
  r.raw.resize(T * K);
  r.weight.resize(T * K);
  std::vector<double> entropy(T), top1(T);
  const float* L = logits.f32();

#pragma omp parallel
  {
    std::vector<float> sel(E), group_score(std::max(m.groups, 1));
    std::vector<char> group_kept(std::max(m.groups, 1));
    std::vector<std::int32_t> order(relu ? E : 0);
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
      if (by_experts) continue;  // the experts choose, below

      std::int32_t* chosen = r.expert.data() + t * K;
      float* v = r.raw.data() + t * K;
      float* w = r.weight.data() + t * K;
      if (relu) {
        // Every expert, best logit first (ties to the lower index); those with a positive logit
        // are the token's, weighted by it.
        for (int e = 0; e < E; ++e) order[e] = e;
        std::stable_sort(order.begin(), order.end(), [l](int a, int b) { return l[a] > l[b]; });
        int n = 0;
        for (int j = 0; j < E; ++j) {
          chosen[j] = order[j];
          const float gate = l[order[j]];
          n += gate > 0;
          v[j] = gate > 0 ? gate : 0.0f;
          w[j] = m.scaling * v[j];
        }
        r.count[t] = n;
        continue;
      }
      for (int e = 0; e < E; ++e) sel[e] = s[e] + (selection_bias ? selection_bias[e] : 0.0f);
      if (m.groups > 0)
        limit_groups(sel.data(), E, m.groups, m.topk_groups, group_score.data(),
                     reinterpret_cast<bool*>(group_kept.data()));
      // top_p: the choices so far reach the mass once their probabilities, summed in order in
      // double, are at least top_p.
      int n = K;
      double mass = 0;
      for (int j = 0; j < K; ++j) {  // k passes of argmax, best first: k and E are small
        int arg = -1;
        for (int e = 0; e < E; ++e)
          if (sel[e] != kNegInf && (arg < 0 || sel[e] > sel[arg])) arg = e;
        if (arg < 0) arg = 0;  // only with NaN scores; the layer reports non-finite output
        chosen[j] = arg;
        sel[arg] = kNegInf;
        if (m.routing == RoutingKind::top_p && n == K) {
          mass += p[arg];
          if (mass >= m.top_p) n = j + 1;
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

  if (by_experts && T > 0) choose_by_experts(r, m, r.sequence);

  // Serial reductions, in token order: deterministic for any thread count. Then, over a group,
  // summed over its ranks: [load E | first E | Σ_t p_te E | Σ_t gate_te E (relu) | tokens by
  // count K+1 | Σ lse² | Σ entropy | Σ top-1 | T].
  std::vector<double> sums(4 * E + (K + 1) + 4, 0.0);
  double* load = sums.data();
  double* first = load + E;
  double* mean_p = first + E;
  double* gate_sum = mean_p + E;
  double* per_token = gate_sum + E;
  double* rest = per_token + K + 1;
  for (std::int64_t t = 0; t < T; ++t) {
    int ffn = 0;  // FFN experts chosen
    for (int j = 0; j < r.count[t]; ++j) {
      load[r.expert[t * K + j]] += 1;
      ffn += r.expert[t * K + j] < N;
      if (relu) gate_sum[r.expert[t * K + j]] += r.raw[t * K + j];
    }
    per_token[ffn] += 1;
    if (r.count[t] > 0) first[r.expert[t * K]] += 1;
    for (int e = 0; e < E; ++e) mean_p[e] += r.probs[t * E + e];
    rest[0] += static_cast<double>(r.lse[t]) * r.lse[t];
    rest[1] += entropy[t];
    rest[2] += top1[t];
  }
  rest[3] = static_cast<double>(T);
  if (group) group->allreduce_sum(sums, "router statistics");
  r.total_tokens = static_cast<std::int64_t>(rest[3]);
  r.load.resize(E);
  r.first.resize(E);
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
  double l1 = 0;
  if (relu)
    for (int e = 0; e < E; ++e) l1 += load[e] * gate_sum[e];
  r.l1_loss = E * l1 * inv_t * inv_t / m.top_k;
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
            return r.scores[(a / K) * E + e] > r.scores[(b / K) * E + e];
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
                    float aux_scale, float l1_coef) {
  const std::int64_t T = r.tokens;
  const int E = r.experts, K = r.k, zero_from = m.first_zero_expert();
  check(dlogits.rank() == 2 && dlogits.dim(0) == T && dlogits.dim(1) == E,
        "[router] dlogits {} must be [{}, {}]", shape_string(dlogits.shape()), T, E);
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

  if (m.routing == RoutingKind::relu) {
    // gate = max(l, 0), w = scaling·gate: a positive logit gets scaling·dw plus the L1 term
    // ∂/∂gate_te of l1_coef·E/(top_k·T²)·Σ_e n_e·Σ_t gate_te (n_e held); the others nothing.
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
    return;
  }

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

void soft_route(Tensor& dispatch, Tensor& combine, const Tensor& logits, std::int64_t sequence,
                double* entropy_sum, double* top_sum) {
  check(logits.rank() == 2, "[router] soft logits {} must be [T, M]", shape_string(logits.shape()));
  const std::int64_t T = logits.dim(0), M = logits.dim(1), S = sequence > 0 ? sequence : T;
  check(T == 0 || T % S == 0, "[router] {} tokens are not whole sequences of {}", T, S);
  dispatch.ensure({T, M});
  combine.ensure({T, M});
  if (T == 0) return;
  const float* L = logits.f32();
  float* Dsp = dispatch.f32();
  // Dispatch: per sequence, the column maxima, then e^(l - max) row by row (contiguous, in
  // float: kernels::exp_fast) with the column sums, then each row scaled by 1/sum.
#pragma omp parallel
  {
    std::vector<float> mx(static_cast<std::size_t>(M)), sum(static_cast<std::size_t>(M));
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < T / S; ++b) {
      const std::int64_t t0 = b * S;
      std::copy(L + t0 * M, L + (t0 + 1) * M, mx.begin());
      for (std::int64_t t = t0 + 1; t < t0 + S; ++t)
#pragma omp simd
        for (std::int64_t j = 0; j < M; ++j) mx[j] = L[t * M + j] > mx[j] ? L[t * M + j] : mx[j];
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (std::int64_t t = t0; t < t0 + S; ++t)
#pragma omp simd
        for (std::int64_t j = 0; j < M; ++j) {
          Dsp[t * M + j] = kernels::exp_fast(L[t * M + j] - mx[j]);
          sum[j] += Dsp[t * M + j];
        }
      for (std::int64_t j = 0; j < M; ++j) sum[j] = 1.0f / sum[j];
      for (std::int64_t t = t0; t < t0 + S; ++t)
#pragma omp simd
        for (std::int64_t j = 0; j < M; ++j) Dsp[t * M + j] *= sum[j];
    }
  }
  // Combine: a softmax row per token. Its entropy without a logarithm per slot:
  // H = -Σ p·(l - m - log z) = m + log z - Σ p·l.
  std::vector<double> entropy(static_cast<std::size_t>(T)), top(static_cast<std::size_t>(T));
  float* C = combine.f32();
#pragma omp parallel
  {
    std::vector<float> e(static_cast<std::size_t>(M));
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < T; ++t) {
      const float* l = L + t * M;
      float mx;
      const float z = kernels::exp_minus_max(e.data(), l, M, &mx);
      const float inv = 1.0f / z;
      double pl = 0;
      float best = 0;
      for (std::int64_t j = 0; j < M; ++j) {
        pl += static_cast<double>(e[j]) * l[j];
        best = e[j] > best ? e[j] : best;
      }
      entropy[t] = mx + std::log(static_cast<double>(z)) - pl * inv;
      top[t] = best * inv;
      float* c = C + t * M;
#pragma omp simd
      for (std::int64_t j = 0; j < M; ++j) c[j] = e[j] * inv;
    }
  }
  for (std::int64_t t = 0; t < T; ++t) {  // in token order: the same sums for any thread count
    *entropy_sum += entropy[t];
    *top_sum += top[t];
  }
}

void soft_route_backward(Tensor& dlogits, const Tensor& dcombine, const Tensor& ddispatch,
                         const Tensor& dispatch, const Tensor& combine, std::int64_t sequence) {
  const std::int64_t T = combine.dim(0), M = combine.dim(1), S = sequence > 0 ? sequence : T;
  dlogits.ensure({T, M});
  if (T == 0) return;
  const float* C = combine.f32();
  const float* dC = dcombine.f32();
  const float* Dsp = dispatch.f32();
  const float* dD = ddispatch.f32();
  float* dL = dlogits.f32();
  // Over the slots: dl = c·(dc - Σ_j c_j·dc_j), per token.
#pragma omp parallel for schedule(static)
  for (std::int64_t t = 0; t < T; ++t) {
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (std::int64_t j = 0; j < M; ++j) dot += C[t * M + j] * dC[t * M + j];
#pragma omp simd
    for (std::int64_t j = 0; j < M; ++j) dL[t * M + j] = C[t * M + j] * (dC[t * M + j] - dot);
  }
  // Over each sequence's tokens: dl += d·(dd - Σ_t d_t·dd_t), per slot.
#pragma omp parallel
  {
    std::vector<float> dot(static_cast<std::size_t>(M));
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < T / S; ++b) {
      std::fill(dot.begin(), dot.end(), 0.0f);
      for (std::int64_t t = b * S; t < (b + 1) * S; ++t)
#pragma omp simd
        for (std::int64_t j = 0; j < M; ++j) dot[j] += Dsp[t * M + j] * dD[t * M + j];
      for (std::int64_t t = b * S; t < (b + 1) * S; ++t)
#pragma omp simd
        for (std::int64_t j = 0; j < M; ++j)
          dL[t * M + j] += Dsp[t * M + j] * (dD[t * M + j] - dot[j]);
    }
  }
}

}  // namespace ffnlab
