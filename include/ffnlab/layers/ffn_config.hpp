// FFNConfig: one description of every FFN variant, parsed from and printed to JSON through one
// name table per enum. See docs/config.md for the JSON format.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "ffnlab/names.hpp"
#include "ffnlab/ops/activation.hpp"
#include "ffnlab/ops/router.hpp"

namespace ffnlab {

// Adding a kind starts with this enum and its name row; CONTRIBUTING.md, "How to add a dense
// FFN kind", lists every place it touches, and which of them nothing checks.
enum class FFNKind : std::uint8_t {
  plain,         // W_down · act(W_up·x + b) + b
  glu,           // W_down · (act(W_gate·x) ⊙ W_up·x)
  multi_branch,  // W_out · Σ_b act(G_b·x) ⊙ (V_b·x)  (the tutorial's "Gated-FFN")
  moe,           // router + routed experts (+ shared experts)
  count
};

// How the input projection(s) are stored and named; the math is the same.
enum class GLULayout : std::uint8_t {
  separate,  // gate_proj / up_proj / down_proj (LLaMA, Mistral; plain: up_proj / down_proj)
  fused,     // dense_h_to_4h [2F, D] = [gate; up] and dense_4h_to_h (ChatGLM, GPT-NeoX naming)
  count
};

// Parameter names of the routed and shared experts in checkpoints (docs/config.md).
enum class MoENaming : std::uint8_t {
  standard,   // experts.{e}.gate_proj/up_proj/down_proj, shared_experts.* (DeepSeek-V3)
  mixtral,    // experts.{e}.w1/w3/w2
  qwen2_moe,  // shared_expert.* (one shared expert)
  count
};

template <>
struct EnumNames<FFNKind> {
  static constexpr auto table = name_table<FFNKind>("ffn", "kind",
                                                    {{FFNKind::plain, "plain"},
                                                     {FFNKind::glu, "glu"},
                                                     {FFNKind::multi_branch, "multi_branch"},
                                                     {FFNKind::moe, "moe"}});
};
template <>
struct EnumNames<GLULayout> {
  static constexpr auto table = name_table<GLULayout>(
      "ffn", "layout", {{GLULayout::separate, "separate"}, {GLULayout::fused, "fused"}});
};
template <>
struct EnumNames<MoENaming> {
  static constexpr auto table = name_table<MoENaming>("ffn", "MoE naming",
                                                      {{MoENaming::standard, "standard"},
                                                       {MoENaming::mixtral, "mixtral"},
                                                       {MoENaming::qwen2_moe, "qwen2_moe"}});
};
static_assert(EnumNames<FFNKind>::table.complete() && EnumNames<GLULayout>::table.complete() &&
              EnumNames<MoENaming>::table.complete());

// The routing options (ops/router.hpp's RouterConfig: experts, top-k, scores, groups, capacity,
// losses) and what the layer adds: the experts, the router's own parameters, training noise.
struct MoEConfig : RouterConfig {
  FFNKind expert_kind = FFNKind::plain;  // plain or glu
  std::int64_t expert_d_ff = 0;          // 0: FFNConfig::d_ff (fine-grained experts set it lower)
  bool router_bias = true;               // the tutorial counts it: 512·8 + 8 = 4,104
  int num_shared = 0;                    // shared experts every token passes through
  std::int64_t shared_d_ff = 0;          // 0: the routed experts' d_ff
  bool shared_gate = false;              // σ(x·w_g) scale on the shared output (Qwen2-MoE)

  float jitter = 0.0f;         // training: router input × U(1-ε, 1+ε) (Switch)
  bool noisy_topk = false;     // training: logits + N(0,1)·softplus(x·W_noise) (Shazeer)
  bool balance_bias = false;   // aux-loss-free bias, added to scores for selection only
  float balance_rate = 1e-3f;  // its update b_e += rate·sign(mean load - load_e)

  // relu routing (ReMoE): the L1 penalty's coefficient λ (state gate.l1_coef) starts at
  // l1_coef_init and, after each optimizer step, is multiplied by l1_coef_rate while the
  // fraction of zero gates since the last step is below target_sparsity, divided otherwise,
  // and never falls below the smallest normal float.
  // In a Transformer one λ follows the sparsity of all its ReLU-routed layers.
  float target_sparsity = 0.0f;  // 0: 1 - top_k/num_experts
  float l1_coef_init = 1e-8f;    // ReMoE's released code
  float l1_coef_rate = 1.2f;
  float sparsity_target() const {
    return target_sparsity > 0 ? target_sparsity
                               : 1.0f - static_cast<float>(top_k) / static_cast<float>(num_experts);
  }

  // MoE++'s gating residuals (Jin et al. 2024): logits += G·W_gᵀ, where G [T, E] are the router
  // logits of the previous MoE layer (with its own residual) and W_g = gate.gate_map.weight
  // [E, E] (E: the router's columns). A Transformer hands each MoE layer the previous one's
  // logits and their gradient back; the first layer has none. A lone layer takes them with
  // its FeedForward::context().previous_logits.
  bool gating_residual = false;

  MoENaming naming = MoENaming::standard;
};

struct FFNConfig {
  FFNKind kind = FFNKind::plain;
  Act act{Activation::relu};
  std::int64_t d_model = 512;
  std::int64_t d_ff = 2048;
  bool bias = true;  // on every Linear
  GLULayout layout = GLULayout::separate;
  int branches = 4;  // multi_branch only
  MoEConfig moe;     // moe only

  std::int64_t expert_d_ff() const { return moe.expert_d_ff ? moe.expert_d_ff : d_ff; }
  std::int64_t shared_d_ff() const { return moe.shared_d_ff ? moe.shared_d_ff : expert_d_ff(); }
  // Gated branches of a dense kind: 0 for plain (h = act(a)), 1 for glu, `branches` for
  // multi_branch; the input projection is then F (plain) or 2·n·F rows wide.
  int gated_branches() const;
  std::int64_t in_width() const;
};

// Throws "[ffn] ..." naming the first thing that makes no sense.
void validate(const FFNConfig& config);

// The named variants of the study: relu, gelu, glu, bilinear, reglu, geglu, swiglu, gated, moe.
FFNConfig variant_config(std::string_view variant, std::int64_t d_model, std::int64_t d_ff,
                         bool bias);
std::vector<std::string> variant_names();
// The variant name of a config ("swiglu"), or kind/activation ("plain/tanh") when it has none.
std::string variant_name(const FFNConfig& config);

// The routing families on one MoE layout, as the study trains them and `ffnlab bench` times
// them: `moe` (its experts, widths, top_k = K and losses) with the family's routing. topk: `moe`
// itself; top_p: p = 0.4, at most 2·K experts, dynamic loss 1e-4 (Huang et al.'s released code);
// relu: held at K experts a token on average; moe_pp: 2 constant, 1 copy and 1 zero expert with
// the gating residuals (MoE++'s 16 + 4); expert_choice: capacity factor 1, K experts a token on
// average; soft: round(K·S/E) slots an expert for sequences of S = `sequence`, K experts'
// compute a token. Families that take no balancing loss or z-loss drop them.
// Throws "[ffn] unknown routing family ..." naming the known ones.
FFNConfig routing_family_config(const FFNConfig& moe, std::string_view family,
                                std::int64_t sequence);
std::vector<std::string> routing_family_names();  // topk first
// A family's name in prose and figures: its RoutingFamily::title ("MoE++" for moe_pp).
std::string routing_family_title(std::string_view family);

// ffnlab's own layer config (docs/config.md). Unknown keys are an error.
FFNConfig config_from_json(const nlohmann::json& j);
nlohmann::json config_to_json(const FFNConfig& config);
// The keys of its "moe" object, in table order (config_to_json writes some only when set).
std::vector<std::string> moe_key_names();

// The dense FFN that one routed expert of an MoE config is; with shared = true, the dense FFN
// all shared experts together are (n shared experts of width F are one FFN of width n·F).
FFNConfig expert_config(const FFNConfig& config, bool shared = false);

}  // namespace ffnlab
