// The FFN-layer flags and their mapping to FFNConfig.
#include "ffn_flags.hpp"

#include <fmt/format.h>

#include "common.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/io/ffn_io.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/names.hpp"

namespace ffnlab::cli {

std::vector<CLI::Option*> add_ffn_flags(CLI::App& cmd, FFNFlags& f, const std::string& group) {
  std::vector<CLI::Option*> out;
  auto add = [&](CLI::Option* o) {
    o->group(group);
    out.push_back(o);
    f.options.push_back(o);
    return o;
  };
  add(cmd.add_option("--d-model", f.d_model, "model width D"))
      ->capture_default_str()
      ->check(int_in(1, limits::kWidth));
  // A command whose default d_ff is 0 picks the width per variant; the others need a width.
  if (f.d_ff == 0)
    add(cmd.add_option("--d-ff", f.d_ff,
                       "FFN hidden width F (0: 4·D; for the GLU kinds the multiple of 8 closest "
                       "to the parameters of the ReLU FFN of 4·D, about 8/3·D)"))
        ->capture_default_str()
        ->check(int_in(0, limits::kWidth));
  else
    add(cmd.add_option("--d-ff", f.d_ff, "FFN hidden width F"))
        ->capture_default_str()
        ->check(int_in(1, limits::kWidth));
  add(cmd.add_flag("--no-bias,--no-ffn-bias", f.no_bias, "no bias on any Linear of the FFN"));
  add(cmd.add_option("--branches", f.branches, "branches of the gated (multi-branch) FFN"))
      ->capture_default_str()
      ->check(int_in(1, limits::kBranches));
  add(cmd.add_option("--experts", f.experts, "MoE: routed experts"))
      ->capture_default_str()
      ->check(int_in(1, limits::kExperts));
  add(cmd.add_option("--top-k", f.top_k,
                     "MoE: experts per token (top_p routing: at most; relu routing: on average, "
                     "held by its L1 penalty)"))
      ->capture_default_str()
      ->check(int_in(1, limits::kExperts));
  add(cmd.add_option(
          "--routing", f.routing,
          "MoE: how many experts a token takes: " + join_names(enum_names<RoutingKind>()) +
              " (top_p: the fewest best whose probabilities reach --top-p; relu: "
              "every expert whose router logit is positive; expert_choice: each expert takes "
              "its best ceil(capacity·k·S/E) tokens of a sequence; soft: every expert's --slots "
              "mix all of a sequence's tokens; both bidirectional models only; docs/moe.md)"))
      ->capture_default_str();
  add(cmd.add_option("--top-p", f.top_p, "MoE, top_p routing: the probability mass to reach"))
      ->capture_default_str()
      ->check(real_in(1e-6, 1));
  add(cmd.add_option("--slots", f.slots,
                     "MoE, soft routing: slots per expert (each a mixture of a sequence's "
                     "tokens; E·slots/S experts' compute a token)"))
      ->capture_default_str()
      ->check(int_in(1, limits::kExperts));
  add(cmd.add_option("--target-sparsity", f.target_sparsity,
                     "MoE, relu routing: the fraction of zero gates the L1 penalty holds (0: 1 - "
                     "top_k/experts)"))
      ->capture_default_str()
      ->check(real_in(0, 0.999999));
  add(cmd.add_option("--l1-coef-init", f.l1_coef_init,
                     "MoE, relu routing: the L1 penalty's first coefficient (it then adapts by "
                     "1.2x per step)"))
      ->capture_default_str()
      ->check(real_in(1e-30, 1e6));
  add(cmd.add_option("--constant-experts", f.constant_experts,
                     "MoE++: constant experts (a·x + b·v) routed beside the FFN experts"))
      ->capture_default_str()
      ->check(int_in(0, limits::kExperts));
  add(cmd.add_option("--copy-experts", f.copy_experts, "MoE++: copy experts (x)"))
      ->capture_default_str()
      ->check(int_in(0, limits::kExperts));
  add(cmd.add_option("--zero-experts", f.zero_experts,
                     "MoE++: zero experts (a token that picks one runs one FFN expert fewer)"))
      ->capture_default_str()
      ->check(int_in(0, limits::kExperts));
  add(cmd.add_option("--zc-balance-weight", f.zc_balance_weight,
                     "MoE++: weight of the zero-computation experts in the balance loss (tau)"))
      ->capture_default_str()
      ->check(real_in(0, 1e6));
  add(cmd.add_flag("--gating-residual", f.gating_residual,
                   "MoE++: each MoE layer's router adds the previous MoE layer's logits through "
                   "a learned [E, E] map (gate.gate_map.weight)"));
  add(cmd.add_option("--shared-experts", f.shared, "MoE: shared experts"))
      ->capture_default_str()
      ->check(int_in(0, limits::kExperts));
  add(cmd.add_option("--expert-d-ff", f.expert_d_ff, "MoE: expert hidden width (0: --d-ff)"))
      ->capture_default_str()
      ->check(int_in(0, limits::kWidth));
  add(cmd.add_option("--aux-coef", f.aux_coef, "MoE: load-balancing loss coefficient"))
      ->capture_default_str()
      ->check(real_in(0, 1e6));
  add(cmd.add_option("--z-coef", f.z_coef, "MoE: router z-loss coefficient"))
      ->capture_default_str()
      ->check(real_in(0, 1e6));
  add(cmd.add_option("--entropy-coef", f.entropy_coef,
                     "MoE: coefficient of the router's mean entropy (top_p's dynamic loss)"))
      ->capture_default_str()
      ->check(real_in(0, 1e6));
  add(cmd.add_option("--capacity", f.capacity,
                     "MoE: capacity factor (0: dropless; expert_choice: the experts per token "
                     "are capacity·k, 0 meaning 1·k)"))
      ->capture_default_str()
      ->check(real_in(0, 1e6));
  add(cmd.add_option("--ffn-config", f.config_file,
                     "a layer config file instead of the variant and the flags above (ffnlab "
                     "JSON, docs/config.md, or a Hugging Face config.json)"));
  return out;
}

CLI::Option* add_variant_flag(CLI::App& cmd, std::string& variant) {
  return cmd.add_option("--variant", variant, "FFN variant: " + join_names(variant_names()))
      ->capture_default_str();
}

CLI::Option* add_variants_flag(CLI::App& cmd, std::string& variants) {
  return cmd
      .add_option("--variants", variants,
                  "comma-separated FFN variants, or 'all' (" + join_names(variant_names()) + ")")
      ->capture_default_str();
}

namespace {

// The routing family a flag belongs to (nullptr: every family's, or not a routing flag).
const char* family_of_flag(const std::string& name) {
  if (name == "--top-p") return "top_p";
  if (name == "--slots") return "soft";
  if (name == "--target-sparsity" || name == "--l1-coef-init") return "relu";
  return nullptr;
}

// A given flag that the layer would not read: refused, naming what it needs.
void refuse_unused_flags(const FFNFlags& f) {
  for (const CLI::Option* o : f.options) {
    if (o->count() == 0) continue;
    const std::string name = o->get_name();
    // (--d-model stays: it is also the model's width, which the layer's must match.)
    if (!f.config_file.empty() && name != "--ffn-config" && name != "--d-model")
      throw UsageError(fmt::format(
          "{}: does not apply with --ffn-config, whose file describes the whole layer (set it "
          "there)",
          name));
    if (const char* family = family_of_flag(name); family && f.routing != family)
      throw UsageError(fmt::format("{}: applies to --routing {} only, not {}", name, family,
                                   f.routing));
  }
}

}  // namespace

FFNConfig ffn_config_from_flags(const FFNFlags& f, const std::string& variant) {
  refuse_unused_flags(f);
  if (!f.config_file.empty()) return read_ffn_config_file(f.config_file);
  FFNConfig c = variant_config(variant, f.d_model, 1, !f.no_bias);
  c.d_ff = f.d_ff > 0 ? f.d_ff : default_d_ff(c);
  c.branches = f.branches;
  MoEConfig& m = c.moe;
  m.num_experts = f.experts;
  m.top_k = f.top_k;
  m.routing = parse_enum<RoutingKind>(f.routing);
  m.top_p = static_cast<float>(f.top_p);
  m.slots = f.slots;
  m.entropy_coef = static_cast<float>(f.entropy_coef);
  m.target_sparsity = static_cast<float>(f.target_sparsity);
  m.l1_coef_init = static_cast<float>(f.l1_coef_init);
  // ReLU gates and expert choice's probabilities are not divided by their sum
  m.normalize = m.routing != RoutingKind::relu && m.routing != RoutingKind::expert_choice;
  m.constant_experts = f.constant_experts;
  m.copy_experts = f.copy_experts;
  m.zero_experts = f.zero_experts;
  m.zc_balance_weight = static_cast<float>(f.zc_balance_weight);
  m.gating_residual = f.gating_residual;
  m.num_shared = f.shared;
  m.expert_d_ff = f.expert_d_ff;
  m.aux_coef = static_cast<float>(f.aux_coef);
  m.z_coef = static_cast<float>(f.z_coef);
  m.capacity_factor = f.capacity;
  validate(c);
  return c;
}

}  // namespace ffnlab::cli
