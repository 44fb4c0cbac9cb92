// The report's last sections (corrections of the seeds, recommendations), the optional d_ff
// sweep, and REPORT.md and results.json.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "../common.hpp"
#include "../zoo_table.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/report/markdown.hpp"
#include "study.hpp"

namespace ffnlab::cli::evolve {

namespace {

const json* find(const json& j, std::initializer_list<const char*> path) {
  const json* p = &j;
  for (const char* k : path) {
    if (!p->is_object() || !p->contains(k)) return nullptr;
    p = &(*p)[k];
  }
  return p;
}

double num(const json& j, std::initializer_list<const char*> path) {
  const json* p = find(j, path);
  return p && p->is_number() ? p->get<double>() : NAN;
}

void corrections(Study& st) {
  const json& r = st.results;
  const FFNConfig relu = variant_config("relu", 512, 2048, true);
  const FFNConfig moe = variant_config("moe", 512, 2048, true);
  const FFNCost kr = ffn_cost(relu, 8), km = ffn_cost(moe, 8);
  const double MiB = 1024.0 * 1024.0;
  const double silu_min = num(r, {"sparsity", "silu_min", "value"});
  std::string dead = "not measured in this run";
  if (const json* s = find(r, {"sparsity", "variants", "relu"}); s && s->is_array()) {
    double zi = 0;
    std::int64_t dead_units = 0, units = 0;
    for (const auto& l : *s) {
      zi += l["zero_fraction_init"].get<double>() / static_cast<double>(s->size());
      dead_units += l["dead_units_trained"].get<std::int64_t>();
      units += l["units"].get<std::int64_t>();
    }
    dead = fmt::format(
        "ReLU's hidden values are exactly zero {} of the time at initialisation, "
        "yet after training {} of its {} hidden units are dead (zero on every "
        "census token), over its {} layers — section 5",
        percent(zi), dead_units, units, s->size());
  }
  std::vector<std::vector<std::string>> rows{
      {"1", "Linear(512, 2048) has \"512 × 2048 × 2 = 2,097,152\" parameters",
       fmt::format("{} weights + {} biases = {}", thousands(512 * 2048), thousands(2048),
                   thousands(512 * 2048 + 2048))},
      {"2", "an activation costs 2·d_model·d_ff FLOPs",
       fmt::format("one operation per hidden value: ReLU's forward elementwise work is {} "
                   "operations per token (activation {} + biases), against {} matrix FLOPs",
                   thousands(static_cast<std::int64_t>(kr.forward.elementwise)), 2048,
                   thousands(static_cast<std::int64_t>(kr.forward.matmul)))},
      {"3", "top-2 MoE costs 0.25× a dense FFN; \"efficiency 32×\"",
       fmt::format("forward matrix FLOPs are {}× one expert's; 25 % is the share of expert "
                   "parameters a token touches (here {} of all parameters with the router)",
                   fixed(num(r, {"costs", "moe_forward_matmul_over_one_expert"}), 3),
                   percent(static_cast<double>(km.active_params) / km.params))},
      {"4", "MoE saves activation memory",
       fmt::format("a training forward saves {} KiB for 8 tokens against ReLU's {} KiB ({}×)",
                   fixed(km.f32.activations / 1024, 1), fixed(kr.f32.activations / 1024, 1),
                   fixed(km.f32.activations / kr.f32.activations, 2))},
      {"5", "ReLU gives ~50 % dead neurons", dead},
      {"6", "LLaMA and Mistral use GELU; GPT-2 1.5B has d_model 1280",
       "they use SwiGLU (LLaMA-7B: d_ff 11008 for d_model 4096, ratio 2.69; Hugging Face "
       "config.json: hidden_act silu, intermediate_size 11008); GPT-2 1.5B (gpt2-xl) has 48 "
       "layers of d_model 1600 (n_layer 48, n_embd 1600)"},
      {"7", "Mistral's MLP returns down · up",
       "it returns down_proj(silu(gate_proj(x)) · up_proj(x)); ffnlab's swiglu matches PyTorch "
       "to f32 rounding in the golden tests (tests/parity)"},
      {"8", "a Transformer block without residual or norm around attention",
       "ffnlab's block has a residual and a norm around both attention and FFN (pre- or "
       "post-norm), and attention takes [batch, seq, d]"},
      {"9", "the toy run shows which FFN trains best",
       "it memorises 8 random vectors; section 4 trains each FFN as a language model on real "
       "text over paired seeds"},
      {"10", "ReLU's FP32 training memory is ~10–12 MB, activations 2–4 MB",
       fmt::format("by the seeds' own definition: weights {} + gradients {} + Adam {} MiB + "
                   "activations {} MiB for 8 tokens = {} MiB",
                   fixed(kr.f32.weights / MiB, 2), fixed(kr.f32.grads / MiB, 2),
                   fixed(kr.f32.adam / MiB, 2), fixed(kr.f32.activations / MiB, 3),
                   fixed(kr.f32.total() / MiB, 2))},
      {"11", "1000B parameters with 8000 experts, top-16: 200B active",
       "1000B × 16/8000 = 2B of expert parameters per token, and each token runs 16 experts"},
      {"12", "LLaMA-2-70B's FFN ratio is 5.33; the 1.6T Switch is \"Switch-L, 128 experts\"",
       "LLaMA-2-70B: d_ff 28672 for d_model 8192, ratio 3.5; the 1.6T model is Switch-C with "
       "2048 experts and top-1 routing (Fedus et al. 2021, table 9)"},
      {"13", "Switch Transformers by \"Lewis et al.\"",
       "by Fedus, Zoph and Shazeer (2021), arXiv:2101.03961"},
      {"14", "training-dynamics prose (\"most stable\")",
       "this report states only what its runs measured (section 4, with spreads)"},
      {"15", "the LayerNorm example normalises over the batch",
       "LayerNorm normalises each token over its d_model features (ops/norm.hpp, checked "
       "against torch.nn.LayerNorm)"},
      {"16", "SwiGLU: xW gives values, Swish(xV) a gate in (0, 1)",
       fmt::format("SwiGLU is (Swish(xW) ⊙ xV)W₂: the Swish branch is the gate, and Swish is "
                   "no (0, 1) gate: unbounded above, and its minimum, measured here, is {:.4f}",
                   silu_min)},
  };
  st.report += "## 8. Corrections of the seeds\n\n";
  st.report +=
      "Each known error of the seed documents (shared/seeds/NOTES.md) beside what this "
      "run computed or measured.\n\n";
  st.report += markdown_table({"#", "the seeds say", "this run"}, rows, "rll");
  st.report += "\n";
  json& out = st.results["corrections"];
  for (const auto& row : rows)
    out.push_back({{"id", row[0]}, {"claim", row[1]}, {"finding", row[2]}});
}

void recommendations(Study& st) {
  const json* vars = find(st.results, {"training", "variants"});
  std::string& md = st.report;
  md +=
      "## 9. Recommendations\n\nDerived from this run's numbers by the rules stated in each "
      "line.\n\n";
  if (!vars) {
    md += "No LM training in this run: no recommendation.\n\n";
    return;
  }
  json& out = st.results["recommendations"];
  // Rule 1: the lowest mean validation among the variants measurably better than ReLU.
  std::string best, lowest;
  double best_bpb = 1e300, lowest_bpb = 1e300;
  for (const auto& [v, x] : vars->items()) {
    const double m = x["mean"].get<double>();
    if (m < lowest_bpb) lowest_bpb = m, lowest = v;
    if (x["verdict"].get<std::string>() == "better than ReLU" && m < best_bpb)
      best_bpb = m, best = v;
  }
  if (best.empty())
    md += fmt::format(
        "- **Best validation at equal parameters:** no variant is measurably "
        "better than ReLU in this run (lowest mean: {}, {:.4f} bits/byte). Rule: "
        "the lowest mean over seeds among the variants whose verdict is better.\n",
        lowest, lowest_bpb);
  else
    md += fmt::format(
        "- **Best validation at equal parameters:** {} ({:.4f} bits/byte, "
        "measurably better than ReLU). Rule: the lowest mean over seeds among the "
        "variants whose verdict is better.\n",
        best, best_bpb);
  out["best_at_equal_parameters"] = best.empty() ? json(nullptr) : json(best);
  // Rule 2: per FLOP — the lowest validation among variants at most ReLU's FFN FLOPs per token.
  const json* study = find(st.results, {"costs", "study"});
  if (study && vars->contains("relu")) {
    const double relu_flops = (*study)["relu"]["flops_per_token"]["forward_matmul"].get<double>();
    std::string best_flop, list;
    double best_flop_bpb = 1e300;
    for (const auto& [v, x] : vars->items()) {
      const double ratio =
          (*study)[v]["flops_per_token"]["forward_matmul"].get<double>() / relu_flops;
      list += fmt::format("{}{} {:.2f}×", list.empty() ? "" : ", ", v, ratio);
      if (ratio <= 1.05 && x["mean"].get<double>() < best_flop_bpb)
        best_flop_bpb = x["mean"].get<double>(), best_flop = v;
    }
    md += fmt::format(
        "- **Per FLOP:** {} ({:.4f} bits/byte). Rule: the lowest mean validation "
        "among the variants whose FFN does at most 1.05× ReLU's forward matrix "
        "FLOPs per token (here: {}).\n",
        best_flop, best_flop_bpb, list);
    out["best_per_flop"] = best_flop;
  }
  // Rule 3: per second — the highest tokens/s among those not worse than ReLU.
  std::string fastest;
  double fastest_tps = 0;
  for (const auto& [v, x] : vars->items()) {
    const std::string vd = x["verdict"].get<std::string>();
    if (vd.find("worse") != std::string::npos) continue;
    const double tps = x["median_tokens_per_second"].get<double>();
    if (tps > fastest_tps) fastest_tps = tps, fastest = v;
  }
  md += fmt::format(
      "- **Per second:** {} ({} tokens/s in training). Rule: the highest training "
      "throughput among the variants not worse than ReLU.\n",
      fastest, thousands(static_cast<std::int64_t>(fastest_tps)));
  out["best_per_second"] = fastest;
  // Rule 4: when MoE pays off.
  if (vars->contains("moe") && study) {
    const auto& m = (*vars)["moe"];
    const double active = (*study)["moe"]["active_fraction"].get<double>();
    const double moe_tps = m["median_tokens_per_second"].get<double>();
    const double relu_tps = (*vars)["relu"]["median_tokens_per_second"].get<double>();
    const std::string verdict = m["verdict"].get<std::string>();
    std::string finding;
    if (verdict == "better than ReLU")
      finding = "it pays off here: better than the dense FFN of its total parameters";
    else if (verdict.find("worse") == std::string::npos && moe_tps > relu_tps)
      finding = "it pays off here on cost: as good as the dense FFN, at more tokens per second";
    else
      finding =
          "it does not pay off in this run: its validation is worse than the dense FFN's "
          "of the same total parameters, whatever it saves per token";
    out["moe_pays_off"] = finding.rfind("it pays off", 0) == 0;
    md += fmt::format(
        "- **MoE:** at equal total parameters it touches {} of them per token and trains at {} "
        "tokens/s against ReLU's {} ({:.2f}×); its paired difference to ReLU is {:+.4f} ± {:.4f} "
        "bits/byte ({}). Rule: MoE pays off where it is better than a dense FFN of its total "
        "parameters, or as good at a lower cost per token. Finding: {}.\n",
        percent(active), thousands(static_cast<std::int64_t>(moe_tps)),
        thousands(static_cast<std::int64_t>(relu_tps)), moe_tps / relu_tps,
        m["paired_difference_to_relu_mean"].get<double>(),
        m["paired_difference_to_relu_std"].get<double>(), verdict, finding);
  }
  md += "\n";
}

}  // namespace

void run_sweep(Study& st) {
  if (!st.options.sweep) return;
  st.stage("sweep: d_ff / d_model = 1, 2, 4, 8 for ReLU and SwiGLU");
  std::vector<std::vector<std::string>> rows;
  std::string csv = "ratio,relu,swiglu\n";
  json& out = st.results["sweep"];
  for (int ratio : st.scale.sweep_ratios) {
    std::vector<std::string> row{std::to_string(ratio)};
    csv += std::to_string(ratio);
    for (const std::string v : {"relu", "swiglu"}) {
      LMConfig m = st.scale.model;
      const std::int64_t D = m.d_model;
      // SwiGLU at 2/3 of the ReLU width of the same ratio: equal parameters per ratio.
      const std::int64_t F =
          v == "relu" ? ratio * D : std::max<std::int64_t>(8, (2 * ratio * D / 3 + 7) / 8 * 8);
      m.ffn = variant_config(v, D, F, true);
      const RunRecord r = train_run(st, m, 1, fmt::format("{} x{}", v, ratio));
      out[v].push_back({{"ratio", ratio}, {"d_ff", F}, {"val_bits_per_byte", r.val_bits_per_byte}});
      row.push_back(fmt::format("{:.4f} (d_ff {})", r.val_bits_per_byte, F));
      csv += fmt::format(",{:.5f}", r.val_bits_per_byte);
    }
    csv += "\n";
    rows.push_back(row);
  }
  write_text(st.dir + "/sweep.csv", csv);
  st.report +=
      "## Sweep: why up-project, activate, down-project\n\nValidation bits/byte of the "
      "study's LM (seed 1, same steps) as the FFN's width grows; SwiGLU at 2/3 of the "
      "ReLU width of the same ratio (equal parameters).\n\n";
  st.report += markdown_table({"d_ff / d_model", "relu", "swiglu"}, rows, "rrr");
  st.report += "\n![sweep](sweep.png)\n\n";
}

void write_report(Study& st) {
  st.report +=
      "## 7. Real models\n\nThe FFN of well-known models (`ffnlab zoo` prints the same "
      "table), costed by ffnlab: one layer's parameters, active parameters and forward FLOPs per "
      "token (matrix and elementwise), and all FFN layers' parameters together. Each row's "
      "source is its last column.\n\n";
  st.report += markdown_table(zoo_header(), zoo_rows(), "llrrrlrrrrrl");
  st.report += "\n";
  st.results["zoo"] = zoo_json();
  corrections(st);
  recommendations(st);
}

}  // namespace ffnlab::cli::evolve
