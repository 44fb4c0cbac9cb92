// Stage "moe_axes": MoE on both of its axes, over the paired seeds of the training stage.
// (a) equal total parameters: the training stage's moe (8 experts of an eighth of ReLU's width,
// top-2: a quarter of its active compute); (b) equal active compute: 8 experts of half ReLU's
// width, top-2, so a token costs ReLU's FFN FLOPs while the layer holds 4× its parameters; (c)
// fine-grained with a shared expert (DeepSeekMoE): 16 experts of a quarter of ReLU's width, top-3,
// and one shared expert of a quarter, the same active compute again. (c), the field's current
// design, is the one the report headlines (kHeadlineMoE); (b) trains with --full only. Both are
// sequential comparisons against ReLU, trained in the training stage's pool (moe_axes_job) and
// judged by its rules (comparison_outcome); the figure places every variant by parameters and by
// FLOPs per token.
#include <fmt/format.h>

#include <cmath>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/report/markdown.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

std::string MoEAxesResult::pareto_csv() const {
  std::string csv =
      "variant,params,forward_flops_per_token,mean,std,kind,difference_to_relu,low,high\n";
  for (const Point& p : pareto)
    csv += fmt::format("{},{},{:.0f},{:.5f},{:.5f},{},{:.5f},{:.5f},{:.5f}\n", p.name, p.params,
                       p.forward_flops, p.mean, p.std, p.moe ? "moe" : "dense", p.difference, p.low,
                       p.high);
  return csv;
}

const MoEAxisRow* MoEAxesResult::find(std::string_view name) const {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  return nullptr;
}

namespace {

struct Axis {
  const char* name;
  const char* what;
};
const Axis kParams{"moe", "equal total parameters (8 experts, top-2)"};
const Axis kCompute{"moe_compute", "equal active compute: 8 experts, top-2"};
const Axis kFine{kHeadlineMoE.data(),
                 "equal active compute: fine-grained, 16 experts, top-3, 1 shared"};

// The MoE FFN of (b) or (c) in the study's LM of width D (ReLU's FFN: 4·D).
FFNConfig axis_ffn(const std::string& name, std::int64_t D) {
  FFNConfig c = study_ffn("moe", D);  // the study's router settings
  if (name == std::string_view(kCompute.name)) {
    c.moe.num_experts = 8;
    c.moe.top_k = 2;
    c.moe.expert_d_ff = 2 * D;  // 2 × 2·D = ReLU's 4·D per token
  } else {
    c.moe.num_experts = 16;
    c.moe.top_k = 3;
    c.moe.expert_d_ff = D;  // 3 × D + D = 4·D per token
    c.moe.num_shared = 1;
    c.moe.shared_d_ff = D;
  }
  return c;
}

MoEAxisRow axis_row(const Study& st, const std::string& name, const std::string& what,
                    const FFNConfig& ffn) {
  MoEAxisRow row;
  row.name = name;
  row.description = what;
  row.ffn = ffn;
  LMConfig m = st.scale.model;
  m.ffn = ffn;
  const TransformerCost tc = transformer_cost(m, st.scale.train.seq, true);
  row.params = tc.params;
  row.forward_flops = tc.forward_flops;
  const FFNCost fc = ffn_cost(ffn, 1);
  row.ffn_params = fc.params;
  row.ffn_active = fc.active_params;
  return row;
}

// The configurations at equal active compute this run trains: the headline one, and with --full
// the top-2 one too.
std::vector<Axis> trained_axes(const Study& st) {
  if (st.options.full) return {kCompute, kFine};
  return {kFine};
}

}  // namespace

FFNConfig headline_moe_ffn(std::int64_t d_model) {
  return axis_ffn(kFine.name, d_model);
}

std::int64_t moe_axes_steps(const Study& st) {
  // At most: every configuration to the design's cap.
  return st.scale.train.steps * st.scale.design.cap *
         static_cast<std::int64_t>(moe_axes_labels(st).size());
}

std::vector<std::string> moe_axes_labels(const Study& st) {
  std::vector<std::string> labels;
  if (st.has_variant("moe"))
    for (const Axis& a : trained_axes(st)) labels.emplace_back(a.name);
  return labels;
}

RunJob moe_axes_job(const Study& st, const std::string& label, int seed) {
  RunJob job;
  job.model = st.scale.model;
  job.model.ffn = axis_ffn(label, st.scale.model.d_model);
  job.seed = static_cast<std::uint64_t>(seed);
  job.label = label;
  job.settings = st.scale.train;
  job.settings->eval_every = 0;  // no periodic evaluations: the stage reads the final one
  job.utilisation = true;
  return job;
}

void run_moe_axes(Study& st) {
  if (!st.has_variant("moe") || !st.results.training) return;
  const std::vector<Axis> axes = trained_axes(st);
  st.stage(fmt::format("MoE at equal active compute: {} (trained with the training stage's runs)",
                       axes.size() == 1 ? "the fine-grained design" : "2 configurations"));
  const std::int64_t D = st.scale.model.d_model;
  const double margin = st.results.training->margin;
  MoEAxesResult out;

  MoEAxisRow r = axis_row(st, "relu", "dense ReLU, the reference", study_ffn("relu", D));
  r.outcome = *st.results.training->find("relu");
  out.rows.push_back(std::move(r));
  r = axis_row(st, kParams.name, kParams.what, study_ffn("moe", D));
  r.outcome = *st.results.training->find("moe");
  out.rows.push_back(std::move(r));

  std::vector<double> compute;
  for (const Axis& a : axes) {
    const FFNConfig ffn = axis_ffn(a.name, D);
    MoEAxisRow row = axis_row(st, a.name, a.what, ffn);
    row.outcome = comparison_outcome(st, a.name);
    if (std::string_view(a.name) == kCompute.name) compute = row.outcome.val_bits_per_byte;
    row.outcome.d_ff = ffn.expert_d_ff();
    row.outcome.params = row.params;
    out.rows.push_back(std::move(row));
  }
  if (!compute.empty())
    out.compute_vs_params =
        paired_outcome("moe_compute − moe", compute, out.rows[1].outcome.val_bits_per_byte, margin);

  for (const VariantOutcome& o : st.results.training->variants) {
    if (o.variant == "moe") continue;  // drawn as an MoE row below
    LMConfig m = st.scale.model;
    m.ffn = study_ffn(o.variant, D);
    const TransformerCost tc = transformer_cost(m, st.scale.train.seq, true);
    const bool relu = o.verdict == Verdict::reference;
    out.pareto.push_back({o.variant, tc.params, tc.forward_flops, o.mean, o.std, false,
                          relu ? 0.0 : o.diff_mean, relu ? 0.0 : o.diff_low,
                          relu ? 0.0 : o.diff_high});
  }
  for (const MoEAxisRow& row : out.rows)
    if (row.name != "relu")
      out.pareto.push_back({row.name, row.params, row.forward_flops, row.outcome.mean,
                            row.outcome.std, true, row.outcome.diff_mean, row.outcome.diff_low,
                            row.outcome.diff_high});
  st.write("moe_pareto.csv", out.pareto_csv());
  st.results.moe_axes = std::move(out);
}

namespace {

json outcome_json(const VariantOutcome& o) {
  return {{"val_bits_per_byte", o.val_bits_per_byte},
          {"mean", o.mean},
          {"std", o.std},
          {"paired_difference_mean", o.diff_mean},
          {"paired_difference_ci95", interval_json(o.diff_low, o.diff_high)},
          {"paired_difference_ci90", interval_json(o.diff_low90, o.diff_high90)},
          {"verdict", verdict_text(o.verdict)},
          {"seeds", o.val_bits_per_byte.size()},
          {"interval_levels",
           o.sequential_seeds > 0 ? json::array({o.level, o.equivalence_level}) : json(nullptr)},
          {"holds_for_all_comparisons", o.holds_for_all_comparisons},
          {"narrow_by_chance", o.narrow_by_chance},
          {"seeds_to_decide", o.seeds_to_decide}};
}

}  // namespace

json moe_axes_json(const Results& res) {
  return json_if(res.moe_axes, [](const MoEAxesResult& a) {
    json out;
    for (const MoEAxisRow& r : a.rows) {
      json row{{"description", r.description},
               {"experts", r.ffn.kind == FFNKind::moe ? r.ffn.moe.num_experts : 0},
               {"top_k", r.ffn.kind == FFNKind::moe ? r.ffn.moe.top_k : 0},
               {"expert_d_ff", r.ffn.expert_d_ff()},
               {"shared_experts", r.ffn.kind == FFNKind::moe ? r.ffn.moe.num_shared : 0},
               {"params", r.params},
               {"ffn_params", r.ffn_params},
               {"ffn_active_params", r.ffn_active},
               {"forward_flops_per_token", r.forward_flops},
               {"median_tokens_per_second", r.outcome.tokens_per_second},
               {"tokens_per_second_over_relu", r.outcome.tokens_per_second_over_relu},
               {"tokens_per_second_spread", r.outcome.tokens_per_second_spread},
               {"tokens_per_second_noisy", r.outcome.tokens_per_second_noisy}};
      json o = outcome_json(r.outcome);
      if (r.name == "relu") {
        o.erase("paired_difference_mean");
        o.erase("paired_difference_ci95");
        o.erase("paired_difference_ci90");
      }
      row["against_relu"] = std::move(o);
      out["rows"][r.name] = std::move(row);
    }
    if (a.compute_vs_params)
      out["equal_compute_minus_equal_parameters"] = outcome_json(*a.compute_vs_params);
    return out;
  });
}

std::string moe_axes_markdown(const Study& st, const Sections& sec) {
  if (!st.results.moe_axes) return "";
  const MoEAxesResult& a = *st.results.moe_axes;
  std::vector<std::vector<std::string>> rows;
  for (const MoEAxisRow& r : a.rows) {
    const VariantOutcome& o = r.outcome;
    rows.push_back({r.name, r.description, thousands(r.params),
                    fmt::format("{} / {}", thousands(r.ffn_active), thousands(r.ffn_params)),
                    fmt::format("{:.2f} M", r.forward_flops / 1e6),
                    fmt::format("{} ± {}", fixed(o.mean, 4), fixed(o.std, 4)),
                    tokens_per_second_cell(o)});
  }
  const MoEAxisRow* topk = a.find(kCompute.name);
  std::string md = fmt::format(
      "MoE's case is more parameters at the same compute per token. The MoE of {} has ReLU's "
      "total parameters and a quarter of its compute; here MoE also trains at ReLU's compute, "
      "fine-grained with a shared expert (DeepSeekMoE's design: 16 experts of a quarter of "
      "ReLU's width, top-3, one shared expert of a quarter), the summary's equal-compute MoE; "
      "the summary gives each row's verdict. {} Same LM, recipe and rules as {}. FLOPs and "
      "parameters are the whole LM's (attention and head included); FFN active / total is one "
      "layer's.\n\n",
      sec.ref("training"),
      topk ? std::string("8 experts of half ReLU's width with top-2 (Mixtral's design) at the "
                         "same compute trains too.")
           : "`--full` also trains 8 experts of half ReLU's width with top-2 (Mixtral's design) "
             "at the same compute.",
      sec.ref("training"));
  md += markdown_table({"FFN", "what", "LM parameters", "FFN active / total", "forward FLOPs/token",
                        "val bits/byte", "tokens/s (÷ ReLU's)"},
                       rows, "llrrrrr");
  if (a.compute_vs_params) {
    const VariantOutcome& c = *a.compute_vs_params;
    const bool one = c.verdict == Verdict::one_seed;
    md += fmt::format(
        "\nEqual active compute (top-2) against equal total parameters (moe_compute − moe, {}): {} "
        "bits/byte, {}.\n",
        one ? std::string("seed 1 alone")
            : fmt::format("paired by seed over the {} seeds both trained, a fixed 95 % interval",
                          c.val_bits_per_byte.size()),
        difference_cell(c),
        one                            ? "which one seed cannot decide"
        : c.verdict == Verdict::better ? "equal compute is better"
        : c.verdict == Verdict::worse  ? "equal parameters is better"
        : c.verdict == Verdict::equivalent
            ? "equivalent within the margin"
            : "inconclusive: these seeds cannot tell them apart" +
                  (c.seeds_to_decide > 0 && c.seeds_to_decide <= 1000
                       ? fmt::format(" (about {} seeds would decide it)", c.seeds_to_decide)
                       : std::string()));
  }
  md += "\n";
  return md;
}

}  // namespace ffnlab::study
