// The MoE router after its Linear: scores, (group-limited) top-k selection, combine weights,
// capacity and the permutation into per-expert blocks, the balancing and z losses, and the
// backward of all of it into the logits. docs/moe.md states every formula.
// Reference: layers/ref/moe_ffn_ref.hpp (an independent, sort-based implementation).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ffnlab/names.hpp"
#include "ffnlab/parallel/group.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab {

// How the router turns logits into scores (docs/moe.md).
enum class ScoreFunc : std::uint8_t { softmax, sigmoid, count };
// How a token gets its experts: the registration table of the routing families. Each value is
// one family, defined by one file of src/layers/moe/routing/ (layers/moe/routing_family.hpp says
// what a family defines; docs/moe.md, "Routing families", states each one's rule).
enum class RoutingKind : std::uint8_t {
  topk,           // the k best scores (Switch, Mixtral, Qwen-MoE, DeepSeek): routing/topk.cpp
  top_p,          // the fewest best whose probabilities reach top_p (Huang et al. 2024)
  relu,           // every expert whose logit is positive (ReMoE, Wang et al. 2025)
  expert_choice,  // each expert takes its best tokens of a sequence (Zhou et al. 2022)
  soft,           // every expert's slots mix a sequence's tokens (Puigcerver et al. 2024)
  hash,           // a fixed hash of the token id (Roller et al. 2021)
  base,           // a balanced assignment of the batch in training (BASE layers, Lewis et al. 2021)
  count
};
// A logit or score as a sort key: NaN (from a diverged run's non-finite logits; the layer's
// output carries them, and the trainer reports it) ranks last, so that an ordering by it stays
// a strict weak order and every token still gets valid experts.
inline float rank_key(float v) {
  return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
}

// Which assignments an expert over capacity drops.
enum class DropPolicy : std::uint8_t {
  position,     // later ones: all first choices before second choices, then by token index
  probability,  // those of lowest score s[e] (ties: the later in the position order)
  count
};
// Which f_e the load-balancing loss E·Σ_e f_e·P_e uses (docs/moe.md).
enum class BalanceLoss : std::uint8_t {
  topk,             // f_e = (assignments to e) / T, all k choices: Mixtral / Qwen2-MoE in HF
  topk_normalized,  // f_e = (assignments to e) / (k·T): GShard, DeepSeek (1 when balanced)
  top1,             // f_e = (tokens whose first choice is e) / T: Switch Transformer
  count
};

template <>
struct EnumNames<ScoreFunc> {
  static constexpr auto table =
      name_table<ScoreFunc>("ffn", "scoring function",
                            {{ScoreFunc::softmax, "softmax"}, {ScoreFunc::sigmoid, "sigmoid"}});
};
template <>
struct EnumNames<RoutingKind> {
  static constexpr auto table =
      name_table<RoutingKind>("ffn", "routing",
                              {{RoutingKind::topk, "topk"},
                               {RoutingKind::top_p, "top_p"},
                               {RoutingKind::relu, "relu"},
                               {RoutingKind::expert_choice, "expert_choice"},
                               {RoutingKind::soft, "soft"},
                               {RoutingKind::hash, "hash"},
                               {RoutingKind::base, "base"}});
};
template <>
struct EnumNames<DropPolicy> {
  static constexpr auto table = name_table<DropPolicy>(
      "ffn", "drop policy",
      {{DropPolicy::position, "position"}, {DropPolicy::probability, "probability"}});
};
template <>
struct EnumNames<BalanceLoss> {
  static constexpr auto table =
      name_table<BalanceLoss>("ffn", "balance loss",
                              {{BalanceLoss::topk, "topk"},
                               {BalanceLoss::topk_normalized, "topk_normalized"},
                               {BalanceLoss::top1, "top1"}});
};
static_assert(EnumNames<ScoreFunc>::table.complete() && EnumNames<DropPolicy>::table.complete() &&
              EnumNames<BalanceLoss>::table.complete() && EnumNames<RoutingKind>::table.complete());

// What the routing math needs of an MoE config (MoEConfig in layers/ffn_config.hpp extends it
// with the experts, the router's own parameters and training noise).
struct RouterConfig {
  int num_experts = 8;  // FFN experts
  // Zero-computation experts (MoE++, Jin et al. 2024), routed beside the FFN experts and after
  // them in this order: constant (a·x + b·v, [a, b] = softmax(W_c·x)), copy (x), zero (0; its
  // weight is 0 before renormalising, so a token that picks it runs one FFN expert fewer).
  int constant_experts = 0, copy_experts = 0, zero_experts = 0;
  float zc_balance_weight = 1.0f;  // η of the zero-computation experts in the balance loss (τ)
  // top_p routing: the most experts a token takes; relu routing: the mean it is held at (the
  // L1 penalty's target sparsity is 1 - top_k/E unless the layer sets another)
  int top_k = 2;
  RoutingKind routing = RoutingKind::topk;
  float top_p = 0.4f;  // top_p routing: the probability mass a token's experts reach
  int slots = 1;       // soft routing: slots per expert (each a mixture of a sequence's tokens)
  ScoreFunc score = ScoreFunc::softmax;
  bool softmax_after_topk = false;  // weights = softmax over the k chosen logits (GPT-OSS)
  // The chosen experts' weights divided by their sum (norm_topk_prob). Config files and flags
  // default it to false under top_p, relu and expert_choice (routing_defaults); a config built
  // in code sets it with the routing.
  bool normalize = true;
  float scaling = 1.0f;  // routed_scaling_factor, applied after normalisation
  int groups = 0;        // n_group (0: no group-limited selection)
  int topk_groups = 0;   // topk_group: groups kept per token

  // Capacity: top-k, top-p: 0 is dropless, else capacity = ceil(c·k·T/E) assignments per expert.
  // expert_choice: each expert takes its best ceil(c·k·S/E) tokens of every sequence of S
  // (c = 1 when 0: k experts per token on average, the compute of top-k), and nothing drops.
  double capacity_factor = 0.0;
  DropPolicy drop = DropPolicy::position;

  // Auxiliary losses, added to the training loss with these coefficients.
  BalanceLoss balance_loss = BalanceLoss::topk;
  float aux_coef = 0.0f;      // load-balancing loss
  float z_coef = 0.0f;        // router z-loss
  float entropy_coef = 0.0f;  // mean entropy of softmax(logits): top-p's "dynamic loss"

  // Experts the router scores: the FFN experts, then the zero-computation ones.
  int routed_experts() const {
    return num_experts + constant_experts + copy_experts + zero_experts;
  }
  int zc_experts() const { return constant_experts + copy_experts + zero_experts; }
  // The router's columns in order: FFN experts [0, N), constant [N, first_copy), copy
  // [first_copy, first_zero), zero [first_zero, routed_experts()).
  int first_copy_expert() const { return num_experts + constant_experts; }
  int first_zero_expert() const { return first_copy_expert() + copy_experts; }
  // Whether assignments over an expert's capacity are dropped (a factor, under a routing whose
  // capacity drops: routing_family's capacity_drops).
  bool drops() const;
  // expert_choice: the tokens an expert takes of a sequence of `sequence` tokens.
  std::int64_t expert_choice_capacity(std::int64_t sequence) const;
  // relu routing's L1 penalty has a coefficient that changes during training (the layer holds
  // it: MoEConfig's l1_coef_* keys); route_backward takes it as an argument.
};

// What the router decided for T tokens, and what its backward needs. Routed over a process group
// (data parallelism), the counts, losses and statistics are those of the group's whole batch: the
// tokens of every rank, as one process holding them all would compute them.
struct Routing {
  std::int64_t tokens = 0;
  std::int64_t total_tokens = 0;  // over the group (= tokens without one)
  // experts: the columns of the logits (FFN experts, then zero-computation ones); ffn_experts:
  // those that get rows. k: the most choices a token has (top_k; E for relu routing).
  int experts = 0, ffn_experts = 0, k = 0;
  std::vector<float> probs;         // [T, E] softmax(logits): balance loss, z-loss, statistics
  std::vector<float> scores;        // [T, E] softmax or sigmoid of the logits
  std::vector<float> lse;           // [T]    logsumexp(logits)
  std::vector<std::int32_t> count;  // [T]    a token's choices: k, or fewer (top_p, relu)
  // [T, k] chosen experts, best first; past a token's count, padding that has raw = weight = 0
  // and slot -1 (still an expert index, the next best)
  std::vector<std::int32_t> expert;
  std::vector<float> raw;     // [T, k] chosen scores before normalisation and scaling
  std::vector<float> weight;  // [T, k] combine weights
  // [T, k] row in the permuted buffer; -1 when dropped, padding or a zero-computation expert
  std::vector<std::int64_t> slot;
  std::vector<std::int64_t> offsets;       // [N + 1] FFN expert blocks in the permuted buffer
  std::vector<std::int64_t> token_of_row;  // [kept] token of each permuted row
  std::vector<std::int64_t> load;          // [E] assignments before capacity (group)
  std::vector<std::int64_t> per_token;     // [k + 1] tokens by their FFN experts chosen (group)
  std::vector<std::int64_t> first;         // [E] tokens whose first choice is e (group)
  std::vector<std::int64_t> kept_total;    // [N] FFN assignments kept (group)
  std::vector<double> mass;                // [E] Σ_t raw weight of e over chosen (group)
  std::int64_t capacity = 0;               // per expert, over the group; 0: dropless
  double balance_loss = 0, z_loss = 0, entropy = 0, top1_prob = 0;
  // relu routing: the L1 penalty without its coefficient, E/(top_k·T²)·Σ_e n_e·Σ_t gate_te
  // (n_e: tokens with a positive gate for e), over the group's tokens
  double l1_loss = 0;
  std::int64_t sequence = 0;  // expert_choice: the tokens of one sequence (its routing group)

  std::int64_t kept() const { return offsets.empty() ? 0 : offsets.back(); }
  // [T, k] the experts each token took: `expert` with -1 past the token's count.
  std::vector<std::int32_t> taken() const;
  std::int64_t rows_of(int e) const { return offsets[e + 1] - offsets[e]; }
};

struct ChoiceInput;  // layers/moe/routing_family.hpp

// Scores and a routing family's choice (layers/moe/routing_family.hpp) for in.tokens tokens:
// softmax probabilities, scores (softmax or sigmoid), logsumexp, then the family's choices and
// combine weights, then the statistics: loads, the balance loss, the z-loss, the entropy, the
// top-1 probability and the family's own loss; with in.group (collective: every rank calls it),
// over the tokens of all its ranks. Without logits (a family with no router Linear) the scores
// are empty and the losses 0. docs/moe.md states every family's rule.
void route(Routing& r, const RouterConfig& m, const ChoiceInput& in);
// The same from logits [T, E] (a training forward); `selection_bias` [E] (null: none) is added
// to the scores for the choice only (aux-loss-free balancing); `sequence`: tokens per sequence
// (0: all T are one).
void route(Routing& r, const Tensor& logits, const float* selection_bias, const RouterConfig& m,
           ProcessGroup* group = nullptr, std::int64_t sequence = 0);

// Capacity (dropping by m.drop) and the layout of the permuted buffer: each expert's kept
// assignments are contiguous, in token order. With a `group` (collective), the capacity is that
// of the group's batch, whose tokens are the ranks' in rank order: an assignment is kept when
// it is kept in one process holding every rank's tokens. Throws for drop = probability with a
// group (not supported: it needs every rank's scores).
void assign_rows(Routing& r, const RouterConfig& m, ProcessGroup* group = nullptr);

// dlogits [T, E] (overwritten) from dweight [T, k], the loss gradient of the combine weights
// (zero for dropped assignments), plus aux_scale·(aux_coef·∂balance + z_coef·∂z +
// entropy_coef·∂entropy)/∂logits, or the family's own backward (ReLU routing's, with its L1
// penalty of coefficient loss_coef).
void route_backward(Tensor& dlogits, const Routing& r, const float* dweight, const RouterConfig& m,
                    float aux_scale, float loss_coef = 0.0f);

// Soft MoE's weights (Puigcerver et al. 2024) from its logits [T, M] (M slots) of sequences of S
// tokens one after another: dispatch [T, M] = softmax over each sequence's tokens (per slot,
// per sequence), combine [T, M] = softmax over the slots (per token); combine may be logits
// itself (overwritten after the dispatch is read from it). Adds each token's combine entropy
// (nats) and largest combine weight to *entropy_sum and *top_sum.
void soft_route(Tensor& dispatch, Tensor& combine, const Tensor& logits, std::int64_t sequence,
                double* entropy_sum, double* top_sum);

// dlogits [T, M] from the gradients of both weights: the combine softmax's backward of dcombine
// plus the dispatch softmax's of ddispatch. dlogits may be dcombine itself.
void soft_route_backward(Tensor& dlogits, const Tensor& dcombine, const Tensor& ddispatch,
                         const Tensor& dispatch, const Tensor& combine, std::int64_t sequence);

}  // namespace ffnlab
