// ffnlab params: the closed-form cost table (parameters, FLOPs, memory) of FFN variants.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/error.hpp"

namespace ffnlab::cli {

namespace {

struct ParamsOptions {
  std::int64_t d_model = 512, d_ff = 2048, tokens = 8;
  bool no_bias = false, json = false;
  int experts = 8, top_k = 2, branches = 4, shared = 0;
  std::int64_t expert_d_ff = 0;
  std::string variants = "relu,gelu,glu,gated,moe";
};

std::string thousands(std::int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (v < 0 ? "-" : "") + out;
}

void run_params(const ParamsOptions& o) {
  const std::vector<std::string> names = variant_list(o.variants);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  std::vector<std::pair<std::string, FFNCost>> costs;
  for (const auto& name : names) {
    FFNConfig c = variant_config(name, o.d_model, o.d_ff, !o.no_bias);
    c.branches = o.branches;
    c.moe.num_experts = o.experts;
    c.moe.top_k = o.top_k;
    c.moe.num_shared = o.shared;
    c.moe.expert_d_ff = o.expert_d_ff;
    const FFNCost cost = ffn_cost(c, o.tokens);
    costs.emplace_back(name, cost);
    auto mem = [](const MemoryBytes& m) {
      return nlohmann::ordered_json{{"weights", m.weights},
                                    {"grads", m.grads},
                                    {"adam", m.adam},
                                    {"activations", m.activations},
                                    {"total", m.total()}};
    };
    rows.push_back({{"variant", name},
                    {"config", config_to_json(c)},
                    {"params", cost.params},
                    {"active_params", cost.active_params},
                    {"flops_per_token",
                     {{"forward_matmul", cost.forward.matmul},
                      {"forward_elementwise", cost.forward.elementwise},
                      {"backward_matmul", cost.backward.matmul},
                      {"backward_elementwise", cost.backward.elementwise}}},
                    {"saved_floats_per_token", cost.saved_floats_per_token},
                    {"memory_bytes", {{"f32", mem(cost.f32)}, {"bf16", mem(cost.bf16)}}}});
  }
  if (o.json) {
    nlohmann::ordered_json out{{"d_model", o.d_model},
                               {"d_ff", o.d_ff},
                               {"bias", !o.no_bias},
                               {"tokens", o.tokens},
                               {"variants", rows}};
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print(
      "FFN costs: d_model {}, d_ff {}, bias {}, {} tokens (MoE: {} experts, top-{}; gated: "
      "{} branches)\n\n",
      o.d_model, o.d_ff, o.no_bias ? "off" : "on", o.tokens, o.experts, o.top_k, o.branches);
  fmt::print("{:<10} {:>13} {:>13} {:>11} {:>9} {:>11} {:>9} {:>10} {:>10} {:>10} {:>11}\n",
             "variant", "params", "active", "fwd mm", "fwd ew", "bwd mm", "bwd ew", "weights",
             "grads", "adam", "activations");
  fmt::print("{:<10} {:>13} {:>13} {:>11} {:>9} {:>11} {:>9} {:>10} {:>10} {:>10} {:>11}\n", "", "",
             "per token", "FLOP/tok", "op/tok", "FLOP/tok", "op/tok", "MiB f32", "MiB f32", "MiB",
             "MiB f32");
  const double MiB = 1024.0 * 1024.0;
  for (const auto& [name, c] : costs)
    fmt::print(
        "{:<10} {:>13} {:>13} {:>11} {:>9} {:>11} {:>9} {:>10.2f} {:>10.2f} {:>10.2f} {:>11.3f}\n",
        name, thousands(c.params), thousands(c.active_params),
        thousands(static_cast<std::int64_t>(c.forward.matmul)),
        thousands(static_cast<std::int64_t>(c.forward.elementwise)),
        thousands(static_cast<std::int64_t>(c.backward.matmul)),
        thousands(static_cast<std::int64_t>(c.backward.elementwise)), c.f32.weights / MiB,
        c.f32.grads / MiB, c.f32.adam / MiB, c.f32.activations / MiB);
  fmt::print(
      "\nmm: matrix-product FLOPs (2 per multiply-add); ew: elementwise operations (1 per element "
      "per stage).\nActivations: what a training forward saves for backward, for all tokens. "
      "Derivations: docs/costs.md.\n");
}

}  // namespace

void add_params_command(CLI::App& app) {
  auto o = std::make_shared<ParamsOptions>();
  auto* cmd = app.add_subcommand(
      "params",
      "Print parameters, FLOPs per token and memory of FFN variants (closed form). The defaults "
      "are the seed study's configuration.");
  cmd->add_option("--d-model", o->d_model, "model width D")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--d-ff", o->d_ff, "hidden width F")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--no-bias", o->no_bias, "no bias on any Linear");
  cmd->add_option("--tokens", o->tokens, "tokens in a batch, for activation memory")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--branches", o->branches, "branches of the gated (multi-branch) FFN")
      ->capture_default_str();
  cmd->add_option("--experts", o->experts, "MoE: routed experts")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "MoE: experts per token")->capture_default_str();
  cmd->add_option("--shared-experts", o->shared, "MoE: shared experts")->capture_default_str();
  cmd->add_option("--expert-d-ff", o->expert_d_ff, "MoE: expert hidden width (0: --d-ff)")
      ->capture_default_str();
  cmd->add_option("--variants", o->variants,
                  "comma-separated variants, or 'all' (relu, gelu, glu, bilinear, reglu, geglu, "
                  "swiglu, gated, moe)")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "print JSON instead of a table");
  cmd->callback([o] { run_params(*o); });
}

}  // namespace ffnlab::cli
