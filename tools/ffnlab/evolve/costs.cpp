// Stage 1: closed-form costs (analysis/costs.hpp) of every variant at the seeds' configuration
// and in the study's model, the equal-budget widths, the FFN's share of a whole Transformer, and
// how the cost grows with d_model.
#include "ffnlab/analysis/costs.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

#include "../common.hpp"
#include "ffnlab/report/markdown.hpp"
#include "study.hpp"

namespace ffnlab::cli::evolve {

namespace {

constexpr std::int64_t kSeedD = 512, kSeedF = 2048, kSeedTokens = 8;  // batch 2 × seq 4

// The seeds' configuration of a variant: d_ff 2048 for all, bias, 4 branches, 8 experts top-2.
FFNConfig seed_config(const std::string& variant) {
  return variant_config(variant, kSeedD, kSeedF, true);
}

json cost_json(const FFNConfig& c, const FFNCost& k) {
  auto mem = [](const MemoryBytes& m) {
    return json{{"weights", m.weights},
                {"grads", m.grads},
                {"adam", m.adam},
                {"activations", m.activations},
                {"total", m.total()}};
  };
  return json{{"d_ff", c.kind == FFNKind::moe ? c.expert_d_ff() : c.d_ff},
              {"params", k.params},
              {"active_params", k.active_params},
              {"active_fraction", static_cast<double>(k.active_params) / k.params},
              {"flops_per_token",
               {{"forward_matmul", k.forward.matmul},
                {"forward_elementwise", k.forward.elementwise},
                {"backward_matmul", k.backward.matmul},
                {"backward_elementwise", k.backward.elementwise}}},
              {"memory_bytes", {{"f32", mem(k.f32)}, {"bf16", mem(k.bf16)}}}};
}

std::string mib(double bytes) {
  return fixed(bytes / (1024.0 * 1024.0), 2);
}

// The cost table of `configs` (name, config) for `tokens` tokens; ratios to the first row.
std::string cost_table(const std::vector<std::pair<std::string, FFNConfig>>& configs,
                       std::int64_t tokens, json& out) {
  std::vector<std::vector<std::string>> rows;
  const double base = static_cast<double>(ffn_cost(configs.front().second, tokens).params);
  const double base_flops = ffn_cost(configs.front().second, tokens).forward.total();
  for (const auto& [name, c] : configs) {
    const FFNCost k = ffn_cost(c, tokens);
    out[name] = cost_json(c, k);
    rows.push_back({name, thousands(c.kind == FFNKind::moe ? c.expert_d_ff() : c.d_ff),
                    thousands(k.params), fixed(k.params / base, 2), thousands(k.active_params),
                    percent(static_cast<double>(k.active_params) / k.params, 0),
                    thousands(static_cast<std::int64_t>(k.forward.matmul)),
                    thousands(static_cast<std::int64_t>(k.forward.elementwise)),
                    thousands(static_cast<std::int64_t>(k.backward.matmul)),
                    thousands(static_cast<std::int64_t>(k.backward.elementwise)),
                    fixed(k.forward.total() / base_flops, 2), mib(k.f32.weights), mib(k.f32.grads),
                    mib(k.f32.adam), fixed(k.f32.activations / 1024.0, 1),
                    fixed(k.bf16.activations / 1024.0, 1), mib(k.f32.total()),
                    mib(k.bf16.total())});
  }
  return markdown_table(
      {"variant", "d_ff", "params", "÷ ReLU", "active params", "active", "fwd matmul FLOP/tok",
       "fwd elementwise op/tok", "bwd matmul FLOP/tok", "bwd elementwise op/tok",
       "fwd FLOPs ÷ ReLU", "weights MiB", "grads MiB", "Adam MiB", "activations KiB f32",
       "activations KiB bf16", "total MiB f32", "total MiB bf16"},
      rows, "lrrrrrrrrrrrrrrrrr");
}

std::string share_table(const std::vector<std::pair<std::string, TransformerCost>>& models,
                        json& out) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& [name, t] : models) {
    out[name] = {{"params", t.params},
                 {"ffn_params", t.ffn_params},
                 {"attention_params", t.attention_params},
                 {"norm_params", t.norm_params},
                 {"embedding_params", t.embedding_params},
                 {"forward_flops_per_token", t.forward_flops},
                 {"ffn_forward_flops_per_token", t.ffn_forward_flops},
                 {"attention_forward_flops_per_token", t.attention_forward_flops},
                 {"head_forward_flops_per_token", t.head_forward_flops},
                 {"ffn_param_share", static_cast<double>(t.ffn_params) / t.params},
                 {"ffn_flop_share", t.ffn_forward_flops / t.forward_flops}};
    rows.push_back({name, thousands(t.params), thousands(t.ffn_params),
                    percent(static_cast<double>(t.ffn_params) / t.params),
                    thousands(t.attention_params), thousands(t.embedding_params),
                    thousands(static_cast<std::int64_t>(t.forward_flops)),
                    percent(t.ffn_forward_flops / t.forward_flops),
                    percent(t.attention_forward_flops / t.forward_flops),
                    percent(t.head_forward_flops / t.forward_flops)});
  }
  return markdown_table(
      {"model", "params", "FFN params", "FFN share", "attention params", "embedding params",
       "fwd FLOPs/token", "FFN share", "attention share", "LM head share"},
      rows, "lrrrrrrrrr");
}

}  // namespace

FFNConfig match_params(FFNConfig c, std::int64_t target, bool active) {
  auto params = [&](std::int64_t f) {
    if (c.kind == FFNKind::moe)
      c.moe.expert_d_ff = f;
    else
      c.d_ff = f;
    const FFNCost k = ffn_cost(c, 1);
    return active ? k.active_params : k.params;
  };
  std::int64_t best = 8;
  double best_gap = 1e300;
  for (std::int64_t f = 8; f <= 64 * c.d_model; f += 8) {
    const double gap = std::abs(static_cast<double>(params(f) - target));
    if (gap < best_gap) {
      best_gap = gap;
      best = f;
    }
    if (params(f) > target) break;
  }
  params(best);
  return c;
}

FFNConfig study_ffn(const std::string& variant, std::int64_t D) {
  FFNConfig c = variant_config(variant, D, 4 * D, true);
  if (variant == "relu" || variant == "gelu") return c;
  if (c.kind == FFNKind::moe) c.moe.aux_coef = 0.01f;  // the usual coefficient (Switch, Mixtral)
  const std::int64_t target = count_params(variant_config("relu", D, 4 * D, true));
  return match_params(c, target, /*active=*/false);
}

void run_costs(Study& st) {
  st.stage("costs (closed form)");
  json& out = st.results["costs"];
  std::string& md = st.report;
  md += "## 1. Costs\n\n";
  md += fmt::format(
      "Closed-form counts (`ffnlab params`, derived in docs/costs.md), checked in the test suite "
      "against the parameters of the built layers. FLOPs per token: matrix products at 2 per "
      "multiply-add; elementwise work at 1 per element per stage. Memory: weights, gradients, "
      "Adam's two moments (always f32) and the activations a training forward saves for "
      "backward, for the seeds' batch of {} tokens.\n\n",
      kSeedTokens);

  // The seeds' configuration, every variant at d_ff 2048 (what the seeds compared).
  std::vector<std::pair<std::string, FFNConfig>> seeds;
  for (const auto& v : variant_names()) seeds.emplace_back(v, seed_config(v));
  md += fmt::format(
      "### The seeds' configuration (d_model {}, d_ff {} for every variant, bias, gated FFN with "
      "4 branches, MoE with 8 ReLU experts, top-2)\n\n",
      kSeedD, kSeedF);
  md += cost_table(seeds, kSeedTokens, out["seeds"]);
  {  // the figure's data
    std::string csv =
        "variant,params_x_relu,active_params_x_relu,forward_flops_x_relu,"
        "weights_mib,grads_mib,adam_mib,activations_mib\n";
    const FFNCost base = ffn_cost(seed_config("relu"), kSeedTokens);
    for (const auto& [name, c] : seeds) {
      const FFNCost k = ffn_cost(c, kSeedTokens);
      const double M = 1024.0 * 1024.0;
      csv += fmt::format("{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.5f}\n", name,
                         static_cast<double>(k.params) / base.params,
                         static_cast<double>(k.active_params) / base.params,
                         k.forward.total() / base.forward.total(), k.f32.weights / M,
                         k.f32.grads / M, k.f32.adam / M, k.f32.activations / M);
    }
    write_text(st.dir + "/costs_seeds.csv", csv);
  }
  const FFNCost moe = ffn_cost(seed_config("moe"), 1);
  const FFNCost expert = ffn_cost(expert_config(seed_config("moe")), 1);
  out["moe_forward_matmul_over_one_expert"] = moe.forward.matmul / expert.forward.matmul;
  md += fmt::format(
      "\nTop-2 MoE: each token runs two whole experts, so its forward matrix FLOPs are {}× one "
      "expert's (the router adds {} FLOPs per token), while {} of its parameters are touched per "
      "token: compute and parameters are two different budgets.\n\n",
      fixed(moe.forward.matmul / expert.forward.matmul, 3),
      thousands(static_cast<std::int64_t>(moe.forward.matmul - 2 * expert.forward.matmul)),
      percent(static_cast<double>(moe.active_params) / moe.params));

  // The study's model: the variants as trained in section 4.
  const LMConfig& lm = st.scale.model;
  std::vector<std::pair<std::string, FFNConfig>> study;
  for (const auto& v : st.variants) study.emplace_back(v, study_ffn(v, lm.d_model));
  md += fmt::format("\n### The study's model (d_model {}, the widths trained in section 4)\n\n",
                    lm.d_model);
  md += cost_table(study, st.scale.train.batch * st.scale.train.seq, out["study"]);

  // The FFN's share of whole Transformers.
  const LMConfig encoder = seeds_encoder_config();
  std::vector<std::pair<std::string, TransformerCost>> models{
      {"seeds' encoder, 6 × (512, 8 heads, ReLU 2048), seq 100, blocks only",
       transformer_cost(encoder, 100, false)}};
  for (const std::string v : {"relu", "swiglu", "moe"}) {
    LMConfig m = lm;
    m.ffn = study_ffn(v, lm.d_model);
    models.emplace_back(fmt::format("study LM, {} layers × {} ({}), seq {}, with embeddings and "
                                    "head",
                                    m.layers, m.d_model, v, st.scale.train.seq),
                        transformer_cost(m, st.scale.train.seq, true));
  }
  md += "\n### The FFN's share of a whole Transformer\n\n";
  md += "Per token of a forward pass; attention counts its full S×S products as computed.\n\n";
  md += share_table(models, out["transformer_share"]);

  // Growth with d_model (d_ff = 4·D; GLU kinds at 8/3·D).
  json& growth = out["growth"];
  std::string csv = "d_model";
  const std::vector<std::string> grow_variants{"relu", "swiglu", "gated", "moe"};
  for (const auto& v : grow_variants) csv += fmt::format(",{0}_params,{0}_fwd_flops", v);
  csv += "\n";
  std::vector<std::vector<std::string>> rows;
  for (std::int64_t D = 128; D <= 8192; D *= 2) {
    csv += std::to_string(D);
    std::vector<std::string> row{thousands(D)};
    for (const auto& v : grow_variants) {
      const FFNConfig c =
          variant_config(v, D, default_d_ff(variant_config(v, 1, 1, true).kind, D), true);
      const FFNCost k = ffn_cost(c, 1);
      growth[v].push_back({{"d_model", D},
                           {"d_ff", c.d_ff},
                           {"params", k.params},
                           {"forward_flops_per_token", k.forward.total()}});
      csv += fmt::format(",{},{}", k.params, k.forward.total());
      row.push_back(thousands(k.params));
    }
    csv += "\n";
    rows.push_back(row);
  }
  write_text(st.dir + "/cost_growth.csv", csv);
  md +=
      "\n### Growth with d_model\n\nParameters of one FFN layer with d_ff = 4·d_model "
      "(SwiGLU 8/3·d_model; the gated FFN and MoE experts at 4·d_model): quadratic in d_model "
      "for every kind. Forward FLOPs per token are about 2 × parameters (per active "
      "parameter for MoE); both are in cost_growth.csv and ffn_performance_comparison.png.\n\n";
  md += markdown_table({"d_model", "relu", "swiglu", "gated (4 branches)", "moe (8 × top-2)"}, rows,
                       "rrrrr");
  md += "\n";

  // Equal budgets at the seeds' d_model: the width each variant gets.
  md += "## 2. Equal budgets\n\n";
  md += fmt::format(
      "Each variant's width chosen (a multiple of 8) so that its parameters come closest to the "
      "ReLU FFN's {} (d_ff {}); MoE twice: equal total parameters (narrow experts) and equal "
      "active parameters (what a token touches).\n\n",
      thousands(count_params(seed_config("relu"))), kSeedF);
  std::vector<std::pair<std::string, FFNConfig>> equal;
  const std::int64_t target = count_params(seed_config("relu"));
  for (const auto& v : variant_names()) {
    if (v == "moe") {
      equal.emplace_back("moe (equal total)", match_params(seed_config(v), target, false));
      equal.emplace_back("moe (equal active)", match_params(seed_config(v), target, true));
    } else if (v == "relu" || v == "gelu") {
      equal.emplace_back(v, seed_config(v));
    } else {
      equal.emplace_back(v, match_params(seed_config(v), target, false));
    }
  }
  md += cost_table(equal, kSeedTokens, out["equal_budget"]);

  md += "\n";
}

}  // namespace ffnlab::cli::evolve
