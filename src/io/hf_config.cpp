// Hugging Face config.json fields -> FFNConfig.
#include "ffnlab/io/hf_config.hpp"

#include <nlohmann/json.hpp>

#include "check.hpp"
#include "json_keys.hpp"

namespace ffnlab {

namespace {

template <typename T>
T require(const nlohmann::json& j, const char* key, const std::string& model) {
  check(j.contains(key), "[config] {} config.json lacks '{}'", model, key);
  try {
    return json_value<T>(j.at(key));
  } catch (const BadValue& e) {
    fail("[config] {} config.json: '{}' {}", model, key, e.problem);
  }
}

// An optional key: its default when absent or null (Hugging Face's "unset"), a named error when of
// the wrong type.
template <typename T>
T optional(const nlohmann::json& j, const char* key, T fallback, const std::string& model) {
  return j.contains(key) && !j.at(key).is_null() ? require<T>(j, key, model) : fallback;
}

// The sparse MoE block of Mixtral, Qwen2-MoE and DeepSeek-V3 (docs/moe.md has the mapping).
void hf_moe_config(FFNConfig& c, const nlohmann::json& j, const std::string& model) {
  MoEConfig& m = c.moe;
  c.kind = FFNKind::moe;
  c.bias = false;
  c.d_model = require<std::int64_t>(j, "hidden_size", model);
  c.act.kind = parse_enum<Activation>(optional<std::string>(j, "hidden_act", "silu", model));
  m.expert_kind = FFNKind::glu;
  m.router_bias = false;
  m.top_k = require<int>(j, "num_experts_per_tok", model);
  m.aux_coef = optional(j, "router_aux_loss_coef", 0.0f, model);
  if (model == "mixtral") {
    c.d_ff = require<std::int64_t>(j, "intermediate_size", model);
    m.num_experts = require<int>(j, "num_local_experts", model);
    m.normalize = true;
    m.jitter = optional(j, "router_jitter_noise", 0.0f, model);
    m.naming = MoENaming::mixtral;
  } else if (model == "qwen2_moe") {
    c.d_ff = require<std::int64_t>(j, "moe_intermediate_size", model);
    m.num_experts = require<int>(j, "num_experts", model);
    m.normalize = optional(j, "norm_topk_prob", false, model);
    const auto shared = optional<std::int64_t>(j, "shared_expert_intermediate_size", 0, model);
    m.num_shared = shared > 0 ? 1 : 0;
    m.shared_d_ff = shared;
    m.shared_gate = shared > 0;
    m.naming = MoENaming::qwen2_moe;
  } else {  // deepseek_v3
    c.d_ff = require<std::int64_t>(j, "moe_intermediate_size", model);
    m.num_experts = require<int>(j, "n_routed_experts", model);
    m.num_shared = optional(j, "n_shared_experts", 0, model);
    m.normalize = optional(j, "norm_topk_prob", true, model);
    m.scaling = optional(j, "routed_scaling_factor", 1.0f, model);
    m.groups = optional(j, "n_group", 0, model);
    m.topk_groups = optional(j, "topk_group", 0, model);
    if (m.groups == 1 && m.topk_groups == 1) m.groups = m.topk_groups = 0;  // no grouping
    m.score = parse_enum<ScoreFunc>(optional<std::string>(j, "scoring_func", "sigmoid", model));
    const auto method = optional<std::string>(j, "topk_method", "noaux_tc", model);
    check(method == "noaux_tc" || method == "greedy",
          "[config] deepseek_v3 topk_method '{}' is not supported (noaux_tc, greedy)", method);
    m.balance_bias = method == "noaux_tc";  // gate.e_score_correction_bias
    if (method == "greedy") m.groups = m.topk_groups = 0;
    m.naming = MoENaming::standard;
  }
}

}  // namespace

bool is_hf_config(const nlohmann::json& j) {
  return j.is_object() && j.contains("model_type");
}

FFNConfig hf_ffn_config(const nlohmann::json& j) {
  const auto model = require<std::string>(j, "model_type", "Hugging Face");
  FFNConfig c;
  c.kind = FFNKind::glu;
  c.act = Act{Activation::silu};
  if (model == "llama" || model == "mistral" || model == "qwen2") {
    c.d_model = require<std::int64_t>(j, "hidden_size", model);
    c.d_ff = require<std::int64_t>(j, "intermediate_size", model);
    c.act.kind = parse_enum<Activation>(optional<std::string>(j, "hidden_act", "silu", model));
    c.bias = optional(j, "mlp_bias", false, model);
    c.layout = GLULayout::separate;
  } else if (model == "chatglm") {
    c.d_model = require<std::int64_t>(j, "hidden_size", model);
    c.d_ff = require<std::int64_t>(j, "ffn_hidden_size", model);
    c.bias = optional(j, "add_bias_linear", false, model);
    c.layout = GLULayout::fused;
  } else if (model == "mixtral" || model == "qwen2_moe" || model == "deepseek_v3") {
    hf_moe_config(c, j, model);
  } else {
    fail(
        "[config] model_type '{}' has no FFN mapping (supported: llama, mistral, qwen2, chatglm, "
        "mixtral, qwen2_moe, deepseek_v3)",
        model);
  }
  validate(c);
  return c;
}

}  // namespace ffnlab
