// A routing family: how a token gets its experts. Each family is one file of
// src/layers/moe/routing/ that defines its RoutingFamily: what its keys mean, its defaults and
// refusals, its choice and that choice's backward, its cost, and how the study configures it.
// RoutingKind (ops/router.hpp), with its name table, is the registration table: a family is one
// enum value there and its file (CONTRIBUTING.md, "Add a routing family"). The layer, the
// trainer, the costs and the front ends ask the family; none of them names a routing.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "ffnlab/ops/router.hpp"

namespace ffnlab {

struct MoEConfig;

// What a family's choice may look at.
struct ChoiceInput {
  std::int64_t tokens = 0;                  // T
  const float* logits = nullptr;            // [T, E] the router's logits (null: no router Linear)
  const float* selection_bias = nullptr;    // [E] added to the scores for the choice only, or null
  const std::int32_t* token_ids = nullptr;  // [T] the tokens' ids, or null
  std::int64_t sequence = 0;                // tokens per sequence (0: the T tokens are one)
  bool train = false;  // routes as in training (BASE layers assign): FFNContext::stochastic
  ProcessGroup* group = nullptr;  // the ranks whose whole batch is routed as one, or null
};

struct RoutingFamily {
  const char* title = "";       // its name in prose and figures ("top-k", "BASE layers")
  const char* summary = "";     // how a token gets its experts (--routing's help, docs/moe.md)
  const char* top_k = "";       // its reading of top_k ("" when it does not read it)
  const char* capacity = "";    // its reading of capacity_factor ("" when it refuses one)
  bool capacity_drops = false;  // a capacity factor drops the assignments over it (assign_rows)

  bool whole_sequence = false;  // compares or mixes a sequence's tokens: bidirectional models only
  bool splits_experts = true;   // its experts can be held by different ranks (expert parallelism)
  bool router_linear = true;    // scores tokens with a Linear (gate.weight [E, D])
  bool own_path = false;        // the layer runs it as its own part (Soft MoE), not through route()
  bool needs_token_ids = false;  // reads FFNContext::token_ids

  // The keys a config file or the flags leave out, as a JSON object ("{}": none).
  const char* defaults = "{}";
  // The MoE keys it does not read, comma-separated: a value other than its default is refused.
  const char* unused = "";
  void (*validate)(const MoEConfig&) = nullptr;  // its own refusals, after the common checks
  // The study's configuration of it on an MoE layout of top_k = K (sequences of `sequence`).
  void (*study)(MoEConfig&, std::int64_t sequence) = nullptr;
  // The configured routing in a few words, for the cost table ("top-2").
  std::string (*describe)(const MoEConfig&) = nullptr;
  // FFN experts a token runs, on average (costs); null: top_k.
  double (*experts_per_token)(const MoEConfig&, std::int64_t sequence) = nullptr;

  // The choice (own_path false). width: r.k, the columns of a token's choices (null: top_k).
  // choose: r.count, r.expert, r.raw and r.weight from the scores route() left in r (probs,
  // scores, lse: empty without logits) and `in`.
  int (*width)(const RouterConfig&) = nullptr;
  void (*choose)(Routing& r, const ChoiceInput& in, const RouterConfig& m) = nullptr;
  // dlogits [T, E] (overwritten) from dweight [T, k] and the family's own loss (coefficient
  // `loss_coef`, scaled by aux_scale); null: route_backward's chain through the scores.
  void (*backward)(float* dlogits, const Routing& r, const float* dweight, const RouterConfig& m,
                   float aux_scale, float loss_coef) = nullptr;
  // The family's own loss from r's group counts and r.mass (null: none), as r.l1_loss.
  double (*own_loss)(const Routing& r, const RouterConfig& m) = nullptr;
};

// The choice by rank shared by top-k and top-p: per token, the k best of score + selection bias
// (within the topk_groups best groups when groups > 0), best first; with reach > 0 (top-p) the
// fewest of them whose probabilities sum to at least reach. Weights: the chosen scores (or the
// softmax over the chosen logits), a zero expert's 0, divided by their sum when m.normalize,
// times m.scaling. Reads r.probs and r.scores; writes r.count, r.expert, r.raw and r.weight.
void choose_ranked(Routing& r, const ChoiceInput& in, const RouterConfig& m, double reach);

// Each family's file defines its specialisation.
template <RoutingKind K>
const RoutingFamily& family_of();

// Throws "[moe] invalid routing" for a value outside the table.
const RoutingFamily& routing_family(RoutingKind kind);
// Sets m.routing to the routing of that name; false when there is none.
bool set_routing(RouterConfig& m, std::string_view name);

// The family's properties, as the layer, the trainer and the plans ask for them.
std::vector<std::string> routing_names();  // RoutingKind's, in order
bool looks_at_whole_sequence(RoutingKind kind);
bool splits_experts(RoutingKind kind);
// "does not split its experts over ranks (<why>)": the one message of that refusal.
inline constexpr const char* kSplitsExpertsRefusal =
    "does not split its experts over ranks (its slots mix every token of a sequence)";
// What a routing changes of the MoE keys a config leaves out (its RoutingFamily::defaults);
// config_flags.hpp has the same by name.
nlohmann::json routing_defaults(RoutingKind routing);

// Whether a layer of `config` reads the tokens' ids (an MoE whose routing chooses by them, as
// hash routing does): the one test of whether token_ids mean anything to a layer.
struct FFNConfig;
bool reads_token_ids(const FFNConfig& config);

// The MoE keys a routing does not read (RoutingFamily::unused), as a list; whether it reads one.
std::vector<std::string> unused_keys(RoutingKind kind);
bool routing_reads(RoutingKind kind, std::string_view key);

}  // namespace ffnlab
