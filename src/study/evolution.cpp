// Stage "evolution": the tutorial's walk ReLU → GELU → GLU → multi-branch gated → MoE read
// through this run's numbers. Each step names what it was meant to fix or buy and what this run
// measured of it; then the three dimensions the tutorial orders the variants by, as one table;
// then which variant to choose in which situation, each pick with the rule or measurement it
// rests on, and the situations this run cannot speak to said as such. It computes nothing new:
// every number comes from the stages before it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "ffnlab/report/markdown.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

namespace {

// After a verdict of a --quick run: its models are too small for it to be a finding.
std::string quick_caveat(const Options& options) {
  return options.quick ? " (in this --quick run: not a finding)" : "";
}

// "worse than ReLU", "undecided against ReLU by these seeds": the verdict alone, whose
// numbers the summary gives.
std::string measured(const VariantOutcome* o, const Options& options) {
  if (!o)
    return fmt::format("not trained in this run (`{}` trains every variant)",
                       full_study_call(options));
  switch (o->verdict) {
    case Verdict::better:
    case Verdict::worse:
      return std::string(verdict_text(o->verdict)) + quick_caveat(options);
    case Verdict::equivalent:
      return "equivalent to ReLU within the margin" + quick_caveat(options);
    case Verdict::reference:
      return "the reference";
    default:
      return "undecided against ReLU by these seeds";
  }
}

// After training, over every layer: the units counted by `count` (dead or near-dead) and all
// units; -1 when the variant's census did not run.
std::int64_t unit_count(const SparsityResult* s, std::string_view v,
                        std::int64_t LayerSparsity::*count, std::int64_t* units) {
  const auto* layers = s ? s->find(v) : nullptr;
  std::int64_t n = 0;
  *units = 0;
  if (layers)
    for (const LayerSparsity& l : *layers) n += l.*count, *units += l.units;
  return layers ? n : -1;
}

// "12 of 512 (2.3 %)", or "not measured".
std::string units_text(const SparsityResult* s, std::string_view v,
                       std::int64_t LayerSparsity::*count) {
  std::int64_t units = 0;
  const std::int64_t n = unit_count(s, v, count, &units);
  if (n < 0 || units == 0) return "not measured";
  return fmt::format("{} of {} ({})", n, units,
                     percent(static_cast<double>(n) / static_cast<double>(units)));
}

std::string steps_markdown(const Study& st, const Sections& sec) {
  const Results& r = st.results;
  const TrainingResult& t = *r.training;
  const SparsityResult* s = r.sparsity ? &*r.sparsity : nullptr;
  std::string md = fmt::format(
      "Each step of the tutorial's walk, what it was meant to change, and what this run "
      "measured of it. The verdicts are the summary's (against ReLU at equal parameters); "
      "\"undecided\" means these seeds cannot decide, not that the two are alike.\n\n");
  // GELU's near-dead units against ReLU's, where the census counted both.
  std::int64_t units = 0;
  const bool census = unit_count(s, "relu", &LayerSparsity::dead_trained, &units) >= 0 &&
                      unit_count(s, "gelu", &LayerSparsity::near_dead_trained, &units) >= 0;
  md += fmt::format(
      "1. **ReLU → GELU: a smooth activation instead of a hard zero.** ReLU's price is units "
      "that stop learning{}. GELU is {}.\n",
      census
          ? fmt::format(": after training, {} of its hidden units are dead ({}). GELU is "
                        "never exactly 0; {} of its units are near-dead (|h| < {}·rms(h) on "
                        "every census token), against ReLU's {}",
                        units_text(s, "relu", &LayerSparsity::dead_trained), sec.ref("sparsity"),
                        units_text(s, "gelu", &LayerSparsity::near_dead_trained), kNearZeroRelative,
                        units_text(s, "relu", &LayerSparsity::near_dead_trained))
          : std::string(" (this run's census did not count ReLU's and GELU's units)"),
      measured(t.find("gelu"), st.options));
  // The GLU family by gate; the members this run did not train are named once, together.
  struct Gate {
    const char* variant;
    const char* gate;
  };
  static const Gate kGates[] = {{"reglu", "a ReLU gate"},
                                {"geglu", "a GELU gate"},
                                {"swiglu", "a Swish gate"},
                                {"glu", "the original sigmoid gate"},
                                {"bilinear", "no activation"}};
  // The trained members grouped by verdict, in kGates's order of first appearance.
  std::vector<std::pair<std::string, std::vector<std::string>>> by_verdict;
  std::vector<std::string> untrained;
  for (const Gate& g : kGates) {
    const VariantOutcome* o = t.find(g.variant);
    if (!o) {
      untrained.push_back(g.variant);
      continue;
    }
    const std::string verdict = measured(o, st.options);
    auto it = std::find_if(by_verdict.begin(), by_verdict.end(),
                           [&](const auto& v) { return v.first == verdict; });
    if (it == by_verdict.end()) it = by_verdict.insert(by_verdict.end(), {verdict, {}});
    it->second.push_back(fmt::format("{} ({})", g.variant, g.gate));
  }
  // "a, b and c are better than ReLU"; the groups joined by "; ".
  std::vector<std::string> groups;
  for (const auto& [verdict, members] : by_verdict) {
    std::string names = members.front();
    for (std::size_t i = 1; i < members.size(); ++i)
      names += (i + 1 == members.size() ? " and " : ", ") + members[i];
    groups.push_back(fmt::format("{} {} {}", names, members.size() == 1 ? "is" : "are", verdict));
  }
  std::string family =
      groups.empty() ? "" : fmt::format(" Of the family, {}.", fmt::join(groups, "; "));
  if (!untrained.empty())
    family += fmt::format(" Not trained in this run: {} (`{}` trains them).",
                          fmt::join(untrained, ", "), full_study_call(st.options));
  md += fmt::format(
      "2. **GELU → GLU: a gate computed from the input.** The hidden value becomes act(xW) ⊙ xV: "
      "a second projection decides, per token and unit, how much passes. At equal parameters "
      "the gate costs width (SwiGLU's {} hidden units instead of ReLU's {}).{}\n",
      // (Widths the study sets by parameters: the same whether or not the variants trained.)
      study_ffn("swiglu", st.scale.model.d_model).d_ff,
      study_ffn("relu", st.scale.model.d_model).d_ff, family);
  const CostRow* gated_cost = r.costs ? r.costs->tutorial_row("gated") : nullptr;
  const CostRow* relu_cost = r.costs ? r.costs->tutorial_row("relu") : nullptr;
  md += fmt::format(
      "3. **GLU → the multi-branch gated FFN: several gated paths summed.** At the tutorial's "
      "configuration it costs {} ReLU's parameters and FLOPs ({}); at equal parameters, where "
      "its branches split ReLU's budget, it is {}.{}\n",
      gated_cost && relu_cost
          ? fmt::format("{:.2f}×", static_cast<double>(gated_cost->cost.params) /
                                       static_cast<double>(relu_cost->cost.params))
          : "several times",
      sec.ref("costs"), measured(t.find("gated"), st.options),
      !t.find("gated") ? ""
      // (A --quick run's verdict is no finding: it reads as undecided here.)
      : st.options.quick ? " This run does not decide it, so it neither explains nor questions "
                           "why the field left it aside."
      : t.find("gated")->verdict == Verdict::better
          ? " Here the split paid, so this run does not explain why the field left it aside."
      : t.find("gated")->verdict == Verdict::worse ||
              t.find("gated")->verdict == Verdict::equivalent
          ? " The split bought nothing here, which fits the field leaving it aside."
          : " These seeds do not decide it, so this run neither explains nor questions why the "
            "field left it aside.");
  const VariantOutcome* moe = t.find("moe");
  const MoEAxisRow* fine = r.moe_axes ? r.moe_axes->find(kHeadlineMoE) : nullptr;
  const MoEAxisRow* topk = r.moe_axes ? r.moe_axes->find("moe_compute") : nullptr;
  const MoEAxisRow* relu_row = r.moe_axes ? r.moe_axes->find("relu") : nullptr;
  if (!moe && !r.moe_axes) {  // a run without the moe variant: none of the MoE stages ran
    md += fmt::format(
        "4. **Dense → MoE: each token uses a few of many experts**: more parameters held, the "
        "same or fewer used per token. Not trained in this run (`{}` trains it).\n\n",
        full_study_call(st.options));
    return md;
  }
  md += fmt::format(
      "4. **Dense → MoE: each token uses a few of many experts** ({}): more parameters held, "
      "the same or fewer used per token. At equal total parameters (a token runs {} of the "
      "FFN's) "
      "MoE is {}. At ReLU's compute per token, with {} the LM's parameters, the fine-grained "
      "MoE with a shared expert is {}.{}\n\n",
      sec.ref("moe_axes"),
      r.moe_axes && r.moe_axes->find("moe")
          ? percent(static_cast<double>(r.moe_axes->find("moe")->ffn_active) /
                    static_cast<double>(r.moe_axes->find("moe")->ffn_params))
          : "a fraction",
      measured(moe, st.options),
      fine && relu_row ? fmt::format("{:.1f}×", static_cast<double>(fine->params) /
                                                    static_cast<double>(relu_row->params))
                       : "more",
      fine ? measured(&fine->outcome, st.options) : "not trained in this run",
      topk ? fmt::format(" 8 experts with top-2 at the same compute is {}.",
                         measured(&topk->outcome, st.options))
           : fmt::format(" 8 experts with top-2 at the same compute trains with `{}`.",
                         full_study_call(st.options)));
  return md;
}

// The tutorial's three dimensions, one row per variant.
std::string dimensions_markdown(const Study& st) {
  const TrainingResult& t = *st.results.training;
  struct Place {
    const char* variant;
    const char* activation;
    const char* paths;
    const char* sparsity;
  };
  static const Place kPlaces[] = {
      {"relu", "fixed: max(0, x)", "one", "dense; exact zeros for negative inputs"},
      {"gelu", "fixed: x·Φ(x)", "one", "dense"},
      {"glu", "learned gate: σ(xW) ⊙ xV", "two (gate, value)", "dense"},
      {"bilinear", "learned gate, no activation: xW ⊙ xV", "two", "dense"},
      {"reglu", "learned gate: ReLU(xW) ⊙ xV", "two", "dense; exact zeros from the gate"},
      {"geglu", "learned gate: GELU(xW) ⊙ xV", "two", "dense"},
      {"swiglu", "learned gate: Swish(xW) ⊙ xV", "two", "dense"},
      {"gated", "learned gates, one per branch", "several (4 gated branches, summed)", "dense"},
      {"moe", "fixed (ReLU experts)", "several experts, chosen per token",
       "sparse: the top-2 of 8 experts per token"},
  };
  std::vector<std::vector<std::string>> rows;
  for (const Place& p : kPlaces)
    if (const VariantOutcome* o = t.find(p.variant))
      rows.push_back({p.variant, p.activation, p.paths, p.sparsity,
                      o->verdict == Verdict::reference ? "reference" : verdict_cell(*o)});
  std::string md =
      "**The three dimensions.** The tutorial orders the variants along three axes: how the "
      "activation is chosen (a fixed function, or a gate learned from the input), how many "
      "paths a token's hidden values take (one, or several combined), and how much of the layer "
      "a token uses (all of it, or a routed part). Every variant of this run on them, with its "
      "verdict against ReLU:\n\n";
  md += markdown_table(
      {"variant", "activation", "paths", "parameters a token uses", "this run, against ReLU"}, rows,
      "lllll");
  return md + "\n";
}

// "geglu (not separable from reglu, swiglu)": the candidates these seeds cannot tell from the
// pick, whatever they are against ReLU.
std::string with_ties(const std::string& pick, const std::vector<std::string>& tied) {
  return tied.empty() ? pick
                      : fmt::format("{} (not separable from {})", pick, fmt::join(tied, ", "));
}

std::string choice_markdown(const Study& st, const Sections& sec) {
  const Results& r = st.results;
  // The tutorial's advice tables (by model size, by task, by compute budget), quoted where a
  // row has one, beside what this run supports.
  constexpr const char* kTutorialBudget =
      "by compute budget: constrained (mobile) ReLU, compact (edge) GELU, ample (server) GLU or "
      "gated, ample (GPU cluster) MoE";
  std::vector<std::vector<std::string>> rows;
  if (const auto& c = r.recommendations) {
    rows.push_back(
        {"a fixed parameter (memory) budget, quality first", "—",
         c->best_at_equal_parameters
             ? with_ties(*c->best_at_equal_parameters, c->best_at_equal_parameters_tied)
             : "ReLU (nothing measurably better)",
         "the summary's equal-parameter verdicts, rule 1 of " + sec.ref("recommendations")});
    rows.push_back(
        {"a fixed compute budget per token", kTutorialBudget,
         c->best_per_flop ? with_ties(*c->best_per_flop, c->best_per_flop_tied) : "not decided",
         "FLOPs per token from " + sec.ref("costs") + ", rule 2"});
    rows.push_back(
        {"training throughput on this machine", "—",
         c->best_per_second.empty() ? "undecided (noisy or overlapping throughput)"
                                    : c->best_per_second,
         "tokens per second as a ratio to ReLU's, rule 3 of " + sec.ref("recommendations")});
    if (c->moe && c->moe->at_equal_compute) {
      const VariantOutcome& o = *c->moe->at_equal_compute;
      rows.push_back(
          {"memory to spare, compute fixed (MoE's case)",
           "MoE \"at extreme scale\" and above 100B parameters",
           o.verdict == Verdict::better ? "MoE at equal compute, " + c->moe->at_equal_compute_design
           : o.verdict == Verdict::worse ? "the dense FFN (MoE at equal compute, " +
                                               c->moe->at_equal_compute_design + ", was worse here)"
           : o.verdict == Verdict::equivalent
               ? "either: MoE at equal compute (" + c->moe->at_equal_compute_design +
                     ") was as good as the dense FFN here, within the margin"
               : std::string("not decided by these seeds"),
           "MoE at equal compute, " + sec.ref("moe_axes")});
    }
  }
  // The size and task rows: measured where the scaling stage ran them, else said unmeasured.
  const std::vector<std::vector<std::string>> measured = scaling_choice_rows(st, sec);
  auto measured_row = [&](std::string_view situation) -> const std::vector<std::string>* {
    for (const auto& row : measured)
      if (row.front() == situation) return &row;
    return nullptr;
  };
  if (const auto* row = measured_row("model size")) {
    rows.push_back(*row);
  } else {
    rows.push_back(
        {"model size",
         "below 100M ReLU or GELU, 100M–1B GELU, 1B–10B GELU or GLU, 10B–100B GLU or gated, "
         "above 100B MoE",
         "not measured: one size (`--sizes` trains a ladder)",
         fmt::format("one LM ({}); the real models ({}) since PaLM (2022) chose SwiGLU from 7B up, "
                     "GPT-3 before them a plain GELU FFN",
                     sec.ref("limitations"), sec.ref("zoo"))});
  }
  if (const auto* row = measured_row("task")) {
    rows.push_back(*row);
  } else {
    rows.push_back({"task",
                    "classification ReLU, NLU and generation GELU, multi-task gated, extreme "
                    "scale MoE",
                    "not measured: one task (`--tasks causal,masked` adds the masked objective)",
                    "next-byte prediction on one corpus; the tutorial measures no task "
                    "either"});
  }
  std::string md =
      "**Choosing by situation.** The tutorial's advice beside what this run supports, and "
      "what it cannot tell you:\n\n";
  md += markdown_table({"situation", "the tutorial says", "this run's choice", "rests on"}, rows,
                       "llll");
  return md + "\n";
}

}  // namespace

// What the tutorial covers beside its walk, which this run explains but does not measure.
std::string beyond_markdown() {
  return "**Why up-project, then down-project.** The FFN widens each token to d_ff hidden "
         "units (4·d_model in the tutorial), applies the nonlinearity there, and projects back. "
         "Each hidden unit is a feature the activation switches on or off, so the width holds "
         "the layer's capacity while the residual stream stays narrow. `ffnlab evolve --sweep` "
         "measures validation as d_ff / d_model grows.\n\n"
         "**ChatGLM's fused layout.** ChatGLM stores a GLU's gate and value projections as one "
         "[2·d_ff, d_model] matrix (`dense_h_to_4h`, the gate half first) and splits the "
         "product: LLaMA's separate `gate_proj` and `up_proj` in one matrix product. ffnlab runs "
         "both layouts (`ffnlab run` with a ChatGLM config.json) and matches PyTorch on each.\n\n"
         "**MoE in production and fine-tuning (from the literature, not measured here).** An "
         "MoE holds every expert in memory though a token uses few, and decoding a small batch "
         "reads every expert some token chose. Expert parallelism adds an all-to-all exchange "
         "per layer; capacity limits drop tokens under uneven load. Fine-tuned on small data, "
         "sparse models overfit more readily than dense ones and prefer smaller batches and "
         "higher learning rates (ST-MoE, Zoph et al. 2022); the balancing loss stays on, or the "
         "router may collapse onto a few experts.\n\n";
}

std::string evolution_markdown(const Study& st, const Sections& sec) {
  if (!st.results.training) return "";
  return steps_markdown(st, sec) + beyond_markdown() + choice_markdown(st, sec) +
         std::string(kDetails) + dimensions_markdown(st);
}

}  // namespace ffnlab::study
