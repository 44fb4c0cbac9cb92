// FFNConfig: name tables, validation, variant presets, JSON.
#include "ffnlab/layers/ffn_config.hpp"

#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "check.hpp"

namespace ffnlab {

namespace {

constexpr std::array<const char*, 4> kKindNames{"plain", "glu", "multi_branch", "moe"};
static_assert(kKindNames.size() == static_cast<std::size_t>(FFNKind::count));
constexpr std::array<const char*, 2> kLayoutNames{"separate", "fused"};
static_assert(kLayoutNames.size() == static_cast<std::size_t>(GLULayout::count));

struct Variant {
  const char* name;
  FFNKind kind;
  Activation act;
};
constexpr std::array kVariants{
    Variant{"relu", FFNKind::plain, Activation::relu},
    Variant{"gelu", FFNKind::plain, Activation::gelu},
    Variant{"glu", FFNKind::glu, Activation::sigmoid},
    Variant{"bilinear", FFNKind::glu, Activation::identity},
    Variant{"reglu", FFNKind::glu, Activation::relu},
    Variant{"geglu", FFNKind::glu, Activation::gelu},
    Variant{"swiglu", FFNKind::glu, Activation::silu},
    Variant{"gated", FFNKind::multi_branch, Activation::sigmoid},
    Variant{"moe", FFNKind::moe, Activation::relu},
};

template <std::size_t N>
int parse_name(const std::array<const char*, N>& names, std::string_view name, const char* what) {
  for (std::size_t i = 0; i < N; ++i)
    if (name == names[i]) return static_cast<int>(i);
  std::string known;
  for (auto n : names) known += (known.empty() ? "" : ", ") + std::string(n);
  fail("[ffn] unknown {} '{}' (known: {})", what, name, known);
}

}  // namespace

const char* kind_name(FFNKind kind) {
  return kKindNames.at(static_cast<std::size_t>(kind));
}
FFNKind parse_kind(std::string_view name) {
  return static_cast<FFNKind>(parse_name(kKindNames, name, "kind"));
}
const char* layout_name(GLULayout layout) {
  return kLayoutNames.at(static_cast<std::size_t>(layout));
}
GLULayout parse_layout(std::string_view name) {
  return static_cast<GLULayout>(parse_name(kLayoutNames, name, "layout"));
}

void validate(const FFNConfig& c) {
  check(c.d_model > 0, "[ffn] d_model = {} must be positive", c.d_model);
  check(c.d_ff > 0, "[ffn] d_ff = {} must be positive", c.d_ff);
  check(c.act.kind < Activation::count, "[ffn] invalid activation");
  check(std::isfinite(c.act.beta) && c.act.beta > 0, "[ffn] swish beta = {} must be positive",
        c.act.beta);
  if (c.kind == FFNKind::multi_branch) {
    check(c.branches >= 1, "[ffn] branches = {} must be >= 1", c.branches);
    check(c.layout == GLULayout::separate,
          "[ffn] layout 'fused' applies to plain and glu FFNs, not multi_branch");
  }
  if (c.kind == FFNKind::moe) {
    const auto& m = c.moe;
    check(m.num_experts >= 1, "[moe] num_experts = {} must be >= 1", m.num_experts);
    check(m.top_k >= 1, "[moe] top_k = {} must be >= 1", m.top_k);
    check(m.top_k <= m.num_experts, "[moe] top_k = {} exceeds num_experts = {}", m.top_k,
          m.num_experts);
    check(m.expert_kind == FFNKind::plain || m.expert_kind == FFNKind::glu,
          "[moe] expert kind '{}' must be plain or glu", kind_name(m.expert_kind));
    check(m.expert_d_ff >= 0 && m.shared_d_ff >= 0, "[moe] expert d_ff must not be negative");
    check(m.num_shared >= 0, "[moe] num_shared = {} must not be negative", m.num_shared);
  }
}

FFNConfig variant_config(std::string_view variant, std::int64_t d_model, std::int64_t d_ff,
                         bool bias) {
  for (const auto& v : kVariants)
    if (variant == v.name) {
      FFNConfig c;
      c.kind = v.kind;
      c.act = Act{v.act};
      c.d_model = d_model;
      c.d_ff = d_ff;
      c.bias = bias;
      return c;
    }
  std::string known;
  for (const auto& v : kVariants) known += (known.empty() ? "" : ", ") + std::string(v.name);
  fail("[ffn] unknown variant '{}' (known: {})", variant, known);
}

std::vector<std::string> variant_names() {
  std::vector<std::string> out;
  for (const auto& v : kVariants) out.emplace_back(v.name);
  return out;
}

std::string variant_name(const FFNConfig& c) {
  if (c.act.beta == 1.0f)
    for (const auto& v : kVariants)
      if (v.kind == c.kind && v.act == c.act.kind) return v.name;
  return std::string(kind_name(c.kind)) + "/" + activation_name(c.act.kind);
}

FFNConfig expert_config(const FFNConfig& c, bool shared) {
  FFNConfig e = c;
  e.kind = c.moe.expert_kind;
  e.d_ff = shared ? c.shared_d_ff() : c.expert_d_ff();
  e.moe = MoEConfig{};
  return e;
}

FFNConfig config_from_json(const nlohmann::json& j) {
  check(j.is_object(), "[config] an FFN config must be a JSON object");
  static const std::set<std::string> kKeys{"variant",  "kind", "activation", "swish_beta",
                                           "d_model",  "d_ff", "bias",       "layout",
                                           "branches", "moe",  "ffnlab"};
  static const std::set<std::string> kMoEKeys{"num_experts", "top_k",       "expert_kind",
                                              "expert_d_ff", "router_bias", "num_shared",
                                              "shared_d_ff", "shared_gate"};
  for (const auto& [key, value] : j.items())
    check(kKeys.count(key), "[config] unknown key '{}'", key);
  try {
    FFNConfig c;
    if (j.contains("variant"))
      c = variant_config(j.at("variant").get<std::string>(), c.d_model, c.d_ff, c.bias);
    if (j.contains("kind")) c.kind = parse_kind(j.at("kind").get<std::string>());
    if (j.contains("activation"))
      c.act.kind = parse_activation(j.at("activation").get<std::string>());
    if (j.contains("swish_beta")) c.act.beta = j.at("swish_beta").get<float>();
    if (j.contains("d_model")) c.d_model = j.at("d_model").get<std::int64_t>();
    if (j.contains("d_ff")) c.d_ff = j.at("d_ff").get<std::int64_t>();
    if (j.contains("bias")) c.bias = j.at("bias").get<bool>();
    if (j.contains("layout")) c.layout = parse_layout(j.at("layout").get<std::string>());
    if (j.contains("branches")) c.branches = j.at("branches").get<int>();
    if (j.contains("moe")) {
      const auto& m = j.at("moe");
      check(m.is_object(), "[config] 'moe' must be an object");
      for (const auto& [key, value] : m.items())
        check(kMoEKeys.count(key), "[config] unknown key 'moe.{}'", key);
      if (m.contains("num_experts")) c.moe.num_experts = m.at("num_experts").get<int>();
      if (m.contains("top_k")) c.moe.top_k = m.at("top_k").get<int>();
      if (m.contains("expert_kind"))
        c.moe.expert_kind = parse_kind(m.at("expert_kind").get<std::string>());
      if (m.contains("expert_d_ff")) c.moe.expert_d_ff = m.at("expert_d_ff").get<std::int64_t>();
      if (m.contains("router_bias")) c.moe.router_bias = m.at("router_bias").get<bool>();
      if (m.contains("num_shared")) c.moe.num_shared = m.at("num_shared").get<int>();
      if (m.contains("shared_d_ff")) c.moe.shared_d_ff = m.at("shared_d_ff").get<std::int64_t>();
      if (m.contains("shared_gate")) c.moe.shared_gate = m.at("shared_gate").get<bool>();
    }
    validate(c);
    return c;
  } catch (const nlohmann::json::exception& e) {
    fail("[config] {}", e.what());
  }
}

nlohmann::json config_to_json(const FFNConfig& c) {
  nlohmann::json j{{"kind", kind_name(c.kind)},
                   {"activation", activation_name(c.act.kind)},
                   {"d_model", c.d_model},
                   {"d_ff", c.d_ff},
                   {"bias", c.bias},
                   {"layout", layout_name(c.layout)}};
  if (c.act.beta != 1.0f) j["swish_beta"] = c.act.beta;
  if (c.kind == FFNKind::multi_branch) j["branches"] = c.branches;
  if (c.kind == FFNKind::moe)
    j["moe"] = {{"num_experts", c.moe.num_experts},
                {"top_k", c.moe.top_k},
                {"expert_kind", kind_name(c.moe.expert_kind)},
                {"expert_d_ff", c.expert_d_ff()},
                {"router_bias", c.moe.router_bias},
                {"num_shared", c.moe.num_shared},
                {"shared_d_ff", c.shared_d_ff()},
                {"shared_gate", c.moe.shared_gate}};
  return j;
}

}  // namespace ffnlab
