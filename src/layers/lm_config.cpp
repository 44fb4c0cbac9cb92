// LMConfig validation, names and JSON.
#include "ffnlab/layers/lm_config.hpp"

#include <array>
#include <nlohmann/json.hpp>

#include "check.hpp"

namespace ffnlab {

namespace {
constexpr std::array<const char*, static_cast<int>(PositionKind::count)> kPositionNames = {
    "learned", "sinusoidal", "rope", "none"};
}

const char* position_name(PositionKind kind) {
  return kPositionNames.at(static_cast<std::size_t>(kind));
}

PositionKind parse_position(std::string_view name) {
  for (std::size_t i = 0; i < kPositionNames.size(); ++i)
    if (name == kPositionNames[i]) return static_cast<PositionKind>(i);
  fail("[lm] unknown positions '{}' (known: learned, sinusoidal, rope, none)", name);
}

void validate(const LMConfig& c) {
  check(c.vocab > 0, "[lm] vocab = {} must be positive", c.vocab);
  check(c.d_model > 0 && c.layers > 0 && c.heads > 0 && c.context > 0,
        "[lm] d_model, layers, heads and context must be positive");
  check(c.d_model % c.heads == 0, "[lm] d_model = {} is not a multiple of heads = {}", c.d_model,
        c.heads);
  check(c.positions != PositionKind::rope || (c.d_model / c.heads) % 2 == 0,
        "[lm] rope needs an even head size, got {}", c.d_model / c.heads);
  check(c.dropout >= 0.f && c.dropout < 1.f, "[lm] dropout = {} must be in [0, 1)", c.dropout);
  check(c.norm_eps > 0.f, "[lm] norm_eps = {} must be positive", c.norm_eps);
  check(c.init_std >= 0.f, "[lm] init_std = {} must be >= 0", c.init_std);
  check(c.ffn.d_model == c.d_model, "[lm] ffn d_model = {} differs from d_model = {}",
        c.ffn.d_model, c.d_model);
  validate(c.ffn);
}

LMConfig lm_config_from_json(const nlohmann::json& j) {
  check(j.is_object(), "[lm] config must be a JSON object");
  LMConfig c;
  for (const auto& [key, v] : j.items()) {
    if (key == "vocab") c.vocab = v.get<std::int64_t>();
    else if (key == "d_model") c.d_model = v.get<std::int64_t>();
    else if (key == "layers") c.layers = v.get<int>();
    else if (key == "heads") c.heads = v.get<std::int64_t>();
    else if (key == "context") c.context = v.get<std::int64_t>();
    else if (key == "positions") c.positions = parse_position(v.get<std::string>());
    else if (key == "rope_theta") c.rope_theta = v.get<float>();
    else if (key == "norm") c.norm = parse_norm(v.get<std::string>());
    else if (key == "norm_eps") c.norm_eps = v.get<float>();
    else if (key == "pre_norm") c.pre_norm = v.get<bool>();
    else if (key == "final_norm") c.final_norm = v.get<bool>();
    else if (key == "tied_head") c.tied_head = v.get<bool>();
    else if (key == "attn_bias") c.attn_bias = v.get<bool>();
    else if (key == "causal") c.causal = v.get<bool>();
    else if (key == "dropout") c.dropout = v.get<float>();
    else if (key == "init_std") c.init_std = v.get<float>();
    else if (key == "ffn") c.ffn = config_from_json(v);
    else fail("[lm] unknown config key '{}'", key);
  }
  validate(c);
  return c;
}

nlohmann::json lm_config_to_json(const LMConfig& c) {
  return {{"vocab", c.vocab},
          {"d_model", c.d_model},
          {"layers", c.layers},
          {"heads", c.heads},
          {"context", c.context},
          {"positions", position_name(c.positions)},
          {"rope_theta", c.rope_theta},
          {"norm", norm_name(c.norm)},
          {"norm_eps", c.norm_eps},
          {"pre_norm", c.pre_norm},
          {"final_norm", c.final_norm},
          {"tied_head", c.tied_head},
          {"attn_bias", c.attn_bias},
          {"causal", c.causal},
          {"dropout", c.dropout},
          {"init_std", c.init_std},
          {"ffn", config_to_json(c.ffn)}};
}

}  // namespace ffnlab
