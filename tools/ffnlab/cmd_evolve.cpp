// ffnlab evolve: the seeds' FFN-evolution study (evolve/study.hpp) as one command that writes a
// report directory: REPORT.md, results.json, figures with their CSV.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "commands.hpp"
#include "common.hpp"
#include "evolve/study.hpp"
#include "ffn_flags.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/report/figure.hpp"
#include "ffnlab/report/staged_dir.hpp"
#include "interrupt.hpp"
#include "progress.hpp"

namespace ffnlab::cli {

namespace {

using evolve::Study;

std::string header(const Study& st, double seconds) {
  const auto& o = st.options;
  std::string md = "# The evolution of the Transformer FFN, measured\n\n";
  md += fmt::format(
      "Written by `ffnlab evolve{}{}{}` in {} on {} OpenMP threads. Every number below was "
      "computed or measured by this run; results.json holds them all, and each figure's data is "
      "the CSV beside it. Runs are deterministic for a given seed, thread count and build, "
      "except the measured times (sections 3 and 4's tokens/s).\n\n",
      o.quick ? " --quick" : "", o.seeds ? fmt::format(" --seeds {}", o.seeds) : "",
      o.steps ? fmt::format(" --steps {}", o.steps) : "", duration(seconds), omp_get_max_threads());
  if (o.quick)
    md +=
        "**This is a --quick run:** small models and few steps, to check the pipeline; its "
        "training numbers say nothing about the variants.\n\n";
  md += "## 0. Data\n\n";
  md += fmt::format(
      "`{}`: {} files, {} bytes, fingerprint `{}`. Byte-level tokens (vocabulary 256); the "
      "last 10 % of the bytes ({}) are the validation part.\n\n",
      st.corpus.source, st.corpus.files.size(), thousands(st.corpus.bytes.size()),
      st.corpus.fingerprint, thousands(st.corpus.validation().size()));
  md += "## Figures\n\n";
  for (const char* f : {"activation_comparison", "ffn_performance_comparison", "training_dynamics",
                        "moe_expert_load", "activation_sparsity"})
    if (std::filesystem::exists(std::filesystem::path(st.dir) / (std::string(f) + ".png")))
      md += fmt::format("![{0}]({0}.png)\n\n", f);

  return md;
}

void run_evolve(evolve::Options& o) {
  InterruptGuard interrupts;  // Ctrl-C stops between steps; the staged folder is removed
  apply_threads(o.threads);
  const auto t0 = std::chrono::steady_clock::now();
  Study st;
  st.options = o;
  st.scale = evolve::make_scale(o);
  st.variants = variant_list(o.variants);
  if (std::find(st.variants.begin(), st.variants.end(), "relu") == st.variants.end())
    throw Error("[evolve] --variants must include relu: every comparison is against it");
  if (!gnuplot_available())
    throw Error(
        "[evolve] gnuplot is not on the PATH (Debian package gnuplot-nox; "
        "scripts/install-deps.sh installs it)");
  // The output place is checked (and staged) before anything is read or computed.
  StagedDirectory out(o.out, {o.data});
  st.corpus = load_corpus(o.data, 0.1);
  // Checked before any stage runs, so that a corpus too small fails at once, not minutes in.
  const auto need = static_cast<std::size_t>(st.scale.train.seq + 1);
  if (st.corpus.train().size() < need || st.corpus.validation().size() < need)
    throw Error(fmt::format(
        "[evolve] '{}' has {} bytes: its training part and its validation part (the last 10 %) "
        "need at least {} bytes each (one sequence of {} and its next byte)",
        o.data, st.corpus.bytes.size(), need, st.scale.train.seq));
  st.dir = out.path();
  st.results["data"] = {{"source", st.corpus.source},
                        {"files", st.corpus.files.size()},
                        {"bytes", st.corpus.bytes.size()},
                        {"fingerprint", st.corpus.fingerprint},
                        {"validation_bytes", st.corpus.validation().size()}};
  st.results["threads"] = omp_get_max_threads();
  st.results["quick"] = o.quick;

  const std::int64_t steps = st.scale.train.steps;
  st.planned_steps =
      steps *
      (static_cast<std::int64_t>(st.variants.size()) * st.scale.seeds +
       (std::find(st.variants.begin(), st.variants.end(), "moe") != st.variants.end() ? 3 : 0) +
       (o.sweep ? 2 * static_cast<std::int64_t>(st.scale.sweep_ratios.size()) : 0));
  Progress progress("step", st.planned_steps, std::max<std::int64_t>(1, st.planned_steps / 100));
  st.progress = &progress;
  fmt::print(
      "ffnlab evolve: {} variants, {} seeds × {} steps ({} training steps in all), into "
      "{}\n",
      st.variants.size(), st.scale.seeds, steps, st.planned_steps, out.final_path());
  try {
    evolve::run_costs(st);
    evolve::run_speed(st);
    evolve::run_toy(st);
    evolve::run_training(st);
    evolve::run_sparsity(st);
    evolve::run_moe(st);
    evolve::run_sweep(st);
    evolve::write_report(st);
    evolve::write_figures(st);
  } catch (...) {
    progress.finish();
    throw;
  }
  progress.finish();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.results["seconds"] = seconds;
  evolve::write_text(st.dir + "/results.json", st.results.dump(2) + "\n");
  evolve::write_text(st.dir + "/REPORT.md", header(st, seconds) + st.report);
  out.commit();
  fmt::print("report written to {}/REPORT.md ({})\n", out.final_path(), duration(seconds));
}

}  // namespace

void add_evolve_command(CLI::App& app) {
  auto o = std::make_shared<evolve::Options>();
  auto* cmd = app.add_subcommand(
      "evolve",
      "The FFN-evolution study: ReLU -> GELU -> GLU family -> gated -> MoE, measured. Costs, "
      "equal-budget widths, speed, the seeds' toy run, every variant trained as a byte-level LM "
      "over paired seeds, activation sparsity, MoE load balancing, corrections of the seeds and "
      "recommendations, with figures. Writes OUT/REPORT.md, OUT/results.json and the figures; "
      "an existing OUT is replaced only when the new report is complete.");
  cmd->add_option("--out", o->out,
                  "report folder: a new or empty folder, or an earlier report (which is replaced "
                  "when the new one is complete); never the data, the current directory or a "
                  "mount point")
      ->capture_default_str();
  cmd->add_flag("--quick", o->quick,
                "small models and few steps (same code path; about 10 seconds): checks the "
                "pipeline, measures nothing about the variants");
  cmd->add_option("--data", o->data, "a text file or a folder of them")->capture_default_str();
  cmd->add_option("--seeds", o->seeds, "LM seeds per variant (default 3; --quick 2)")
      ->check(int_in(1, 1000));
  cmd->add_option("--steps", o->steps, "optimizer steps per LM run (default 600; --quick 40)")
      ->check(int_in(1, 1000000000));
  add_variants_flag(*cmd, o->variants);
  cmd->add_flag("--sweep", o->sweep,
                "also train ReLU and SwiGLU LMs at d_ff/d_model = 1, 2, 4, 8 (8 more runs)");
  add_threads_option(*cmd, o->threads);
  cmd->callback([o] { run_evolve(*o); });
}

}  // namespace ffnlab::cli
