// Stages "costs" and "equal_budget": closed-form costs (analysis/costs.hpp) of every variant at
// the tutorial's configuration and in the study's model, the FFN's share of a whole Transformer,
// how the cost grows with d_model, and the width each variant gets at equal parameters.
#include "ffnlab/analysis/costs.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "ffnlab/report/markdown.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

namespace {

// The tutorial's configuration: d_model 512, d_ff 2048 for every variant, bias, 4 branches,
// 8 experts top-2, and its batch of 2 × 4 tokens.
constexpr std::int64_t kTutorialD = 512, kTutorialF = 2048, kTutorialTokens = 8;

FFNConfig tutorial_config(const std::string& variant) {
  return variant_config(variant, kTutorialD, kTutorialF, true);
}

std::int64_t width(const FFNConfig& c) {
  return c.kind == FFNKind::moe ? c.expert_d_ff() : c.d_ff;
}

CostRow row(std::string name, const FFNConfig& c, std::int64_t tokens) {
  return {std::move(name), c, ffn_cost(c, tokens)};
}

json rows_json(const std::vector<CostRow>& rows) {
  json out = json::object();
  for (const CostRow& r : rows) {
    json j{{"d_ff", width(r.config)}};
    j.update(to_json(r.cost));
    j["active_fraction"] =
        static_cast<double>(r.cost.active_params) / static_cast<double>(r.cost.params);
    out[r.name] = j;
  }
  return out;
}

std::string mib(double bytes) {
  return fixed(bytes / (1024.0 * 1024.0), 2);
}

// Consecutive rows that differ only in their name become one ("glu, bilinear, reglu, ..."):
// the GLU family costs the same at equal widths.
std::vector<std::vector<std::string>> merge_equal_rows(std::vector<std::vector<std::string>> rows) {
  std::vector<std::vector<std::string>> out;
  for (auto& row : rows) {
    if (!out.empty() &&
        std::equal(row.begin() + 1, row.end(), out.back().begin() + 1, out.back().end()))
      out.back()[0] += ", " + row[0];
    else
      out.push_back(std::move(row));
  }
  return out;
}

// The cost table of `rows`, ratios to the first row: parameters, what a token touches, forward
// FLOPs and training memory. The counts behind it are in cost_compute_table and
// cost_memory_table.
std::string cost_table(const std::vector<CostRow>& rows) {
  std::vector<std::vector<std::string>> cells;
  const double base = static_cast<double>(rows.front().cost.params);
  const double base_flops = rows.front().cost.forward.total();
  for (const CostRow& r : rows) {
    const FFNCost& k = r.cost;
    cells.push_back({r.name, thousands(width(r.config)), thousands(k.params),
                     fixed(k.params / base, 2),
                     percent(static_cast<double>(k.active_params) / k.params, 0),
                     thousands(static_cast<std::int64_t>(k.forward.total())),
                     fixed(k.forward.total() / base_flops, 2), mib(k.f32.total())});
  }
  return markdown_table({"variant", "d_ff", "parameters", "÷ ReLU", "active per token",
                         "forward FLOPs/token", "÷ ReLU", "training memory MiB (f32)"},
                        merge_equal_rows(std::move(cells)), "lrrrrrrr");
}

// Forward and backward work per token, matrix products apart from elementwise work.
std::string cost_compute_table(const std::vector<CostRow>& rows) {
  std::vector<std::vector<std::string>> cells;
  for (const CostRow& r : rows) {
    const FFNCost& k = r.cost;
    cells.push_back({r.name, thousands(k.active_params),
                     thousands(static_cast<std::int64_t>(k.forward.matmul)),
                     thousands(static_cast<std::int64_t>(k.forward.elementwise)),
                     thousands(static_cast<std::int64_t>(k.backward.matmul)),
                     thousands(static_cast<std::int64_t>(k.backward.elementwise))});
  }
  return markdown_table({"variant", "active params", "fwd matmul FLOP/tok",
                         "fwd elementwise op/tok", "bwd matmul FLOP/tok", "bwd elementwise op/tok"},
                        merge_equal_rows(std::move(cells)), "lrrrrr");
}

// Training memory: weights, gradients, Adam's moments, saved activations (f32 and bf16).
std::string cost_memory_table(const std::vector<CostRow>& rows) {
  std::vector<std::vector<std::string>> cells;
  for (const CostRow& r : rows) {
    const FFNCost& k = r.cost;
    cells.push_back({r.name, mib(k.f32.weights), mib(k.f32.grads), mib(k.f32.adam),
                     fixed(k.f32.activations / 1024.0, 1), fixed(k.bf16.activations / 1024.0, 1),
                     mib(k.f32.total()), mib(k.bf16.total())});
  }
  return markdown_table({"variant", "weights MiB", "grads MiB", "Adam MiB", "activations KiB f32",
                         "activations KiB bf16", "total MiB f32", "total MiB bf16"},
                        merge_equal_rows(std::move(cells)), "lrrrrrrr");
}

const std::vector<std::string> kGrowthVariants{"relu", "swiglu", "gated", "moe"};

}  // namespace

double CostsResult::moe_forward_matmul_over_one_expert() const {
  return moe_token.forward.matmul / expert_token.forward.matmul;
}

const CostRow* CostsResult::study_row(std::string_view variant) const {
  for (const CostRow& r : study)
    if (r.name == variant) return &r;
  return nullptr;
}

const CostRow* CostsResult::tutorial_row(std::string_view variant) const {
  for (const CostRow& r : tutorial)
    if (r.name == variant) return &r;
  return nullptr;
}

void run_costs(Study& st) {
  st.stage("costs (closed form)");
  CostsResult c;
  c.tutorial_tokens = kTutorialTokens;
  for (const auto& v : variant_names())
    c.tutorial.push_back(row(v, tutorial_config(v), kTutorialTokens));
  c.moe_token = ffn_cost(tutorial_config("moe"), 1);
  c.expert_token = ffn_cost(expert_config(tutorial_config("moe")), 1);
  const LMConfig& lm = st.scale.model;
  c.study_tokens = st.scale.train.batch * st.scale.train.seq;
  for (const auto& v : st.options.variants)
    c.study.push_back(row(v, study_ffn(v, lm.d_model), c.study_tokens));
  c.transformer_share.emplace_back(
      "the tutorial's encoder, 6 × (512, 8 heads, ReLU 2048), seq 100, blocks only",
      transformer_cost(tutorial_encoder_config(), 100, false));
  for (const std::string v : {"relu", "swiglu", "moe"}) {
    LMConfig m = lm;
    m.ffn = study_ffn(v, lm.d_model);
    c.transformer_share.emplace_back(
        fmt::format("study LM, {} layers × {} ({}), seq {}, with embeddings and head", m.layers,
                    m.d_model, v, st.scale.train.seq),
        transformer_cost(m, st.scale.train.seq, true));
  }
  for (std::int64_t D = 128; D <= 8192; D *= 2)
    for (const auto& v : kGrowthVariants) {
      FFNConfig f = variant_config(v, D, 4 * D, true);
      f.d_ff = default_d_ff(f);
      const FFNCost k = ffn_cost(f, 1);
      c.growth.push_back({v, D, f.d_ff, k.params, k.forward.total()});
    }

  // The figures' data.
  std::string csv =
      "variant,params_x_relu,active_params_x_relu,forward_flops_x_relu,"
      "weights_mib,grads_mib,adam_mib,activations_mib\n";
  const FFNCost& base = c.tutorial.front().cost;
  const double M = 1024.0 * 1024.0;
  for (const CostRow& r : c.tutorial) {
    const FFNCost& k = r.cost;
    csv += fmt::format("{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.5f}\n", r.name,
                       static_cast<double>(k.params) / base.params,
                       static_cast<double>(k.active_params) / base.params,
                       k.forward.total() / base.forward.total(), k.f32.weights / M, k.f32.grads / M,
                       k.f32.adam / M, k.f32.activations / M);
  }
  st.write("costs_tutorial.csv", csv);
  std::string growth = "d_model";
  for (const auto& v : kGrowthVariants) growth += fmt::format(",{0}_params,{0}_fwd_flops", v);
  growth += "\n";
  for (std::size_t i = 0; i < c.growth.size(); i += kGrowthVariants.size()) {
    growth += std::to_string(c.growth[i].d_model);
    for (std::size_t k = 0; k < kGrowthVariants.size(); ++k)
      growth +=
          fmt::format(",{},{}", c.growth[i + k].params, c.growth[i + k].forward_flops_per_token);
    growth += "\n";
  }
  st.write("cost_growth.csv", growth);
  st.results.costs = std::move(c);
}

json costs_json(const Results& r) {
  return json_if(r.costs, [](const CostsResult& c) {
    json out{{"tutorial", rows_json(c.tutorial)},
             {"moe_forward_matmul_over_one_expert", c.moe_forward_matmul_over_one_expert()},
             {"study", rows_json(c.study)}};
    json& share = out["transformer_share"];
    for (const auto& [name, t] : c.transformer_share) share[name] = to_json(t);
    json& growth = out["growth"];
    for (const GrowthPoint& g : c.growth)
      growth[g.variant].push_back({{"d_model", g.d_model},
                                   {"d_ff", g.d_ff},
                                   {"params", g.params},
                                   {"forward_flops_per_token", g.forward_flops_per_token}});
    return out;
  });
}

std::string costs_markdown(const Study& st, const Sections& sec) {
  if (!st.results.costs) return "";
  const CostsResult& c = *st.results.costs;
  std::string md = fmt::format(
      "One FFN layer at the tutorial's configuration (d_model {}, d_ff {} for every variant, "
      "bias, the gated FFN with 4 branches, MoE with 8 ReLU experts and top-2), counted in "
      "closed form (`ffnlab params`; docs/costs.md). \"Active per token\": the share of the "
      "parameters a token's forward pass touches. FLOPs: 2 per multiply-add, 1 per element of "
      "each elementwise stage. Training memory: weights, gradients, Adam's two moments and the "
      "activations saved for backward, for the tutorial's {} tokens.\n\n",
      kTutorialD, kTutorialF, c.tutorial_tokens);
  md += cost_table(c.tutorial);
  md += fmt::format(
      "\nTop-2 MoE: each token runs two whole experts, so its forward matrix FLOPs are {}× one "
      "expert's (the router adds {} FLOPs per token), while {} of its parameters are touched per "
      "token: compute and parameters are two different budgets. The work behind each column, "
      "the study's own model and the FFN's share of a whole Transformer are in the appendix.\n",
      fixed(c.moe_forward_matmul_over_one_expert(), 3),
      thousands(static_cast<std::int64_t>(c.moe_token.forward.matmul -
                                          2 * c.expert_token.forward.matmul)),
      percent(static_cast<double>(c.moe_token.active_params) / c.moe_token.params));
  md += kDetails;
  md += fmt::format(
      "**The tutorial's configuration, per token** (matrix products and elementwise work, "
      "forward and backward), and its training memory for {} tokens:\n\n",
      c.tutorial_tokens);
  md += cost_compute_table(c.tutorial) + "\n" + cost_memory_table(c.tutorial);
  md += fmt::format(
      "\n**The study's model** (d_model {}, the widths trained in {}; memory for one training "
      "batch of {} tokens, {} sequences of {}):\n\n",
      st.scale.model.d_model, sec.ref("training"), thousands(c.study_tokens), st.scale.train.batch,
      st.scale.train.seq);
  md += cost_table(c.study);

  md +=
      "\n**The FFN's share of a whole Transformer**, per token of a forward pass (attention "
      "counts its full S×S products as computed):\n\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& [name, t] : c.transformer_share)
    rows.push_back({name, thousands(t.params), thousands(t.ffn_params),
                    percent(static_cast<double>(t.ffn_params) / t.params),
                    thousands(t.attention_params), thousands(t.embedding_params),
                    thousands(static_cast<std::int64_t>(t.forward_flops)),
                    percent(t.ffn_forward_flops / t.forward_flops),
                    percent(t.attention_forward_flops / t.forward_flops),
                    percent(t.head_forward_flops / t.forward_flops)});
  md += markdown_table(
      {"model", "params", "FFN params", "FFN share", "attention params", "embedding params",
       "fwd FLOPs/token", "FFN share", "attention share", "LM head share"},
      rows, "lrrrrrrrrr");

  md +=
      "\n**Growth with d_model.** Parameters of one FFN layer with d_ff = 4·d_model grow "
      "quadratically in d_model for every kind (SwiGLU at ReLU's parameters, about 8/3·d_model; "
      "the gated FFN and MoE experts at 4·d_model), and forward FLOPs per token are about twice "
      "the (active) parameters: cost_growth.csv has both from d_model 128 to 8,192, and "
      "ffn_performance_comparison.png draws them.\n";
  return md + "\n";
}

void run_equal_budget(Study& st) {
  EqualBudgetResult e;
  e.relu_d_ff = kTutorialF;
  e.tokens = kTutorialTokens;
  e.target = count_params(tutorial_config("relu"));
  for (const auto& v : variant_names()) {
    if (v == "moe") {
      e.rows.push_back(row("moe (equal total)", match_params(tutorial_config(v), e.target, false),
                           kTutorialTokens));
      e.rows.push_back(row("moe (equal active)", match_params(tutorial_config(v), e.target, true),
                           kTutorialTokens));
    } else if (v == "relu" || v == "gelu") {
      e.rows.push_back(row(v, tutorial_config(v), kTutorialTokens));
    } else {
      e.rows.push_back(row(v, match_params(tutorial_config(v), e.target), kTutorialTokens));
    }
  }
  st.results.equal_budget = std::move(e);
}

json equal_budget_json(const Results& r) {
  return json_if(r.equal_budget, [](const EqualBudgetResult& e) { return rows_json(e.rows); });
}

std::string equal_budget_markdown(const Study& st, const Sections& sec) {
  if (!st.results.equal_budget) return "";
  const EqualBudgetResult& e = *st.results.equal_budget;
  std::string md = fmt::format(
      "Each variant's width chosen (a multiple of 8) so that its parameters come closest to the "
      "ReLU FFN's {} (d_ff {}); MoE twice: equal total parameters (narrow experts) and equal "
      "active parameters (what a token touches). Memory for the tutorial's batch of {} "
      "tokens.\n\n",
      thousands(e.target), e.relu_d_ff, e.tokens);
  md += cost_table(e.rows);
  md += std::string(kDetails) +
        fmt::format("**Equal budgets, per token and in memory** (the widths of {}):\n\n",
                    sec.ref("equal_budget")) +
        cost_compute_table(e.rows) + "\n" + cost_memory_table(e.rows);
  return md + "\n";
}

}  // namespace ffnlab::study
