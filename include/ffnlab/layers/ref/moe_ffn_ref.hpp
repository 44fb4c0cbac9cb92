// Scalar reference of the MoE layer, forward only, in any floating type: every token is routed
// by sorting (not by the fast layer's argmax passes), capacity is applied by sorting each
// expert's assignments, and each kept assignment runs the reference dense FFN of its expert on
// its own. The fast MoEFFN is compared with it (tests/unit/test_moe_ffn.cpp); its gradients are
// checked by central differences of this forward in double precision with the routing held.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/ref/dense_ffn_ref.hpp"

namespace ffnlab::ref {

template <typename T>
struct MoEFFN {
  FFNConfig config;
  // Parameters by their names (the fast layer's names; see docs/config.md).
  std::map<std::string, std::vector<T>> params;
  // Training noise to apply (empty: none): jitter [tokens·D] multiplies the router input,
  // noise [tokens·E] scales softplus(x·W_noiseᵀ) into the logits.
  std::vector<T> jitter, noise;
  // expert_choice: the tokens of one sequence (0: all tokens are one).
  std::int64_t sequence = 0;
  // MoE++'s gating residual (config.moe.gating_residual): the previous MoE layer's logits
  // [tokens, E], added through gate.gate_map.weight (empty: none, as for a first layer).
  std::vector<T> gate_residual;
  // hash routing: the tokens' ids [tokens].
  std::vector<std::int32_t> token_ids;
  // BASE layers: a training forward (the balanced assignment) or not (each token's best).
  bool train = false;
  // Routing: computed by forward unless hold_routing, then reused as given.
  bool hold_routing = false;
  std::vector<int> chosen;  // [tokens, k]
  std::vector<int> count;   // [tokens] choices taken: k, or fewer (top_p, relu)
  std::vector<char> kept;   // [tokens, k] runs an FFN row (0 past a token's count, for a
                            // zero-computation expert, or dropped)
  // Results of forward.
  std::vector<T> weight;  // [tokens, k]
  T balance = 0, z = 0, entropy = 0;
  T l1 = 0;  // relu routing: E/(top_k·T²)·Σ_e n_e·Σ_t gate_te, without its coefficient
  std::vector<T> logits;  // [tokens, E] the router's, residual included (what the next layer takes)

  // The columns of chosen / weight / kept: top_k, or every expert with relu and expert-choice
  // routing.
  int choices() const {
    const RoutingKind r = config.moe.routing;
    if (r == RoutingKind::soft) return 0;  // nothing is chosen
    return r == RoutingKind::relu || r == RoutingKind::expert_choice ? config.moe.num_experts
                                                                     : config.moe.top_k;
  }

  // BASE layers' balanced assignment, exactly: each token to one expert, expert e taking
  // T/E tokens (the first T mod E one more), maximising Σ a[t, e], by successive shortest
  // augmenting paths (Bellman-Ford) on the flow network source → tokens → experts → sink.
  static std::vector<int> balanced_assignment(const std::vector<T>& a, std::int64_t tokens, int E) {
    const std::int64_t n = tokens + E + 2, src = 0, sink = tokens + E + 1;
    struct Edge {
      std::int64_t to;
      int cap;
      T cost;
    };
    std::vector<Edge> edges;
    std::vector<std::vector<std::size_t>> out(static_cast<std::size_t>(n));
    auto add = [&](std::int64_t u, std::int64_t v, int cap, T cost) {
      out[u].push_back(edges.size());
      edges.push_back({v, cap, cost});
      out[v].push_back(edges.size());
      edges.push_back({u, 0, -cost});
    };
    for (std::int64_t t = 0; t < tokens; ++t) {
      add(src, 1 + t, 1, T(0));
      for (int e = 0; e < E; ++e) add(1 + t, 1 + tokens + e, 1, -a[t * E + e]);
    }
    for (int e = 0; e < E; ++e)
      add(1 + tokens + e, sink, static_cast<int>(tokens / E + (e < tokens % E)), T(0));
    for (std::int64_t flow = 0; flow < tokens; ++flow) {
      std::vector<T> dist(static_cast<std::size_t>(n), std::numeric_limits<T>::infinity());
      std::vector<std::size_t> via(static_cast<std::size_t>(n), edges.size());
      dist[src] = 0;
      for (bool changed = true; changed;) {
        changed = false;
        for (std::int64_t u = 0; u < n; ++u) {
          if (dist[u] == std::numeric_limits<T>::infinity()) continue;
          for (std::size_t i : out[u])
            if (edges[i].cap > 0 && dist[u] + edges[i].cost < dist[edges[i].to] - T(1e-12)) {
              dist[edges[i].to] = dist[u] + edges[i].cost;
              via[edges[i].to] = i;
              changed = true;
            }
        }
      }
      for (std::int64_t v = sink; v != src; v = edges[via[v] ^ 1].to) {
        edges[via[v]].cap -= 1;
        edges[via[v] ^ 1].cap += 1;
      }
    }
    std::vector<int> expert(static_cast<std::size_t>(tokens), -1);
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::size_t i : out[1 + t])
        if (edges[i].to > tokens && edges[i].to <= tokens + E && edges[i].cap == 0 && i % 2 == 0)
          expert[t] = static_cast<int>(edges[i].to - 1 - tokens);
    return expert;
  }

  // hash routing's key of expert e for token id `id`: splitmix64's finaliser of (id << 32 | e).
  static std::uint64_t hash_key(std::int32_t id, int e) {
    std::uint64_t z = (std::uint64_t{static_cast<std::uint32_t>(id)} << 32) + std::uint32_t(e);
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  // MoE++'s zero-computation expert e (≥ num_experts) on one token: constant (a·x + b·v with
  // [a, b] = softmax(W_c·x)), copy (x) or zero.
  std::vector<T> zero_computation(int e, const std::vector<T>& xt) const {
    const MoEConfig& m = config.moe;
    const std::int64_t D = config.d_model;
    const int i = e - m.num_experts;
    std::vector<T> out(D, T(0));
    if (i < m.constant_experts) {
      const auto& wc = p("constant_experts." + std::to_string(i) + ".gate.weight");
      const auto& v = p("constant_experts." + std::to_string(i) + ".vector");
      T z0 = 0, z1 = 0;
      for (std::int64_t d = 0; d < D; ++d) {
        z0 += wc[d] * xt[d];
        z1 += wc[D + d] * xt[d];
      }
      const T a = std::exp(z0) / (std::exp(z0) + std::exp(z1)), b = T(1) - a;
      for (std::int64_t d = 0; d < D; ++d) out[d] = a * xt[d] + b * v[d];
    } else if (e < m.first_zero_expert()) {
      out = xt;
    }
    return out;
  }

  const std::vector<T>& p(const std::string& name) const { return params.at(name); }

  std::string in_name(int e, int part) const {
    const std::string pre = "experts." + std::to_string(e) + ".";
    if (config.moe.naming == MoENaming::mixtral) return pre + (part == 0 ? "w1" : "w3");
    if (config.moe.expert_kind == FFNKind::plain) return pre + "up_proj";
    return pre + (part == 0 ? "gate_proj" : "up_proj");
  }
  std::string out_name(int e) const {
    return "experts." + std::to_string(e) + "." +
           (config.moe.naming == MoENaming::mixtral ? "w2" : "down_proj");
  }

  // The dense reference of expert e, its weights concatenated from the per-expert tensors.
  DenseFFN<T> expert(int e) const {
    DenseFFN<T> d;
    d.config = config;
    d.config.kind = config.moe.expert_kind;
    d.config.d_ff = config.expert_d_ff();
    const int parts = d.config.kind == FFNKind::glu ? 2 : 1;
    for (int part = 0; part < parts; ++part) {
      const auto& w = p(in_name(e, part) + ".weight");
      d.w_in.insert(d.w_in.end(), w.begin(), w.end());
      if (config.bias) {
        const auto& b = p(in_name(e, part) + ".bias");
        d.b_in.insert(d.b_in.end(), b.begin(), b.end());
      }
    }
    d.w_out = p(out_name(e) + ".weight");
    if (config.bias) d.b_out = p(out_name(e) + ".bias");
    return d;
  }

  DenseFFN<T> shared() const {
    const std::string pre =
        config.moe.naming == MoENaming::qwen2_moe ? "shared_expert." : "shared_experts.";
    DenseFFN<T> d;
    d.config = config;
    d.config.kind = config.moe.expert_kind;
    d.config.d_ff = config.moe.num_shared * config.shared_d_ff();
    if (d.config.kind == FFNKind::glu) {
      d.w_in = p(pre + "gate_proj.weight");
      const auto& u = p(pre + "up_proj.weight");
      d.w_in.insert(d.w_in.end(), u.begin(), u.end());
      if (config.bias) {
        d.b_in = p(pre + "gate_proj.bias");
        const auto& ub = p(pre + "up_proj.bias");
        d.b_in.insert(d.b_in.end(), ub.begin(), ub.end());
      }
    } else {
      d.w_in = p(pre + "up_proj.weight");
      if (config.bias) d.b_in = p(pre + "up_proj.bias");
    }
    d.w_out = p(pre + "down_proj.weight");
    if (config.bias) d.b_out = p(pre + "down_proj.bias");
    return d;
  }

  // y += g·shared(x), g = σ(x·w_g) or 1.
  void add_shared(std::vector<T>& y, const std::vector<T>& x, std::int64_t tokens) const {
    const MoEConfig& m = config.moe;
    const std::int64_t D = config.d_model;
    if (m.num_shared == 0) return;
    DenseFFN<T> s = shared();
    std::vector<T> out;
    s.forward(out, x, tokens);
    for (std::int64_t t = 0; t < tokens; ++t) {
      T g = 1;
      if (m.shared_gate) {
        T v = 0;
        for (std::int64_t d = 0; d < D; ++d) v += p("shared_expert_gate.weight")[d] * x[t * D + d];
        g = T(1) / (T(1) + std::exp(-v));
      }
      for (std::int64_t d = 0; d < D; ++d) y[t * D + d] += g * out[t * D + d];
    }
  }

  // Soft MoE (Puigcerver et al. 2024), one sequence at a time, slot by slot: logits between the
  // l2-normalised token and scale·the l2-normalised slot parameter (ε 1e-6 on the sum of
  // squares), dispatch softmax over the sequence's tokens, combine softmax over the slots.
  void soft_forward(std::vector<T>& y, const std::vector<T>& x, std::int64_t tokens) const {
    const MoEConfig& m = config.moe;
    const std::int64_t D = config.d_model, p_ = m.slots, M = m.num_experts * p_;
    const std::int64_t S = sequence > 0 ? sequence : tokens;
    auto normalized = [D](const T* v, T scale) {
      T ss = 0;
      for (std::int64_t d = 0; d < D; ++d) ss += v[d] * v[d];
      std::vector<T> out(v, v + D);
      for (auto& o : out) o *= scale / std::sqrt(ss + T(1e-6));
      return out;
    };
    const auto& phi = p("gate.phi");
    const T scale = p("gate.scale")[0];
    std::vector<std::vector<T>> slot(M);
    for (std::int64_t j = 0; j < M; ++j) slot[j] = normalized(phi.data() + j * D, scale);
    std::vector<DenseFFN<T>> experts;
    for (int e = 0; e < m.num_experts; ++e) experts.push_back(expert(e));
    y.assign(tokens * D, T(0));
    for (std::int64_t b = 0; b < tokens; b += S) {
      std::vector<T> L(S * M);
      for (std::int64_t s = 0; s < S; ++s) {
        const std::vector<T> xn = normalized(x.data() + (b + s) * D, T(1));
        for (std::int64_t j = 0; j < M; ++j) {
          T v = 0;
          for (std::int64_t d = 0; d < D; ++d) v += xn[d] * slot[j][d];
          L[s * M + j] = v;
        }
      }
      std::vector<std::vector<T>> out(M);
      for (std::int64_t j = 0; j < M; ++j) {  // slot j: Σ_s softmax_s(L[s, j])·x_s
        T sum = 0;
        for (std::int64_t s = 0; s < S; ++s) sum += std::exp(L[s * M + j]);
        std::vector<T> in(D, T(0));
        for (std::int64_t s = 0; s < S; ++s)
          for (std::int64_t d = 0; d < D; ++d)
            in[d] += std::exp(L[s * M + j]) / sum * x[(b + s) * D + d];
        experts[j / p_].forward(out[j], in, 1);
      }
      for (std::int64_t s = 0; s < S; ++s) {  // token s: Σ_j softmax_j(L[s, j])·out_j
        T sum = 0;
        for (std::int64_t j = 0; j < M; ++j) sum += std::exp(L[s * M + j]);
        for (std::int64_t j = 0; j < M; ++j)
          for (std::int64_t d = 0; d < D; ++d)
            y[(b + s) * D + d] += std::exp(L[s * M + j]) / sum * out[j][d];
      }
    }
  }

  void forward(std::vector<T>& y, const std::vector<T>& x, std::int64_t tokens) {
    const MoEConfig& m = config.moe;
    if (m.routing == RoutingKind::soft) {  // no choice, no losses
      soft_forward(y, x, tokens);
      add_shared(y, x, tokens);
      balance = z = entropy = l1 = T(0);
      return;
    }
    const std::int64_t D = config.d_model;
    // E: the router's columns (FFN experts, then zero-computation ones); N: the FFN experts.
    const int E = m.routed_experts(), N = m.num_experts, K = choices();
    const int zero_from = m.first_zero_expert();
    const bool relu = m.routing == RoutingKind::relu;
    const bool hashed = m.routing == RoutingKind::hash;  // no router: no logits
    const T inf = std::numeric_limits<T>::infinity();

    // Router logits, probabilities, scores.
    logits.assign(tokens * E, T(0));
    std::vector<T> probs(tokens * E), scores(tokens * E), lse(tokens);
    const bool residual = m.gating_residual && !gate_residual.empty();
    for (std::int64_t t = 0; t < tokens && !hashed; ++t) {
      std::vector<T> xr(x.begin() + t * D, x.begin() + (t + 1) * D);
      if (!jitter.empty())
        for (std::int64_t d = 0; d < D; ++d) xr[d] *= jitter[t * D + d];
      for (int e = 0; e < E; ++e) {
        T v = m.router_bias ? p("gate.bias")[e] : T(0);
        for (std::int64_t d = 0; d < D; ++d) v += p("gate.weight")[e * D + d] * xr[d];
        if (!noise.empty()) {
          T n = 0;
          for (std::int64_t d = 0; d < D; ++d) n += p("gate.noise.weight")[e * D + d] * xr[d];
          v += noise[t * E + e] * std::log1p(std::exp(n));
        }
        if (residual)
          for (int f = 0; f < E; ++f)
            v += p("gate.gate_map.weight")[e * E + f] * gate_residual[t * E + f];
        logits[t * E + e] = v;
      }
      const T mx = *std::max_element(logits.begin() + t * E, logits.begin() + (t + 1) * E);
      T sum = 0;
      for (int e = 0; e < E; ++e) sum += std::exp(logits[t * E + e] - mx);
      lse[t] = mx + std::log(sum);
      for (int e = 0; e < E; ++e) {
        probs[t * E + e] = std::exp(logits[t * E + e] - lse[t]);
        scores[t * E + e] = m.score == ScoreFunc::softmax
                                ? probs[t * E + e]
                                : T(1) / (T(1) + std::exp(-logits[t * E + e]));
      }
    }

    // Selection: sort experts by biased score, after dropping the groups that lose.
    if (!hold_routing) {
      chosen.assign(tokens * K, 0);
      for (std::int64_t t = 0; t < tokens; ++t) {
        std::vector<T> sel(E);
        for (int e = 0; e < E; ++e)
          sel[e] = relu ? logits[t * E + e]
                        : scores[t * E + e] +
                              (m.balance_bias ? p("gate.e_score_correction_bias")[e] : T(0));
        if (m.groups > 0) {
          const int size = E / m.groups;
          std::vector<T> gs(m.groups);
          for (int g = 0; g < m.groups; ++g) {
            std::vector<T> v(sel.begin() + g * size, sel.begin() + (g + 1) * size);
            std::sort(v.begin(), v.end(), std::greater<T>());
            gs[g] = v[0] + (size >= 2 ? v[1] : T(0));
          }
          std::vector<int> order(m.groups);
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return gs[a] > gs[b]; });
          for (int i = m.topk_groups; i < m.groups; ++i)
            for (int e = order[i] * size; e < (order[i] + 1) * size; ++e) sel[e] = -inf;
        }
        std::vector<int> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sel[a] > sel[b]; });
        if (hashed) {  // Roller et al.: experts ranked by a fixed hash of (id, expert)
          std::vector<std::uint64_t> key(E);
          for (int e = 0; e < E; ++e) key[e] = hash_key(token_ids[t], e);
          std::stable_sort(order.begin(), order.end(),
                           [&](int a, int b) { return key[a] > key[b]; });
        }
        for (int j = 0; j < K; ++j) chosen[t * K + j] = order[j];
      }
      if (m.routing == RoutingKind::base && train) {  // Lewis et al.: the balanced assignment
        const std::vector<int> assigned = balanced_assignment(logits, tokens, E);
        for (std::int64_t t = 0; t < tokens; ++t) chosen[t] = assigned[t];
      }
      // top_p: the fewest best experts whose probabilities sum to at least top_p, at most k.
      count.assign(tokens, K);
      if (relu)  // ReMoE: every expert whose logit is positive (sorted best first above)
        for (std::int64_t t = 0; t < tokens; ++t) {
          count[t] = 0;
          while (count[t] < E && logits[t * E + chosen[t * K + count[t]]] > T(0)) ++count[t];
        }
      if (m.routing == RoutingKind::expert_choice) {
        // Zhou et al.: in each sequence expert e takes its C tokens of best probability (ties to
        // the earlier token); a token's choices are the experts that took it, best first.
        const std::int64_t S = sequence > 0 ? sequence : tokens;
        const std::int64_t C = m.expert_choice_capacity(S);
        std::vector<char> took(tokens * E, 0);
        for (std::int64_t b = 0; b < tokens; b += S)
          for (int e = 0; e < E; ++e) {
            std::vector<std::int64_t> order(S);
            std::iota(order.begin(), order.end(), b);
            std::stable_sort(order.begin(), order.end(), [&](std::int64_t u, std::int64_t v) {
              return scores[u * E + e] > scores[v * E + e];
            });
            for (std::int64_t i = 0; i < C; ++i) took[order[i] * E + e] = 1;
          }
        for (std::int64_t t = 0; t < tokens; ++t) {
          std::vector<int> order(E);
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
            if (took[t * E + a] != took[t * E + b]) return took[t * E + a] > took[t * E + b];
            return scores[t * E + a] > scores[t * E + b];
          });
          count[t] = 0;
          for (int j = 0; j < E; ++j) {
            chosen[t * K + j] = order[j];
            count[t] += took[t * E + order[j]];
          }
        }
      }
      if (m.routing == RoutingKind::top_p)
        for (std::int64_t t = 0; t < tokens; ++t) {
          T mass = 0;
          for (int j = 0; j < K; ++j) {
            mass += probs[t * E + chosen[t * K + j]];
            if (mass >= T(m.top_p)) {
              count[t] = j + 1;
              break;
            }
          }
        }
    }

    // Combine weights.
    weight.assign(tokens * K, T(0));
    for (std::int64_t t = 0; t < tokens; ++t) {
      const int n = count[t];
      std::vector<T> v(K, T(0));
      if (relu) {  // the gate is the logit itself (held: no ReLU kink inside a difference step)
        for (int j = 0; j < n; ++j) v[j] = logits[t * E + chosen[t * K + j]];
      } else if (hashed) {  // every chosen expert counts the same
        for (int j = 0; j < n; ++j) v[j] = T(1);
      } else if (n < K) {
        for (int j = 0; j < n; ++j) v[j] = scores[t * E + chosen[t * K + j]];
      } else if (m.softmax_after_topk) {
        T sum = 0;
        for (int j = 0; j < K; ++j) sum += std::exp(logits[t * E + chosen[t * K + j]]);
        for (int j = 0; j < K; ++j) v[j] = std::exp(logits[t * E + chosen[t * K + j]]) / sum;
      } else {
        for (int j = 0; j < K; ++j) v[j] = scores[t * E + chosen[t * K + j]];
      }
      for (int j = 0; j < n; ++j)  // MoE++: the zero expert weighs nothing, before renormalising
        if (chosen[t * K + j] >= zero_from) v[j] = T(0);
      T total = 0;
      for (int j = 0; j < n; ++j) total += v[j];
      for (int j = 0; j < n; ++j)
        weight[t * K + j] =
            T(m.scaling) * (m.normalize && !relu ? (total > 0 ? v[j] / total : T(0)) : v[j]);
    }

    // Capacity: each expert keeps its first `capacity` assignments in priority order.
    if (!hold_routing) {
      kept.assign(tokens * K, 1);  // (zero-computation choices run no FFN row: not kept)
      for (std::int64_t t = 0; t < tokens; ++t)
        for (int j = 0; j < K; ++j)
          if (j >= count[t] || chosen[t * K + j] >= N) kept[t * K + j] = 0;
      if (m.drops()) {
        const auto cap = static_cast<std::int64_t>(
            std::ceil(m.capacity_factor * K * static_cast<double>(tokens) / N));
        for (int e = 0; e < N; ++e) {
          std::vector<std::int64_t> list;  // assignment t·K + j
          for (std::int64_t a = 0; a < tokens * K; ++a)
            if (chosen[a] == e && a % K < count[a / K]) list.push_back(a);
          // probability: best score first, ties in the position order (rank, then token)
          std::stable_sort(list.begin(), list.end(), [&](std::int64_t a, std::int64_t b) {
            if (m.drop == DropPolicy::probability &&
                scores[(a / K) * E + e] != scores[(b / K) * E + e])
              return scores[(a / K) * E + e] > scores[(b / K) * E + e];
            return a % K != b % K ? a % K < b % K : a < b;  // rank, then token
          });
          for (std::size_t i = static_cast<std::size_t>(cap); i < list.size(); ++i)
            kept[list[i]] = 0;
        }
      }
    }

    // Experts, one assignment at a time.
    y.assign(tokens * D, T(0));
    std::vector<DenseFFN<T>> experts;
    for (int e = 0; e < N; ++e) experts.push_back(expert(e));
    for (std::int64_t t = 0; t < tokens; ++t)
      for (int j = 0; j < K; ++j) {
        const bool zc = j < count[t] && chosen[t * K + j] >= N;
        if (!kept[t * K + j] && !zc) continue;
        std::vector<T> xt(x.begin() + t * D, x.begin() + (t + 1) * D), out;
        if (zc)
          out = zero_computation(chosen[t * K + j], xt);
        else
          experts[chosen[t * K + j]].forward(out, xt, 1);
        for (std::int64_t d = 0; d < D; ++d) y[t * D + d] += weight[t * K + j] * out[d];
      }
    add_shared(y, x, tokens);

    // Losses (f_e from the choices before capacity; P_e the mean softmax probability).
    std::vector<T> f(E, T(0)), mean_p(E, T(0));
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (int j = 0; j < count[t]; ++j)
        if (m.balance_loss != BalanceLoss::top1 || j == 0) f[chosen[t * K + j]] += T(1);
      for (int e = 0; e < E; ++e) mean_p[e] += probs[t * E + e] / T(tokens);
    }
    balance = 0;
    for (int e = 0; e < E; ++e) {
      T fe = f[e] / T(tokens);
      if (m.balance_loss == BalanceLoss::topk_normalized) fe /= T(K);
      if (e >= N) fe *= T(m.zc_balance_weight);  // MoE++'s η for zero-computation experts
      balance += fe * mean_p[e];
    }
    balance *= T(E);
    z = 0;
    for (std::int64_t t = 0; t < tokens; ++t) z += lse[t] * lse[t] / T(tokens);
    l1 = 0;  // n_e: the tokens with a positive gate for e, held with the routing
    if (relu) {
      std::vector<T> n(E, T(0)), gate_sum(E, T(0));
      for (std::int64_t t = 0; t < tokens; ++t)
        for (int j = 0; j < count[t]; ++j) {
          n[chosen[t * K + j]] += T(1);
          gate_sum[chosen[t * K + j]] += logits[t * E + chosen[t * K + j]];
        }
      for (int e = 0; e < E; ++e) l1 += n[e] * gate_sum[e];
      l1 *= T(E) / (T(m.top_k) * T(tokens) * T(tokens));
    }
    entropy = 0;  // mean over tokens of -Σ_e p_e log p_e
    for (std::int64_t t = 0; t < tokens; ++t)
      for (int e = 0; e < E; ++e) {
        const T pe = probs[t * E + e];
        if (pe > 0) entropy -= pe * std::log(pe) / T(tokens);
      }
  }
};

}  // namespace ffnlab::ref
