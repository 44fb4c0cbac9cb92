// FFNConfig: name tables, validation, variant presets, JSON.
#include "ffnlab/layers/ffn_config.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>

#include "check.hpp"
#include "ffnlab/config_flags.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/limits.hpp"
#include "json_keys.hpp"

namespace ffnlab {

namespace {

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

// A key m's routing does not read holds its default (defined below, with the MoE keys).
void refuse_unused_keys(const MoEConfig& m);
// Every key of c (and of its MoE) in its row's range (defined below, with the key tables).
void check_ranges(const FFNConfig& c);

}  // namespace

int FFNConfig::gated_branches() const {
  switch (kind) {  // a new kind says here how its hidden mix is gated (-Wswitch)
    case FFNKind::plain:
      return 0;
    case FFNKind::glu:
      return 1;
    case FFNKind::multi_branch:
    case FFNKind::moe:  // not a dense mix: its experts' configs are dense kinds
      return branches;
    case FFNKind::count:
      break;
  }
  fail("[ffn] kind {} has no hidden mix", static_cast<int>(kind));
}

std::int64_t FFNConfig::in_width() const {
  const int n = gated_branches();
  return n == 0 ? d_ff : 2 * n * d_ff;
}

void validate(const FFNConfig& c) {
  check_ranges(c);
  check(c.act.kind < Activation::count, "[ffn] invalid activation");
  check(std::isfinite(c.act.beta) && c.act.beta > 0, "[ffn] swish beta = {} must be positive",
        c.act.beta);
  if (c.kind == FFNKind::multi_branch) {
    check(c.layout == GLULayout::separate,
          "[ffn] layout 'fused' applies to plain and glu FFNs, not multi_branch");
  }
  if (c.kind == FFNKind::moe) {
    const auto& m = c.moe;
    check(!*routing_family(m.routing).top_k || m.top_k <= m.num_experts,
          "[moe] top_k = {} exceeds num_experts = {}", m.top_k, m.num_experts);
    check(m.expert_kind == FFNKind::plain || m.expert_kind == FFNKind::glu,
          "[moe] expert kind '{}' must be plain or glu", enum_name(m.expert_kind));
    check_range(m.shared_d_ff, 0, limits::kWidth, "moe", "shared_d_ff");
    check(m.score < ScoreFunc::count && m.drop < DropPolicy::count &&
              m.balance_loss < BalanceLoss::count && m.naming < MoENaming::count,
          "[moe] invalid enum value");
    check(std::isfinite(m.scaling) && m.scaling > 0, "[moe] routed scaling = {} must be positive",
          m.scaling);
    check_range(m.groups, 0, limits::kExperts, "moe", "groups");
    check_range(m.topk_groups, 0, limits::kExperts, "moe", "topk_groups");
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
    // Keys that size or tune a part the layer does not have would be ignored: refused unless at
    // their default (shared_d_ff also as a printed config resolves it, the experts' width).
    check(m.balance_bias || m.balance_rate == MoEConfig{}.balance_rate,
          "[moe] balance_rate = {} is the balancing bias's step: it needs balance_bias (or leave "
          "it out)",
          m.balance_rate);
    check(m.zc_experts() > 0 || m.zc_balance_weight == MoEConfig{}.zc_balance_weight,
          "[moe] zc_balance_weight = {} weighs the zero-computation experts (MoE++): it needs "
          "zero, copy or constant experts (or leave it out)",
          m.zc_balance_weight);
    check(m.num_shared > 0 || m.shared_d_ff == 0 || m.shared_d_ff == c.expert_d_ff(),
          "[moe] shared_d_ff = {} sizes the shared experts: it needs num_shared > 0 (or leave it "
          "out)",
          m.shared_d_ff);
    check(!(m.softmax_after_topk && m.score != ScoreFunc::softmax),
          "[moe] softmax_after_topk needs the softmax scoring function");
    check(!(m.naming == MoENaming::qwen2_moe && m.num_shared > 1),
          "[moe] qwen2_moe naming has one shared expert, not {}", m.num_shared);
    check(!m.shared_gate || m.num_shared > 0,
          "[moe] shared_gate gates the shared experts' output: it needs num_shared > 0");
    check(c.layout == GLULayout::separate,
          "[moe] layout 'fused' applies to dense FFNs; experts are stored per expert");
    check(!(m.naming == MoENaming::mixtral && m.expert_kind != FFNKind::glu),
          "[moe] mixtral naming (w1/w3/w2) needs glu experts");
    if (m.zc_experts() > 0) {
      // MoE++: zero-computation experts are top-k choices beside the FFN experts.
      check(m.routing == MoEConfig{}.routing,
            "[moe] zero-computation experts (zero, copy, constant) are chosen by top-k routing, "
            "not '{}'",
            enum_name(m.routing));
      check(m.capacity_factor == 0,
            "[moe] zero-computation experts need the dropless layer (capacity_factor 0): a "
            "capacity counts FFN rows, which they do not take");
      check(m.groups == 0,
            "[moe] zero-computation experts do not combine with group-limited selection");
      check(!m.balance_bias,
            "[moe] zero-computation experts do not combine with the balancing bias (it would "
            "drive them to the FFN experts' load; MoE++ weights their balance loss by "
            "zc_balance_weight instead)");
      check(m.score == ScoreFunc::softmax && !m.softmax_after_topk,
            "[moe] zero-computation experts are weighted by softmax probabilities (MoE++): score "
            "'softmax' without softmax_after_topk");
    }
    if (m.gating_residual) {
      // MoE++: the previous layer's logits join this layer's before the choice.
      check(routing_family(m.routing).router_linear,
            "[moe] gating_residual adds the previous layer's router logits to this layer's: "
            "routing '{}' has no router logits",
            enum_name(m.routing));
      check(!m.noisy_topk && m.jitter == 0,
            "[moe] gating_residual does not combine with noisy top-k or jitter: the logits "
            "handed to the next layer would carry this layer's training noise");
    }
    const RoutingFamily& family = routing_family(m.routing);
    if (family.validate) family.validate(m);
    refuse_unused_keys(m);
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
  return std::string(enum_name(c.kind)) + "/" + enum_name(c.act.kind);
}

FFNConfig expert_config(const FFNConfig& c, bool shared) {
  FFNConfig e = c;
  e.kind = c.moe.expert_kind;
  e.d_ff = shared ? c.moe.num_shared * c.shared_d_ff() : c.expert_d_ff();
  e.moe = MoEConfig{};
  return e;
}

namespace {

using json = nlohmann::json;

// Every key of the "moe" object, in the order they are read and printed; the keys with a flag
// first, in the order of the help.
constexpr double kWidth = limits::kWidth, kExperts = limits::kExperts;
template <auto Member>
constexpr auto moe_key(const char* name, bool (*printed)(const MoEConfig&) = nullptr,
                       KeyFlag flag = {}) {
  return field<MoEConfig, Member>(name, printed, flag);
}
template <auto Member>
constexpr auto moe_key(const char* name, KeyFlag flag) {
  return field<MoEConfig, Member>(name, nullptr, flag);
}
// Whether m's routing reads `key` (RoutingFamily::unused): its keys are printed where it does.
bool reads(std::string_view key, const MoEConfig& m) {
  return routing_reads(m.routing, key);
}
bool relu_routed(const MoEConfig& m) {
  return reads("target_sparsity", m);
}
bool zc_routed(const MoEConfig& m) {
  return m.zc_experts() > 0;
}

constexpr std::array kMoEKeys{
    moe_key<&MoEConfig::num_experts>(
        "num_experts",
        {.name = "--experts", .help = "MoE: routed experts", .lo = 1, .hi = kExperts}),
    // (The routing families' readings of top_k and capacity_factor, and their rules, are
    // added to these keys' help from the registration table: ffn_config_flags.)
    moe_key<&MoEConfig::top_k>(
        "top_k", {.name = "--top-k", .help = "MoE: experts per token", .lo = 1, .hi = kExperts}),
    moe_key<&MoEConfig::routing>(
        "routing", [](const MoEConfig& m) { return m.routing != MoEConfig{}.routing; },
        {.name = "--routing", .help = "MoE: how a token gets its experts: {names}"}),
    moe_key<&MoEConfig::top_p>("top_p", [](const MoEConfig& m) { return reads("top_p", m); },
                               {.name = "--top-p",
                                .help = "MoE, top_p routing: the probability mass to reach",
                                .lo = 1e-6,
                                .hi = 1,
                                .routing = "top_p"}),
    moe_key<&MoEConfig::slots>(
        "slots", [](const MoEConfig& m) { return reads("slots", m); },
        {.name = "--slots",
         .help = "MoE, soft routing: slots per expert (each a mixture of a sequence's tokens; "
                 "E·slots/S experts' compute a token)",
         .lo = 1,
         .hi = kExperts,
         .routing = "soft"}),
    moe_key<&MoEConfig::target_sparsity>(
        "target_sparsity", relu_routed,
        {.name = "--target-sparsity",
         .help = "MoE, relu routing: the fraction of zero gates the L1 penalty holds (0: 1 - "
                 "top_k/experts)",
         .lo = 0,
         .hi = 0.999999,
         .routing = "relu"}),
    moe_key<&MoEConfig::l1_coef_init>(
        "l1_coef_init", relu_routed,
        {.name = "--l1-coef-init",
         .help = "MoE, relu routing: the L1 penalty's first coefficient (it then adapts by 1.2x "
                 "per step)",
         .lo = 1e-30,
         .hi = 1e6,
         .routing = "relu"}),
    moe_key<&MoEConfig::constant_experts>(
        "constant_experts", zc_routed,
        {.name = "--constant-experts",
         .help = "MoE++: constant experts (a·x + b·v) routed beside the FFN experts",
         .hi = kExperts}),
    moe_key<&MoEConfig::copy_experts>(
        "copy_experts", zc_routed,
        {.name = "--copy-experts", .help = "MoE++: copy experts (x)", .hi = kExperts}),
    moe_key<&MoEConfig::zero_experts>(
        "zero_experts", zc_routed,
        {.name = "--zero-experts",
         .help = "MoE++: zero experts (a token that picks one runs one FFN expert fewer)",
         .hi = kExperts}),
    moe_key<&MoEConfig::zc_balance_weight>(
        "zc_balance_weight", zc_routed,
        {.name = "--zc-balance-weight",
         .help = "MoE++: weight of the zero-computation experts in the balance loss (tau)",
         .hi = 1e6}),
    moe_key<&MoEConfig::gating_residual>(
        "gating_residual", [](const MoEConfig& m) { return m.gating_residual; },
        {.name = "--gating-residual",
         .help = "MoE++: each MoE layer's router adds the previous MoE layer's logits through a "
                 "learned [E, E] map (gate.gate_map.weight)"}),
    moe_key<&MoEConfig::num_shared>(
        "num_shared", {.name = "--shared-experts", .help = "MoE: shared experts", .hi = kExperts}),
    moe_key<&MoEConfig::expert_d_ff>(
        "expert_d_ff",
        {.name = "--expert-d-ff", .help = "MoE: expert hidden width (0: --d-ff)", .hi = kWidth}),
    moe_key<&MoEConfig::aux_coef>(
        "aux_coef",
        {.name = "--aux-coef", .help = "MoE: load-balancing loss coefficient", .hi = 1e6}),
    moe_key<&MoEConfig::z_coef>(
        "z_coef", {.name = "--z-coef", .help = "MoE: router z-loss coefficient", .hi = 1e6}),
    moe_key<&MoEConfig::entropy_coef>(
        "entropy_coef", [](const MoEConfig& m) { return m.entropy_coef != 0; },
        {.name = "--entropy-coef",
         .help = "MoE: coefficient of the router's mean entropy (top_p's dynamic loss)",
         .hi = 1e6}),
    moe_key<&MoEConfig::capacity_factor>(
        "capacity_factor", {.name = "--capacity", .help = "MoE: capacity factor", .hi = 1e6}),
    moe_key<&MoEConfig::normalize>(
        "normalize", {.name = "--normalize",
                      .help = "MoE: divide a token's expert weights by their sum (--no-normalize: "
                              "keep them as scored)",
                      .both = true}),
    moe_key<&MoEConfig::expert_kind>("expert_kind"),
    moe_key<&MoEConfig::router_bias>("router_bias"),
    // Printed only where they mean something, so that a printed config changed in one key (no
    // more shared experts, no balancing bias) reads back without a key it would refuse.
    moe_key<&MoEConfig::shared_d_ff>("shared_d_ff",
                                     [](const MoEConfig& m) { return m.num_shared > 0; }),
    moe_key<&MoEConfig::shared_gate>("shared_gate"),
    moe_key<&MoEConfig::score>("score"),
    moe_key<&MoEConfig::softmax_after_topk>("softmax_after_topk"),
    moe_key<&MoEConfig::scaling>("scaling"),
    moe_key<&MoEConfig::groups>("groups"),
    moe_key<&MoEConfig::topk_groups>("topk_groups"),
    moe_key<&MoEConfig::jitter>("jitter"),
    moe_key<&MoEConfig::noisy_topk>("noisy_topk"),
    moe_key<&MoEConfig::balance_bias>("balance_bias"),
    moe_key<&MoEConfig::balance_rate>("balance_rate",
                                      [](const MoEConfig& m) { return m.balance_bias; }),
    moe_key<&MoEConfig::drop>("drop"),
    moe_key<&MoEConfig::balance_loss>("balance_loss"),
    moe_key<&MoEConfig::l1_coef_rate>("l1_coef_rate", relu_routed),
    moe_key<&MoEConfig::naming>("naming"),
};

void refuse_unused_keys(const MoEConfig& m) {
  const auto unused = unused_keys(m.routing);
  if (unused.empty()) return;
  // The default is the routing's: MoEConfig's, with the routing's defaults.
  MoEConfig d;
  d.routing = m.routing;
  read_keys(kMoEKeys, d, routing_defaults(m.routing), "moe", "moe.");
  for (const auto& k : kMoEKeys) {
    if (!k.write || std::find(unused.begin(), unused.end(), k.name) == unused.end()) continue;
    const json given = k.write(m), standard = k.write(d);
    check(given == standard,
          "[moe] routing '{}' does not read {} (given {}): leave it out, or at its default {} "
          "(docs/moe.md, \"Routing families\")",
          enum_name(m.routing), k.name, given.dump(), standard.dump());
  }
}

// A config file's MoE object: the keys it gives, and its routing's defaults (routing_defaults)
// for the keys it leaves out.
void read_moe_keys(MoEConfig& m, const json& j) {
  read_keys(kMoEKeys, m, j, "config", "moe.");
  const json defaults = routing_defaults(m.routing);
  json absent = json::object();
  for (const auto& [key, value] : defaults.items())
    if (!j.contains(key)) absent[key] = value;
  read_keys(kMoEKeys, m, absent, "config", "moe.");
}

// Whether `name` is a variant's (what the --variant flag accepts, as variant_config does).
bool is_variant(std::string_view name) {
  for (const auto& v : kVariants)
    if (name == v.name) return true;
  return false;
}

// The FFN config's keys. "variant" comes first: it is a preset that the other keys refine.
// "ffnlab" is accepted and ignored (a marker some config files carry).
constexpr std::array kFFNKeys{
    JsonKey<FFNConfig>{"variant",
                       [](FFNConfig& c, const json& j) {
                         c = variant_config(json_value<std::string>(j), c.d_model, c.d_ff, c.bias);
                       },
                       nullptr,
                       nullptr,
                       {.name = "--variant",
                        .help = "FFN variant: {names}",
                        .presets = "kind,activation,swish_beta"},
                       &variant_names,
                       &is_variant},
    field<FFNConfig, &FFNConfig::kind>("kind"),
    JsonKey<FFNConfig>{"activation",
                       [](FFNConfig& c, const json& j) { c.act.kind = json_value<Activation>(j); },
                       [](const FFNConfig& c) { return json_of(c.act.kind); }},
    JsonKey<FFNConfig>{"swish_beta",
                       [](FFNConfig& c, const json& j) { c.act.beta = json_value<float>(j); },
                       [](const FFNConfig& c) { return json_float(c.act.beta); },
                       [](const FFNConfig& c) { return c.act.beta != 1.0f; }},
    field<FFNConfig, &FFNConfig::d_model>(
        "d_model", {.name = "--d-model", .help = "model width D", .lo = 1, .hi = kWidth}),
    field<FFNConfig, &FFNConfig::d_ff>(
        "d_ff", {.name = "--d-ff", .help = "FFN hidden width F", .lo = 1, .hi = kWidth}),
    field<FFNConfig, &FFNConfig::bias>("bias", {.name = "--no-bias,--no-ffn-bias",
                                                .help = "no bias on any Linear of the FFN",
                                                .negated = true}),
    field<FFNConfig, &FFNConfig::layout>("layout"),
    field<FFNConfig, &FFNConfig::branches>(
        "branches", [](const FFNConfig& c) { return c.kind == FFNKind::multi_branch; },
        {.name = "--branches",
         .help = "branches of the gated (multi-branch) FFN",
         .lo = 1,
         .hi = limits::kBranches}),
    JsonKey<FFNConfig>{"moe", [](FFNConfig& c, const json& j) { read_moe_keys(c.moe, j); },
                       [](const FFNConfig& c) {
                         // The expert widths are printed resolved (0 means "inherit").
                         json m = write_keys(kMoEKeys, c.moe);
                         m["expert_d_ff"] = c.expert_d_ff();
                         if (c.moe.num_shared > 0) m["shared_d_ff"] = c.shared_d_ff();
                         return m;
                       },
                       [](const FFNConfig& c) { return c.kind == FFNKind::moe; }},
    JsonKey<FFNConfig>{"ffnlab", [](FFNConfig&, const json&) {}},
};

void check_ranges(const FFNConfig& c) {
  check_key_ranges(kFFNKeys, c, "ffn");
  if (c.kind == FFNKind::moe) check_key_ranges(kMoEKeys, c.moe, "moe");
}

}  // namespace

std::vector<std::string> routing_family_names() {
  // Every routing, and MoE++ (top-k with zero-computation experts) before the first routing that
  // looks at whole sequences.
  std::vector<std::string> out;
  bool added = false;
  for (const auto& name : routing_names()) {
    RouterConfig r;
    set_routing(r, name);
    if (!added && routing_family(r.routing).whole_sequence) {
      out.emplace_back("moe_pp");
      added = true;
    }
    out.push_back(name);
  }
  if (!added) out.emplace_back("moe_pp");
  return out;
}

std::string routing_family_title(std::string_view family) {
  if (family == "moe_pp") return "MoE++";
  RouterConfig r;
  check(set_routing(r, family), "[ffn] unknown routing family '{}'", family);
  return routing_family(r.routing).title;
}

FFNConfig routing_family_config(const FFNConfig& moe, std::string_view family,
                                std::int64_t sequence) {
  check(moe.kind == FFNKind::moe, "[ffn] a routing family needs an MoE layout, not '{}'",
        enum_name(moe.kind));
  FFNConfig c = moe;
  MoEConfig& m = c.moe;
  if (family == "moe_pp") {
    m.constant_experts = 2;  // MoE++'s 16 + 4 configuration
    m.copy_experts = 1;
    m.zero_experts = 1;
    m.gating_residual = true;  // as the paper's model: each layer adds the previous one's logits
  } else {
    if (!set_routing(m, family)) {
      std::string known;
      for (const auto& n : routing_family_names()) known += (known.empty() ? "" : ", ") + n;
      fail("[ffn] unknown routing family '{}' (known: {})", family, known);
    }
    routing_family(m.routing).study(m, sequence);
  }
  // A family that changes the routing takes the routing's defaults for the other keys.
  if (m.routing != moe.moe.routing)
    read_keys(kMoEKeys, m, routing_defaults(m.routing), "ffn", "moe.");
  validate(c);
  return c;
}

namespace {

// " (topk: ...; top_p: ...; docs/moe.md)": every routing's reading of an MoE key (its summary,
// for "routing").
std::string routing_readings(std::string_view key) {
  std::string out;
  for (const auto& name : routing_names()) {
    RouterConfig r;
    set_routing(r, name);
    const RoutingFamily& f = routing_family(r.routing);
    std::string text = key == "routing"           ? f.summary
                       : key == "top_k"           ? f.top_k
                       : key == "capacity_factor" ? f.capacity
                                                  : "";
    if (text.empty()) text = key == "capacity_factor" ? "refused (dropless)" : "not read";
    if (key == "routing" && f.whole_sequence) text += ", bidirectional models only";
    out += fmt::format("{}{}: {}", out.empty() ? " (" : "; ", name, text);
  }
  return out + "; docs/moe.md)";
}

}  // namespace

std::vector<ConfigFlag> ffn_config_flags() {
  std::vector<ConfigFlag> out = flags_of(kFFNKeys, FFNConfig{});
  for (auto& f : flags_of(kMoEKeys, MoEConfig{}, "moe.")) {
    // Each routing family's reading of the keys whose meaning it sets.
    for (const char* key : {"routing", "top_k", "capacity_factor"})
      if (f.key == std::string("moe.") + key) f.help += routing_readings(key);
    if (f.key == "moe.normalize") {  // the routings whose defaults turn it off
      std::vector<std::string> off;
      for (const auto& name : routing_names())
        if (routing_defaults(name).value("normalize", true) == false) off.push_back(name);
      f.help += fmt::format(". Default: on; off under --routing {}", join_names(off));
    }
    out.push_back(std::move(f));
  }
  return out;
}

FFNConfig config_from_json(const nlohmann::json& j) {
  FFNConfig c;
  read_keys(kFFNKeys, c, j, "config");
  // A key the layer would not read is refused, not ignored (as its flag is on the command line).
  if (j.contains("moe") && c.kind != FFNKind::moe)
    fail("[config] key 'moe' applies to an MoE layer (variant moe), not to this {} layer",
         variant_name(c));
  if (j.contains("branches") && c.kind != FFNKind::multi_branch)
    fail("[config] key 'branches' applies to the gated FFN (variant gated), not to this {} layer",
         variant_name(c));
  validate(c);
  return c;
}

nlohmann::json config_to_json(const FFNConfig& c) {
  return write_keys(kFFNKeys, c);
}

std::vector<std::string> moe_key_names() {
  std::vector<std::string> names;
  for (const auto& k : kMoEKeys) names.emplace_back(k.name);
  return names;
}

}  // namespace ffnlab
