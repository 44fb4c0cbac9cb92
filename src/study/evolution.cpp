// Stage "evolution": the tutorial's walk ReLU → GELU → GLU → multi-branch gated → MoE read
// through this run's numbers. Each step names what it was meant to fix or buy and what this run
// measured of it; then the three dimensions the tutorial orders the variants by, as one table;
// then which variant to choose in which situation, each pick with the rule or measurement it
// rests on, and the situations this run cannot speak to said as such. It computes nothing new:
// every number comes from the stages before it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ffnlab/report/markdown.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

namespace {

// "worse than ReLU by +0.075 [+0.05, +0.10] bits/byte", "inconclusive against ReLU (...)".
std::string measured(const VariantOutcome* o) {
  if (!o) return "not trained in this run (`ffnlab evolve --full` trains every variant)";
  switch (o->verdict) {
    case Verdict::better:
    case Verdict::worse:
      return fmt::format(
          "{} by {} bits/byte (paired over {} seeds, the sequential rule's interval)",
          verdict_text(o->verdict), difference_cell(*o), o->val_bits_per_byte.size());
    case Verdict::equivalent:
      return fmt::format("equivalent to ReLU within the margin ({} bits/byte)",
                         difference_cell(*o));
    case Verdict::reference:
      return "the reference";
    default:
      return fmt::format("not separable from ReLU by these seeds: {} bits/byte, {}",
                         difference_cell(*o), verdict_cell(*o));
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

// GELU's near-dead units against ReLU's: the like-for-like comparison, since GELU is never
// exactly 0 and so has no dead units by definition.
std::string near_dead_comparison(const SparsityResult* s) {
  std::int64_t relu_units = 0, gelu_units = 0;
  const std::int64_t relu = unit_count(s, "relu", &LayerSparsity::near_dead_trained, &relu_units);
  const std::int64_t gelu = unit_count(s, "gelu", &LayerSparsity::near_dead_trained, &gelu_units);
  if (relu < 0 || gelu < 0 || relu_units == 0 || gelu_units == 0) return "";
  const double r = static_cast<double>(relu) / static_cast<double>(relu_units);
  const double g = static_cast<double>(gelu) / static_cast<double>(gelu_units);
  return g < r   ? ", a smaller share than ReLU's"
         : g > r ? ", a larger share than ReLU's"
                 : ", the same share as ReLU's";
}

std::string steps_markdown(const Study& st, const Sections& sec) {
  const Results& r = st.results;
  const TrainingResult& t = *r.training;
  const SparsityResult* s = r.sparsity ? &*r.sparsity : nullptr;
  const VariantOutcome* relu = t.find("relu");
  std::string md = fmt::format(
      "Each step of the tutorial's walk, what it was meant to change, and what this run "
      "measured of it. Verdicts are against ReLU at equal parameters, paired over seeds "
      "({}); \"not separable\" means these seeds cannot decide, not that the two are alike.\n\n",
      sec.ref("training"));
  md += fmt::format(
      "1. **ReLU → GELU: a smooth activation instead of a hard zero.** ReLU's price is units "
      "that stop learning: after training, {} of ReLU's hidden units are dead (zero on every "
      "census token) and {} near-dead (0 or |h| < {}·rms(h) on every census token; {}, "
      "activation_sparsity.png). GELU is never exactly 0, so it has no dead units by "
      "definition; what compares with ReLU's is its near-dead units: {}{}. What the smoothness "
      "bought here: GELU is {}.\n",
      units_text(s, "relu", &LayerSparsity::dead_trained),
      units_text(s, "relu", &LayerSparsity::near_dead_trained), kNearZeroRelative,
      sec.ref("sparsity"), units_text(s, "gelu", &LayerSparsity::near_dead_trained),
      near_dead_comparison(s), measured(t.find("gelu")));
  const VariantOutcome* swiglu = t.find("swiglu");
  // The GLU family by gate; the members this run did not train are named once, together.
  struct Gate {
    const char* variant;
    const char* gate;
  };
  static const Gate kGates[] = {{"reglu", "a ReLU gate"},
                                {"geglu", "a GELU gate"},
                                {"swiglu", "a Swish gate"},
                                {"glu", "the original GLU's sigmoid gate"},
                                {"bilinear", "no activation at all (bilinear)"}};
  std::string family;
  std::vector<std::string> untrained;
  for (const Gate& g : kGates) {
    if (const VariantOutcome* o = t.find(g.variant))
      family += fmt::format(" With {}, {} is {}.", g.gate, g.variant, measured(o));
    else
      untrained.push_back(g.variant);
  }
  if (!untrained.empty())
    family += fmt::format(
        " Not trained in this run: {} (`ffnlab evolve --full` trains the whole "
        "family).",
        fmt::join(untrained, ", "));
  md += fmt::format(
      "2. **GELU → GLU: a gate computed from the input.** The hidden value becomes act(xW) ⊙ xV: "
      "a second projection decides, per token and unit, how much passes. At equal parameters "
      "the gate costs width ({} hidden units instead of ReLU's {}).{}\n",
      swiglu ? std::to_string(swiglu->d_ff) : "?", relu ? std::to_string(relu->d_ff) : "?", family);
  const CostRow* gated_cost = r.costs ? r.costs->tutorial_row("gated") : nullptr;
  const CostRow* relu_cost = r.costs ? r.costs->tutorial_row("relu") : nullptr;
  md += fmt::format(
      "3. **GLU → the multi-branch gated FFN: several gated paths summed.** At the tutorial's "
      "configuration it costs {} ReLU's parameters and forward FLOPs ({}); at equal parameters "
      "its branches share ReLU's budget, and it is {}. {}\n",
      gated_cost && relu_cost
          ? fmt::format("{:.2f}×", static_cast<double>(gated_cost->cost.params) /
                                       static_cast<double>(relu_cost->cost.params))
          : "several times",
      sec.ref("costs"), measured(t.find("gated")),
      t.find("gated") && t.find("gated")->verdict == Verdict::better
          ? "Here the split paid, so this run does not explain why the field left it aside."
          : "That it did not become mainstream fits these numbers: it is a GLU whose budget is "
            "split over more, narrower paths, and the split bought nothing measurable here (a "
            "reading of this run, not a measurement of why the field chose).");
  const VariantOutcome* moe = t.find("moe");
  const MoEAxisRow* fine = r.moe_axes ? r.moe_axes->find(kHeadlineMoE) : nullptr;
  const MoEAxisRow* topk = r.moe_axes ? r.moe_axes->find("moe_compute") : nullptr;
  const MoEAxisRow* relu_row = r.moe_axes ? r.moe_axes->find("relu") : nullptr;
  md += fmt::format(
      "4. **Dense → MoE: each token uses a few of many experts** ({}). MoE trades memory for "
      "compute: more parameters held, the same or fewer used per token. At equal total "
      "parameters (a token runs {} of the FFN's parameters) the MoE LM is {}. At ReLU's "
      "compute per token, with {} the LM's parameters, the fine-grained MoE with a shared "
      "expert (16 experts, top-3, 1 shared) is {}. {}\n\n",
      sec.ref("moe_axes"),
      r.moe_axes && r.moe_axes->find("moe")
          ? percent(static_cast<double>(r.moe_axes->find("moe")->ffn_active) /
                    static_cast<double>(r.moe_axes->find("moe")->ffn_params))
          : "a fraction",
      measured(moe),
      fine && relu_row ? fmt::format("{:.1f}×", static_cast<double>(fine->params) /
                                                    static_cast<double>(relu_row->params))
                       : "more",
      fine ? measured(&fine->outcome) : "not trained in this run",
      topk
          ? fmt::format("8 experts with top-2 at the same compute is {}.", measured(&topk->outcome))
          : "8 experts with top-2 at the same compute trains with `ffnlab evolve --full`.");
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

// "geglu (tied with reglu, swiglu)".
std::string with_ties(const std::string& pick, const std::vector<std::string>& tied) {
  return tied.empty() ? pick : fmt::format("{} (tied with {})", pick, fmt::join(tied, ", "));
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
    rows.push_back({"a fixed parameter (memory) budget, quality first", "—",
                    c->best_at_equal_parameters
                        ? with_ties(*c->best_at_equal_parameters, c->best_at_equal_parameters_tied)
                        : "ReLU (nothing measurably better)",
                    "the equal-parameter verdicts (" + sec.ref("training") + "), rule 1 of " +
                        sec.ref("recommendations")});
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
         fmt::format("this run trains one LM ({}); the real models of {} show what the field "
                     "chose at each size (SwiGLU from 7B down, not GELU), evidence of another "
                     "kind",
                     sec.ref("limitations"), sec.ref("zoo"))});
  }
  if (const auto* row = measured_row("task")) {
    rows.push_back(*row);
  } else {
    rows.push_back({"task",
                    "classification ReLU, NLU and generation GELU, multi-task gated, extreme "
                    "scale MoE",
                    "not measured: one task (`--tasks causal,masked` adds the masked objective)",
                    "byte-level language modelling on one corpus; nothing here says how a "
                    "variant fares on another task, and the tutorial gives no measurement "
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
         "The width is where the layer's capacity lives: each hidden unit is a direction the "
         "activation can switch on or off, so more units give more separately gated features "
         "for the same d_model, while the residual stream stays narrow. `ffnlab evolve --sweep` "
         "measures validation as d_ff / d_model grows.\n\n"
         "**ChatGLM's fused layout.** ChatGLM stores a GLU's gate and value projections as one "
         "[2·d_ff, d_model] matrix (`dense_h_to_4h`, the gate half first) and splits the "
         "product's output; the result is the same as LLaMA's separate `gate_proj` and "
         "`up_proj`, from one matrix product that reads the input once. ffnlab runs both layouts "
         "(`ffnlab run` with a ChatGLM config.json) and matches PyTorch on each.\n\n"
         "**MoE in production and fine-tuning (from the literature, not measured here).** Every "
         "expert must be in memory although a token uses few, so an MoE serves from more memory "
         "than a dense model of its compute, and decoding a small batch reads the weights of "
         "every expert some token chose. Expert parallelism adds an all-to-all exchange per "
         "layer, and capacity limits drop tokens under uneven load. Fine-tuned on small data, "
         "sparse models overfit more readily than dense ones and prefer other settings (ST-MoE, "
         "Zoph et al. 2022, reports smaller batches and higher learning rates); the balancing "
         "loss stays on, or the router may collapse onto a few experts.\n\n";
}

std::string evolution_markdown(const Study& st, const Sections& sec) {
  if (!st.results.training) return "";
  return steps_markdown(st, sec) + beyond_markdown() + choice_markdown(st, sec) +
         std::string(kDetails) + dimensions_markdown(st);
}

}  // namespace ffnlab::study
