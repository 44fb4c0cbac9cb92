// BASE layers (Lewis et al. 2021, "BASE Layers: Simplifying Training of Large, Sparse Models"):
// in training the tokens of the batch are assigned to the experts as a balanced linear
// assignment, each expert taking T/E of them (the first T mod E experts one more), maximising
// the sum of the router's affinities h_t·w_e; at inference each token takes its expert of best
// affinity (greedy top-1). A token's output is σ(h_t·w_e)·FFN_e(h_t), as the paper's
// σ-weighted mix of the expert into the residual stream. The assignment is solved by the
// auction algorithm (Bertsekas 1979) with ε-scaling, to within T·ε of the optimum (ε a 1e-7 of
// the affinities' range per token: the optimum itself unless two assignments are that close);
// in data-parallel training over the whole batch of every rank, as one process would.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <vector>

#include "check.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"

namespace ffnlab {

namespace {

// One expert's slots as a min-heap by price: the cheapest slot is the one a bid takes.
struct Slots {
  struct Slot {
    double price = 0;
    std::int64_t token = -1;
  };
  std::vector<Slot> heap;
  double min_price() const { return heap[0].price; }
  double second_price() const {  // the next cheapest slot (none: +inf)
    if (heap.size() < 2) return std::numeric_limits<double>::infinity();
    return heap.size() < 3 ? heap[1].price : std::min(heap[1].price, heap[2].price);
  }
  // The cheapest slot goes to `token` at `price`; returns its previous holder (-1: none).
  std::int64_t take(std::int64_t token, double price) {
    const std::int64_t previous = heap[0].token;
    heap[0] = {price, token};
    for (std::size_t i = 0;;) {  // sift down
      const std::size_t l = 2 * i + 1, r = l + 1;
      std::size_t m = i;
      if (l < heap.size() && heap[l].price < heap[m].price) m = l;
      if (r < heap.size() && heap[r].price < heap[m].price) m = r;
      if (m == i) break;
      std::swap(heap[i], heap[m]);
      i = m;
    }
    return previous;
  }
};

// Each of T tokens to one of E experts, expert e taking T/E (the first T mod E one more),
// maximising Σ a[t, expert(t)] [T, E] to within T·ε of the optimum: the auction algorithm
// (Bertsekas 1979) with ε-scaling, an expert's slots as its objects. Ties go to the lower expert
// and the earlier token: deterministic.
std::vector<std::int32_t> balanced_assignment(const double* a, std::int64_t T, int E) {
  std::vector<std::int32_t> expert(static_cast<std::size_t>(T), -1);
  if (T == 0) return expert;
  std::vector<Slots> slots(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) slots[e].heap.resize(static_cast<std::size_t>(T / E + (e < T % E)));
  double lo = a[0], hi = a[0];
  for (std::int64_t i = 0; i < T * E; ++i) {
    lo = std::min(lo, a[i]);
    hi = std::max(hi, a[i]);
  }
  const double range = std::max(hi - lo, 1e-30);
  const double eps_final = 1e-7 * range / static_cast<double>(T);
  const double inf = std::numeric_limits<double>::infinity();
  for (double eps = range / 4;; eps = std::max(eps / 5, eps_final)) {
    // A phase: every token bids again at the prices the last phase left.
    for (auto& s : slots)
      for (auto& slot : s.heap) slot.token = -1;
    std::deque<std::int64_t> waiting;
    for (std::int64_t t = 0; t < T; ++t) waiting.push_back(t);
    while (!waiting.empty()) {
      const std::int64_t t = waiting.front();
      waiting.pop_front();
      const double* at = a + t * E;
      int best = -1;
      double v1 = -inf, v2 = -inf;
      for (int e = 0; e < E; ++e) {
        if (slots[e].heap.empty()) continue;
        const double v = at[e] - slots[e].min_price();
        if (v > v1) {
          v2 = v1;
          v1 = v;
          best = e;
        } else if (v > v2) {
          v2 = v;
        }
      }
      v2 = std::max(v2, at[best] - slots[best].second_price());  // its own next slot
      const double bid = v2 == -inf ? eps : v1 - v2 + eps;
      const std::int64_t out = slots[best].take(t, slots[best].min_price() + bid);
      expert[t] = best;
      if (out >= 0) {
        expert[out] = -1;
        waiting.push_back(out);
      }
    }
    if (eps <= eps_final) break;
  }
  return expert;
}

// Non-finite affinities (a diverged run's NaN or infinite logits) as finite ones in the same
// order: +inf above every finite value, -inf and NaN below, so that the auction's prices stay
// finite and it ends; the non-finite logits still reach the output, which the trainer reports.
void make_finite(std::vector<double>& a) {
  double lo = 0, hi = 0;
  bool any = false;
  for (const double v : a)
    if (std::isfinite(v)) {
      lo = any ? std::min(lo, v) : v;
      hi = any ? std::max(hi, v) : v;
      any = true;
    }
  const double span = std::max(hi - lo, 1.0);
  for (double& v : a)
    if (!std::isfinite(v)) v = v > 0 ? hi + span : lo - span;  // NaN > 0 is false
}

// Training: the balanced assignment of the group's whole batch by the logits; inference: each
// token's best logit (ties to the lower expert). Weight: scaling·σ(logit).
void choose(Routing& r, const ChoiceInput& in, const RouterConfig& m) {
  const int E = r.experts;
  const std::int64_t T = r.tokens;
  std::vector<std::int32_t> chosen(static_cast<std::size_t>(T));
  if (in.train) {
    std::vector<std::int64_t> at{T}, total{T};
    std::vector<double> all;
    if (in.group) {  // every rank's logits, in rank order, on every rank
      in.group->exscan_sum(at, "BASE assignment");
      in.group->allreduce_sum(total, "BASE assignment");
    } else {
      at[0] = 0;
    }
    all.assign(static_cast<std::size_t>(total[0] * E), 0.0);
    for (std::int64_t i = 0; i < T * E; ++i) all[at[0] * E + i] = in.logits[i];
    if (in.group) in.group->allreduce_sum(all, "BASE assignment");
    make_finite(all);
    const std::vector<std::int32_t> whole = balanced_assignment(all.data(), total[0], E);
    std::copy(whole.begin() + at[0], whole.begin() + at[0] + T, chosen.begin());
  } else {
    for (std::int64_t t = 0; t < T; ++t) {
      const float* l = in.logits + t * E;
      // NaN ranks last; all NaN: the first expert
      chosen[t] = static_cast<std::int32_t>(
          std::max_element(l, l + E, [](float a, float b) { return rank_key(a) < rank_key(b); }) -
          l);
    }
  }
  for (std::int64_t t = 0; t < T; ++t) {
    r.count[t] = 1;
    r.expert[t] = chosen[t];
    r.raw[t] = r.scores[t * E + chosen[t]];
    r.weight[t] = m.scaling * r.raw[t];
  }
}

}  // namespace

template <>
const RoutingFamily& family_of<RoutingKind::base>() {
  static const RoutingFamily family{
      .title = "BASE layers",
      .summary =
          "a balanced assignment of the batch's tokens, T/E an expert, in training; the "
          "best affinity at inference",
      .top_k = "1: one expert a token",
      .defaults = R"({"top_k": 1, "score": "sigmoid", "normalize": false, "router_bias": false,
                      "aux_coef": 0.0})",
      .unused =
          "top_p,slots,target_sparsity,l1_coef_init,l1_coef_rate,score,softmax_after_topk,"
          "normalize,groups,topk_groups,noisy_topk,balance_bias,balance_rate,drop,"
          "balance_loss,aux_coef,entropy_coef",
      .validate =
          [](const MoEConfig& m) {
            check(m.top_k == 1,
                  "[moe] routing 'base' assigns one expert a token: top_k = {} must be 1", m.top_k);
            check(m.capacity_factor == 0,
                  "[moe] routing 'base' does not combine with a capacity factor: every expert "
                  "takes T/E tokens by construction");
          },
      .study = [](MoEConfig& m, std::int64_t) { m.z_coef = 0.0f; },
      .describe =
          [](const MoEConfig& m) {
            return fmt::format("BASE layers: a balanced assignment, 1 of {} experts a token",
                               m.num_experts);
          },
      .choose = choose,
  };
  return family;
}

}  // namespace ffnlab
