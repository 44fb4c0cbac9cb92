// Hugging Face config.json fields -> FFNConfig.
#include "ffnlab/io/hf_config.hpp"

#include <nlohmann/json.hpp>

#include "check.hpp"

namespace ffnlab {

namespace {

template <typename T>
T require(const nlohmann::json& j, const char* key, const std::string& model) {
  check(j.contains(key), "[config] {} config.json lacks '{}'", model, key);
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    fail("[config] {} config.json: '{}' has the wrong type", model, key);
  }
}

// An optional key: its default when absent, a named error when of the wrong type.
template <typename T>
T optional(const nlohmann::json& j, const char* key, T fallback, const std::string& model) {
  return j.contains(key) ? require<T>(j, key, model) : fallback;
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
    c.act.kind = parse_activation(optional<std::string>(j, "hidden_act", "silu", model));
    c.bias = optional(j, "mlp_bias", false, model);
    c.layout = GLULayout::separate;
  } else if (model == "chatglm") {
    c.d_model = require<std::int64_t>(j, "hidden_size", model);
    c.d_ff = require<std::int64_t>(j, "ffn_hidden_size", model);
    c.bias = optional(j, "add_bias_linear", false, model);
    c.layout = GLULayout::fused;
  } else {
    fail(
        "[config] model_type '{}' has no dense MLP mapping (supported: llama, mistral, qwen2, "
        "chatglm)",
        model);
  }
  validate(c);
  return c;
}

}  // namespace ffnlab
