// FFNConfig: one description of every FFN variant, parsed from and printed to JSON through one
// name table per enum. See docs/config.md for the JSON format.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "ffnlab/ops/activation.hpp"

namespace ffnlab {

// Adding a kind touches: this enum, kKindNames in src/layers/ffn_config.cpp, validate(),
// make_ffn() in src/layers/feed_forward.cpp, analysis/costs.cpp, and the parity script.
enum class FFNKind : std::uint8_t {
  plain,         // W_down · act(W_up·x + b) + b
  glu,           // W_down · (act(W_gate·x) ⊙ W_up·x)
  multi_branch,  // W_out · Σ_b act(G_b·x) ⊙ (V_b·x)  (the seeds' "Gated-FFN")
  moe,           // router + routed experts (+ shared experts)
  count
};

// How the input projection(s) are stored and named; the math is the same.
enum class GLULayout : std::uint8_t {
  separate,  // gate_proj / up_proj / down_proj (LLaMA, Mistral; plain: up_proj / down_proj)
  fused,     // dense_h_to_4h [2F, D] = [gate; up] and dense_4h_to_h (ChatGLM, GPT-NeoX naming)
  count
};

const char* kind_name(FFNKind kind);
FFNKind parse_kind(std::string_view name);
const char* layout_name(GLULayout layout);
GLULayout parse_layout(std::string_view name);

// How the router turns logits into scores (docs/moe.md).
enum class ScoreFunc : std::uint8_t { softmax, sigmoid, count };
// Which assignments an expert over capacity drops.
enum class DropPolicy : std::uint8_t {
  position,     // later ones: all first choices before second choices, then by token index
  probability,  // those of lowest combine weight
  count
};
// Which f_e the load-balancing loss E·Σ_e f_e·P_e uses (docs/moe.md).
enum class BalanceLoss : std::uint8_t {
  topk,             // f_e = (assignments to e) / T, all k choices: Mixtral / Qwen2-MoE in HF
  topk_normalized,  // f_e = (assignments to e) / (k·T): GShard, DeepSeek (1 when balanced)
  top1,             // f_e = (tokens whose first choice is e) / T: Switch Transformer
  count
};
// Parameter names of the routed and shared experts in checkpoints (docs/config.md).
enum class MoENaming : std::uint8_t {
  standard,   // experts.{e}.gate_proj/up_proj/down_proj, shared_experts.* (DeepSeek-V3)
  mixtral,    // experts.{e}.w1/w3/w2
  qwen2_moe,  // shared_expert.* (one shared expert)
  count
};

const char* score_name(ScoreFunc f);
ScoreFunc parse_score(std::string_view name);
const char* drop_policy_name(DropPolicy p);
DropPolicy parse_drop_policy(std::string_view name);
const char* balance_loss_name(BalanceLoss l);
BalanceLoss parse_balance_loss(std::string_view name);
const char* naming_name(MoENaming n);
MoENaming parse_naming(std::string_view name);

struct MoEConfig {
  int num_experts = 8;
  int top_k = 2;
  FFNKind expert_kind = FFNKind::plain;  // plain or glu
  std::int64_t expert_d_ff = 0;          // 0: FFNConfig::d_ff (fine-grained experts set it lower)
  bool router_bias = true;               // the seeds count it: 512·8 + 8 = 4,104
  int num_shared = 0;                    // shared experts every token passes through
  std::int64_t shared_d_ff = 0;          // 0: the routed experts' d_ff
  bool shared_gate = false;              // σ(x·w_g) scale on the shared output (Qwen2-MoE)

  // Routing.
  ScoreFunc score = ScoreFunc::softmax;
  bool softmax_after_topk = false;  // weights = softmax over the k chosen logits (GPT-OSS)
  bool normalize = true;            // top-k weights divided by their sum (norm_topk_prob)
  float scaling = 1.0f;             // routed_scaling_factor, applied after normalisation
  int groups = 0;                   // n_group (0: no group-limited selection)
  int topk_groups = 0;              // topk_group: groups kept per token
  float jitter = 0.0f;              // training: router input × U(1-ε, 1+ε) (Switch)
  bool noisy_topk = false;          // training: logits + N(0,1)·softplus(x·W_noise) (Shazeer)
  bool balance_bias = false;        // aux-loss-free bias, added to scores for selection only
  float balance_rate = 1e-3f;       // its update b_e += rate·sign(mean load - load_e)

  // Capacity.
  double capacity_factor = 0.0;  // 0: dropless; else capacity = ceil(c·k·T/E)
  DropPolicy drop = DropPolicy::position;

  // Auxiliary losses, added to the training loss with these coefficients.
  BalanceLoss balance_loss = BalanceLoss::topk;
  float aux_coef = 0.0f;  // load-balancing loss
  float z_coef = 0.0f;    // router z-loss

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
};

// Throws "[ffn] ..." naming the first thing that makes no sense.
void validate(const FFNConfig& config);

// The named variants of the study: relu, gelu, glu, bilinear, reglu, geglu, swiglu, gated, moe.
FFNConfig variant_config(std::string_view variant, std::int64_t d_model, std::int64_t d_ff,
                         bool bias);
std::vector<std::string> variant_names();
// The variant name of a config ("swiglu"), or kind/activation ("plain/tanh") when it has none.
std::string variant_name(const FFNConfig& config);

// ffnlab's own layer config (docs/config.md). Unknown keys are an error.
FFNConfig config_from_json(const nlohmann::json& j);
nlohmann::json config_to_json(const FFNConfig& config);

// The dense FFN that one routed expert of an MoE config is; with shared = true, the dense FFN
// all shared experts together are (n shared experts of width F are one FFN of width n·F).
FFNConfig expert_config(const FFNConfig& config, bool shared = false);

}  // namespace ffnlab
