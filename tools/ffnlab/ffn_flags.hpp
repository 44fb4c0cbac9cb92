// The FFN-layer flags, defined once for every command that builds a layer (params, toy, train):
// the same names, checks and help text everywhere, and one mapping to FFNConfig.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "ffnlab/layers/ffn_config.hpp"

namespace ffnlab::cli {

struct FFNFlags {
  std::int64_t d_model = 512;
  std::int64_t d_ff = 2048;  // 0: default_d_ff() of the variant's kind (allowed on the command
                             // line only where it is the command's default)
  bool no_bias = false;
  int branches = 4;  // gated (multi-branch) FFN
  // MoE
  int experts = 8, top_k = 2, shared = 0;
  std::string routing = "topk";
  double top_p = 0.4, entropy_coef = 0.0;
  int slots = 1;
  double target_sparsity = 0.0, l1_coef_init = 1e-8;             // relu routing
  int constant_experts = 0, copy_experts = 0, zero_experts = 0;  // MoE++
  double zc_balance_weight = 1.0;
  bool gating_residual = false;  // MoE++: each MoE layer adds the previous one's router logits
  std::int64_t expert_d_ff = 0;
  double aux_coef = 0.0, z_coef = 0.0, capacity = 0.0;
  std::string config_file;  // --ffn-config: a layer config instead of the flags
  // The options add_ffn_flags registered: which were given decides what is refused as unused.
  std::vector<const CLI::Option*> options;
};

// Registers --d-model, --d-ff, --no-bias, --branches, --experts, --top-k, --routing, --top-p,
// --slots,
// --target-sparsity, --l1-coef-init, --constant-experts, --copy-experts, --zero-experts,
// --zc-balance-weight, --shared-experts, --expert-d-ff, --aux-coef, --z-coef,
// --entropy-coef, --capacity and --ffn-config in `group`, with f's current values as the shown
// defaults. Returns the options, for commands that need to know which were given.
std::vector<CLI::Option*> add_ffn_flags(CLI::App& cmd, FFNFlags& f, const std::string& group);

// --variant NAME (one) or --variants LIST (comma-separated or 'all'), help built from the
// variant table.
CLI::Option* add_variant_flag(CLI::App& cmd, std::string& variant);
CLI::Option* add_variants_flag(CLI::App& cmd, std::string& variants);

// The layer the flags describe for one named variant (or the --ffn-config file, when given).
// Throws UsageError for a flag given that the layer would not use: a routing family's flag
// (--top-p, --slots, --target-sparsity, --l1-coef-init) under another --routing, and any FFN
// flag but --d-model (also the model's width) beside --ffn-config.
FFNConfig ffn_config_from_flags(const FFNFlags& f, const std::string& variant);

}  // namespace ffnlab::cli
