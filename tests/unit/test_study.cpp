// The study layer: its stage table and section numbers, equal-budget widths, the statistics
// helpers, and recommendations read from typed results.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <boost/math/distributions/students_t.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <variant>

#include "../common/test_util.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/failure.hpp"
#include "ffnlab/interrupt.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/report/markdown.hpp"
#include "ffnlab/report/staged_dir.hpp"
#include "ffnlab/study/stages.hpp"
#include "ffnlab/study/study.hpp"
#include "ffnlab/study/zoo_table.hpp"
// The stages' functions (an internal header of the library) for the comparisons' outcomes.
#include "../../src/study/stage_functions.hpp"
#include "thread_group.hpp"

namespace ffnlab {
namespace {

using study::Stage;
using study::stages;

using test::ScratchDir;

const Stage& stage(std::string_view key) {
  for (const Stage& s : stages())
    if (s.key == key) return s;
  throw std::runtime_error("no stage " + std::string(key));
}

TEST(StudyStages, KeysAndFiguresAreUniqueAndSectionsNumberedInOrder) {
  std::set<std::string_view> keys, figures;
  int expected = 1;
  const study::Sections sec(stages());
  for (const Stage& s : stages()) {
    EXPECT_TRUE(keys.insert(s.key).second) << s.key;
    for (const auto& f : s.figures) EXPECT_TRUE(figures.insert(f.name).second) << f.name;
    ASSERT_TRUE(s.run && s.to_json && s.markdown && s.planned_steps) << s.key;
    if (s.numbered && !s.section.empty()) {
      EXPECT_EQ(sec.number(s.key), expected) << s.key;
      EXPECT_EQ(sec.heading(s.key),
                "## " + std::to_string(expected) + ". " + std::string(s.section) + "\n\n");
      ++expected;
    }
  }
  // The summary comes first; the data's paragraph is in the appendix, so Costs is section 1.
  EXPECT_EQ(stages().front().key, "summary");
  EXPECT_THROW(sec.ref("data"), Error);
  EXPECT_EQ(sec.ref("costs"), "section 1");
  EXPECT_EQ(sec.title("training"), "Training dynamics");
  // A stage without a section of its own is in the section before it.
  EXPECT_EQ(stage("training").section, "");
  EXPECT_EQ(sec.ref("training"), sec.ref("toy"));
  EXPECT_EQ(sec.heading("training"), "");
  EXPECT_THROW(sec.number("no such stage"), Error);
  EXPECT_THROW(sec.ref("sweep"), Error);  // unnumbered: nothing to refer to by number
}

TEST(StudyStages, PlanCountsTheTrainingStepsOfTheStagesThatRun) {
  study::Study st;
  st.options.quick = true;
  st.options.variants = {"relu", "swiglu"};
  st.scale = study::make_scale(st.options);
  std::int64_t planned = 0;
  for (const Stage& s : stages()) planned += s.planned_steps(st);
  // At most: every comparison to the sequential design's cap; no MoE, no sweep.
  const std::int64_t n = st.scale.train.steps, cap = st.scale.design.cap, s = st.scale.seeds;
  EXPECT_GT(cap, s);
  EXPECT_EQ(planned, 2 * cap * n);
  st.options.variants.push_back("moe");
  st.options.sweep = true;
  planned = 0;
  for (const Stage& s : stages()) planned += s.planned_steps(st);
  // training 3 variants to the cap; MoE: 3 balancing runs of half the steps; MoE at equal
  // compute, fine-grained, to the cap; the routing families: a causal run a seed of each that
  // decides per token but top-k (the moe_axes stage's), one seed by default; the sweep: 8 runs.
  const auto names = routing_family_names();
  const auto families = static_cast<std::int64_t>(names.size());
  std::int64_t causal = -1;  // (top-k's causal runs are another stage's)
  for (const auto& name : names)
    causal += !looks_at_whole_sequence(
        routing_family_config(variant_config("moe", 16, 32, true), name, 8).moe.routing);
  EXPECT_EQ(st.scale.routing_seeds, 1);
  EXPECT_EQ(planned, 3 * cap * n + 3 * (n / 2) + cap * n + causal * n + 8 * n);
  // --full adds the z-loss ablation over the seeds and MoE with top-2 at equal compute, and
  // trains the routing families over the seeds, on the masked objective too (every family).
  st.options.full = true;
  st.scale = study::make_scale(st.options);
  EXPECT_EQ(st.scale.routing_seeds, st.scale.seeds);
  planned = 0;
  for (const Stage& s : stages()) planned += s.planned_steps(st);
  EXPECT_EQ(planned, 3 * cap * n + (3 * (n / 2) + cap * n) + 2 * cap * n +
                         (causal + families) * s * n + 8 * n);
}

TEST(StudyStages, TheDefaultVariantsTakeOneStepOfTheEvolutionEachAndFullTakesThemAll) {
  EXPECT_EQ(study::default_variants(),
            (std::vector<std::string>{"relu", "gelu", "glu", "swiglu", "gated", "moe"}));
  EXPECT_EQ(study::default_variants(true), variant_names());
}

// Every table and ratio of the report is against the first variant: ReLU comes first whatever
// the order given (--variants gelu,relu would otherwise give every "÷ ReLU" column against GELU).
TEST(StudyStages, TheStudyTrainsReLUFirstWhateverTheOrderGiven) {
  study::Options o;
  o.variants = {"gelu", "moe", "relu", "swiglu"};
  EXPECT_EQ(study::study_variants(o), (std::vector<std::string>{"relu", "gelu", "moe", "swiglu"}));
  o.variants = {};
  EXPECT_EQ(study::study_variants(o), study::default_variants());
  o.full = true;
  EXPECT_EQ(study::study_variants(o).front(), "relu");
}

// The narrowest multiple of 8 whose parameters are closest to the target, by search.
std::int64_t searched_width(FFNConfig c, std::int64_t target, bool active) {
  std::int64_t best = 8;
  double gap = 1e300;
  for (std::int64_t f = 8; f <= 64 * c.d_model; f += 8) {
    (c.kind == FFNKind::moe ? c.moe.expert_d_ff : c.d_ff) = f;
    const FFNCost k = ffn_cost(c, 1);
    const double g = std::abs(static_cast<double>((active ? k.active_params : k.params) - target));
    if (g < gap) gap = g, best = f;
  }
  return best;
}

TEST(EqualBudget, MatchParamsFindsTheClosestWidthOfEveryVariant) {
  for (const std::int64_t D : {16, 64, 96, 200, 512})
    for (const auto& v : variant_names())
      for (const bool bias : {true, false})
        for (const bool active : {false, true}) {
          const FFNConfig c = variant_config(v, D, 4 * D, bias);
          const std::int64_t target = count_params(variant_config("relu", D, 4 * D, bias));
          const FFNConfig m = match_params(c, target, active);
          const std::int64_t got = c.kind == FFNKind::moe ? m.moe.expert_d_ff : m.d_ff;
          EXPECT_EQ(got, searched_width(c, target, active))
              << v << " D " << D << " bias " << bias << " active " << active;
        }
}

TEST(EqualBudget, DefaultWidthIsFourDOrReLUsParametersForTheGLUKinds) {
  EXPECT_EQ(default_d_ff(variant_config("relu", 128, 1, true)), 512);
  EXPECT_EQ(default_d_ff(variant_config("gated", 128, 1, true)), 512);
  EXPECT_EQ(default_d_ff(variant_config("moe", 128, 1, true)), 512);
  // 128: ReLU has 131,712 parameters; SwiGLU 386·F + 128 is closest at F = 344 (about 8/3·D).
  EXPECT_EQ(default_d_ff(variant_config("swiglu", 128, 1, true)), 344);
  // 256: 680 (523,856 against ReLU's 525,568), not 8/3·D rounded up (688: 530,016).
  EXPECT_EQ(default_d_ff(variant_config("swiglu", 256, 1, true)), 680);
  EXPECT_EQ(default_d_ff(variant_config("swiglu", 4096, 1, false)), 10920);
  // The sweep's SwiGLU widths at d_model 128 for d_ff / d_model = 1, 2, 4, 8 (docs/evolve.md);
  // 8/3·D rounded up gave 88, 176, 344, 688.
  std::vector<std::int64_t> sweep;
  for (const std::int64_t r : {1, 2, 4, 8})
    sweep.push_back(match_params(variant_config("swiglu", 128, r * 128, true),
                                 count_params(variant_config("relu", 128, r * 128, true)))
                        .d_ff);
  EXPECT_EQ(sweep, (std::vector<std::int64_t>{88, 168, 344, 680}));
}

// Each cost table's memory columns are for a stated batch, and the number printed is for the
// batch stated: the tutorial's 8 tokens, the study's training batch of batch × seq tokens.
TEST(StudyCosts, EachTableSaysTheTokensItsMemoryIsFor) {
  const ScratchDir scratch("costs");
  study::Study st;
  st.dir = scratch.path.string();
  st.options.variants = {"relu", "moe"};
  st.scale = study::make_scale(st.options);
  stage("costs").run(st);
  const study::CostsResult& c = *st.results.costs;
  const std::int64_t tokens = st.scale.train.batch * st.scale.train.seq;
  ASSERT_EQ(c.study_tokens, tokens);
  ASSERT_EQ(c.tutorial_tokens, 8);
  const std::string md = stage("costs").markdown(st, study::Sections(stages()));
  EXPECT_NE(md.find(fmt::format("memory for one training batch of {} tokens, {} sequences of {})",
                                thousands(tokens), st.scale.train.batch, st.scale.train.seq)),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("saved for backward, for the tutorial's 8 tokens."), std::string::npos) << md;
  EXPECT_NE(md.find("its training memory for 8 tokens:"), std::string::npos) << md;
  EXPECT_EQ(md.find("the tutorial's batch of 8 tokens.\n"), std::string::npos) << md;
  // The study table's activations are those of `tokens` tokens, not of 8.
  const study::CostRow* relu = c.study_row("relu");
  ASSERT_NE(relu, nullptr);
  EXPECT_EQ(relu->cost.f32.activations, ffn_cost(relu->config, tokens).f32.activations);
  EXPECT_GT(relu->cost.f32.activations, ffn_cost(relu->config, 8).f32.activations);
}

TEST(Stats, MeanStandardDeviationsAndMedian) {
  const std::vector<double> v{2, 4, 4, 4, 5, 5, 7, 9};
  EXPECT_DOUBLE_EQ(mean(v), 5.0);
  EXPECT_DOUBLE_EQ(population_std(v), 2.0);
  EXPECT_DOUBLE_EQ(sample_std(v), std::sqrt(32.0 / 7.0));
  EXPECT_EQ(sample_std(std::vector<double>{3.0}), 0.0);
  EXPECT_TRUE(std::isnan(mean(std::vector<double>{})));
  EXPECT_EQ(median({3, 1, 2}), 2.0);
  EXPECT_EQ(median({4, 1, 3, 2}), 3.0);  // the upper of the two middle values: one measured
  EXPECT_TRUE(std::isnan(median({})));
  // The interquartile spread: one disturbed round on either side barely moves it; max − min
  // over the median would be 0.5 here.
  EXPECT_DOUBLE_EQ(interquartile_spread({1.0, 0.98, 1.02, 1.5, 1.01, 0.99, 1.0}),
                   (1.02 - 0.99) / 1.0);
  EXPECT_DOUBLE_EQ(interquartile_spread({0.9, 1.0, 1.1}), (1.1 - 0.9) / 1.0);  // n/4 = 0: all
  EXPECT_EQ(interquartile_spread({2.0}), 0.0);
}

TEST(CostJson, OneSchemaForEveryWriter) {
  const nlohmann::ordered_json j = to_json(ffn_cost(variant_config("swiglu", 64, 176, false), 8));
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"params", "active_params", "flops_per_token",
                                            "saved_floats_per_token", "memory_bytes"}));
  EXPECT_EQ(j["params"], 3 * 64 * 176);
  EXPECT_EQ(j["flops_per_token"]["forward_matmul"], 2.0 * 3 * 64 * 176);
  EXPECT_TRUE(j["memory_bytes"]["bf16"].contains("total"));
}

study::VariantOutcome outcome(std::string v, double mean, study::Verdict verdict, double tps) {
  study::VariantOutcome o;
  o.variant = std::move(v);
  o.mean = mean;
  o.val_bits_per_byte = {mean - 0.01, mean + 0.01, mean};  // paired differences: constant
  o.verdict = verdict;
  o.tokens_per_second = tps;
  o.tokens_per_second_over_relu = tps / 100.0;  // ReLU runs at 100 tokens/s in these tests
  o.tokens_per_second_ratio_low = o.tokens_per_second_ratio_high = tps / 100.0;
  o.diff_mean = mean - 3.00;  // ReLU's mean in these tests
  return o;
}

// The costs stage's study table for `variants` at d_model 128 (what the recommendations read).
study::CostsResult study_costs(const std::vector<std::string>& variants) {
  study::CostsResult costs;
  for (const auto& v : variants)
    costs.study.push_back({v, study::study_ffn(v, 128), ffn_cost(study::study_ffn(v, 128), 1)});
  return costs;
}

// One wording for every comparison: results.json's verdicts against ReLU (docs/schemas.md) and
// the routing stage's against top-k differ only in what they compare with.
TEST(Verdicts, OneWordingWhateverTheReference) {
  using study::Verdict;
  EXPECT_EQ(study::verdict_text(Verdict::better), "better than ReLU");
  EXPECT_EQ(study::verdict_text(Verdict::worse, "top-k"), "worse than top-k");
  EXPECT_EQ(study::verdict_text(Verdict::equivalent), "equivalent to ReLU within the margin");
  EXPECT_EQ(study::verdict_text(Verdict::equivalent, "top-k"),
            "equivalent to top-k within the margin");
  for (const char* reference : {"ReLU", "top-k"}) {
    EXPECT_EQ(study::verdict_text(Verdict::inconclusive, reference), "inconclusive");
    EXPECT_EQ(study::verdict_text(Verdict::one_seed, reference),
              "one seed: no spread to compare with");
    EXPECT_EQ(study::verdict_text(Verdict::reference, reference), "reference");
  }
}

// The recommendations stage reads verdicts, costs and speeds from the typed results.
TEST(Recommendations, FollowTheVerdictsNotTheirWording) {
  study::Study st;
  st.options.variants = {"relu", "gelu", "swiglu", "moe"};
  st.scale = study::make_scale(st.options);
  st.results.costs = study_costs(st.options.variants);
  study::TrainingResult t;
  t.margin = 0.02;
  t.variants = {outcome("relu", 3.00, study::Verdict::reference, 100),
                outcome("gelu", 3.10, study::Verdict::worse, 200),
                outcome("swiglu", 2.90, study::Verdict::better, 90),
                outcome("moe", 3.01, study::Verdict::equivalent, 120)};
  st.results.training = t;
  const Stage& rec = stage("recommendations");
  const study::Sections sec(stages());
  rec.run(st);
  nlohmann::ordered_json j = rec.to_json(st.results);
  EXPECT_EQ(j["best_at_equal_parameters"], "swiglu");
  EXPECT_EQ(j["best_per_second"], "moe");  // gelu is faster but worse
  EXPECT_EQ(j["moe_pays_off"], true);      // equivalent within the margin, and faster
  EXPECT_EQ(j["best_per_flop"], "swiglu");
  std::string md = rec.markdown(st, sec);
  EXPECT_NE(md.find("1. **Best validation at equal parameters:** swiglu"), std::string::npos) << md;
  // The per-FLOP pool takes every variant under the cap, whatever its verdict: rule 2 says so
  // rather than borrowing rule 1's "better than ReLU".
  EXPECT_NE(md.find("2. **Per FLOP:** swiglu"), std::string::npos) << md;
  EXPECT_NE(md.find("whatever its verdict"), std::string::npos) << md;
  EXPECT_NE(md.find("pays off here on cost: equivalent to the dense FFN within ±0.02"),
            std::string::npos)
      << md;

  // Inconclusive is neither good enough for a per-second pick nor a finding about MoE.
  st.results.training->variants[3].verdict = study::Verdict::inconclusive;
  rec.run(st);
  j = rec.to_json(st.results);
  EXPECT_TRUE(j["moe_pays_off"].is_null());
  EXPECT_EQ(j["best_per_second"], "relu");
  md = rec.markdown(st, sec);
  EXPECT_NE(md.find("Finding: undecided at the cap of seeds"), std::string::npos) << md;

  st.results.training->variants[3].verdict = study::Verdict::worse;
  rec.run(st);
  j = rec.to_json(st.results);
  EXPECT_EQ(j["moe_pays_off"], false);
  EXPECT_EQ(j["best_per_second"], "relu");
  st.results.training->variants[2].verdict = study::Verdict::inconclusive;
  rec.run(st);
  EXPECT_TRUE(rec.to_json(st.results)["best_at_equal_parameters"].is_null());
}

// MoE at equal compute may have gone to more looks than MoE at equal parameters: their
// comparison is over the seeds both trained, and says so in every field.
TEST(StudyComparisons, APairedOutcomeIsOverTheSeedsBothHave) {
  const std::vector<double> reference{3.10, 3.09, 3.07};
  const study::VariantOutcome o = study::paired_outcome(
      "moe_compute − moe", {3.08, 3.11, 3.08, 3.10, 3.18, 3.12}, reference, 0.02);
  EXPECT_EQ(o.val_bits_per_byte, (std::vector<double>{3.08, 3.11, 3.08}));
  EXPECT_NEAR(o.mean, (3.08 + 3.11 + 3.08) / 3, 1e-12);
  EXPECT_NEAR(o.diff_mean, (-0.02 + 0.02 + 0.01) / 3, 1e-12);
  // The shorter side may be the values: the reference's extra seeds pair with nothing.
  const study::VariantOutcome shorter = study::paired_outcome("x", {3.0, 3.1}, reference, 0.02);
  EXPECT_EQ(shorter.val_bits_per_byte.size(), 2u);
  EXPECT_NEAR(shorter.diff_mean, (-0.10 + 0.01) / 2, 1e-12);
}

// A comparison's outcome from its runs: the sequential verdict with the seeds it was decided at,
// narrow by chance against the other comparisons' spread, the verdict with the error shared
// over both comparisons, and ReLU held to the same noise test as the others.
TEST(StudyComparisons, OutcomesCarryTheSequentialFlagsAndTheReferenceNoiseTest) {
  study::Study st;
  st.options.variants = {"relu", "moe"};
  st.scale = study::make_scale(st.options);  // 3 seeds first, cap 6
  const std::vector<double> relu{3.00, 3.02, 2.99};
  auto add = [](std::vector<study::RunRecord>& runs, const std::string& label,
                const std::vector<double>& val, const std::vector<double>& tps) {
    for (std::size_t i = 0; i < val.size(); ++i) {
      study::RunRecord r;
      r.variant = label;
      r.seed = static_cast<int>(i) + 1;
      r.val_bits_per_byte = val[i];
      r.median_tokens_per_second = tps[i];
      r.matrix_gflops = 8;
      r.bare_products_gflops = 10;
      runs.push_back(r);
    }
  };
  add(st.runs, "relu", relu, {100, 100, 130});  // its runs spread by 30 %: noisy
  // moe − relu: +0.01, +0.05, +0.03 (t = 2.6: undecided at the first look, whose bound is 13.3).
  add(st.runs, "moe", {3.01, 3.07, 3.02}, {150, 150, 150});
  // The fine-grained MoE: −0.1 on every seed within 0.0001 (t ≈ 1700: decided, and far
  // narrower than the other comparison's spread of 0.02).
  add(st.axes_runs, std::string(study::kHeadlineMoE), {2.9000, 2.9199, 2.8901}, {90, 91, 89});
  st.axes_runs[1].matrix_gflops = 11;  // one run above its bare products: not measured

  const study::VariantOutcome fine =
      study::comparison_outcome(st, std::string(study::kHeadlineMoE));
  EXPECT_EQ(fine.verdict, study::Verdict::better);
  EXPECT_EQ(fine.sequential_seeds, 3);
  EXPECT_TRUE(fine.narrow_by_chance);
  EXPECT_TRUE(fine.holds_for_all_comparisons);
  EXPECT_GT(fine.level, 0.99);  // the first look's nominal level
  EXPECT_TRUE(std::isnan(fine.flop_utilisation));
  EXPECT_EQ(study::verdict_cell(fine), "better than ReLU (decided at 3 seeds); narrow by chance");

  const study::VariantOutcome moe = study::comparison_outcome(st, "moe");
  EXPECT_EQ(moe.verdict, study::Verdict::inconclusive);
  EXPECT_FALSE(moe.narrow_by_chance);
  EXPECT_FALSE(moe.holds_for_all_comparisons);
  EXPECT_GE(moe.seeds_to_decide, 4);
  EXPECT_NEAR(moe.flop_utilisation, 0.8, 1e-12);
  // Throughput: the median over seeds, ÷ ReLU's median (150 / 100); noisy, since the ratio to
  // ReLU's run of the same seed is 1.5, 1.5 and 1.15 (spread 23 %).
  EXPECT_NEAR(moe.tokens_per_second_over_relu, 1.5, 1e-12);
  EXPECT_TRUE(moe.tokens_per_second_noisy);
  EXPECT_NEAR(moe.tokens_per_second_ratio_low, 150.0 / 130.0, 1e-12);
  EXPECT_NEAR(moe.tokens_per_second_ratio_high, 1.5, 1e-12);

  const study::VariantOutcome reference = study::comparison_outcome(st, "relu");
  EXPECT_EQ(reference.verdict, study::Verdict::reference);
  EXPECT_EQ(reference.tokens_per_second_over_relu, 1.0);
  EXPECT_TRUE(reference.tokens_per_second_noisy) << "ReLU's own runs spread by 30 %";
  EXPECT_NEAR(reference.tokens_per_second_spread, 0.3, 1e-12);
}

// Two candidates that the seeds cannot separate are a tie, named as one; a separated one is not.
TEST(Recommendations, ATieIsNeverCalledTheBest) {
  study::Study st;
  st.options.variants = {"relu", "reglu", "geglu", "swiglu"};
  st.results.costs = study_costs(st.options.variants);
  study::TrainingResult t;
  t.margin = 0.02;
  t.variants = {outcome("relu", 3.00, study::Verdict::reference, 100),
                outcome("reglu", 2.9133, study::Verdict::better, 100),
                outcome("geglu", 2.91, study::Verdict::better, 100),
                outcome("swiglu", 2.99, study::Verdict::better, 100)};
  // reglu − geglu per seed: +0.01, −0.02, +0.02 (an interval around 0); swiglu − geglu: about
  // +0.08 on every seed (separated).
  t.variants[1].val_bits_per_byte = {2.91, 2.90, 2.93};
  t.variants[2].val_bits_per_byte = {2.90, 2.92, 2.91};
  t.variants[3].val_bits_per_byte = {2.99, 2.99, 2.99};
  st.results.training = t;
  const Stage& rec = stage("recommendations");
  rec.run(st);
  const nlohmann::ordered_json j = rec.to_json(st.results);
  EXPECT_EQ(j["best_at_equal_parameters"], "geglu");
  EXPECT_EQ(j["best_at_equal_parameters_tied"], nlohmann::ordered_json::array({"reglu"}));
  EXPECT_EQ(j["best_per_flop"], "geglu");
  EXPECT_EQ(j["best_per_flop_tied"], nlohmann::ordered_json::array({"reglu"}));
  const std::string md = rec.markdown(st, study::Sections(stages()));
  EXPECT_NE(md.find("1. **Best validation at equal parameters:** geglu (2.9100 bits/byte); these "
                    "seeds cannot separate it from reglu"),
            std::string::npos)
      << md;

  // With reglu clearly behind on every seed, geglu stands alone.
  st.results.training->variants[1].val_bits_per_byte = {2.95, 2.97, 2.96};
  st.results.training->variants[1].mean = 2.96;
  rec.run(st);
  EXPECT_TRUE(rec.to_json(st.results)["best_at_equal_parameters_tied"].empty());
  EXPECT_NE(rec.markdown(st, study::Sections(stages())).find("separated from every other"),
            std::string::npos);
}

// Under the sequential rule a candidate stopped early on lucky seeds can have the lowest mean over
// its own seeds while another is measurably lower on the seeds both trained: that one is the pick,
// and the first is separated from it, not named "not separable".
TEST(Recommendations, ACandidateLowerOnTheSharedSeedsIsThePick) {
  study::Study st;
  st.options.variants = {"relu", "reglu", "geglu"};
  st.results.costs = study_costs(st.options.variants);
  study::TrainingResult t;
  t.margin = 0.02;
  t.variants = {outcome("relu", 3.00, study::Verdict::reference, 100),
                outcome("reglu", 2.90, study::Verdict::better, 100),
                outcome("geglu", 2.9083, study::Verdict::better, 100)};
  // reglu: −0.1 against ReLU on its 3 seeds; geglu: −0.17, −0.23, −0.20, then +0.05, 0, 0 (a mean
  // of −0.0917 over its 6), so geglu − reglu on seeds 1–3 is −0.07, −0.13, −0.10: below 0.
  t.variants[0].val_bits_per_byte = {3.00, 3.00, 3.00, 3.00, 3.00, 3.00};
  t.variants[1].val_bits_per_byte = {2.9000, 2.8999, 2.9001};
  t.variants[2].val_bits_per_byte = {2.83, 2.77, 2.80, 3.05, 3.00, 3.00};
  t.variants[1].diff_mean = -0.1;
  t.variants[2].diff_mean = -0.55 / 6;
  st.results.training = t;
  const Stage& rec = stage("recommendations");
  rec.run(st);
  const nlohmann::ordered_json j = rec.to_json(st.results);
  EXPECT_EQ(j["best_at_equal_parameters"], "geglu");
  EXPECT_TRUE(j["best_at_equal_parameters_tied"].empty()) << j.dump();
  EXPECT_EQ(j["best_per_flop"], "geglu");
}

// Rule 3's pick is faster on every seed: a lead under half a percent shows its third digit
// rather than "1.00×".
TEST(Recommendations, APerSecondLeadUnderHalfAPercentShowsAThirdDigit) {
  study::Study st;
  st.options.variants = {"relu", "swiglu"};
  st.results.costs = study_costs(st.options.variants);
  study::TrainingResult t;
  t.margin = 0.02;
  t.variants = {outcome("relu", 3.00, study::Verdict::reference, 100),
                outcome("swiglu", 2.90, study::Verdict::better, 100.4)};
  st.results.training = t;
  const Stage& rec = stage("recommendations");
  rec.run(st);
  const std::string md = rec.markdown(st, study::Sections(stages()));
  EXPECT_NE(md.find("3. **Per second:** swiglu (100 tokens/s in training, 1.004× ReLU's)"),
            std::string::npos)
      << md;
}

// The summary's sentence gives each difference to three decimals, or four where three would read
// a decided difference as 0.
TEST(Summary, ADifferenceUnderHalfAThousandthKeepsAFourthDecimal) {
  study::Study st;
  st.options.variants = {"relu", "swiglu", "gelu"};
  study::TrainingResult t;
  t.margin = 0.02;
  t.model.d_model = 128;
  t.variants = {outcome("relu", 3.00, study::Verdict::reference, 100),
                outcome("swiglu", 2.9996, study::Verdict::better, 100),
                outcome("gelu", 2.95, study::Verdict::better, 100)};
  st.results.training = t;
  const std::string md = stage("summary").markdown(st, study::Sections(stages()));
  EXPECT_NE(md.find("SwiGLU (-0.0004)"), std::string::npos) << md;
  EXPECT_NE(md.find("GELU FFN (-0.050)"), std::string::npos) << md;
}

// With no variant better than ReLU, rule 1 names the lowest of the others and its difference,
// never ReLU itself (whose difference to itself, 0, is below every worse variant's).
TEST(Recommendations, NoneBetterNamesTheLowestVariantNotReLU) {
  study::Study st;
  st.options.variants = {"relu", "gelu", "moe"};
  st.results.costs = study_costs(st.options.variants);
  study::TrainingResult t;
  t.margin = 0.02;
  t.variants = {outcome("relu", 3.00, study::Verdict::reference, 100),
                outcome("gelu", 3.07, study::Verdict::worse, 100),
                outcome("moe", 3.09, study::Verdict::worse, 100)};
  st.results.training = t;
  const Stage& rec = stage("recommendations");
  rec.run(st);
  const std::string md = rec.markdown(st, study::Sections(stages()));
  EXPECT_NE(md.find("none: no variant is measurably better than ReLU (the lowest against ReLU: "
                    "gelu, +0.0700 bits/byte)"),
            std::string::npos)
      << md;
}

// The literature stage puts this run's verdicts beside Shazeer 2020's Table 1, by its rule.
TEST(Literature, AgreementFollowsTheVerdictsAndThePapersDirection) {
  study::Study st;
  study::TrainingResult t;
  t.margin = 0.02;
  t.train.steps = 600;
  t.variants = {outcome("relu", 3.00, study::Verdict::reference, 100),
                outcome("gelu", 3.08, study::Verdict::worse, 100),
                outcome("glu", 3.10, study::Verdict::worse, 100),
                outcome("geglu", 2.95, study::Verdict::better, 100),
                outcome("swiglu", 2.99, study::Verdict::inconclusive, 100),
                outcome("gated", 3.10, study::Verdict::worse, 100)};  // not in the paper
  st.results.training = t;
  const Stage& lit = stage("literature");
  lit.run(st);
  const nlohmann::ordered_json j = lit.to_json(st.results);
  const auto& v = j.at("variants");
  EXPECT_FALSE(v.contains("gated"));
  EXPECT_EQ(v.at("geglu").at("shazeer_65536_steps"), 1.942);
  EXPECT_EQ(v.at("geglu").at("shazeer_direction"), "better");
  EXPECT_EQ(v.at("geglu").at("agreement"), "agrees");
  // The paper's GLU is below ReLU in both columns (1.982 and 1.663 against 1.997 and 1.677).
  EXPECT_EQ(v.at("glu").at("agreement"), "disagrees");
  // GELU is below ReLU after 65,536 steps and above it after 524,288 (1.679 against 1.677).
  EXPECT_EQ(v.at("gelu").at("shazeer_direction"), "mixed");
  EXPECT_EQ(v.at("gelu").at("agreement"), "the paper's two columns differ");
  EXPECT_EQ(v.at("swiglu").at("agreement"), "this run cannot tell");
  const std::string md = lit.markdown(st, study::Sections(stages()));
  EXPECT_NE(md.find("Agrees: geglu. Disagrees: glu."), std::string::npos) << md;

  // Without training there is nothing to compare.
  study::Study none;
  lit.run(none);
  EXPECT_TRUE(lit.to_json(none.results).is_null());
}

// The evolution section says what each step measured, by its verdict, and never more.
TEST(Evolution, EachStepSaysWhatItsVerdictSays) {
  study::Study st;
  st.options.variants = {"relu", "gelu", "swiglu", "gated", "moe"};
  st.results.costs = study_costs(st.options.variants);
  study::TrainingResult t;
  t.margin = 0.02;
  t.variants = {outcome("relu", 3.00, study::Verdict::reference, 100),
                outcome("gelu", 3.08, study::Verdict::worse, 100),
                outcome("swiglu", 2.95, study::Verdict::better, 100),
                outcome("gated", 3.01, study::Verdict::inconclusive, 100),
                outcome("moe", 3.10, study::Verdict::worse, 100)};
  t.variants[1].diff_mean = 0.08, t.variants[1].diff_low = 0.05, t.variants[1].diff_high = 0.11;
  st.results.training = t;
  study::SparsityResult sp;
  sp.variants.push_back({"relu", {{0, 0.5, 0.5, 0.5, 0.5, 512, 0, 100, 0, 130}}});
  sp.variants.push_back({"gelu", {{0, 0, 0, 0, 0, 512, 0, 0, 0, 40}}});
  st.results.sparsity = sp;
  stage("recommendations").run(st);
  const std::string md = stage("evolution").markdown(st, study::Sections(stages()));
  EXPECT_NE(md.find("100 of 512 (19.5 %) of its hidden units are dead"), std::string::npos) << md;
  // GELU is never exactly 0: its dead count is no finding, its near-dead count is compared with
  // ReLU's, under the stated threshold.
  EXPECT_NE(md.find("40 of 512 (7.8 %) of its units are near-dead (|h| < 0.001·rms(h) on every "
                    "census token), against ReLU's 130 of 512 (25.4 %)"),
            std::string::npos)
      << md;
  EXPECT_EQ(md.find("GELU has 0"), std::string::npos) << md;
  // The verdict, whose interval the summary gives: the steps do not repeat it.
  EXPECT_NE(md.find("GELU is worse than ReLU."), std::string::npos) << md;
  EXPECT_EQ(md.find("[+0.0500, +0.1100]"), std::string::npos) << md;
  EXPECT_NE(md.find("swiglu (a Swish gate) is better than ReLU."), std::string::npos) << md;
  // An inconclusive step is "undecided", and its reading says nothing was measured.
  EXPECT_NE(md.find("it is undecided against ReLU by these seeds"), std::string::npos) << md;
  EXPECT_EQ(md.find("bought nothing"), std::string::npos) << "read from an undecided gated FFN";
  EXPECT_NE(md.find("These seeds do not decide it, so this run neither explains nor questions"),
            std::string::npos)
      << md;
  // A --quick run's verdicts are said to be no finding where the steps name them.
  study::Study quick = st;
  quick.options.quick = true;
  EXPECT_NE(stage("evolution")
                .markdown(quick, study::Sections(stages()))
                .find("GELU is worse than ReLU (in this --quick run: not a finding)."),
            std::string::npos);
  quick.results.training->variants[3].verdict = study::Verdict::worse;  // the gated FFN
  const std::string quick_md = stage("evolution").markdown(quick, study::Sections(stages()));
  EXPECT_EQ(quick_md.find("bought nothing"), std::string::npos) << quick_md;
  EXPECT_NE(quick_md.find("This run does not decide it"), std::string::npos) << quick_md;
  EXPECT_NE(md.find("| swiglu | learned gate: Swish(xW) ⊙ xV | two | dense | better than ReLU |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| a fixed parameter (memory) budget, quality first | — | swiglu |"),
            std::string::npos)
      << md;
  // GLU members with one verdict are named together.
  study::Study glus = st;
  glus.results.training->variants.push_back(outcome("glu", 2.96, study::Verdict::better, 100));
  const std::string grouped = stage("evolution").markdown(glus, study::Sections(stages()));
  EXPECT_NE(grouped.find("Of the family, swiglu (a Swish gate) and glu (the original sigmoid "
                         "gate) are better than ReLU."),
            std::string::npos)
      << grouped;
  // A multi-branch FFN that loses fits the field's choice; one that wins is not explained away.
  st.results.training->variants[3].verdict = study::Verdict::worse;
  EXPECT_NE(stage("evolution")
                .markdown(st, study::Sections(stages()))
                .find("The split bought nothing here, which fits the field leaving it aside."),
            std::string::npos);
  st.results.training->variants[3].verdict = study::Verdict::better;
  const std::string won = stage("evolution").markdown(st, study::Sections(stages()));
  EXPECT_EQ(won.find("bought nothing"), std::string::npos) << won;
  EXPECT_NE(won.find("Here the split paid"), std::string::npos) << won;
  // Sizes and tasks this run did not measure are said to be unmeasured.
  EXPECT_NE(md.find("above 100B MoE | not measured: one size (`--sizes` trains a ladder) |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("extreme scale MoE | not measured: one task (`--tasks causal,masked`"),
            std::string::npos)
      << md;
  // Measured tasks at one size: the task row is measured, the size row still says it is not.
  study::ScalingResult scaling;
  scaling.tasks = {"masked"};
  study::ScalingSize own;
  own.name = "s";
  own.model.d_model = 128;
  own.params = 842496;
  scaling.sizes = {own};
  study::ScalingCell cell;
  cell.size = "s";
  cell.task = "masked";
  cell.variants = {{outcome("relu", 3.5, study::Verdict::reference, 100), 1e12},
                   {outcome("gelu", 3.4, study::Verdict::better, 100), 1e12}};
  scaling.cells = {cell};
  st.results.scaling = scaling;
  const std::string masked = stage("evolution").markdown(st, study::Sections(stages()));
  EXPECT_NE(masked.find("above 100B MoE | not measured: one size"), std::string::npos) << masked;
  EXPECT_NE(masked.find("| task | classification ReLU, NLU and generation GELU, multi-task gated, "
                        "extreme scale MoE | measured on masked: masked: s gelu |"),
            std::string::npos)
      << masked;
  // No training, no section.
  study::Study none;
  EXPECT_TRUE(stage("evolution").markdown(none, study::Sections(stages())).empty());
}

// Correction 14 says that the tutorial's own gradient table contradicts its "most stable"
// prose, and reads this run's toy numbers, whichever way they fall.
TEST(StudyCorrections, StabilityProseIsCheckedAgainstTheTableAndTheToyRun) {
  auto finding = [](const study::Study& st) {
    for (const study::Correction& c : *st.results.corrections)
      if (c.id == "14") return c.finding;
    return std::string("no correction 14");
  };
  study::Study st;
  stage("corrections").run(st);
  EXPECT_NE(finding(st).find("GLU's 0.0933 is below GELU's 0.1010"), std::string::npos)
      << finding(st);
  EXPECT_NE(finding(st).find("did not run the toy"), std::string::npos) << finding(st);
  study::ToyResult toy;
  for (const auto& [v, sd] : std::vector<std::pair<std::string, double>>{
           {"relu", 0.12}, {"gelu", 0.11}, {"glu", 0.09}, {"gated", 0.17}, {"moe", 0.24}}) {
    study::ToyVariant tv;
    tv.variant = v;
    tv.first_seed.grad_std = sd;
    toy.variants.push_back(tv);
  }
  st.results.toy = toy;
  stage("corrections").run(st);
  const std::string f = finding(st);
  EXPECT_NE(f.find("relu 0.1200, gelu 0.1100, glu 0.0900, gated 0.1700, moe 0.2400"),
            std::string::npos)
      << f;
  EXPECT_NE(f.find("The lowest is glu's, not GELU's: the run agrees with the table"),
            std::string::npos)
      << f;
  EXPECT_NE(f.find("gated's is the second highest of the 5, as in the table"), std::string::npos)
      << f;
  // Numbers that side with the prose are said to.
  st.results.toy->variants[1].first_seed.grad_std = 0.05;
  st.results.toy->variants[3].first_seed.grad_std = 0.10;
  stage("corrections").run(st);
  EXPECT_NE(finding(st).find("Here GELU's is the lowest, as the prose says"), std::string::npos)
      << finding(st);
  EXPECT_NE(finding(st).find("gated's is the third highest of the 5."), std::string::npos)
      << finding(st);
}

// The report gives each correction one line (the claim and the right number); the appendix
// quotes the claim beside its evidence.
TEST(StudyCorrections, EachIsOneLineInTheReportAndQuotedInTheAppendix) {
  study::Study st;
  stage("corrections").run(st);
  // Without the census, the lines that read it say so, with no number.
  const std::string unmeasured = stage("corrections").markdown(st, study::Sections(stages()));
  EXPECT_NE(unmeasured.find("gate: unbounded above, negative below 0.\n"), std::string::npos)
      << unmeasured;
  EXPECT_EQ(unmeasured.find("nan"), std::string::npos) << unmeasured;
  // The lines that read measured numbers, from a run that measured them.
  study::SparsityResult sp;
  sp.silu_min = -0.2785;
  sp.variants.push_back({"relu", {{0, 0.5, 0, 0, 0, 512, 0, 100, 0, 130}}});
  st.results.sparsity = sp;
  stage("corrections").run(st);
  const std::string md = stage("corrections").markdown(st, study::Sections(stages()));
  const std::size_t cut = md.find(study::kDetails);
  ASSERT_NE(cut, std::string::npos) << md;
  const std::string main = md.substr(0, cut), details = md.substr(cut);
  ASSERT_EQ(st.results.corrections->size(), 16u);
  EXPECT_NE(main.find("16. In SwiGLU the Swish branch is the gate, and Swish is no (0, 1) "
                      "gate: its minimum is -0.2785.\n"),
            std::string::npos)
      << main;
  EXPECT_NE(main.find("after training 100 of its 512 hidden units are dead (section 5).\n"),
            std::string::npos)
      << main;
  // A quotation's full stop ends the line alone.
  EXPECT_NE(main.find("not \"Lewis et al.\"\n"), std::string::npos) << main;
  for (const study::Correction& c : *st.results.corrections) {
    const bool stopped = c.brief.ends_with(".") || c.brief.ends_with(".\"");
    const std::string line = c.id + ". " + c.brief + (stopped ? "" : ".") + "\n";
    EXPECT_NE(main.find(line), std::string::npos) << line;
    std::istringstream words(c.brief);
    EXPECT_LE(std::distance(std::istream_iterator<std::string>(words),
                            std::istream_iterator<std::string>()),
              40)
        << c.brief;
    EXPECT_NE(details.find("| " + c.id + " | " + c.claim + " | "), std::string::npos) << c.id;
    EXPECT_EQ(main.find(c.claim), std::string::npos) << c.id << ": the claim quoted in the report";
  }
  EXPECT_NE(main.find("1. Linear(512, 2048) has 1,050,624 parameters, not 2,097,152.\n"),
            std::string::npos)
      << main;
}

// When the expert load settles is measured from the logged shares, never assumed; and without
// the z-loss ablation the section says the z-loss's effect is not measured, with no number.
TEST(StudyMoE, LoadSettlesWhereItIsMeasuredToAndTheZLossIsNotClaimed) {
  // Two experts' shares at logged steps of a 100-step run; the last 10 % is step 100 alone.
  study::LoadSeries settles;
  settles.steps = {1, 10, 20, 30, 40, 100};
  for (double a : {0.9, 0.7, 0.56, 0.52, 0.5, 0.5}) settles.shares.push_back({a, 1 - a});
  EXPECT_EQ(settles.last_moving_step(100, 0.05), 20);
  EXPECT_EQ(settles.settled_step(100, 0.05), 30);
  EXPECT_EQ(settles.settled_step(100, 0.5), 1);  // nothing strays that far: settled throughout
  // Still swinging in the last 10 % (steps 95 and 100 around their mean 0.5): never settles.
  study::LoadSeries swings;
  swings.steps = {1, 50, 95, 100};
  for (double a : {0.5, 0.5, 0.3, 0.7}) swings.shares.push_back({a, 1 - a});
  EXPECT_EQ(swings.last_moving_step(100, 0.05), 100);
  EXPECT_FALSE(swings.settled_step(100, 0.05).has_value());
  // Moving until step 89 and held from step 91: inside the last 10 % (steps 91 to 100), the
  // window its own mean is taken over, which is no settling.
  study::LoadSeries late;
  late.steps = {1, 50, 89, 91, 95, 100};
  for (double a : {0.9, 0.7, 0.6, 0.5, 0.5, 0.5}) late.shares.push_back({a, 1 - a});
  EXPECT_EQ(late.last_moving_step(100, 0.05), 89);
  EXPECT_FALSE(late.settled_step(100, 0.05).has_value());
  // A run under 10 steps: its window is its last logged step alone, which settles nothing; nor
  // does a run of one logged step, whose first step is its last.
  study::LoadSeries five;
  five.steps = {1, 2, 3, 4, 5};
  for (double a : {0.9, 0.8, 0.7, 0.6, 0.5}) five.shares.push_back({a, 1 - a});
  EXPECT_EQ(five.last_moving_step(5, 0.05), 4);
  EXPECT_FALSE(five.settled_step(5, 0.05).has_value());
  study::LoadSeries one;
  one.steps = {1};
  one.shares.push_back({0.5, 0.5});
  EXPECT_EQ(one.last_moving_step(1, 0.05), 0);
  EXPECT_FALSE(one.settled_step(1, 0.05).has_value());

  study::Study st;
  study::MoEResult m;
  m.balancing_steps = 100;
  m.load_tolerance = 0.05;
  m.experts = 2;
  m.top_k = 1;
  m.z_coef = 0.001f;
  m.settings = {{"loss", "load-balancing loss", 3.0, 0.1, 1.1, 0, 0.69, 1000, settles},
                {"bias", "aux-loss-free bias", 3.0, 0.1, 1.1, 0, 0.69, 1000, swings},
                {"none", "no balancing", 3.0, 0.1, 1.1, 0, 0.69, 1000, late}};
  st.results.moe = m;
  const std::string md = stage("moe").markdown(st, study::Sections(stages()));
  // Each setting's row ends with the step its load settled from, or says it never did.
  EXPECT_NE(md.find("| step 30 |\n"), std::string::npos) << md;
  EXPECT_NE(md.find("| not by step 100, the last logged |\n"), std::string::npos) << md;
  EXPECT_NE(md.find("| not before the last 10 % (step 89 still moved) |\n"), std::string::npos)
      << md;
  EXPECT_NE(md.find("stays within 0.05 (absolute share)"), std::string::npos) << md;
  EXPECT_EQ(md.find("settles long before"), std::string::npos) << md;
  EXPECT_NE(md.find("not measured by this run: `ffnlab evolve --full --resume` measures it"),
            std::string::npos)
      << md;
  EXPECT_EQ(md.find("bits/byte behind"), std::string::npos) << md;
  EXPECT_EQ(md.find("hundred steps"), std::string::npos) << md;
  const nlohmann::ordered_json j = stage("moe").to_json(st.results);
  EXPECT_EQ(j.at("settings").at("loss").at("load_settled_step"), 30);
  EXPECT_TRUE(j.at("settings").at("bias").at("load_settled_step").is_null());
  EXPECT_TRUE(j.at("settings").at("none").at("load_settled_step").is_null());
  EXPECT_EQ(j.at("load_settled_tolerance"), 0.05);
}

// A smooth gate has no exact zeros, so "0 dead units" is true of it by definition; the census
// also counts the units near zero on every token, writes them to results.json and the summary
// CSV, and states the threshold where the count appears.
TEST(StudySparsity, NearDeadUnitsAreCountedBesideDeadOnes) {
  const ScratchDir scratch("sparsity");
  study::Study st;
  st.dir = scratch.path.string();
  st.options.variants = {"relu", "gelu"};
  // Two units: unit 0 tiny on every token (near-dead), unit 1 large. ReLU's unit 0 is 0.
  for (const auto& [v, tiny] : {std::pair<std::string, float>{"relu", 0.f}, {"gelu", 1e-6f}}) {
    UnitSparsity u;
    add_hidden(u, Tensor::from({2, 2}, {tiny, 1.f, tiny, -2.f}));
    st.census_init[v] = {u};
    st.census_trained[v] = {u};
  }
  stage("sparsity").run(st);
  const nlohmann::ordered_json j = stage("sparsity").to_json(st.results);
  const auto& gelu = j.at("variants").at("gelu").at(0);
  EXPECT_EQ(gelu.at("dead_units_trained"), 0);
  EXPECT_EQ(gelu.at("near_dead_units_trained"), 1);
  EXPECT_EQ(gelu.at("near_dead_units_init"), 1);
  EXPECT_EQ(j.at("variants").at("relu").at(0).at("near_dead_units_trained"), 1);
  const std::string md = stage("sparsity").markdown(st, study::Sections(stages()));
  EXPECT_NE(md.find("| near-dead units trained |"), std::string::npos) << md;
  EXPECT_NE(md.find("0 or |h| < 0.001·rms(h) on every census token"), std::string::npos) << md;
  EXPECT_NE(md.find("| 0 of 2 (0.0 %) | 1 of 2 (50.0 %) |"), std::string::npos) << md;
  std::ifstream summary(scratch.path / "sparsity_summary.csv");
  std::string header;
  std::getline(summary, header);
  EXPECT_EQ(header.substr(header.rfind(',') + 1), "near_dead_trained");
}

// No verdict but "equivalent" lets the report speak of two variants as alike.
TEST(Recommendations, NeverSayAsGoodWithoutTheEquivalenceTest) {
  for (const auto verdict :
       {study::Verdict::better, study::Verdict::worse, study::Verdict::inconclusive,
        study::Verdict::one_seed, study::Verdict::equivalent})
    for (const double tps : {80.0, 120.0}) {
      study::Study st;
      st.options.variants = {"relu", "moe"};
      st.results.costs = study_costs(st.options.variants);
      study::TrainingResult t;
      t.margin = 0.02;
      t.variants = {outcome("relu", 3.0, study::Verdict::reference, 100),
                    outcome("moe", 3.0, verdict, tps)};
      st.results.training = t;
      const Stage& rec = stage("recommendations");
      rec.run(st);
      const std::string md = rec.markdown(st, study::Sections(stages()));
      const bool alike = md.find("as good") != std::string::npos ||
                         md.find("equivalent to the dense FFN") != std::string::npos;
      EXPECT_EQ(alike, verdict == study::Verdict::equivalent)
          << study::verdict_text(verdict) << " at " << tps << " tokens/s:\n"
          << md;
    }
}

// MoE at equal compute gets its own finding; a noisy throughput decides nothing.
TEST(Recommendations, MoEAtEqualComputeAndNoisyThroughput) {
  study::Study st;
  st.options.variants = {"relu", "swiglu", "moe"};
  st.results.costs = study_costs(st.options.variants);
  study::TrainingResult t;
  t.margin = 0.02;
  t.variants = {outcome("relu", 3.00, study::Verdict::reference, 100),
                outcome("swiglu", 2.90, study::Verdict::better, 150),
                outcome("moe", 3.00, study::Verdict::equivalent, 120)};
  st.results.training = t;
  study::MoEAxesResult axes;
  study::MoEAxisRow relu, compute, fine;
  relu.name = "relu";
  relu.params = 1000;
  // The finding rests on the headline design (fine-grained); the other is reported beside it.
  compute.name = "moe_compute";
  compute.description = "equal active compute: 8 experts, top-2";
  compute.params = 2600;
  compute.outcome = outcome("moe_compute", 3.01, study::Verdict::inconclusive, 80);
  fine.name = std::string(study::kHeadlineMoE);
  fine.description = "equal active compute: fine-grained, 16 experts, top-3, 1 shared";
  fine.params = 2500;
  fine.outcome = outcome(fine.name, 2.95, study::Verdict::better, 80);
  // Their FFNs at ReLU's active compute (d_model 128, ReLU's d_ff 512): 2 × 256 and 3 × 128 + 128.
  compute.ffn = study::study_ffn("moe", 128);
  compute.ffn.moe.expert_d_ff = 256;
  fine.ffn = study::study_ffn("moe", 128);
  fine.ffn.moe.num_experts = 16;
  fine.ffn.moe.top_k = 3;
  fine.ffn.moe.expert_d_ff = 128;
  fine.ffn.moe.num_shared = 1;
  fine.ffn.moe.shared_d_ff = 128;
  axes.rows = {relu, compute, fine};
  st.results.moe_axes = axes;
  const Stage& rec = stage("recommendations");
  const study::Sections sec(stages());
  rec.run(st);
  nlohmann::ordered_json j = rec.to_json(st.results);
  EXPECT_EQ(j["best_per_second"], "swiglu");
  EXPECT_EQ(j["moe_pays_off"], true);
  EXPECT_EQ(j["moe_at_equal_compute"], "better than ReLU");
  EXPECT_EQ(j["moe_at_equal_compute_design"], "fine-grained, 16 experts, top-3, 1 shared");
  EXPECT_EQ(j["moe_at_equal_compute_other"], "inconclusive");
  std::string md = rec.markdown(st, sec);
  EXPECT_NE(md.find("**MoE at equal compute** (fine-grained, 16 experts, top-3, 1 shared)"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("better than ReLU at the same FLOPs per token"), std::string::npos) << md;
  EXPECT_NE(md.find("2.5× the LM's parameters"), std::string::npos) << md;
  // The per-FLOP pool holds MoE at equal compute too: the fine-grained one is the lowest there
  // after swiglu, at about ReLU's FLOPs.
  EXPECT_NE(md.find("moe_fine_shared 1.0"), std::string::npos) << md;
  EXPECT_NE(md.find("moe_compute 1.0"), std::string::npos) << md;
  EXPECT_NE(md.find("The other design at that compute (8 experts, top-2) is inconclusive"),
            std::string::npos)
      << md;
  // Shown equivalent, MoE at equal compute is a decision too: the choices table says either
  // serves, not "not decided".
  st.results.moe_axes->rows[2].outcome.verdict = study::Verdict::equivalent;
  rec.run(st);
  const std::string choices = stage("evolution").markdown(st, sec);
  EXPECT_NE(choices.find("either: MoE at equal compute (fine-grained, 16 experts, top-3, 1 "
                         "shared) was as good as the dense FFN here, within the margin"),
            std::string::npos)
      << choices;
  st.results.moe_axes->rows[2].outcome.verdict = study::Verdict::better;
  rec.run(st);

  // Noisy throughput: swiglu leaves the per-second rule, and MoE's "on cost" is undecided.
  auto& v = st.results.training->variants;
  v[1].tokens_per_second_noisy = true;
  v[2].tokens_per_second_noisy = true;
  st.results.moe_axes->rows[2].outcome.verdict = study::Verdict::inconclusive;
  st.results.moe_axes->rows[1].outcome.verdict = study::Verdict::better;  // never the basis
  rec.run(st);
  j = rec.to_json(st.results);
  // A noisy candidate cannot be ranked: the rule is undecided, not won by the others.
  EXPECT_TRUE(j["best_per_second"].is_null());
  EXPECT_TRUE(j["moe_pays_off"].is_null());
  EXPECT_EQ(j["moe_at_equal_compute"], "inconclusive");
  md = rec.markdown(st, sec);
  EXPECT_NE(md.find("**Per second:** undecided: the throughput of swiglu, moe was noisy"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("the throughput that would decide it was noisy"), std::string::npos) << md;
  EXPECT_NE(md.find("undecided: the seeds cannot tell it from ReLU"), std::string::npos) << md;
  EXPECT_EQ(md.find("as good"), std::string::npos) << md;

  // The reference is held to the same noise test.
  v[0].tokens_per_second_noisy = true;
  rec.run(st);
  md = rec.markdown(st, sec);
  EXPECT_NE(md.find("**Per second:** undecided: the throughput of relu, swiglu, moe was noisy"),
            std::string::npos)
      << md;

  // No noise, but the fastest by median was not faster on every seed: undecided too.
  for (auto& o : v) o.tokens_per_second_noisy = false;
  v[1].tokens_per_second_over_relu = 1.30;
  v[1].tokens_per_second_ratio_low = 0.97;  // slower than ReLU's run on one seed
  v[1].tokens_per_second_ratio_high = 1.4;
  rec.run(st);
  EXPECT_TRUE(rec.to_json(st.results)["best_per_second"].is_null());
  md = rec.markdown(st, sec);
  EXPECT_NE(md.find("undecided: swiglu has the highest median, but on some seeds relu, moe"),
            std::string::npos)
      << md;
  v[1].tokens_per_second_ratio_low = 1.25;  // above moe's 1.20 and ReLU's 1 on every seed
  rec.run(st);
  EXPECT_EQ(rec.to_json(st.results)["best_per_second"], "swiglu");
}

// The routing stage from given runs: each family paired with top-k of its objective (the causal
// one: the headline MoE's runs), behaviour from the second half of the steps, FLOPs at the
// experts a token ran.
TEST(Routing, FamiliesAreJudgedAgainstTopKAtTheComputeTheyRan) {
  study::Study st;
  st.options.quick = true;
  st.options.variants = {"relu", "moe"};
  st.options.routing_seeds = 2;
  st.options.full = true;  // the masked objective too
  st.scale = study::make_scale(st.options);
  ASSERT_EQ(st.scale.routing_seeds, 2);
  const int layers = static_cast<int>(st.scale.model.layers);
  study::TrainingResult t;
  t.margin = 0.02;
  st.results.training = t;
  // A run whose first half routes 10 experts a token and whose second half routes `ran`.
  auto run = [&](const std::string& label, int seed, double val, double ran) {
    study::RunRecord r;
    r.variant = label;
    r.seed = seed;
    r.val_bits_per_byte = val;
    r.median_tokens_per_second = 1000;
    for (int s = 1; s <= 4; ++s) {
      StepLog log;
      log.step = s;
      log.experts_per_token = s <= 2 ? 10.0 : ran;
      log.load_cv = s <= 2 ? 5.0 : 0.25;
      r.steps.push_back(log);
    }
    return r;
  };
  for (int seed = 1; seed <= 3; ++seed)  // the third is not paired: routing trains 2
    st.axes_runs.push_back(run(std::string(study::kHeadlineMoE), seed, 3.0 + 0.01 * seed, 3));
  const std::vector<std::pair<std::string, double>> families{
      {"causal/top_p", 2.5},  {"causal/relu", 3.5},        {"causal/moe_pp", 2.5},
      {"masked/topk", 3},     {"masked/top_p", 2.5},       {"masked/relu", 3.5},
      {"masked/moe_pp", 2.5}, {"masked/expert_choice", 3}, {"masked/soft", 3}};
  for (int seed = 1; seed <= 2; ++seed)
    for (const auto& [label, ran] : families) {
      // top_p is clearly worse than top-k on both seeds; the others differ from it by noise.
      const double base = label.rfind("masked", 0) == 0 ? 4.0 : 3.0;
      const double noise = label == "masked/topk" ? 0.0 : (seed == 1 ? 0.03 : -0.03);
      const double val = base + 0.01 * seed +
                         (label.find("top_p") != std::string::npos ? 0.10 + 0.01 * seed : noise);
      st.routing_runs.push_back(run(label, seed, val, ran));
      study::RoutingBehaviour b;
      b.experts_per_token_by_layer.assign(static_cast<std::size_t>(layers), ran);
      if (label != "masked/soft")
        b.experts_distribution.assign(static_cast<std::size_t>(layers), {0.1, 0.2, 0.3, 0.4});
      st.routing_runs.back().gathered = study::routing_behaviour_json(b);
    }
  const Stage& routing = stage("routing");
  routing.run(st);
  ASSERT_TRUE(st.results.routing);
  const nlohmann::ordered_json j = routing.to_json(st.results);
  EXPECT_EQ(j["config"]["seeds"], 2);
  EXPECT_EQ(j["config"]["causal_reference_seeds"], 2);
  EXPECT_EQ(j["causal"]["topk"]["val_bits_per_byte"].size(), 2u);
  EXPECT_EQ(j["causal"]["topk"]["verdict"], "reference");
  EXPECT_FALSE(j["causal"].contains("expert_choice")) << "it would read the future";
  EXPECT_FALSE(j["causal"].contains("soft"));
  EXPECT_EQ(j["masked"].size(), 6u);
  EXPECT_EQ(j["causal"]["top_p"]["verdict"], "worse than top-k");
  EXPECT_EQ(j["masked"]["top_p"]["verdict"], "worse than top-k");
  EXPECT_NEAR(j["causal"]["top_p"]["paired_difference_to_topk_mean"].get<double>(), 0.115, 1e-9);
  EXPECT_EQ(j["causal"]["relu"]["verdict"], "inconclusive");
  // The second half of the steps only.
  EXPECT_DOUBLE_EQ(j["causal"]["relu"]["experts_per_token"].get<double>(), 3.5);
  EXPECT_DOUBLE_EQ(j["causal"]["relu"]["load_cv"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(j["causal"]["topk"]["experts_per_token"].get<double>(), 3.0);
  // Dropless top-k: every token runs k experts in every layer.
  EXPECT_EQ(j["causal"]["topk"]["experts_per_token_distribution_by_layer"][0].back(), 1.0);
  // FLOPs at the experts a token ran: ReLU routing ran half an expert more than its target in
  // every layer, MoE++ half an expert fewer than its k; expert choice as configured.
  const FFNConfig relu = config_from_json(j["causal"]["relu"]["ffn"]);
  const double per_expert = ffn_cost(expert_config(relu), 1).forward.total() + 2.0 * relu.d_model;
  const double topk_flops = j["causal"]["topk"]["active_forward_flops_per_token"].get<double>();
  EXPECT_NEAR(j["causal"]["relu"]["active_forward_flops_per_token"].get<double>() - topk_flops,
              layers * 0.5 * per_expert, 1e-6 * topk_flops);
  EXPECT_LT(j["causal"]["moe_pp"]["active_forward_flops_per_token"].get<double>(), topk_flops);
  EXPECT_DOUBLE_EQ(j["masked"]["expert_choice"]["active_forward_flops_per_token"].get<double>(),
                   j["masked"]["topk"]["active_forward_flops_per_token"].get<double>());
  // Soft MoE's slots give k experts' compute a token over the study's sequence.
  EXPECT_DOUBLE_EQ(j["masked"]["soft"]["experts_per_token_config"].get<double>(),
                   j["masked"]["topk"]["experts_per_token_config"].get<double>());
  const std::string md = routing.markdown(st, study::Sections(stages()));
  EXPECT_NE(md.find("**The causal LM** (bits per byte;"), std::string::npos) << md;
  EXPECT_NE(md.find("**The masked objective** (bits per masked byte;"), std::string::npos);
  EXPECT_NE(md.find("| top_p | dynamic top-p"), std::string::npos) << md;
  EXPECT_NE(md.find("worse than top-k"), std::string::npos);
  EXPECT_NE(md.find("3.50 [0–3], 10.0 % none"), std::string::npos) << md;
  EXPECT_EQ(md.find("than ReLU"), std::string::npos) << "judged against top-k, not ReLU";
}

TEST(Stats, PairedComparisonsUseStudentsTAndTheMargin) {
  // n = 3: t(0.975, 2) = 4.302653, t(0.95, 2) = 2.919986; mean −0.02, s = 0.01.
  const std::vector<double> d{-0.03, -0.02, -0.01};
  const MeanInterval ci = mean_interval(d, 0.95);
  EXPECT_NEAR(ci.mean, -0.02, 1e-12);
  EXPECT_NEAR(ci.low, -0.02 - 4.302653 * 0.01 / std::sqrt(3.0), 1e-6);
  EXPECT_NEAR(ci.high, -0.02 + 4.302653 * 0.01 / std::sqrt(3.0), 1e-6);
  EXPECT_NEAR(mean_interval(d, 0.90).low, -0.02 - 2.919986 * 0.01 / std::sqrt(3.0), 1e-6);
  // 95 %: [−0.0448, +0.0048] holds 0; 90 %: [−0.0369, −0.0031] is not within ±0.02.
  EXPECT_EQ(compare_paired(d, 0.02).verdict, Comparison::inconclusive);
  EXPECT_EQ(compare_paired(d, 0.05).verdict, Comparison::equivalent);  // a wider margin
  const std::vector<double> lower{-0.05, -0.04, -0.045}, higher{0.05, 0.04, 0.045};
  EXPECT_EQ(compare_paired(lower, 0.02).verdict, Comparison::better);
  EXPECT_EQ(compare_paired(higher, 0.02).verdict, Comparison::worse);
  EXPECT_EQ(compare_paired(std::vector<double>{0.001, -0.002, 0.0005}, 0.02).verdict,
            Comparison::equivalent);
  // The old rule (|mean| > std) called this one better: t = 1.73 with 3 seeds is p ≈ 0.11.
  EXPECT_EQ(compare_paired(std::vector<double>{-0.01, -0.03, -0.02 + 0.01 * 0.9}, 0.001).verdict,
            Comparison::inconclusive);
  // A stalled seed (MoE − ReLU from a run where seed 2 stalled): inconclusive, not "as good".
  EXPECT_EQ(compare_paired(std::vector<double>{0.10, 0.47, 0.11}, 0.02).verdict,
            Comparison::inconclusive);
  const PairedComparison one = compare_paired(std::vector<double>{0.1}, 0.02);
  EXPECT_EQ(one.verdict, Comparison::one_value);
  EXPECT_TRUE(std::isnan(one.ci95.low));
}

// The message of the Error that run_study throws for `o` ("" when it throws none).
std::string refusal(const study::Options& o) {
  struct Quiet : study::Observer {
  } quiet;
  try {
    study::run_study(o, quiet);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Study, RefusesBadOptionsBeforeAnyWork) {
  const ScratchDir scratch("options");
  const auto& dir = scratch.path;
  study::Options o;
  o.out = (dir / "report").string();
  o.data = (dir / "no-corpus-needed").string();  // refused before the data is read
  o.variants = {"gelu"};
  EXPECT_NE(refusal(o).find("must include relu"), std::string::npos) << refusal(o);
  o.variants = {"relu", "no-such-variant"};
  EXPECT_NE(refusal(o).find("'no-such-variant' is not one of"), std::string::npos);
  o.variants = {"relu", "swiglu", "swiglu"};  // would pair two runs of one seed with ReLU's
  EXPECT_NE(refusal(o).find("'swiglu' is listed twice"), std::string::npos);
  o.variants = {"relu"};
  o.seeds = 1001;
  EXPECT_NE(refusal(o).find("seeds = 1001"), std::string::npos);
  o.seeds = 0;
  o.steps = -1;
  EXPECT_NE(refusal(o).find("steps = -1"), std::string::npos);
  o.steps = 0;
  o.routing_seeds = 4;  // more than the 3 seeds of the fine-grained MoE they pair with
  EXPECT_NE(refusal(o).find("routing seeds = 4 must not exceed seeds = 3"), std::string::npos)
      << refusal(o);
  EXPECT_FALSE(std::filesystem::exists(o.out));  // nothing written, no staging folder either
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

// The options of a quick study on a small corpus written into `dir`: what the serving-rank
// tests serve.
study::Options serving_options(const std::filesystem::path& dir) {
  {
    std::ofstream corpus(dir / "corpus.txt");
    for (int i = 0; i < 500; ++i) corpus << "Q: Why did the chicken cross the road?\n%\n";
  }
  study::Options o;
  o.data = (dir / "corpus.txt").string();
  o.quick = true;
  return o;
}

// A message between the study's ranks that does not read, or that no rank should have sent, is
// the ranks' own exchange failing, a system failure (exit 3): a serving rank ends with it, or,
// when it knows the run the message was about, tells rank 0 of that run's failure as such.
TEST(Study, AServingRankTakesAMessageItCannotReadAsTheSystemsFailure) {
  const ScratchDir scratch("serve_messages");
  const study::Options o = serving_options(scratch.path);
  // Rank 0 sends rank 1 `tag` with `bytes`, waits for its answer when `answers`, then sends the
  // study's end: how rank 1 ended, and the failure it told rank 0 of ("kind message").
  struct Served {
    std::string ended, told;
  };
  const auto served = [&](int tag, const std::string& bytes, bool answers) {
    Served s;
    s.ended = test::ThreadGroup::outcomes(
        2,
        [&](test::ThreadGroup& g) {
          if (g.rank() == 1) return study::serve_runs(o, g);
          g.send(bytes, 1, tag, "test");
          std::string answer;
          int from = 0, answer_tag = 0;
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
          while (answers && !g.try_receive(answer, from, answer_tag, "test") &&
                 std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          if (answer_tag == study::kFailed) {
            const Failure f = Failure::from_json(nlohmann::json::from_cbor(answer).at("failure"));
            s.told = fmt::format("{} {}", static_cast<int>(f.kind), f.message);
          }
          g.send("", 1, study::kFinish, "test");
        },
        "served")[1];
    return s;
  };
  const auto starts = [](const std::string& text, const std::string& start) {
    return text.starts_with(start);
  };
  // A stop about a run it had finished already: nothing to do.
  EXPECT_EQ(served(study::kStop, "", false).ended, "served");
  EXPECT_EQ(served(99, "", false).ended, "3 0 [evolve] rank 1: an unknown message 99 from rank 0");
  const std::string unread = served(study::kJob, "not CBOR", false).ended;
  EXPECT_PRED2(starts, unread, "3 0 [evolve] a message from rank 0 does not read (");
  // A run's message that reads as far as its index, without the run: that run failed, as the
  // system's failure, and rank 1 goes on serving.
  const std::vector<std::uint8_t> index_only = nlohmann::json::to_cbor({{"index", 0}});
  const Served partial = served(study::kJob, {index_only.begin(), index_only.end()}, true);
  EXPECT_EQ(partial.ended, "served");
  EXPECT_PRED2(starts, partial.told, "3 [evolve] a message from rank 0 does not read (");
}

// A message to rank 0 that the serving rank cannot send (a send that timed out may still be in
// flight, reading its buffer) ends that rank with the send's failure: it does not report the run
// as failed to rank 0 and go on serving. The step's message and the record's alike, and a
// message out of step with the run.
TEST(Study, AServingRankWhoseMessageFailsEndsWithThatFailure) {
  const ScratchDir scratch("serve_send");
  const study::Options o = serving_options(scratch.path);
  study::Study st;  // what rank 0 describes the run with, as serve_runs reads it
  st.options = o;
  st.options.variants = study::study_variants(o);
  st.scale = study::make_scale(st.options);
  st.corpus = load_corpus(o.data);
  study::RunJob job;
  job.model.d_model = 8;
  job.model.layers = 1;
  job.model.heads = 1;
  job.model.context = 8;
  job.model.ffn = variant_config("relu", 8, 16, true);
  job.label = "relu";
  TrainConfig t;
  t.batch = 2;
  t.seq = 8;
  t.steps = 2;
  job.settings = t;
  const std::vector<std::uint8_t> message =
      nlohmann::json::to_cbor({{"index", 0},
                               {"job", study::job_to_json(st, job)},
                               {"data", st.corpus.fingerprint},
                               {"bare", nullptr}});
  for (const int failing : {study::kStep, study::kDone}) {
    std::atomic<bool> stopped{false};
    const std::string ended = test::ThreadGroup::outcomes(
        2,
        [&](test::ThreadGroup& g) {
          if (g.rank() == 1) {
            g.failing_send_tag = failing;
            try {
              study::serve_runs(o, g);
            } catch (...) {
              stopped = true;
              throw;
            }
            stopped = true;
            return;
          }
          g.send({message.begin(), message.end()}, 1, study::kJob, "test");
          // Until rank 1 ends, or answers the run other than by its steps (then it serves on,
          // and the study's end ends it).
          std::string answer;
          int from = 0, tag = 0;
          while (!stopped) {
            if (g.try_receive(answer, from, tag, "test") && tag != study::kStep) {
              g.send("", 1, study::kFinish, "test");
              break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        },
        "served")[1];
    EXPECT_EQ(ended, fmt::format("3 {} [dist] the send of message {} failed", ETIMEDOUT, failing));
  }
  // A message other than a stop while it trains: the ranks are out of step, and rank 1 ends.
  const std::string ended = test::ThreadGroup::outcomes(
      2,
      [&](test::ThreadGroup& g) {
        if (g.rank() == 1) return study::serve_runs(o, g);
        g.send({message.begin(), message.end()}, 1, study::kJob, "test");
        g.send("", 1, study::kFinish, "test");  // read by the run's first step
      },
      "served")[1];
  EXPECT_EQ(ended, "3 0 [evolve] rank 1: message 6 while training");
}

// A stop that comes after the last figure, before the report replaces the earlier one (the
// observer's end() is called there), keeps the earlier report: nothing between the figures and
// the commit may lose an interrupt.
TEST(Study, AStopAfterTheFiguresKeepsTheEarlierReport) {
#ifdef FFNLAB_SANITIZED
  GTEST_SKIP() << "a whole study takes minutes under the sanitizers; the release suite runs it";
#endif
  const ScratchDir scratch("stop_before_commit");
  const auto& dir = scratch.path;
  {
    std::ofstream corpus(dir / "corpus.txt");
    for (int i = 0; i < 1500; ++i)
      corpus << "Q: Why did the chicken cross the road?\nA: To get to the other side.\n%\n";
  }
  const auto report = dir / "report";
  std::filesystem::create_directories(report);
  std::ofstream(report / "REPORT.md") << "the old report\n";
  std::ofstream(report / kReportMarker) << kReportMarkerText;
  study::Options o;
  o.out = report.string();
  o.data = (dir / "corpus.txt").string();
  o.quick = true;
  o.variants = {"relu"};
  o.seeds = 1;
  o.max_seeds = 1;
  o.steps = 2;
  struct StopAtTheEnd : study::Observer {
    bool ended = false;
    void end() override {
      ended = true;
      request_stop(SIGINT);
    }
  } observer;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  EXPECT_THROW(study::run_study(o, observer), Interrupted);
  clear_stop();
  omp_set_num_threads(threads);
  EXPECT_TRUE(observer.ended);
  std::ifstream in(report / "REPORT.md");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "the old report\n");
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".partial-"), std::string::npos) << e.path();
}

}  // namespace
}  // namespace ffnlab

namespace ffnlab {
namespace {

// A speed ratio that cannot be true, or rounds that disagree, is noise: flagged, never a finding.
TEST(LayerSpeedNoise, ImpossibleRatiosAndSpreadRoundsAreFlagged) {
  LayerSpeed s;
  s.forward_of_bare = s.forward_backward_of_bare = 0.95;
  s.forward_of_bare_spread = s.forward_backward_of_bare_spread = 0.03;
  EXPECT_FALSE(s.noisy());
  s.forward_of_bare = 2.17;  // "fwd of peak 217 %" under load
  EXPECT_TRUE(s.noisy());
  s.forward_of_bare = 0.95;
  s.forward_backward_of_bare_spread = 0.4;
  EXPECT_TRUE(s.noisy());
  EXPECT_TRUE(to_json(s)["noisy"].get<bool>());
}

// Draws the one figure of `key`'s stage into st.dir and checks that a PNG came out.
void draw_the_figure(const study::Study& st, std::string_view key) {
  const Stage& s = stage(key);
  ASSERT_EQ(s.figures.size(), 1u);
  s.figures[0].draw(st);
  EXPECT_GT(std::filesystem::file_size(std::filesystem::path(st.dir) /
                                       (std::string(s.figures[0].name) + ".png")),
            1000u);
}

// The speed panel leaves noisy rows out; when every row is noisy it says so instead of failing
// (gnuplot refuses a histogram with no valid point).
TEST(StudyFigures, SpeedPanelWithEveryRowNoisyStillDraws) {
  const ScratchDir scratch("figure");
  const auto& dir = scratch.path;
  study::Study st;
  st.dir = dir.string();
  st.write("costs_tutorial.csv",
           "variant,params_x_relu,active_params_x_relu,forward_flops_x_relu,weights_mib,"
           "grads_mib,adam_mib,activations_mib\nrelu,1,1,1,8,8,16,0.1\n");
  st.write(
      "cost_growth.csv",
      "d_model,relu_params,relu_fwd_flops,swiglu_params,swiglu_fwd_flops,gated_params,"
      "gated_fwd_flops,moe_params,moe_fwd_flops\n128,1,2,1,2,3,6,8,2\n256,4,8,4,8,12,24,32,8\n");
  st.write("speed.csv",
           "variant,forward_gflops,forward_backward_gflops,bare_forward_gflops,"
           "bare_forward_backward_gflops,noisy\nrelu,100,90,50,45,1\n");
  LayerSpeed noisy;
  noisy.forward_of_bare = noisy.forward_backward_of_bare = 2.0;  // "200 % of bare"
  st.results.speed = study::SpeedResult{};
  st.results.speed->variants.emplace_back("relu", noisy);
  ASSERT_TRUE(noisy.noisy());
  draw_the_figure(st, "speed");
}

// moe_pareto.png names every point; two points closer than a line (SwiGLU and the fine-grained
// MoE against FLOPs per token, in a default run) get their names on different lines, and a
// point with room keeps its name beside it. It draws the paired differences to ReLU.
TEST(StudyFigures, ParetoNamesOfNearbyPointsDoNotOverlap) {
  const ScratchDir scratch("pareto");
  const auto& dir = scratch.path;
  study::Study st;
  st.dir = dir.string();
  study::MoEAxesResult axes;
  // Differences to ReLU with their intervals, as a default run has them.
  axes.pareto = {
      {"relu", 842496, 1920896, 3.09514, 0.02030, false, 0, 0, 0},
      {"gelu", 842496, 1920896, 3.16180, 0.00679, false, 0.06666, 0.016, 0.138},
      {"swiglu", 847296, 1930496, 3.04577, 0.01307, false, -0.04937, -0.096, -0.001},
      {"gated", 835840, 1908928, 3.19456, 0.02214, false, 0.09942, 0.072, 0.145},
      {"moe", 850208, 1142312, 3.17741, 0.01554, true, 0.08227, 0.054, 0.110},
      {"moe_fine_shared", 2569536, 1942732, 3.04189, 0.01344, true, -0.05325, -0.060, -0.011}};
  st.write("moe_pareto.csv", axes.pareto_csv());
  st.results.moe_axes = axes;
  draw_the_figure(st, "moe_axes");
  // The label rows of each panel, from the script: "set label 'name' at x,y left ...", and the
  // height of a line of text in its y units, (hi - lo)·16/440 of "set yrange [lo:hi]" (a
  // 9-point line is about 16 of the panel's 440 pixels).
  std::ifstream in(dir / "moe_pareto.gp");
  struct Panel {
    std::map<std::string, double> rows;
    double line_h = 0;
  };
  std::vector<Panel> panels;
  double line_h = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("set yrange [", 0) == 0) {
      const auto colon = line.find(':');
      line_h = (std::stod(line.substr(colon + 1)) - std::stod(line.substr(12))) * 16.0 / 440;
    }
    if (line == "unset label") panels.push_back({{}, line_h});
    if (line.rfind("set label '", 0) != 0) continue;
    ASSERT_FALSE(panels.empty());
    const auto name_end = line.find('\'', 11);
    const auto comma = line.find(',', name_end);
    panels.back().rows[line.substr(11, name_end - 11)] = std::stod(line.substr(comma + 1));
  }
  ASSERT_EQ(panels.size(), 2u);
  for (const auto& p : panels) EXPECT_EQ(p.rows.size(), axes.pareto.size());
  const Panel& flops = panels[1];
  ASSERT_GT(flops.line_h, 0.0);
  // 0.0039 apart at their points, less than a line: their names a whole line apart.
  EXPECT_GE(std::abs(flops.rows.at("swiglu") - flops.rows.at("moe_fine_shared")),
            flops.line_h * (1 - 1e-9));
  EXPECT_DOUBLE_EQ(flops.rows.at("gated"), 0.09942);  // nothing near it: beside its point
}

// A run as data: a job of every stage's kind reads back as it was written, a record round-trips
// exactly (NaN too, through CBOR), and the store keeps it under the job and the data, starts
// empty without --resume and refuses a folder that is not one of its own.
TEST(StudyRuns, JobsAndRecordsRoundTripAndTheStoreKeepsThemByJobAndData) {
  study::Study st;
  st.options.quick = true;
  st.options.variants = study::default_variants();
  st.scale = study::make_scale(st.options);
  study::RunJob job;
  job.model = st.scale.model;
  job.model.ffn = study::study_ffn("moe", st.scale.model.d_model);
  job.seed = 3;
  job.label = "moe";
  job.probe = study::Probe::census;
  const nlohmann::json described = study::job_to_json(st, job);
  EXPECT_EQ(described.at("train").at("seed"), 3) << "the settings are resolved, seed included";
  EXPECT_EQ(study::job_to_json(st, study::job_from_json(described)), described);
  // Every routing family's FFN in the study's bidirectional LM (where every family may run)
  // reads back as it was written.
  for (const auto& name : routing_family_names()) {
    study::RunJob f = job;
    f.model.causal = false;
    f.model.vocab = kMaskToken + 1;
    f.model.positions = PositionKind::rope;
    f.model.ffn = routing_family_config(study::headline_moe_ffn(st.scale.model.d_model), name,
                                        st.scale.train.seq);
    f.probe = study::Probe::routing_behaviour;
    const nlohmann::json d = study::job_to_json(st, f);
    EXPECT_EQ(study::job_to_json(st, study::job_from_json(d)), d) << name;
  }

  study::RunRecord r;
  r.variant = "moe";
  r.seed = 3;
  r.d_ff = 96;
  r.params = 12345;
  StepLog s;
  s.step = 1;
  s.loss = 5.25;
  s.grad_norm = std::nan("");
  s.lr = 1.0 / 3.0;
  r.steps = {s};
  r.evals = {EvalLog{1, 3.5, 1.0 / 7.0, 512}};
  r.val_bits_per_byte = 2.0 / 3.0;
  r.gathered = {{"shares", {0.1, 1.0 / 3.0}}};
  const study::RunRecord back = study::record_from_json(
      nlohmann::json::from_cbor(nlohmann::json::to_cbor(study::record_to_json(r))));
  EXPECT_EQ(back.steps.at(0).lr, s.lr);
  EXPECT_TRUE(std::isnan(back.steps.at(0).grad_norm));
  EXPECT_EQ(back.evals.at(0).bits_per_byte, 1.0 / 7.0);
  EXPECT_EQ(back.evals.at(0).tokens, 512);
  EXPECT_EQ(back.val_bits_per_byte, r.val_bits_per_byte);
  EXPECT_EQ(back.gathered, r.gathered);
  EXPECT_EQ(back.params, r.params);

  ScratchDir dir("run-store");
  const std::string store_dir = (dir.path / "runs").string();
  {
    const study::RunStore store(store_dir, false, "fnv1a64:1");
    EXPECT_FALSE(store.find(described).has_value());
    store.put(described, r);
  }
  {
    const study::RunStore store(store_dir, true, "fnv1a64:1");
    const std::optional<study::RunRecord> kept = store.find(described);
    ASSERT_TRUE(kept.has_value());
    EXPECT_EQ(kept->val_bits_per_byte, r.val_bits_per_byte);
    nlohmann::json other = described;
    other["seed"] = 4;
    EXPECT_FALSE(store.find(other).has_value()) << "another seed is another run";
  }
  {  // A record file that is CBOR but not a record (an empty map): the file named, not a raw
     // library error, and the record left for the user to remove.
    std::filesystem::path record;
    for (const auto& e : std::filesystem::directory_iterator(store_dir))
      if (e.path().extension() == ".cbor") record = e.path();
    ASSERT_FALSE(record.empty());
    std::ifstream in(record, std::ios::binary);
    const std::string saved((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    std::ofstream(record, std::ios::binary | std::ios::trunc) << '\xa0';
    try {
      (void)study::RunStore(store_dir, true, "fnv1a64:1").find(described);
      ADD_FAILURE() << "an empty map taken as a record";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + record.string() + "' cannot be read"),
                std::string::npos)
          << e.what();
    }
    std::ofstream(record, std::ios::binary | std::ios::trunc) << saved;
  }
  EXPECT_FALSE(study::RunStore(store_dir, true, "fnv1a64:2").find(described).has_value())
      << "other data: the run trains again";
  EXPECT_FALSE(study::RunStore(store_dir, false, "fnv1a64:1").find(described).has_value())
      << "without resume the store starts empty";
  EXPECT_FALSE(study::RunStore(store_dir, true, "fnv1a64:1").find(described).has_value());

  {  // A record an older ffnlab wrote: its job's floats in another form and without a key added
     // since (at its default), its file named by that text's key. It is the same run.
    nlohmann::json older = described;
    const nlohmann::json defaults = train_config_to_json(TrainConfig{});
    std::string dropped;
    for (const auto& [key, value] : defaults.items())
      if (key != "seed" && key != "steps" && older.at("train").at(key) == value) dropped = key;
    ASSERT_FALSE(dropped.empty());
    older["train"].erase(dropped);
    const float lr = older.at("train").at("lr").get<float>();
    older["train"]["lr"] = static_cast<double>(lr);  // the float widened: 0.003000000026...
    ASSERT_NE(older.at("train").at("lr"), described.at("train").at("lr"));
    ASSERT_NE(study::run_key(older, "fnv1a64:1"), study::run_key(described, "fnv1a64:1"));
    EXPECT_EQ(study::job_as_written_now(older), described);
    const std::string older_dir = (dir.path / "older").string();
    (void)study::RunStore(older_dir, false, "fnv1a64:1");  // marked, empty
    const nlohmann::json stored{
        {"job", older}, {"data", "fnv1a64:1"}, {"record", study::record_to_json(r)}};
    const std::vector<std::uint8_t> bytes = nlohmann::json::to_cbor(stored);
    std::ofstream(std::filesystem::path(older_dir) / (study::run_key(older, "fnv1a64:1") + ".cbor"),
                  std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    std::ofstream(std::filesystem::path(older_dir) / "0123456789abcdef.cbor", std::ios::binary)
        << '\xff';  // not a record: left out of the index, not in the way
    const std::optional<study::RunRecord> kept =
        study::RunStore(older_dir, true, "fnv1a64:1").find(described);
    ASSERT_TRUE(kept.has_value()) << "an older store's run trained again";
    EXPECT_EQ(kept->val_bits_per_byte, r.val_bits_per_byte);
    // The same run written by today's ffnlab beside the older copy: today's is the one found.
    study::RunRecord now = r;
    now.val_bits_per_byte = 0.5;
    study::RunStore(older_dir, true, "fnv1a64:1").put(described, now);
    const std::optional<study::RunRecord> found =
        study::RunStore(older_dir, true, "fnv1a64:1").find(described);
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(found->val_bits_per_byte, 0.5);
    nlohmann::json other = described;
    other["train"]["lr"] = 0.004;
    EXPECT_FALSE(study::RunStore(older_dir, true, "fnv1a64:1").find(other).has_value())
        << "another setting is another run";
  }

  std::ofstream(dir.path / "notes.txt") << "mine\n";
  EXPECT_THROW(study::RunStore(dir.path.string(), false, "fnv1a64:1"), Error)
      << "a folder of other files is never emptied";
  EXPECT_TRUE(std::filesystem::exists(dir.path / "notes.txt"));
}

}  // namespace
}  // namespace ffnlab

namespace ffnlab {
namespace {

// Welch's interval of the difference of two means, written out: what slope_interval must give
// for two groups, over the distance of their x.
TEST(Stats, TheSlopeIntervalIsWelchsForTwoGroupsAndExactOnALine) {
  const std::vector<double> a{1, 2, 3}, b{2, 4, 6, 8};
  const double va = 1.0 / 3.0, vb = (20.0 / 3.0) / 4.0;  // s² / n of each
  const double df = (va + vb) * (va + vb) / (va * va / 2 + vb * vb / 3);
  const double half =
      boost::math::quantile(boost::math::students_t(df), 0.975) * std::sqrt(va + vb);
  for (const double dx : {1.0, 2.5}) {
    const std::vector<double> x{0.5, 0.5 + dx};
    const SlopeInterval s = slope_interval(x, {a, b});
    ASSERT_TRUE(s.defined());
    EXPECT_NEAR(s.slope, (5.0 - 2.0) / dx, 1e-12);
    EXPECT_NEAR(s.degrees_of_freedom, df, 1e-9);
    EXPECT_NEAR(s.low, (3.0 - half) / dx, 1e-9);
    EXPECT_NEAR(s.high, (3.0 + half) / dx, 1e-9);
  }
  // Groups on the line 1 − 0.5·x with the same deviations: the slope is exact, the interval
  // around it, and a wider spread widens it.
  const std::vector<double> x{1, 2, 4};
  auto groups = [&](double spread) {
    std::vector<std::vector<double>> g;
    for (double xi : x) g.push_back({1 - 0.5 * xi - spread, 1 - 0.5 * xi, 1 - 0.5 * xi + spread});
    return g;
  };
  const SlopeInterval narrow = slope_interval(x, groups(0.01)),
                      wide = slope_interval(x, groups(0.1));
  EXPECT_NEAR(narrow.slope, -0.5, 1e-12);
  EXPECT_NEAR(narrow.slope - narrow.low, narrow.high - narrow.slope, 1e-12);
  EXPECT_LT(narrow.high, 0);
  EXPECT_NEAR((wide.high - wide.low) / (narrow.high - narrow.low), 10, 1e-9);
  // No interval: one group, a group of one value, two groups at one x.
  EXPECT_FALSE(slope_interval(std::vector<double>{1}, {a}).defined());
  EXPECT_FALSE(slope_interval(std::vector<double>{1, 2}, {a, {3}}).defined());
  EXPECT_TRUE(std::isfinite(slope_interval(std::vector<double>{1, 2}, {a, {3}}).slope));
  EXPECT_FALSE(slope_interval(std::vector<double>{1, 1}, {a, b}).defined());
  EXPECT_THROW(slope_interval(std::vector<double>{1, 2}, {a}), Error);
}

TEST(StudyScaling, TheLadderGrowsTokensWithParametersFromTheStudysOwnLM) {
  for (bool quick : {false, true}) {
    study::Options o;
    o.quick = quick;
    o.variants = {"relu", "swiglu", "moe"};
    const study::Scale scale = study::make_scale(o);
    const auto& ladder = study::size_ladder(quick);
    ASSERT_EQ(ladder.size(), 4u);
    const study::ModelSize& own = ladder[1];
    EXPECT_EQ(own.name, "s");
    EXPECT_EQ(scale.model.d_model, own.d_model) << "the study's LM is the ladder's s";
    EXPECT_EQ(scale.model.layers, own.layers);
    EXPECT_EQ(scale.model.heads, own.heads);
    const auto params = [&](const study::ModelSize& m) {
      return static_cast<double>(
          transformer_cost(study::size_model(scale, m), scale.train.seq).params);
    };
    for (const study::ModelSize& m : ladder) {
      const TrainConfig t = study::size_settings(scale, m);
      const double grown = static_cast<double>(scale.train.steps) * params(m) / params(own);
      EXPECT_EQ(t.steps,
                std::max(scale.train.steps, static_cast<std::int64_t>(std::llround(grown))))
          << m.name;
      EXPECT_EQ(t.warmup, t.steps / 4);
      EXPECT_EQ(t.eval_every, 0);
      EXPECT_EQ(t.batch, scale.train.batch);
      EXPECT_EQ(t.seq, scale.train.seq);
    }
    EXPECT_EQ(study::size_settings(scale, ladder[0]).steps, scale.train.steps)
        << "a smaller LM trains the study's steps";
    EXPECT_GT(study::size_settings(scale, ladder[3]).steps, 4 * scale.train.steps);
  }
  study::Study st;
  st.options.quick = true;
  st.options.variants = {"relu", "swiglu", "moe"};
  st.scale = study::make_scale(st.options);
  EXPECT_FALSE(study::trains_scaling(st.options));
  EXPECT_EQ(study::scaling_steps(st), 0);
  EXPECT_EQ(study::scaling_labels(st, "causal"),
            (std::vector<std::string>{"relu", "swiglu", "moe", std::string(study::kHeadlineMoE)}));
  EXPECT_EQ(study::scaling_labels(st, "masked"), (std::vector<std::string>{"relu", "swiglu"}))
      << "MoE trains on the causal LM only";
  st.options.sizes = {"s", "xs"};  // taken in the ladder's order
  st.options.tasks = {"masked", "causal"};
  const auto sizes = study::scaling_sizes(st.options);
  ASSERT_EQ(sizes.size(), 2u);
  EXPECT_EQ(sizes[0].name, "xs");
  EXPECT_EQ(study::scaling_tasks(st.options), (std::vector<std::string>{"causal", "masked"}));
  const study::RunJob job = study::scaling_job(st, sizes[0], "masked", "swiglu", 2);
  EXPECT_EQ(job.label, "xs/masked/swiglu");
  EXPECT_EQ(job.seed, 2u);
  EXPECT_FALSE(job.model.causal);
  EXPECT_EQ(job.model.vocab, kMaskToken + 1);
  EXPECT_EQ(job.settings->objective, Objective::masked);
  EXPECT_EQ(job.model.d_model, sizes[0].d_model);
  // Every cell to the cap but the study's own (s, causal: the training stage's runs).
  const std::int64_t xs = study::size_settings(st.scale, sizes[0]).steps,
                     s = study::size_settings(st.scale, sizes[1]).steps, cap = st.scale.design.cap;
  EXPECT_EQ(study::scaling_steps(st), (4 + 2) * cap * xs + 2 * cap * s);
  st.options.tasks = {};
  st.options.sizes = {"m"};
  EXPECT_EQ(study::scaling_tasks(st.options), (std::vector<std::string>{"causal"}));
}

// Cells compare with ReLU of their own size and task; the study's own cell is the training
// stage's runs; the trend reads the slope's interval.
TEST(StudyScaling, CellsPairWithTheirOwnReLUAndTheTrendReadsTheSlope) {
  study::Study st;
  st.options.quick = true;
  st.options.variants = {"relu", "swiglu"};
  st.options.sizes = {"xs", "s"};
  st.options.tasks = {"causal", "masked"};
  st.scale = study::make_scale(st.options);
  auto record = [](const std::string& label, int seed, double value) {
    study::RunRecord r;
    r.variant = label;
    r.seed = seed;
    r.val_bits_per_byte = value;
    return r;
  };
  // swiglu − relu per seed: −0.01 at xs and −0.05 at s, on both tasks (a gap that grows).
  const std::vector<double> noise{0.002, -0.001, 0.0};
  for (int seed = 1; seed <= 3; ++seed) {
    const double n = noise[static_cast<std::size_t>(seed - 1)];
    st.runs.push_back(record("relu", seed, 5.0 + 0.1 * seed));
    st.runs.push_back(record("swiglu", seed, 5.0 + 0.1 * seed - 0.05 + n));
    for (const std::string task : {"causal", "masked"}) {
      // stored out of seed order: the cell reads them by seed
      st.scaling_runs.insert(st.scaling_runs.begin(),
                             record("xs/" + task + "/relu", seed, 6.0 + 0.1 * seed));
      st.scaling_runs.push_back(
          record("xs/" + task + "/swiglu", seed, 6.0 + 0.1 * seed - 0.01 + n));
      st.scaling_runs.push_back(record("s/" + task + "/relu", seed, 5.5 + 0.1 * seed));
      st.scaling_runs.push_back(record("s/" + task + "/swiglu", seed, 5.5 + 0.1 * seed - 0.05 + n));
    }
  }
  const study::ScalingResult r = study::scaling_result(st);
  ASSERT_EQ(r.cells.size(), 4u);
  EXPECT_EQ(r.comparisons, 4);
  const study::ScalingCell* own = r.find("s", "causal");
  ASSERT_NE(own, nullptr);
  EXPECT_TRUE(own->from_training);
  EXPECT_NEAR(own->variants[0].outcome.mean, 5.2, 1e-12) << "the training stage's ReLU";
  const study::ScalingCell* small = r.find("xs", "masked");
  ASSERT_NE(small, nullptr);
  EXPECT_FALSE(small->from_training);
  ASSERT_EQ(small->variants.size(), 2u);
  EXPECT_EQ(small->variants[0].outcome.verdict, study::Verdict::reference);
  EXPECT_EQ(small->variants[1].outcome.val_bits_per_byte,
            (std::vector<double>{6.1 - 0.01 + 0.002, 6.2 - 0.01 - 0.001, 6.3 - 0.01}));
  EXPECT_NEAR(small->variants[1].outcome.diff_mean, -0.01 + 0.001 / 3, 1e-12);
  EXPECT_GT(r.sizes[1].training_flops, r.sizes[0].training_flops);
  ASSERT_EQ(r.trends.size(), 2u);
  for (const study::ScalingTrend& t : r.trends) {
    EXPECT_EQ(t.variant, "swiglu");
    // (x: the training FLOPs of ReLU's run of the task at each size)
    const double dx = std::log10(r.find("s", t.task)->variants[0].training_flops) -
                      std::log10(r.find("xs", t.task)->variants[0].training_flops);
    EXPECT_NEAR(t.slope.slope, -0.04 / dx, 1e-9) << t.task;
    EXPECT_EQ(t.reading, "gains on ReLU with size") << t.task;
    EXPECT_TRUE(t.holds_for_all_trends) << t.task << ": far from 0";
  }
  // Two trends share the 5 %: a gap just wide enough for a trend's own 95 % interval is not
  // enough for the 97.5 % one. Narrowing the growth of the gap finds such a case, and each
  // trend's mark is what the 97.5 % interval says.
  bool found_marked = false;
  for (double growth = 0.04; growth > 0 && !found_marked; growth -= 0.0005) {
    study::Study narrowed = st;
    for (auto& run : narrowed.scaling_runs)
      if (run.variant.starts_with("xs/") && run.variant.ends_with("/swiglu"))
        run.val_bits_per_byte -= 0.04 - growth;
    for (const study::ScalingTrend& t : study::scaling_result(narrowed).trends) {
      if (t.reading != "gains on ReLU with size") continue;
      found_marked |= !t.holds_for_all_trends;
      const double x_xs = std::log10(r.find("xs", t.task)->variants[0].training_flops);
      const double x_s = std::log10(r.find("s", t.task)->variants[0].training_flops);
      EXPECT_NEAR(t.slope.slope, -growth / (x_s - x_xs), 1e-9);
      std::vector<std::vector<double>> groups(2);
      for (double n : noise) {
        groups[0].push_back(-0.05 + growth + n);
        groups[1].push_back(-0.05 + n);
      }
      const std::vector<double> x{x_xs, x_s};
      EXPECT_EQ(t.holds_for_all_trends, slope_interval(x, groups, 0.975).high < 0) << growth;
    }
  }
  EXPECT_TRUE(found_marked) << "no gap decided at 95 % and not at 97.5 %";
  // The same gap at both sizes: undecided.
  for (auto& run : st.scaling_runs)
    if (run.variant.starts_with("xs/") && run.variant.ends_with("/swiglu"))
      run.val_bits_per_byte -= 0.04;
  for (const study::ScalingTrend& t : study::scaling_result(st).trends)
    EXPECT_EQ(t.reading, "undecided") << t.task;
  const std::string csv = r.figure_csv();
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "task,variant,size,training_flops,mean,std,seeds,difference_to_relu,difference_low,"
            "difference_high");
  EXPECT_NE(csv.find("\ncausal,relu,xs,"), std::string::npos);
  EXPECT_LT(csv.find("\ncausal,relu,s,"), csv.find("\ncausal,swiglu,xs,"))
      << "each line of the figure in consecutive rows";
}

// What the study prints at its end: each undecided comparison with the seeds that would
// decide it.
TEST(StudyScaling, UndecidedComparisonsSayWhatWouldDecideThem) {
  study::Study st;
  st.options.quick = true;
  st.options.variants = {"relu", "swiglu"};
  st.scale = study::make_scale(st.options);
  st.results.training = study::TrainingResult{};
  EXPECT_TRUE(study::undecided_comparisons(st).empty()) << "no runs, nothing undecided";
  study::ScalingCell cell;
  cell.size = "xs";
  cell.task = "masked";
  study::VariantOutcome relu, swiglu;
  relu.variant = "relu";
  relu.verdict = study::Verdict::reference;
  relu.val_bits_per_byte = {5.0, 5.1, 5.2};
  swiglu.variant = "swiglu";
  swiglu.verdict = study::Verdict::inconclusive;
  swiglu.val_bits_per_byte = {4.99, 5.12, 5.18};  // differences −0.01, +0.02, −0.02
  cell.variants = {{relu, 0}, {swiglu, 0}};
  study::ScalingResult scaling;
  scaling.cells = {cell};
  st.results.scaling = scaling;
  const std::vector<double> d{-0.01, 0.02, -0.02};
  const int n = values_to_decide(d, st.options.margin);
  ASSERT_GT(n, 3);
  EXPECT_EQ(study::undecided_comparisons(st),
            (std::vector<std::string>{
                fmt::format("swiglu at xs, masked: about {} seeds would decide it", n)}));
}

TEST(StudyPlan, DurationsAndTheWallTimeOfRoundsOnWorkers) {
  EXPECT_EQ(study::parse_duration("90s"), 90);
  EXPECT_EQ(study::parse_duration("30m"), 1800);
  EXPECT_EQ(study::parse_duration("1.5h"), 5400);
  EXPECT_EQ(study::parse_duration("600"), 600);
  for (const char* bad : {"", "m", "30x", "-5m", "0", "nan", "1e300h"})
    EXPECT_THROW(study::parse_duration(bad), Error) << bad;
  study::StudyPlan plan;
  plan.other_seconds = 10;
  plan.first = {{5, 3, 3, 1}, {4}};
  plan.cap = {{5, 3, 3, 1}, {4}, {2, 2}};
  EXPECT_EQ(plan.core_seconds(false), 10 + 12 + 4);
  EXPECT_EQ(plan.core_seconds(true), 10 + 12 + 4 + 4);
  // Longest first to whichever worker frees first: {5, 1 | 3, 3} on 2 workers ends at 6.
  EXPECT_EQ(plan.wall_seconds(2, false), 10 + 6 + 4);
  EXPECT_EQ(plan.wall_seconds(2, true), 10 + 6 + 4 + 2);
  EXPECT_EQ(plan.wall_seconds(1, true), plan.core_seconds(true));
  EXPECT_EQ(plan.wall_seconds(64, true), 10 + 5 + 4 + 2) << "the longest run of a round is a floor";
}

TEST(StudyPlan, ABudgetChoosesWhatFitsOrSaysWhatTheSmallestChoiceTakes) {
  Corpus corpus;
  corpus.source = "test";
  std::string text;
  for (int i = 0; text.size() < 200000; ++i) text += fmt::format("line {} of a test corpus. ", i);
  corpus.bytes.assign(text.begin(), text.end());
  corpus.split = static_cast<std::int64_t>(corpus.bytes.size() * 9 / 10);
  study::Options o;
  o.quick = true;
  o.variants = {"relu", "swiglu"};
  // Without a budget: the options as given, the study's own LM and the ladder's.
  o.sizes = {"xs", "m"};
  const study::StudyPlan given = study::plan_study(o, 2, corpus);
  ASSERT_EQ(given.sizes.size(), 3u);
  EXPECT_EQ(given.sizes[0].name, "xs");
  EXPECT_EQ(given.sizes[1].name, "s");
  EXPECT_EQ(given.sizes[2].name, "m");
  for (const auto& s : given.sizes) EXPECT_GT(s.step_seconds, 0) << s.name;
  EXPECT_GT(given.sizes[2].steps, given.sizes[1].steps);
  EXPECT_TRUE(given.why.empty());
  EXPECT_GE(given.wall_seconds(2, true), given.wall_seconds(2, false));
  EXPECT_GE(given.wall_seconds(1, true), given.wall_seconds(2, true));
  const std::string text_plan = study::plan_text(given, 2, {8, 64});
  for (const char* part : {"| xs |", "| m |", "core-hours", "| 8 |", "| 2 (this machine) |"})
    EXPECT_NE(text_plan.find(part), std::string::npos) << part << "\n" << text_plan;
  // A day holds the whole ladder at the study's seeds and steps.
  o.sizes = {};
  o.budget_seconds = 86400;
  const study::StudyPlan all = study::plan_study(o, 2, corpus);
  EXPECT_EQ(all.options.sizes, (std::vector<std::string>{"xs", "s", "m", "l"}));
  EXPECT_EQ(all.scale.design.cap, study::make_scale(o).design.cap);
  EXPECT_EQ(all.scale.train.steps, study::make_scale(o).train.steps);
  EXPECT_NE(all.why.find("a budget of 24.0 h on 2 workers: sizes xs,s,m,l"), std::string::npos)
      << all.why;
  // Less than the stages that train nothing: refused, saying what the smallest choice takes.
  o.budget_seconds = 1;
  try {
    study::plan_study(o, 2, corpus);
    ADD_FAILURE() << "a budget of 1 s was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a budget of 1.0 s on 2 workers cannot hold the study"),
              std::string::npos)
        << e.what();
  }
}

TEST(Study, RefusesBadSizesTasksAndBudgets) {
  const ScratchDir scratch("scaling-options");
  study::Options o;
  o.out = (scratch.path / "report").string();
  o.data = (scratch.path / "no-corpus-needed").string();
  o.variants = {"relu"};
  o.sizes = {"xs", "xl"};
  EXPECT_NE(refusal(o).find("size 'xl' is not one of xs, s, m, l"), std::string::npos)
      << refusal(o);
  o.sizes = {"s", "s"};
  EXPECT_NE(refusal(o).find("size 's' is listed twice"), std::string::npos);
  o.sizes = {};
  o.tasks = {"causal", "classification"};
  EXPECT_NE(refusal(o).find("task 'classification' is not one of causal, masked"),
            std::string::npos);
  o.tasks = {};
  o.budget_seconds = -1;
  EXPECT_NE(refusal(o).find("budget = -1 s must be positive"), std::string::npos);
  o.budget_seconds = 3600;
  o.resume = true;  // the planner could choose other runs than the stopped study's
  EXPECT_NE(refusal(o).find("--budget with --resume: the planner times this machine on every "
                            "start"),
            std::string::npos)
      << refusal(o);
  // From Python, the same refusal in ffnlab.evolve's arguments.
  o.front_end = study::FrontEnd::python;
  EXPECT_NE(refusal(o).find("budget= with resume=True: the planner"), std::string::npos)
      << refusal(o);
  EXPECT_NE(refusal(o).find("give them as sizes=, max_seeds= and steps=)"), std::string::npos)
      << refusal(o);
  EXPECT_TRUE(std::filesystem::is_empty(scratch.path));
}

// Messages and the report's first line name options in the words of the front end that runs the
// study; the advice to train the full study names the command that resumes into the same folders.
// The option rows both front ends read: one flag per field, each named once, each number with
// a range, and each row's value a field of the right type (the front ends std::get by it).
TEST(Study, EachOptionIsOneRowWithAFieldOfItsKind) {
  using V = study::OptionRow::Value;
  std::set<std::string> flags, arguments;
  for (const study::OptionRow& row : study::option_rows()) {
    EXPECT_TRUE(row.flag.starts_with("--")) << row.flag;
    EXPECT_TRUE(flags.insert(row.flag).second) << row.flag;
    EXPECT_TRUE(arguments.insert(study::argument_name(row.flag)).second) << row.flag;
    EXPECT_FALSE(row.help.empty()) << row.flag;
    EXPECT_EQ(&study::option_row(row.flag), &row);
    const bool fits = std::visit(
        [&]<class T>(T study::Options::*) {
          switch (row.value) {
            case V::path:
              return std::is_same_v<T, std::string>;
            case V::on:
              return std::is_same_v<T, bool>;
            case V::count:
              return std::is_integral_v<T> && !std::is_same_v<T, bool>;
            case V::real:
            case V::duration:
              return std::is_same_v<T, double>;
            case V::names:
              return std::is_same_v<T, std::vector<std::string>>;
          }
          return false;
        },
        row.field);
    EXPECT_TRUE(fits) << row.flag;
    if (row.value == V::count || row.value == V::real || row.value == V::duration) {
      EXPECT_LT(row.lo, row.hi) << row.flag;
    }
  }
  const auto& rows = study::option_rows();
  for (std::size_t i = 0; i < rows.size(); ++i)  // two rows on one field would set it twice
    for (std::size_t j = i + 1; j < rows.size(); ++j)
      EXPECT_FALSE(rows[i].field == rows[j].field) << rows[i].flag << " " << rows[j].flag;
  EXPECT_EQ(study::argument_name("--max-seeds"), "max_seeds");
  EXPECT_THROW(study::option_row("--no-such-flag"), std::logic_error);
  // The numbers are checked by their rows also for a library caller, who skips both front ends.
  study::Options o;
  o.variants = {"relu"};
  o.max_seeds = 1001;
  try {
    study::check_options(o);
    ADD_FAILURE() << "max_seeds = 1001 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_seeds = 1001 must be in [1, 1000]"),
              std::string::npos)
        << e.what();
  }
  o.max_seeds = 0;
  o.margin = 0;
  EXPECT_THROW(study::check_options(o), Error);
}

TEST(Study, NamesOptionsInTheCallersWords) {
  study::Options o;
  EXPECT_EQ(study::option_name(o, "--max-seeds"), "--max-seeds");
  EXPECT_EQ(study::call_text(o.front_end, {{"--quick", ""}, {"--sizes", "xs,s"}}),
            "ffnlab evolve --quick --sizes xs,s");
  EXPECT_EQ(study::full_study_call(o), "ffnlab evolve --full --resume");
  o.quick = true;
  o.steps = 40;
  o.out = "r";
  o.runs = "store";
  o.tasks = {"causal", "masked"};
  EXPECT_EQ(study::full_study_call(o),
            "ffnlab evolve --quick --full --steps 40 --tasks causal,masked --resume --out r "
            "--runs store");
  o.margin = 0.05;  // what decides the verdicts: carried, as the scale is
  o.sweep = true;
  EXPECT_NE(study::full_study_call(o).find("--tasks causal,masked --margin 0.05 --sweep --resume"),
            std::string::npos)
      << study::full_study_call(o);
  o.margin = study::Options{}.margin;
  o.sweep = false;
  o.front_end = study::FrontEnd::python;
  EXPECT_EQ(study::option_name(o, "--max-seeds"), "max_seeds=");
  EXPECT_EQ(study::option_name(o, "--resume"), "resume=True");
  EXPECT_EQ(
      study::call_text(o.front_end,
                       {{"--quick", ""}, {"--seeds", "3"}, {"--sizes", "xs,s"}, {"--runs", "a b"}}),
      "ffnlab.evolve(quick=True, seeds=3, sizes=['xs', 's'], runs='a b')");
  // Values are literals by the flag, not by their look, and escaped: pasted, they are the values.
  EXPECT_EQ(study::call_text(o.front_end, {{"--runs", "2024"}, {"--data", R"(a'b\c)"}}),
            R"(ffnlab.evolve(runs='2024', data='a\'b\\c'))");
  EXPECT_EQ(study::call_text(o.front_end, {{"--data", "a\nb"}}), R"(ffnlab.evolve(data='a\x0ab'))");
  EXPECT_EQ(study::call_text(study::FrontEnd::command_line,
                             {{"--out", "my report"}, {"--data", "it's"}, {"--runs", "r.runs"}}),
            R"(ffnlab evolve --out 'my report' --data 'it'\''s' --runs r.runs)");
  // A stopped study's advice: --resume, in place of what refuses it.
  {
    study::Options r;
    EXPECT_EQ(study::resume_call(r), "the same command with --resume");
    r.force = true;
    EXPECT_EQ(study::resume_call(r), "the same command with --resume in place of --force");
    r.front_end = study::FrontEnd::python;
    EXPECT_EQ(study::resume_call(r), "the same call with resume=True in place of force=True");
    r.force = false;
    r.budget_seconds = 60;
    EXPECT_NE(study::resume_call(r).find("resume=True and, in place of budget=, the sizes"),
              std::string::npos)
        << study::resume_call(r);
    r.force = true;  // both refuse resume=True beside them
    EXPECT_NE(study::resume_call(r).find(
                  "resume=True in place of force=True and, in place of budget=, the sizes"),
              std::string::npos)
        << study::resume_call(r);
  }
  // The report speaks the command line's words whichever front end wrote it.
  EXPECT_EQ(study::full_study_call(o).substr(0, 34), "ffnlab evolve --quick --full --ste");
  // A run store folder that holds other files is refused before any work, in the caller's words.
  const ScratchDir scratch("not-a-store");
  o.runs = scratch.path.string();
  std::ofstream(scratch.path / "notes.txt") << "mine";
  try {
    study::check_run_store(o);
    ADD_FAILURE() << "a folder of other files taken as a run store";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not a run store of ffnlab evolve (no "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("give another runs= folder"), std::string::npos)
        << e.what();
  }
}

// The report's real-model section words the table (src/study/report.cpp, zoo_markdown): BERT,
// GPT-2 and GPT-3 a plain GELU FFN, T5 v1.1 a GEGLU, the dense models from PaLM on SwiGLU;
// Switch plain ReLU experts, GLaM plain GELU ones, the MoE models from Mixtral on SwiGLU
// experts. A row added to or changed in the table that breaks a sentence fails here.
TEST(Zoo, TheReportsWordsAgreeWithTheTable) {
  const auto rows = study::zoo_table_rows();
  std::vector<std::pair<std::string, std::string>> dense, moe;  // (model, FFN), in table order
  for (const auto& r : rows) {
    const bool experts = r[5] != "—";
    (experts ? moe : dense).emplace_back(r[0], r[1]);
  }
  bool since_palm = false;
  for (const auto& [model, ffn] : dense) {
    since_palm = since_palm || model.rfind("PaLM", 0) == 0;
    if (since_palm)
      EXPECT_EQ(ffn, "GLU (silu)") << model;
    else if (model.rfind("T5", 0) == 0)
      EXPECT_EQ(ffn, "GLU (gelu_tanh)") << model;
    else
      EXPECT_EQ(ffn.rfind("plain (gelu", 0), 0u) << model << ": " << ffn;
  }
  EXPECT_TRUE(since_palm);
  bool since_mixtral = false;
  for (const auto& [model, ffn] : moe) {
    since_mixtral = since_mixtral || model.rfind("Mixtral", 0) == 0;
    if (since_mixtral)
      EXPECT_EQ(ffn, "GLU (silu)") << model;
    else if (model.rfind("Switch", 0) == 0)
      EXPECT_EQ(ffn, "plain (relu)") << model;
    else
      EXPECT_EQ(ffn, "plain (gelu)") << model;  // GLaM, costed so
  }
  EXPECT_TRUE(since_mixtral);
}

}  // namespace
}  // namespace ffnlab
