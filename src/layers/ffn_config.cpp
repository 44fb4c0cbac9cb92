// FFNConfig: name tables, validation, variant presets, JSON.
#include "ffnlab/layers/ffn_config.hpp"

#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "check.hpp"

namespace ffnlab {

namespace {

constexpr std::array<const char*, 4> kKindNames{"plain", "glu", "multi_branch", "moe"};
static_assert(kKindNames.size() == static_cast<std::size_t>(FFNKind::count));
constexpr std::array<const char*, 2> kLayoutNames{"separate", "fused"};
static_assert(kLayoutNames.size() == static_cast<std::size_t>(GLULayout::count));
constexpr std::array<const char*, 2> kScoreNames{"softmax", "sigmoid"};
static_assert(kScoreNames.size() == static_cast<std::size_t>(ScoreFunc::count));
constexpr std::array<const char*, 2> kDropNames{"position", "probability"};
static_assert(kDropNames.size() == static_cast<std::size_t>(DropPolicy::count));
constexpr std::array<const char*, 3> kBalanceNames{"topk", "topk_normalized", "top1"};
static_assert(kBalanceNames.size() == static_cast<std::size_t>(BalanceLoss::count));
constexpr std::array<const char*, 3> kNamingNames{"standard", "mixtral", "qwen2_moe"};
static_assert(kNamingNames.size() == static_cast<std::size_t>(MoENaming::count));

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

const char* score_name(ScoreFunc f) {
  return kScoreNames.at(static_cast<std::size_t>(f));
}
ScoreFunc parse_score(std::string_view name) {
  return static_cast<ScoreFunc>(parse_name(kScoreNames, name, "scoring function"));
}
const char* drop_policy_name(DropPolicy p) {
  return kDropNames.at(static_cast<std::size_t>(p));
}
DropPolicy parse_drop_policy(std::string_view name) {
  return static_cast<DropPolicy>(parse_name(kDropNames, name, "drop policy"));
}
const char* balance_loss_name(BalanceLoss l) {
  return kBalanceNames.at(static_cast<std::size_t>(l));
}
BalanceLoss parse_balance_loss(std::string_view name) {
  return static_cast<BalanceLoss>(parse_name(kBalanceNames, name, "balance loss"));
}
const char* naming_name(MoENaming n) {
  return kNamingNames.at(static_cast<std::size_t>(n));
}
MoENaming parse_naming(std::string_view name) {
  return static_cast<MoENaming>(parse_name(kNamingNames, name, "MoE naming"));
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
    check(m.score < ScoreFunc::count && m.drop < DropPolicy::count &&
              m.balance_loss < BalanceLoss::count && m.naming < MoENaming::count,
          "[moe] invalid enum value");
    check(std::isfinite(m.scaling) && m.scaling > 0, "[moe] routed scaling = {} must be positive",
          m.scaling);
    check(m.groups >= 0 && m.topk_groups >= 0, "[moe] groups and topk_groups must not be negative");
    if (m.groups > 0) {
      check(m.num_experts % m.groups == 0,
            "[moe] num_experts = {} is not divisible by n_group = {}", m.num_experts, m.groups);
      check(m.topk_groups >= 1 && m.topk_groups <= m.groups,
            "[moe] topk_group = {} must be between 1 and n_group = {}", m.topk_groups, m.groups);
      check(m.top_k <= m.topk_groups * (m.num_experts / m.groups),
            "[moe] top_k = {} exceeds the {} experts of the {} kept groups", m.top_k,
            m.topk_groups * (m.num_experts / m.groups), m.topk_groups);
    } else {
      check(m.topk_groups == 0, "[moe] topk_group = {} needs n_group > 0", m.topk_groups);
    }
    check(std::isfinite(m.jitter) && m.jitter >= 0 && m.jitter < 1,
          "[moe] jitter = {} must be in [0, 1)", m.jitter);
    check(std::isfinite(m.balance_rate) && m.balance_rate >= 0,
          "[moe] balance rate = {} must not be negative", m.balance_rate);
    check(std::isfinite(m.capacity_factor) && m.capacity_factor >= 0,
          "[moe] capacity factor = {} must not be negative (0 is dropless)", m.capacity_factor);
    check(std::isfinite(m.aux_coef) && m.aux_coef >= 0 && std::isfinite(m.z_coef) && m.z_coef >= 0,
          "[moe] loss coefficients must not be negative");
    check(!(m.softmax_after_topk && m.score != ScoreFunc::softmax),
          "[moe] softmax_after_topk needs the softmax scoring function");
    check(!(m.naming == MoENaming::qwen2_moe && m.num_shared > 1),
          "[moe] qwen2_moe naming has one shared expert, not {}", m.num_shared);
    check(c.layout == GLULayout::separate,
          "[moe] layout 'fused' applies to dense FFNs; experts are stored per expert");
    check(!(m.naming == MoENaming::mixtral && m.expert_kind != FFNKind::glu),
          "[moe] mixtral naming (w1/w3/w2) needs glu experts");
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
  e.d_ff = shared ? c.moe.num_shared * c.shared_d_ff() : c.expert_d_ff();
  e.moe = MoEConfig{};
  return e;
}

FFNConfig config_from_json(const nlohmann::json& j) {
  check(j.is_object(), "[config] an FFN config must be a JSON object");
  static const std::set<std::string> kKeys{"variant",  "kind", "activation", "swish_beta",
                                           "d_model",  "d_ff", "bias",       "layout",
                                           "branches", "moe",  "ffnlab"};
  static const std::set<std::string> kMoEKeys{
      "num_experts", "top_k",        "expert_kind",     "expert_d_ff",  "router_bias",
      "num_shared",  "shared_d_ff",  "shared_gate",     "score",        "softmax_after_topk",
      "normalize",   "scaling",      "groups",          "topk_groups",  "jitter",
      "noisy_topk",  "balance_bias", "balance_rate",    "capacity_factor", "drop",
      "balance_loss", "aux_coef",    "z_coef",          "naming"};
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
      auto get = [&m](const char* key, auto& field) {
        if (m.contains(key)) field = m.at(key).get<std::decay_t<decltype(field)>>();
      };
      auto get_name = [&m](const char* key, auto& field, auto parse) {
        if (m.contains(key)) field = parse(m.at(key).get<std::string>());
      };
      MoEConfig& o = c.moe;
      get("num_experts", o.num_experts);
      get("top_k", o.top_k);
      get_name("expert_kind", o.expert_kind, parse_kind);
      get("expert_d_ff", o.expert_d_ff);
      get("router_bias", o.router_bias);
      get("num_shared", o.num_shared);
      get("shared_d_ff", o.shared_d_ff);
      get("shared_gate", o.shared_gate);
      get_name("score", o.score, parse_score);
      get("softmax_after_topk", o.softmax_after_topk);
      get("normalize", o.normalize);
      get("scaling", o.scaling);
      get("groups", o.groups);
      get("topk_groups", o.topk_groups);
      get("jitter", o.jitter);
      get("noisy_topk", o.noisy_topk);
      get("balance_bias", o.balance_bias);
      get("balance_rate", o.balance_rate);
      get("capacity_factor", o.capacity_factor);
      get_name("drop", o.drop, parse_drop_policy);
      get_name("balance_loss", o.balance_loss, parse_balance_loss);
      get("aux_coef", o.aux_coef);
      get("z_coef", o.z_coef);
      get_name("naming", o.naming, parse_naming);
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
  if (c.kind == FFNKind::moe) {
    const MoEConfig& m = c.moe;
    j["moe"] = {{"num_experts", m.num_experts},
                {"top_k", m.top_k},
                {"expert_kind", kind_name(m.expert_kind)},
                {"expert_d_ff", c.expert_d_ff()},
                {"router_bias", m.router_bias},
                {"num_shared", m.num_shared},
                {"shared_d_ff", c.shared_d_ff()},
                {"shared_gate", m.shared_gate},
                {"score", score_name(m.score)},
                {"softmax_after_topk", m.softmax_after_topk},
                {"normalize", m.normalize},
                {"scaling", m.scaling},
                {"groups", m.groups},
                {"topk_groups", m.topk_groups},
                {"jitter", m.jitter},
                {"noisy_topk", m.noisy_topk},
                {"balance_bias", m.balance_bias},
                {"balance_rate", m.balance_rate},
                {"capacity_factor", m.capacity_factor},
                {"drop", drop_policy_name(m.drop)},
                {"balance_loss", balance_loss_name(m.balance_loss)},
                {"aux_coef", m.aux_coef},
                {"z_coef", m.z_coef},
                {"naming", naming_name(m.naming)}};
  }
  return j;
}

}  // namespace ffnlab
