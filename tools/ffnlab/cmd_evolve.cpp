// ffnlab evolve: the FFN-evolution study (ffnlab/study/study.hpp) from the command line: flags,
// a progress bar, and one call.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include "commands.hpp"
#include "common.hpp"
#include "ffnlab/analysis/machine.hpp"
#include "ffnlab/parallel/mpi.hpp"
#include "ffnlab/study/study.hpp"
#include "ffnlab/train/data.hpp"
#include "interrupt.hpp"
#include "launch.hpp"
#include "progress.hpp"

namespace ffnlab::cli {

namespace {

struct EvolveOptions {
  study::Options study;
  std::string variants;  // not given: the study's default (study::default_variants)
  CLI::Option* variants_flag = nullptr;
  std::string sizes, tasks, budget;
  bool plan = false;
  std::string plan_cores = "8,64,512";
  int threads = 0;
  double dist_timeout = 300;  // under mpirun
};

std::vector<std::string> name_list(const std::string& spec) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = spec.find(',', start);
    out.push_back(
        spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::vector<int> core_counts(const std::string& spec) {
  std::vector<int> out;
  for (const std::string& c : name_list(spec)) {
    std::size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(c, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != c.size() || n < 1 || n > 10000000)
      throw Error(fmt::format("[evolve] --plan-cores: '{}' is not a core count (1 or more)", c));
    out.push_back(n);
  }
  return out;
}

// --plan: the study's plan on this machine, printed; nothing is trained or written.
void print_plan(const EvolveOptions& o) {
  const Corpus corpus = load_corpus(o.study.data, 0.1);
  const int workers = omp_get_max_threads();
  fmt::print("ffnlab evolve --plan: timing the sizes' steps on one thread of this machine ({})\n",
             this_machine().describe());
  study::Options options = o.study;
  if (options.variants.empty()) options.variants = study::default_variants(options.full);
  const study::StudyPlan plan = study::plan_study(options, workers, corpus);
  fmt::print("{}", study::plan_text(plan, workers, core_counts(o.plan_cores)));
}

// The study's progress as a bar over its training steps, with stage lines above it.
class ProgressObserver : public study::Observer {
 public:
  void begin(std::int64_t planned, const std::string& line) override {
    fmt::print("ffnlab evolve: {}\n", line);
    progress_ =
        std::make_unique<Progress>("step", planned, std::max<std::int64_t>(1, planned / 100));
  }
  void message(const std::string& line) override { progress_->message(line); }
  void step(std::int64_t done, std::int64_t planned, const std::string& text, double eta) override {
    progress_->set_total(planned);  // the plan shrinks as comparisons are decided
    progress_->update(done, text, eta);
  }
  void end() override { progress_->finish(); }

 private:
  std::unique_ptr<Progress> progress_;
};

void run_evolve(EvolveOptions& o) {
  InterruptGuard interrupts;  // Ctrl-C stops between steps; the staged folder is removed
  apply_threads(o.threads);
  // Given, the list must name variants (an empty one is refused, not the default).
  if (o.variants_flag->count() > 0) o.study.variants = variant_list(o.variants);
  if (!o.sizes.empty()) o.study.sizes = name_list(o.sizes);
  if (!o.tasks.empty()) o.study.tasks = name_list(o.tasks);
  if (!o.budget.empty()) o.study.budget_seconds = study::parse_duration(o.budget);
  if (o.plan) {
    if (mpi_launched())
      throw Error("[evolve] --plan runs in one process: it trains nothing (drop mpirun)");
    print_plan(o);
    return;
  }
  run_launched(o.dist_timeout, [&](ProcessGroup* ranks) {
    if (ranks != nullptr && ranks->rank() > 0) {  // rank 0 runs the study; this rank trains
      study::serve_runs(o.study, *ranks);
      return;
    }
    ProgressObserver observer;
    const study::Results r = study::run_study(o.study, observer, ranks, o.dist_timeout);
    if (ranks != nullptr) study::release_ranks(*ranks);
    fmt::print("report written to {}/REPORT.md (in {})\n", o.study.out, elapsed(r.seconds));
  });
}

}  // namespace

void add_evolve_command(CLI::App& app) {
  auto o = std::make_shared<EvolveOptions>();
  auto* cmd = app.add_subcommand(
      "evolve",
      "The FFN-evolution study: ReLU -> GELU -> GLU family -> gated -> MoE, measured. Costs, "
      "equal-budget widths, speed, the FFN-evolution tutorial's toy run, every variant trained "
      "as a byte-level LM over paired seeds, activation sparsity, MoE load balancing, "
      "corrections of the tutorial and recommendations, with figures. Writes OUT/REPORT.md, "
      "its details in OUT/APPENDIX.md, OUT/results.json and the figures; an existing OUT is "
      "replaced only when the new report is complete.");
  cmd->add_option("--out", o->study.out,
                  "report folder: a new or empty folder, or an earlier report (which is replaced "
                  "when the new one is complete); never the data, the current directory or a "
                  "mount point")
      ->capture_default_str();
  cmd->add_flag("--quick", o->study.quick,
                "small models and few steps (same code path; under a minute): checks the "
                "pipeline, measures nothing about the variants");
  cmd->add_option("--data", o->study.data, "a text file or a folder of them")
      ->capture_default_str();
  cmd->add_option("--seeds", o->study.seeds,
                  "paired LM seeds every comparison with ReLU trains before its first look "
                  "(default 3; --quick 2)")
      ->check(int_in(1, 1000));
  cmd->add_option("--max-seeds", o->study.max_seeds,
                  "the cap of the sequential rule: a comparison still undecided trains one more "
                  "seed per round up to this many (default 6; --quick 3; at least --seeds)")
      ->check(int_in(1, 1000));
  cmd->add_option("--routing-seeds", o->study.routing_seeds,
                  "LM seeds of each routing family (and with --full of top-k on the masked "
                  "objective); default 1, which gives values but no interval; --full: --seeds; "
                  "at most --seeds")
      ->check(int_in(1, 1000));
  cmd->add_option("--steps", o->study.steps, "optimizer steps per LM run (default 600; --quick 40)")
      ->check(int_in(1, 1000000000));
  o->variants_flag = cmd->add_option(
      "--variants", o->variants,
      fmt::format("comma-separated FFN variants, or 'all' ({}); default: one per step "
                  "of the evolution, {} (with --full: all)",
                  join_names(variant_names()), fmt::join(study::default_variants(), ",")));
  cmd->add_flag("--full", o->study.full,
                "the whole study: every variant (the whole GLU family, unless --variants says "
                "otherwise), MoE with 8 experts and top-2 at equal compute beside the "
                "fine-grained design, the router z-loss ablation, and the routing families on the "
                "masked objective too, over --seeds");
  cmd->add_option("--margin", o->study.margin,
                  "equivalence margin in bits/byte, fixed before the run: a variant is called "
                  "equivalent to ReLU only when its paired difference is shown to lie within it")
      ->capture_default_str()
      ->check(real_in(0, 1, /*hi_open=*/false, /*lo_open=*/true));
  cmd->add_option("--runs", o->study.runs,
                  "the folder that keeps every finished LM run, one file each, for --resume "
                  "(default: OUT.runs, beside the report)");
  cmd->add_flag("--resume", o->study.resume,
                "take the runs the --runs folder kept instead of training them again: a study "
                "that was stopped trains only what it lacks, and one with more seeds or variants "
                "reuses the runs it shares (each run is kept under its whole configuration, the "
                "data's fingerprint and its seed)");
  cmd->add_flag("--force", o->study.force,
                "start over: discard the runs the --runs folder keeps (a folder that keeps runs "
                "is refused without --resume or --force)");
  cmd->add_option("--sizes", o->sizes,
                  "train every variant at these sizes of the ladder too, comma-separated: xs "
                  "(d_model 64, 2 layers), s (128, 4: the study's LM), m (256, 6), l (512, 8); "
                  "tokens grow with the parameters. Adds the section \"Across model sizes and "
                  "tasks\": verdicts per size, the scaling figure, and whether each variant's gap "
                  "to ReLU grows with size");
  cmd->add_option("--tasks", o->tasks,
                  "tasks of that section, comma-separated: causal (next byte, the default) and "
                  "masked (a bidirectional LM; dense variants only)");
  cmd->add_option(
      "--budget", o->budget,
      "a wall-time budget (90s, 30m, 2h): the planner times this machine and "
      "chooses the sizes (unless --sizes), the seeds (unless --max-seeds) and the "
      "steps (unless --steps) that end within it even if no comparison decides "
      "before the cap, and says what it chose and why (not with --resume: resume with what "
      "it chose)");
  cmd->add_flag("--plan", o->plan,
                "print the plan and exit: each size's runs, their time on this machine, the "
                "core-hours, and the wall time here and on --plan-cores cores; trains nothing");
  cmd->add_option("--plan-cores", o->plan_cores,
                  "core counts the plan's wall time is given for, comma-separated")
      ->capture_default_str();
  cmd->add_flag("--sweep", o->study.sweep,
                "also train ReLU and SwiGLU LMs at d_ff/d_model = 1, 2, 4, 8 (8 more runs)");
  add_threads_option(*cmd, o->threads);
  cmd->add_option("--dist-timeout", o->dist_timeout,
                  "under mpirun: seconds a rank may stay silent while it trains a run (or in an "
                  "exchange) before the study fails, naming the run")
      ->capture_default_str()
      ->check(real_in(0.001, 1e6));
  cmd->callback([o] { run_evolve(*o); });
}

}  // namespace ffnlab::cli
