// ffnlab params: the closed-form cost table (parameters, FLOPs, memory) of FFN variants.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "commands.hpp"
#include "common.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/limits.hpp"
#include "key_flags.hpp"
#include "launch.hpp"

namespace ffnlab::cli {

namespace {

// "top-2", "top-p 0.5 with at most 2 experts, costed at 2" (RoutingFamily::describe).
std::string routing_text(const MoEConfig& m) {
  return routing_family(m.routing).describe(m);
}

struct ParamsOptions {
  KeyFlags ffn;  // the FFN flags (the tutorial's configuration by default)
  std::string config_file;
  std::int64_t tokens = kCostTokens;
  bool json = false;
  std::string variants = "relu,gelu,glu,gated,moe";
  CLI::Option *variants_flag = nullptr, *config_flag = nullptr, *ffn_config_flag = nullptr;
};

void run_params(const ParamsOptions& o) {
  if (o.config_flag->count() > 0 && o.ffn_config_flag->count() > 0)
    throw UsageError("--config: the same as --ffn-config; give one of them");
  const std::vector<std::string> names =
      o.config_file.empty() ? variant_list(o.variants) : std::vector<std::string>{""};
  if (o.config_file.empty()) refuse_flags_no_variant_reads(o.ffn, names);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  std::vector<std::pair<std::string, FFNCost>> costs;
  const auto layer = [&](const std::string& variant) {
    return layer_config(o.ffn, "", o.config_file, variant);
  };
  // The yardstick: a ReLU FFN of the same d_model and d_ff (of a config file's, when given).
  std::optional<FFNConfig> file;
  if (!o.config_file.empty()) {
    file = layer("");
    refuse_flags_beside_layer_file(o.ffn, *o.variants_flag, o.config_file, *file);
  }
  const nlohmann::json flags = o.ffn.values();
  const std::int64_t d_model = file ? file->d_model : flags["d_model"].get<std::int64_t>();
  const std::int64_t d_ff = file ? file->d_ff : flags["d_ff"].get<std::int64_t>();
  const bool bias = file ? file->bias : flags["bias"].get<bool>();
  FFNConfig relu_layer = variant_config("relu", d_model, d_ff, bias);
  validate(relu_layer);
  const FFNCost relu = ffn_cost(relu_layer, o.tokens);
  for (const auto& name : names) {
    const FFNConfig c = layer(name);
    const FFNCost cost = ffn_cost(c, o.tokens);
    costs.emplace_back(name.empty() ? variant_name(c) : name, cost);
    nlohmann::ordered_json row{{"variant", costs.back().first}, {"config", config_to_json(c)}};
    row.update(to_json(cost));
    row["params_over_relu"] = static_cast<double>(cost.params) / relu.params;
    row["forward_flops_over_relu"] = cost.forward.total() / relu.forward.total();
    rows.push_back(row);
  }
  if (o.json) {
    nlohmann::ordered_json out{{"d_model", d_model},
                               {"d_ff", d_ff},
                               {"bias", bias},
                               {"tokens", o.tokens},
                               {"variants", rows}};
    fmt::print("{}\n", out.dump(2));
    return;
  }
  if (file)
    fmt::print("FFN costs of {}: d_model {}, d_ff {}, bias {}, {} tokens{}\n\n", o.config_file,
               file->d_model, file->d_ff, file->bias ? "on" : "off", o.tokens,
               file->kind == FFNKind::moe
                   ? fmt::format(" ({} experts of d_ff {}, {})", file->moe.num_experts,
                                 file->expert_d_ff(), routing_text(file->moe))
                   : "");
  else {
    // The MoE and gated settings, when a variant of that kind is costed.
    std::vector<std::string> kinds;
    const auto costed = [&](FFNKind kind) {
      return std::any_of(names.begin(), names.end(),
                         [&](const std::string& n) { return layer(n).kind == kind; });
    };
    if (costed(FFNKind::moe))
      kinds.push_back(fmt::format("MoE: {} experts, {}", flags["moe"]["num_experts"].get<int>(),
                                  routing_text(layer("moe").moe)));
    if (costed(FFNKind::multi_branch))
      kinds.push_back(fmt::format("gated: {} branches", flags["branches"].get<int>()));
    fmt::print("FFN costs: d_model {}, d_ff {}, bias {}, {} tokens{}\n\n", d_model, d_ff,
               bias ? "on" : "off", o.tokens,
               kinds.empty() ? "" : fmt::format(" ({})", fmt::join(kinds, "; ")));
  }
  fmt::print(
      "{:<10} {:>13} {:>7} {:>13} {:>11} {:>9} {:>7} {:>11} {:>9} {:>10} {:>10} {:>10} {:>11}\n",
      "variant", "params", "params", "active", "fwd mm", "fwd ew", "fwd", "bwd mm", "bwd ew",
      "weights", "grads", "adam", "activations");
  fmt::print(
      "{:<10} {:>13} {:>7} {:>13} {:>11} {:>9} {:>7} {:>11} {:>9} {:>10} {:>10} {:>10} {:>11}\n",
      "", "", "÷ ReLU", "per token", "FLOP/tok", "op/tok", "÷ ReLU", "FLOP/tok", "op/tok",
      "MiB f32", "MiB f32", "MiB", "MiB f32");
  const double MiB = 1024.0 * 1024.0;
  for (const auto& [name, c] : costs)
    fmt::print(
        "{:<10} {:>13} {:>7.2f} {:>13} {:>11} {:>9} {:>7.2f} {:>11} {:>9} {:>10.2f} {:>10.2f} "
        "{:>10.2f} {:>11.3f}\n",
        name, thousands(c.params), static_cast<double>(c.params) / relu.params,
        thousands(c.active_params), thousands(static_cast<std::int64_t>(c.forward.matmul)),
        thousands(static_cast<std::int64_t>(c.forward.elementwise)),
        c.forward.total() / relu.forward.total(),
        thousands(static_cast<std::int64_t>(c.backward.matmul)),
        thousands(static_cast<std::int64_t>(c.backward.elementwise)), c.f32.weights / MiB,
        c.f32.grads / MiB, c.f32.adam / MiB, c.f32.activations / MiB);
  fmt::print(
      "\nmm: matrix-product FLOPs (2 per multiply-add); ew: elementwise operations (1 per element "
      "per stage).\n÷ ReLU: against a ReLU FFN of the same d_model and d_ff (fwd: all forward "
      "work).\nActivations: what a training forward saves for backward, for all tokens. "
      "Derivations: docs/costs.md.\n");
}

}  // namespace

void add_params_command(CLI::App& app) {
  auto o = std::make_shared<ParamsOptions>();
  auto* cmd = app.add_subcommand(
      "params",
      "Print parameters, FLOPs per token and memory of FFN variants (closed form). The defaults "
      "are the FFN-evolution tutorial's configuration.");
  add_layer_flags(*cmd, o->ffn, o->config_file, "FFN");
  o->ffn_config_flag = cmd->get_option("--ffn-config");
  o->config_flag = cmd->add_option("--config", o->config_file,
                                   "cost the FFN of a config file (a Hugging Face config.json or "
                                   "ffnlab's layer JSON; the same as --ffn-config)")
                       ->check(named_path());
  o->variants_flag = add_variants_flag(*cmd, o->variants);
  cmd->add_option("--tokens", o->tokens,
                  "tokens in a batch, for activation memory (and Soft MoE's sequence length)")
      ->capture_default_str()
      ->check(int_in(0, limits::kTokens));
  cmd->add_flag("--json", o->json, "print JSON instead of a table");
  cmd->callback([o] {
    require_one_process("params");
    run_params(*o);
  });
}

}  // namespace ffnlab::cli
