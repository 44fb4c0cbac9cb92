// The stage table (stages.hpp) and the section numbers it gives the report.
#include "ffnlab/study/stages.hpp"

#include <fmt/format.h>

#include "check.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

namespace {

std::int64_t none(const Study&) {
  return 0;
}
void nothing(Study&) {}
json no_json(const Results&) {
  return nullptr;
}

}  // namespace

const std::vector<Stage>& stages() {
  static const std::vector<Stage> table{
      // The answer first: every comparison with ReLU in one table, from the stages below.
      {"summary", "Summary", false, none, nothing, no_json, summary_markdown, {}},
      // Unnumbered: its paragraph goes to the appendix (kDetails).
      {"data", "Data", false, none, nothing, data_json, data_markdown, {}},
      {"costs", "Costs", true, none, run_costs, costs_json, costs_markdown, {}},
      {"equal_budget",
       "Equal budgets",
       true,
       none,
       run_equal_budget,
       equal_budget_json,
       equal_budget_markdown,
       {}},
      {"speed",
       "Speed",
       true,
       none,
       run_speed,
       speed_json,
       speed_markdown,
       {{"ffn_performance_comparison", draw_ffn_performance,
         "parameters, active parameters and FLOPs per token as multiples of ReLU's; training "
         "memory; growth with d_model (ReLU's line lies under SwiGLU's: they are matched in "
         "parameters); measured forward+backward speed as a share of the bare matrix products "
         "of the same shapes (the median of alternating rounds; rows the speed table flags as "
         "noisy are left out, unnamed)"}}},
      {"toy", "Training dynamics", true, none, run_toy, toy_json, toy_markdown, {}},
      {"training",
       "",
       true,
       training_steps,
       run_training,
       training_json,
       training_markdown,
       {{"training_dynamics", draw_training_dynamics,
         "validation at the periodic evaluations, on a part of the validation data (so its last "
         "values differ from the tables'), and training loss in bits per byte from a tenth of "
         "the steps on, each the mean over the variant's seeds with a min-to-max band; the "
         "gradient norm (mean over seeds); the tutorial's toy run"}}},
      {"sparsity",
       "Activation sparsity",
       true,
       none,
       run_sparsity,
       sparsity_json,
       sparsity_markdown,
       {{"activation_comparison", draw_activation_comparison,
         "each activation (tanh and sigmoid too, as the tutorial compares them) and its "
         "derivative as ffnlab computes them; GELU's tanh and sigmoid approximations minus exact "
         "GELU, which the first panel cannot tell apart; last, the tutorial's dead-neuron "
         "number for what it is, the share of hidden values exactly 0 at initialisation, beside "
         "the dead units after training"},
        {"activation_sparsity", draw_activation_sparsity,
         "per variant, the share of hidden units (every layer, after training) by how often "
         "they are non-zero over the census tokens; the red bar on the left is the dead units, "
         "which only ReLU-gated kinds can have. A variant with no dead unit and over 99 % of its "
         "units non-zero on more than 95 % of the tokens (a smooth gate) gets no panel; the "
         "title names it"}}},
      {"moe",
       "MoE behaviour",
       true,
       moe_steps,
       run_moe,
       moe_json,
       moe_markdown,
       {{"moe_expert_load", draw_moe_expert_load,
         "each expert's share of the assignments over training, for the three balancing settings "
         "(rows) in every layer (columns), all on one y range: where a setting keeps the lines "
         "near the dashed 1/E and where one expert takes over"},
        {"moe_specialisation", draw_moe_specialisation,
         "which bytes each expert takes in seed 1's trained MoE LM, per layer: red where an "
         "expert takes a class more often than the data has it, blue where less, grey where "
         "never (an expert no token reached is a grey row); the panel titles give the mutual "
         "information between expert and byte class"}}},
      {"moe_axes",
       "MoE at equal compute",
       true,
       moe_axes_steps,
       run_moe_axes,
       moe_axes_json,
       moe_axes_markdown,
       {{"moe_pareto", draw_moe_pareto,
         "each FFN's validation minus ReLU's, paired by seed, with the interval its verdict rests "
         "on (a bar wholly below the dashed line at 0 is better than ReLU, wholly above it "
         "worse), against the LM's parameters (left) and its forward FLOPs per token (right): the "
         "dense variants have about ReLU's parameters (points of one cost are drawn side by side), "
         "and MoE at equal compute moves right in the first panel only"}}},
      {"routing",
       "Routing families",
       true,
       routing_steps,
       run_routing,
       routing_json,
       routing_markdown,
       {{"routing_families", draw_routing_families,
         "validation against the LM's forward FLOPs per token at the experts a token actually "
         "ran, per routing family (the mean over seeds, ± one standard deviation when there are "
         "several); with --full, the masked objective in a second panel. The grey band around "
         "top-k is ± one standard deviation of a single seed's paired difference (the run's "
         "comparisons with ReLU, pooled): a family inside it differs from top-k by less than one "
         "seed's luck, and one seed alone never tells a family apart"}}},
      // Unnumbered, like the sweep: it runs only with --sizes or --tasks, and the sections
      // after it keep their numbers either way.
      {"scaling",
       "Across model sizes and tasks",
       false,
       scaling_steps,
       run_scaling,
       scaling_json,
       scaling_markdown,
       {{"scaling", draw_scaling,
         "validation against the training compute of a run (log scale), one line per variant "
         "across the sizes of the ladder, one panel per task: where a variant's line falls "
         "away from ReLU's as compute grows, its lead grows with size"}}},
      {"evolution",
       "The evolution, step by step, in this run's numbers",
       true,
       none,
       nothing,
       no_json,
       evolution_markdown,
       {}},
      {"literature",
       "The literature: the GLU variants in Shazeer 2020",
       true,
       none,
       run_literature,
       literature_json,
       literature_markdown,
       {}},
      {"sweep",
       "Sweep: why up-project, activate, down-project",
       false,
       sweep_steps,
       run_sweep,
       sweep_json,
       sweep_markdown,
       {{"sweep", draw_sweep,
         "validation of ReLU and SwiGLU (at ReLU's parameters) as d_ff / d_model grows, seed 1"}}},
      {"zoo", "Real models", true, none, run_zoo, zoo_json, zoo_markdown, {}},
      {"corrections",
       "Corrections of the FFN-evolution tutorial",
       true,
       none,
       run_corrections,
       corrections_json,
       corrections_markdown,
       {}},
      {"recommendations",
       "Recommendations",
       true,
       none,
       run_recommendations,
       recommendations_json,
       recommendations_markdown,
       {}},
      {"limitations",
       "Limits of this study",
       true,
       none,
       nothing,
       no_json,
       limitations_markdown,
       {}},
      {"references", "References", false, none, nothing, no_json, references_markdown, {}},
  };
  return table;
}

Sections::Sections(const std::vector<Stage>& table) : table_(table) {}

int Sections::number(std::string_view key) const {
  int n = 0;
  for (const Stage& s : table_) {
    if (s.numbered && !s.section.empty()) ++n;
    if (s.key == key) return n;
  }
  throw Error(fmt::format("[study] no stage '{}' in the table", key));
}

std::string Sections::ref(std::string_view key) const {
  // A stage is referred to by the numbered section it is in (its own, or the one it continues).
  for (const Stage& s : table_)
    if (s.key == key && !s.numbered)
      throw Error(fmt::format("[study] stage '{}' has no numbered section to refer to", key));
  return fmt::format("section {}", number(key));
}

std::string_view Sections::title(std::string_view key) const {
  std::string_view title;
  for (const Stage& s : table_) {
    if (!s.section.empty()) title = s.section;
    if (s.key == key) return title;
  }
  throw Error(fmt::format("[study] no stage '{}' in the table", key));
}

std::string Sections::heading(std::string_view key) const {
  for (const Stage& s : table_)
    if (s.key == key) {
      if (s.section.empty()) return "";
      return s.numbered ? fmt::format("## {}. {}\n\n", number(key), s.section)
                        : fmt::format("## {}\n\n", s.section);
    }
  throw Error(fmt::format("[study] no stage '{}' in the table", key));
}

}  // namespace ffnlab::study
