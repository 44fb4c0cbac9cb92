// ffnlab evolve as a user runs it: the --quick report's structure and key numbers, its figures,
// results.json against REPORT.md, atomic replacement, and determinism.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "cli_fixture.hpp"
#include "ffnlab/report/staged_dir.hpp"
#include "ffnlab/study/study.hpp"

using namespace ffnlab;
namespace fs = std::filesystem;
using nlohmann::json;
using test::Cli;
using test::Outcome;
using test::start;
using test::Started;

namespace {

std::string fmt4(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

}  // namespace

TEST_F(Cli, EvolveQuickWritesTheWholeReportAndReplacesTheOldOneAtomically) {
  const std::string out = path("report");
  // An old report: a failed run must leave it whole; a successful one replaces all of it.
  fs::create_directories(out);
  std::ofstream(out + "/REPORT.md") << "old report\n";
  std::ofstream(out + "/stale.csv") << "1\n";
  std::ofstream(out + "/.ffnlab-report") << kReportMarkerText;  // the marker every report carries
  expect_error(run("evolve --quick --out " + out + " --data " + path("no-such-corpus")),
               "does not exist");
  EXPECT_EQ(read(out + "/REPORT.md"), "old report\n");
  EXPECT_TRUE(fs::exists(out + "/stale.csv"));

  // The staging folder of a run that was killed outright (its process is gone).
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);
  fs::create_directories(path(".report.partial-" + std::to_string(gone)));

  // --full: every variant, both designs of MoE at equal compute, the z-loss ablation.
  const Outcome r = run("evolve --quick --full --out " + out);
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  EXPECT_FALSE(fs::exists(out + "/stale.csv")) << "the old report's files must be gone";
  EXPECT_TRUE(fs::exists(out + "/.ffnlab-report")) << "the new report carries the marker";
  for (const auto& e : fs::directory_iterator(path("")))  // no staging folder left behind
    EXPECT_EQ(e.path().filename().string().find(".partial-"), std::string::npos) << e.path();
  EXPECT_NE(r.out.find("== training"), std::string::npos) << "progress names the stages";
  EXPECT_NE(r.out.find("ETA"), std::string::npos);
  // The bar's total follows the plan, which shrinks as comparisons are decided: the last
  // training step is step N of N.
  {
    const std::size_t last = r.out.rfind("\nstep ");
    ASSERT_NE(last, std::string::npos) << r.out;
    const std::string line = r.out.substr(last + 6, r.out.find(' ', last + 6) - last - 6);
    const std::size_t slash = line.find('/');
    ASSERT_NE(slash, std::string::npos) << line;
    EXPECT_EQ(line.substr(0, slash), line.substr(slash + 1)) << line;
  }

  const std::string md = read(out + "/REPORT.md");
  for (const char* section :
       {"## Summary",
        "| ReLU FFN (the reference) |",
        "## 1. Costs",
        "## 2. Equal budgets",
        "## 3. Speed",
        "## 4. Training dynamics",
        "## 5. Activation sparsity",
        "## 6. MoE behaviour",
        "## 7. MoE at equal compute",
        "| moe_compute | equal active compute",
        "## 8. Routing families",
        "**The masked objective** (bits per masked byte;",
        "| soft | Soft MoE: 6 slots an expert",
        "## 9. The evolution, step by step, in this run's numbers",
        "**Choosing by situation.**",
        "## 10. The literature: the GLU variants in Shazeer 2020",
        "| geglu | 1.942 (0.004) | 1.633 |",
        "## 11. Real models",
        "`ffnlab zoo` prints it too, and results.json holds it",
        "## 12. Corrections of the FFN-evolution tutorial",
        "1. Linear(512, 2048) has 1,050,624 parameters, not 2,097,152.",
        "## 13. Recommendations",
        "## 14. Limits of this study",
        "ReLU's validation (on",
        "## References",
        "arXiv:2002.05202",

        "5. **MoE at equal compute** (fine-grained, 16 experts, top-3, 1 shared)",
        "This is a --quick run",
        "## Appendix",
        "[APPENDIX.md](APPENDIX.md)"})
    EXPECT_NE(md.find(section), std::string::npos) << section;
  // The details stand in the appendix, under their sections, and not in the report.
  const std::string appendix = read(out + "/APPENDIX.md");
  for (const char* heading : {"# Appendix to the report", "## Data", "## 1. Costs"})
    EXPECT_NE(appendix.find(heading), std::string::npos) << heading;
  for (const char* detail :
       {"[REPORT.md](REPORT.md)", "**The three dimensions.**",
        "**Router z-loss (an ablation of the recipe).**", "**Which bytes each expert takes.**",
        "| 1 | Linear(512, 2048) has \"512 × 2048 × 2 = 2,097,152\" parameters |",
        "**How many seeds, and when a comparison is decided"}) {
    EXPECT_NE(appendix.find(detail), std::string::npos) << detail;
    EXPECT_EQ(md.find(detail), std::string::npos) << detail;
  }
  EXPECT_LT(appendix.find("## Data"), appendix.find("## 1. Costs"));
  // The summary opens the report, and each figure stands in its own section.
  EXPECT_LT(md.find("## Summary"), md.find("## 1. Costs"));
  EXPECT_LT(md.find("## 4. Training dynamics"), md.find("![training_dynamics]"));
  EXPECT_LT(md.find("![training_dynamics]"), md.find("## 5. Activation sparsity"));
  EXPECT_LT(md.find("## 7. MoE at equal compute"), md.find("![moe_pareto]"));
  EXPECT_LT(md.find("![moe_pareto]"), md.find("## 8. Routing families"));
  // MoE top-2 against MoE at equal parameters: over the seeds both trained, in every field.
  {
    const nlohmann::json j = nlohmann::json::parse(read(out + "/results.json"));
    const auto& c = j.at("moe_axes").at("equal_compute_minus_equal_parameters");
    const std::size_t both =
        std::min(j.at("training").at("variants").at("moe").at("val_bits_per_byte").size(),
                 j.at("moe_axes")
                     .at("rows")
                     .at("moe_compute")
                     .at("against_relu")
                     .at("val_bits_per_byte")
                     .size());
    EXPECT_EQ(c.at("seeds").get<std::size_t>(), both);
    EXPECT_EQ(c.at("val_bits_per_byte").size(), both);
    EXPECT_NE(md.find(fmt::format("paired by seed over the {} seeds both trained", both)),
              std::string::npos);
  }
  for (const char* figure : {"activation_comparison", "ffn_performance_comparison",
                             "training_dynamics", "moe_expert_load", "activation_sparsity",
                             "moe_pareto", "moe_specialisation", "routing_families"}) {
    const fs::path png = fs::path(out) / (std::string(figure) + ".png");
    ASSERT_TRUE(fs::exists(png)) << png;
    EXPECT_GT(fs::file_size(png), 10000u) << png;
    // The image stands in its section with its caption right below it.
    const std::string name(figure);
    const std::string image = "![" + name + "](" + name + ".png)\n\n*" + name + ".png: ";
    EXPECT_NE(md.find(image), std::string::npos) << figure << ": the image and its caption";
    EXPECT_EQ(md.find("](" + name + ".png)"), md.rfind("](" + name + ".png)"))
        << figure << ": drawn once";
    EXPECT_TRUE(fs::exists(fs::path(out) / (std::string(figure) + ".gp"))) << figure;
  }

  std::ifstream in(out + "/results.json");
  const json j = json::parse(in);
  // The tutorial's five parameter counts, exactly.
  const auto& tutorial = j.at("costs").at("tutorial");
  EXPECT_EQ(tutorial.at("relu").at("params"), 2099712);
  EXPECT_EQ(tutorial.at("gelu").at("params"), 2099712);
  EXPECT_EQ(tutorial.at("glu").at("params"), 3150336);
  EXPECT_EQ(tutorial.at("gated").at("params"), 9454080);
  EXPECT_EQ(tutorial.at("moe").at("params"), 16801800);
  for (const char* n : {"2,099,712", "3,150,336", "9,454,080", "16,801,800"})
    EXPECT_NE(md.find(n), std::string::npos) << n;
  // Top-2 MoE: forward matrix FLOPs about twice one expert's (the router adds a little).
  const double moe_ratio = j.at("costs").at("moe_forward_matmul_over_one_expert");
  EXPECT_GT(moe_ratio, 2.0);
  EXPECT_LT(moe_ratio, 2.01);
  // Equal budgets within 1 % of ReLU's parameters (MoE equal-active: its active parameters).
  for (const auto& [name, c] : j.at("equal_budget").items()) {
    const double p = c.at(name == "moe (equal active)" ? "active_params" : "params");
    EXPECT_NEAR(p / 2099712.0, 1.0, 0.01) << name;
  }

  // results.json and REPORT.md say the same: every variant's mean validation and the MoE rows.
  const auto& vars = j.at("training").at("variants");
  ASSERT_EQ(vars.size(), 9u);
  EXPECT_EQ(vars.at("relu").at("tokens_per_second_over_relu"), 1.0);  // its own runs
  EXPECT_TRUE(vars.at("relu").at("paired_difference_to_relu_ci95").is_null());
  EXPECT_TRUE(vars.at("swiglu").at("paired_difference_to_relu_ci95").is_array());
  // The sequential design (--quick: 2 seeds first, then one more per round up to 3): a
  // comparison undecided at a look trains another seed, so an inconclusive one ends at the cap;
  // ReLU trains as many as the comparison that went furthest.
  const auto& design = j.at("training").at("config").at("sequential");
  EXPECT_EQ(design.at("first_seeds"), 2);
  EXPECT_EQ(design.at("max_seeds"), 3);
  std::size_t furthest = 0;
  auto check_sequential = [&](const std::string& name, const json& x) {
    const std::size_t n = x.at("val_bits_per_byte").size();
    EXPECT_GE(n, 2u) << name;
    EXPECT_LE(n, 3u) << name;
    if (x.at("verdict") == "inconclusive") {
      EXPECT_EQ(n, 3u) << name;
    }
    furthest = std::max(furthest, n);
  };
  for (const auto& [v, x] : vars.items()) {
    if (v != "relu") check_sequential(v, x);
    EXPECT_GT(x.at("tokens_per_second_over_relu").get<double>(), 0.0) << v;
    // Measured, not asserted; never a number above 100 %.
    const auto& u = x.at("model_flop_utilisation");
    EXPECT_TRUE(u.is_null() || (u.get<double>() > 0 && u.get<double>() <= 1)) << v;
    const double mean = x.at("mean");
    EXPECT_TRUE(std::isfinite(mean) && mean > 0 && mean < 8) << v;
    EXPECT_NE(md.find("| " + v + " | "), std::string::npos) << v;
    EXPECT_NE(md.find(fmt4(mean)), std::string::npos) << v << " mean " << mean;
  }
  EXPECT_NE(appendix.find("| FLOP utilisation |"), std::string::npos);
  // The summary is the one place of each comparison's difference and interval: results.json's.
  for (const auto& [v, x] : vars.items()) {
    if (v == "relu") continue;
    const auto& ci = x.at("paired_difference_to_relu_ci95");
    if (!ci.is_array()) continue;  // no interval: the summary says why in words
    char cell[96];
    std::snprintf(cell, sizeof cell, "%+.4f [%+.4f, %+.4f]",
                  x.at("paired_difference_to_relu_mean").get<double>(), ci[0].get<double>(),
                  ci[1].get<double>());
    if (md.find(cell) == std::string::npos) ADD_FAILURE() << v << ": " << cell;
  }
  for (const auto& [s, x] : j.at("moe").at("settings").items())
    EXPECT_NE(md.find(fmt4(x.at("val_bits_per_byte"))), std::string::npos) << s;
  // MoE on both axes: the training stage's ReLU and MoE rows, and two trained at equal compute,
  // whose LM forward FLOPs per token are ReLU's (within the router's few).
  const auto& axes = j.at("moe_axes").at("rows");
  ASSERT_EQ(axes.size(), 4u);
  const double relu_flops = axes.at("relu").at("forward_flops_per_token");
  for (const char* name : {"moe_compute", "moe_fine_shared"}) {
    const auto& row = axes.at(name);
    EXPECT_NEAR(row.at("forward_flops_per_token").get<double>() / relu_flops, 1.0, 0.1) << name;
    EXPECT_GT(row.at("params").get<double>(), 2.0 * axes.at("relu").at("params").get<double>());
    check_sequential(name, row.at("against_relu"));
    EXPECT_NE(md.find(fmt4(row.at("against_relu").at("mean"))), std::string::npos) << name;
  }
  EXPECT_EQ(vars.at("relu").at("val_bits_per_byte").size(), furthest);
  // The z-loss ablation pairs with every seed the MoE LM trained.
  EXPECT_EQ(j.at("moe").at("z_loss_ablation").at("without_z_loss_val_bits_per_byte").size(),
            vars.at("moe").at("val_bits_per_byte").size());
  // The census counts dead units apart from the zero fraction.
  const auto& relu_layers = j.at("sparsity").at("variants").at("relu");
  ASSERT_FALSE(relu_layers.empty());
  EXPECT_GT(relu_layers[0].at("zero_fraction_init").get<double>(), 0.3);
  EXPECT_EQ(j.at("sparsity").at("variants").at("gelu")[0].at("zero_fraction_trained"), 0.0);
  // Near-dead units, which a smooth gate can have, beside the dead ones (which it cannot), and
  // never fewer: a dead unit is near-dead too.
  for (const auto& v : {"relu", "gelu"})
    for (const auto& l : j.at("sparsity").at("variants").at(v))
      EXPECT_GE(l.at("near_dead_units_trained").get<int>(), l.at("dead_units_trained").get<int>())
          << v;
  // When each balancing setting's load settles is measured: a step, or null.
  for (const auto& s : j.at("moe").at("settings"))
    EXPECT_TRUE(s.at("load_settled_step").is_null() || s.at("load_settled_step").is_number())
        << s.at("description");
  EXPECT_NE(md.find("**Load settled from**"), std::string::npos);
  // Each setting's row ends with the step its load settled from, or says it never did.
  for (const auto& [name, s] : j.at("moe").at("settings").items()) {
    const std::string row_start = "| " + s.at("description").get<std::string>() + " |";
    const std::size_t row = md.find(row_start);
    ASSERT_NE(row, std::string::npos) << row_start;
    const std::string line = md.substr(row, md.find('\n', row) - row);
    if (s.at("load_settled_step").is_null())
      EXPECT_TRUE(line.find("| not by step ") != std::string::npos ||
                  line.find("| not before the last 10 % ") != std::string::npos)
          << line;
    else
      EXPECT_NE(line.find("| step " + std::to_string(s.at("load_settled_step").get<int>())),
                std::string::npos)
          << line;
  }
  // MoE's experts are censused unit by unit: 8 experts' units per layer, dead ones counted.
  const auto& moe_layers = j.at("sparsity").at("variants").at("moe");
  ASSERT_FALSE(moe_layers.empty());
  EXPECT_EQ(moe_layers[0].at("units").get<int>() % 8, 0);
  EXPECT_GT(moe_layers[0].at("units").get<int>(), 8);
  // The sparsity figure's data: a dead-units bar apart from the live bins, for every variant
  // (MoE included), over every layer's units.
  {
    std::ifstream hist(out + "/unit_frequency_hist.csv");
    std::string header, first;
    std::getline(hist, header);
    std::getline(hist, first);
    EXPECT_NE(header.find(",moe"), std::string::npos) << header;
    EXPECT_EQ(first.rfind("dead,", 0), 0u) << first;
    std::ifstream units(out + "/unit_frequency.csv");
    std::set<std::string> layers;
    for (std::string line; std::getline(units, line);)
      if (line.rfind("relu,", 0) == 0) layers.insert(line.substr(5, line.find(',', 5) - 5));
    EXPECT_EQ(layers.size(), 2u) << "both layers of the --quick LM";
  }
  // The expert-load figure draws every layer: one column per layer and expert.
  {
    std::ifstream load(out + "/moe_load_loss.csv");
    std::string header;
    std::getline(load, header);
    EXPECT_NE(header.find("layer_1_expert_7"), std::string::npos) << header;
  }
  // Which bytes each expert takes: per layer, every class's share per expert.
  const auto& spec = j.at("moe").at("specialisation");
  ASSERT_EQ(spec.size(), 2u);
  for (const auto& layer : spec) {
    const double mi = layer.at("mutual_information_bits");
    EXPECT_TRUE(mi >= 0.0 && mi < 3.0) << mi;
    EXPECT_EQ(layer.at("classes").at("digit").at("share_per_expert").size(), 8u);
  }
  EXPECT_EQ(j.at("corrections").size(), 16u);
  // Corrections quote the tutorial's whole claim, then the finding, in the appendix.
  for (const char* claim :
       {"\"parameters ×8, compute only +25 %, efficiency ×32!\"", "\"12\" layers",
        "(1000 × 16/8000)", "\"inference cost 5× lower\"",
        "\"the FFN expansion ratio is basically fixed at 4–5x\"",
        "\"GELU FFN rules models below 100B\"", "(64, 100, 512)", "ReLU ~49.96 %, GELU ~0 %"})
    EXPECT_NE(appendix.find(claim), std::string::npos) << claim;
  EXPECT_NE(appendix.find("hidden units (2 layers of 128)"), std::string::npos)
      << "the dead-unit count names its layers";
  EXPECT_EQ(j.at("zoo").size(), 15u);
  // The real models' table is results.json's (and `ffnlab zoo`'s), not the report's.
  std::set<std::string> models;
  for (const auto& row : j.at("zoo")) models.insert(row.at("model").get<std::string>());
  for (const char* model : {"DeepSeek-V3", "LLaMA-2 70B", "GLaM 64B/64E", "BERT-large"})
    EXPECT_TRUE(models.count(model)) << model;
  for (const auto& row : j.at("zoo"))
    if (row.at("model") == "LLaMA-2 70B") {
      EXPECT_EQ(row.at("config").at("d_model"), 8192);
      EXPECT_EQ(row.at("config").at("d_ff"), 28672);
    }
  // The table itself stands in the appendix, with its sources, not in the report.
  EXPECT_EQ(md.find("| DeepSeek-V3 |"), std::string::npos);
  const std::string appendix_text = read(out + "/APPENDIX.md");
  EXPECT_NE(appendix_text.find("| DeepSeek-V3 | GLU (silu) | 7,168 | 2,048 |"), std::string::npos);
  EXPECT_NE(appendix_text.find("\n15. "), std::string::npos);  // the fifteenth row's source
  // Rule 2 marks the variants over its FLOP cap (the gated FFN: 1.12× ReLU's at --quick's size).
  EXPECT_NE(md.find("gated 1.12× (over)"), std::string::npos);
  EXPECT_EQ(j.at("data").at("fingerprint").get<std::string>().rfind("fnv1a64:", 0), 0u);

  // Where the time went: every stage that ran, and the figures.
  for (const char* stage : {"costs", "speed", "training", "moe", "moe_axes", "figures"})
    EXPECT_GE(j.at("stage_seconds").at(stage).get<double>(), 0.0) << stage;

    // Deterministic for a seed, whatever --threads: every LM run trains on one thread of its own
    // (runs go side by side), so a second run of two variants on one thread trains the same.
    // Not under the sanitizers: determinism is arithmetic, which the release suite checks, and a
    // second run would repeat the memory checks of the first at 4 minutes under ASan (the toy
    // stage's few-token products run in ffnlab's own, instrumented loops).
#ifdef FFNLAB_SANITIZED
  return;
#endif
  // The default run (no --full) on one thread: one variant per step of the evolution and the
  // headline MoE at equal compute; the same numbers as the --full run for every run they share
  // (which runs share the pool changes none).
  const std::string again = path("again");
  const Outcome d = run("evolve --quick --threads 1 --out " + again);
  ASSERT_EQ(d.status, 0) << d.err;
  EXPECT_NE(d.out.find("6 variants"), std::string::npos) << d.out.substr(0, 300);
  EXPECT_NE(d.out.find("  toy: moe, 2 seeds × "), std::string::npos) << "the toy stage's progress";
  std::ifstream in2(again + "/results.json");
  const json j2 = json::parse(in2);
  const auto& vars2 = j2.at("training").at("variants");
  ASSERT_EQ(vars2.size(), 6u);
  EXPECT_EQ(j.at("full"), true);
  EXPECT_EQ(j2.at("full"), false);
  // (A comparison's seeds depend on its own numbers only; ReLU trains as many as the comparison
  // that went furthest, which --full's top-2 MoE may be: its first seeds are the same.)
  for (const char* v : {"relu", "gelu", "glu", "swiglu", "gated", "moe"}) {
    const auto& a = vars.at(v).at("val_bits_per_byte");
    const auto& b = vars2.at(v).at("val_bits_per_byte");
    if (std::string_view(v) != "relu") {
      EXPECT_EQ(a.size(), b.size()) << v;
    }
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) EXPECT_EQ(a[i], b[i]) << v;
  }
  const auto& axes2 = j2.at("moe_axes").at("rows");
  EXPECT_FALSE(axes2.contains("moe_compute"));
  EXPECT_FALSE(j2.at("moe_axes").contains("equal_compute_minus_equal_parameters"));
  EXPECT_EQ(axes2.at("moe_fine_shared").at("against_relu").at("val_bits_per_byte"),
            axes.at("moe_fine_shared").at("against_relu").at("val_bits_per_byte"));
  EXPECT_FALSE(j2.at("moe").contains("z_loss_ablation"));
  EXPECT_EQ(j2.at("speed").at("variants").size(), 6u) << "the speed of the variants it trains";
  // The report says what it left out and how to get it: the full study at this one's scale, in
  // its folders, taking the runs they share (plain --full would be refused: the store keeps
  // this study's runs).
  const std::string md2 = read(again + "/REPORT.md");
  const std::string full_call = "`ffnlab evolve --quick --full --resume --out " + again + "`";
  EXPECT_NE(read(again + "/APPENDIX.md")
                .find("not measured by this run: " + full_call + " measures it as an ablation"),
            std::string::npos);
  for (const std::string& text :
       {"Not trained in this run: reglu, geglu, bilinear (" + full_call + " trains them)",
        std::string("`--full` also trains 8 experts"),
        "8 experts with top-2 at the same compute trains with " + full_call + "."})
    EXPECT_NE(md2.find(text), std::string::npos) << text;
  EXPECT_EQ(md2.find("--full`` "), std::string::npos);
  EXPECT_EQ(md2.find("| moe_compute |"), std::string::npos);
}

// One seed: each comparison has no interval. The cost figure draws every point (without bars, as
// its title says) instead of NaN bars that leave the point out, and progress counts "1 seed".
TEST_F(Cli, EvolveWithOneSeedDrawsEveryPointAndCountsInTheSingular) {
  const std::string out = path("one");
  const Outcome r = run("evolve --quick --threads 1 --seeds 1 --max-seeds 1 --out " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string script = read(out + "/moe_pareto.gp");
  EXPECT_EQ(script.find("nan"), std::string::npos) << script;
  EXPECT_NE(script.find("a point without bars has one seed, and no interval"), std::string::npos);
  const std::string said = r.out + r.err;
  EXPECT_NE(said.find("look at 1 seed:"), std::string::npos) << said;
  EXPECT_EQ(said.find("1 seeds"), std::string::npos) << said;
}

TEST_F(Cli, EvolveSweepAddsTheWidthTableAndFigure) {
  const std::string out = path("sweep");
  const Outcome r =
      run("evolve --quick --variants relu,gelu --seeds 1 --max-seeds 1 --sweep --out " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string md = read(out + "/REPORT.md");
  // The GLU step gives the widths at equal parameters, set by the study whether or not the
  // family trained (here none of it did; --quick: d_model 32, ReLU's d_ff 128).
  const std::string widths = "the gate costs width (SwiGLU's " +
                             std::to_string(study::study_ffn("swiglu", 32).d_ff) +
                             " hidden units instead of ReLU's 128). Not trained in this run: "
                             "reglu, geglu, swiglu, glu, bilinear";
  EXPECT_NE(md.find(widths), std::string::npos) << widths;
  // Without the moe variant no MoE stage runs, and the report points at none of their sections.
  EXPECT_NE(md.find("4. **Dense → MoE: each token uses a few of many experts**: more parameters "
                    "held, the same or fewer used per token. Not trained in this run"),
            std::string::npos);
  EXPECT_NE(md.find("- **No language:** the toy run"), std::string::npos);
  // One seed has no spread to print, and the MoE it did not train is not described.
  const std::string appendix = read(out + "/APPENDIX.md");
  for (const char* absent : {"section 6", "section 7", "section 8", "1 seeds", "1 comparisons"})
    EXPECT_EQ(appendix.find(absent), std::string::npos) << absent;
  EXPECT_NE(appendix.find("Each comparison with ReLU (here) trains 1 seed, then looks"),
            std::string::npos);
  for (const char* absent :
       {"section 6", "section 7", "section 8", "± 0.0000", "moe: 8 experts, top-2"})
    EXPECT_EQ(md.find(absent), std::string::npos) << absent;
  // Without the MoE stages the summary still costs each LM's forward FLOPs (GELU's equal ReLU's).
  const std::size_t gelu = md.find("| GELU FFN |");
  ASSERT_NE(gelu, std::string::npos) << md;
  EXPECT_NE(md.substr(gelu, md.find('\n', gelu) - gelu).find("| 1.00× |"), std::string::npos)
      << md.substr(gelu, 200);
  EXPECT_NE(md.find("## Sweep"), std::string::npos);
  EXPECT_NE(md.find("one seed: no spread to compare with"), std::string::npos);
  EXPECT_GT(fs::file_size(out + "/sweep.png"), 10000u);
  std::ifstream in(out + "/results.json");
  const json j = json::parse(in);
  ASSERT_EQ(j.at("sweep").at("relu").size(), 4u);
  EXPECT_EQ(j.at("sweep").at("relu")[3].at("d_ff"), 8 * 32);  // --quick: d_model 32
  EXPECT_FALSE(j.at("training").at("variants").contains("moe"));
  EXPECT_FALSE(j.contains("moe"));  // no MoE runs without the moe variant
}

TEST_F(Cli, EvolveRejectsBadInput) {
  expect_usage_error(run("evolve --quick --variants gelu,swiglu --out " + path("r")),
                     "include relu");
  expect_usage_error(run("evolve --quick --variants relu,selu --out " + path("r")),
                     "unknown variant 'selu'");
  std::ofstream(path("tiny.txt")) << "a corpus of a few dozen bytes is too small\n";
  expect_error(run("evolve --quick --data " + path("tiny.txt") + " --out " + path("r")),
               "need at least 33 bytes each");
  EXPECT_EQ(run("evolve --seeds 0").status, 2);
  // The seeds, by the study and by its plan alike (a plan plans only what would run).
  for (const std::string plan : {"", " --plan"}) {
    expect_usage_error(run("evolve --quick --seeds 4 --max-seeds 3 --out " + path("r") + plan),
                       "max seeds = 3 must not be below the seeds of the first look, 4");
    // The default first look (3 seeds) counts too.
    expect_usage_error(
        run("evolve --max-seeds 2 --out " + path("r") + plan),
        "max seeds = 2 must not be below the seeds of the first look, 3 (the default");
    expect_usage_error(run("evolve --quick --routing-seeds 4 --out " + path("r") + plan),
                       "routing seeds = 4 must not exceed seeds = 2");
  }
  expect_usage_error(run("evolve --quick --sizes xs,xl --out " + path("r")),
                     "size 'xl' is not one of xs, s, m, l");
  expect_usage_error(run("evolve --quick --tasks causal,causal --out " + path("r")),
                     "task 'causal' is listed twice");
  expect_usage_error(run("evolve --quick --budget 5x --out " + path("r")),
                     "budget '5x' is not a duration");
  expect_usage_error(run("evolve --quick --budget '' --out " + path("r")),
                     "budget '' is not a duration");
  expect_usage_error(run("evolve --quick --plan --plan-cores 8,none"),
                     "--plan-cores: 'none' is not a core count");
  expect_usage_error(run("evolve --quick --plan --plan-cores 0"),
                     "--plan-cores: '0' is not a core count (1 to 10000000)");
  // A list given empty is refused, not taken as the default (the study's LM alone).
  const Outcome empty = run("evolve --quick --sizes '' --out " + path("r"));
  EXPECT_EQ(empty.status, 2) << empty.err;
  EXPECT_NE(empty.err.find("--sizes: '' names nothing"), std::string::npos) << empty.err;
  EXPECT_FALSE(fs::exists(path("r")));
}

// The command has a flag for each of the study's option rows (which Python's evolve reads too),
// with the row's help and, for a number, the row's range.
TEST_F(Cli, EvolveHasAFlagForEachOptionRow) {
  const Outcome help = run("evolve --help");
  ASSERT_EQ(help.status, 0);
  for (const study::OptionRow& row : study::option_rows()) {
    EXPECT_NE(help.out.find("  " + row.flag + " "), std::string::npos) << row.flag;
    EXPECT_NE(help.out.find(row.help.substr(0, 24)), std::string::npos) << row.flag;
    // A number past its row's range is refused when the command line is read (with a corpus
    // that does not exist, a check that went missing fails at once instead of studying).
    const auto refused = [&](const std::string& value) {
      const Outcome r = run(fmt::format("evolve --quick --data {} --out {} {} {}",
                                        path("no-corpus"), path("r"), row.flag, value));
      EXPECT_EQ(r.status, 2) << row.flag << " " << value << "\n" << r.err;
      EXPECT_NE(r.err.find(row.flag + ": '" + value + "' is not"), std::string::npos) << r.err;
    };
    if (row.value == study::OptionRow::Value::count)
      refused(std::to_string(static_cast<std::int64_t>(row.hi) + 1));
    if (row.value == study::OptionRow::Value::real) {
      refused(fmt::format("{}", row.hi + 1));
      refused(fmt::format("{}", row.lo));  // (lo, hi]: lo itself is out
    }
  }
}

namespace {

int kept_runs(const std::string& dir) {
  int n = 0;
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".cbor";
  return n;
}

}  // namespace

// A study killed outright after some of its runs finished resumes with --resume: it trains only
// the runs it lacks and ends with the results of a study that was never stopped.
TEST_F(Cli, EvolvePlanPrintsWhatEachSizeCostsAndTrainsNothing) {
  const Outcome plan =
      run("evolve --quick --sizes xs,m --tasks causal,masked --plan --plan-cores 8,512 --out " +
          path("r"));
  ASSERT_EQ(plan.status, 0) << plan.err;
  for (const char* part : {"timing the sizes' steps on one thread", "| xs | 16 / 1 / 1 |",
                           "| s | 32 / 2 / 2 |", "| m | 64 / 2 / 2 |", "core-hours",
                           "(this machine) |", "| 8 |", "| 512 |", "tasks causal,masked"})
    EXPECT_NE(plan.out.find(part), std::string::npos) << part << "\n" << plan.out;
  EXPECT_FALSE(fs::exists(path("r")));
  EXPECT_FALSE(fs::exists(path("r.runs")));
  // With a budget, the plan says what it chose and why.
  const Outcome budget = run("evolve --quick --budget 1h --plan");
  ASSERT_EQ(budget.status, 0) << budget.err;
  EXPECT_NE(budget.out.find("chosen for a budget of 60 min on"), std::string::npos) << budget.out;
  expect_error(run("evolve --quick --budget 2s --plan"), "cannot hold the study");
  // As JSON: Python's ffnlab.plan, the output nothing but the JSON.
  const Outcome as_json = run("evolve --quick --sizes xs,s --plan --json --plan-cores 1,8");
  ASSERT_EQ(as_json.status, 0) << as_json.err;
  const nlohmann::json p = nlohmann::json::parse(as_json.out);
  EXPECT_EQ(p.at("arguments").at("sizes"), nlohmann::json({"xs", "s"}));
  EXPECT_EQ(p.at("arguments").at("steps"), 40);
  ASSERT_EQ(p.at("sizes").size(), 2u);
  EXPECT_EQ(p.at("sizes").at(0).at("size"), "xs");
  EXPECT_TRUE(p.at("wall_seconds").at(0).at("this_machine").get<bool>());
  EXPECT_EQ(p.at("wall_seconds").back().at("cores"), 8);
  EXPECT_NE(p.at("text").get<std::string>().find("| xs | 16 / 1 / 1 |"), std::string::npos);
  EXPECT_NE(as_json.err.find("timing the sizes' steps"), std::string::npos) << as_json.err;
  // The plan's flags without --plan would be ignored while a study ran: refused.
  for (const char* flag : {"--plan-cores 8", "--json"}) {
    const Outcome alone = run(std::string("evolve --quick --out ") + path("r") + " " + flag);
    EXPECT_EQ(alone.status, 2) << flag << ": " << alone.err;
    EXPECT_NE(alone.err.find("--plan"), std::string::npos) << alone.err;
    EXPECT_FALSE(fs::exists(path("r")));
  }
}

// Two sizes and two tasks: the section across them, verdicts per cell and the scaling figure.
TEST_F(Cli, EvolveAcrossSizesAndTasksResumesAfterAKillAsIfUninterrupted) {
#ifdef FFNLAB_SANITIZED
  GTEST_SKIP() << "three quick studies; the release suite checks the resume (the same code)";
#endif
  const std::vector<std::string> args = {"evolve",     "--quick",         "--threads", "1",
                                         "--variants", "relu,swiglu,moe", "--sizes",   "xs,s",
                                         "--tasks",    "causal,masked"};
  auto command = [&](const std::string& out, const std::string& more) {
    std::string c;
    for (const auto& a : args) c += a + " ";
    return c + "--out " + out + more;
  };
  const Outcome whole = run(command(path("whole"), ""));
  ASSERT_EQ(whole.status, 0) << whole.err;
  const int total = kept_runs(path("whole.runs"));
  ASSERT_GT(total, 30) << "every finished run is kept beside the report";
  {
    std::ifstream in(path("whole") + "/results.json");
    const json scaling = json::parse(in).at("scaling");
    for (const char* size : {"xs", "s"})
      for (const char* task : {"causal", "masked"}) {
        const json& cell = scaling.at("cells").at(size).at(task);
        EXPECT_EQ(cell.at("from_training_stage"),
                  std::string(size) == "s" && std::string(task) == "causal");
        EXPECT_EQ(cell.at("variants").contains("moe"), std::string(task) == "causal");
        EXPECT_GE(cell.at("variants").at("swiglu").at("seeds"), 2);
      }
    EXPECT_EQ(scaling.at("trends").size(), 2u + 2u) << "swiglu on both tasks; both MoEs, causal";
    const std::string report = read(path("whole") + "/REPORT.md");
    for (const char* part : {"Across model sizes and tasks", "Does the gap to ReLU grow with size?",
                             "| model size | below 100M", "measured on causal and masked",
                             "- **Sizes.** The ladder of the section"})
      EXPECT_NE(report.find(part), std::string::npos) << part;
    EXPECT_TRUE(fs::exists(path("whole") + "/scaling.png"));
    EXPECT_TRUE(fs::exists(path("whole") + "/scaling.csv"));
  }

  // A random point: after a third to two thirds of the runs (in the training stage, or in the
  // one across sizes), SIGKILL (nothing is cleaned up).
  const int after = total / 3 + static_cast<int>(std::random_device{}() % (total / 3));
  std::vector<std::string> cut_args = args;
  cut_args.insert(cut_args.end(), {"--out", path("cut")});
  const Started cut = start(cut_args, path(""), {}, false);
  ASSERT_GT(cut.pid, 0);
  const auto t0 = std::chrono::steady_clock::now();
  while (kept_runs(path("cut.runs")) < after &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(600))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ::kill(cut.pid, SIGKILL);
  ::waitpid(cut.pid, nullptr, 0);
  const int finished = kept_runs(path("cut.runs"));
  ASSERT_GE(finished, after) << "killed after " << after << " runs: " << read(cut.err);
  ASSERT_LT(finished, total) << "killed after " << after << " runs: the study had ended";
  EXPECT_FALSE(fs::exists(path("cut") + "/REPORT.md"));

  const Outcome resumed = run(command(path("cut"), " --resume"));
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  int taken = 0;
  for (std::size_t at = resumed.out.find("(kept in the run store)"); at != std::string::npos;
       at = resumed.out.find("(kept in the run store)", at + 1))
    ++taken;
  EXPECT_EQ(taken, finished) << "killed after " << after << " runs";
  EXPECT_EQ(kept_runs(path("cut.runs")), total);
  // Its report's time is the resumed run's, and it says so.
  EXPECT_NE(read(path("cut") + "/REPORT.md")
                .find(fmt::format("(resumed with `--resume`, reusing {} run{} already trained)",
                                  finished, finished == 1 ? "" : "s")),
            std::string::npos);
  EXPECT_EQ(read(path("whole") + "/REPORT.md").find("resumed with"), std::string::npos);

  std::ifstream a(path("whole") + "/results.json"), b(path("cut") + "/results.json");
  const json ja = test::without_timings(json::parse(a)), jb = test::without_timings(json::parse(b));
  EXPECT_EQ(ja, jb) << "killed after " << after << " runs";
  EXPECT_EQ(ja.dump().size(), jb.dump().size());
}
