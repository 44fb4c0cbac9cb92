// ffnlab evolve: the FFN-evolution study (ffnlab/study/study.hpp) from the command line: flags,
// a progress bar, and one call.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <map>
#include <stdexcept>
#include <type_traits>
#include <variant>

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
  // The flags of the study's rows, and the text of a list or a duration as given.
  std::map<std::string, CLI::Option*> given;
  std::map<std::string, std::string> texts;
  bool plan = false, json = false;
  std::string plan_cores = "8,64,512";
  int threads = 0;
  double dist_timeout = 300;  // under mpirun
  bool dist_timeout_given = false;
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

// A list flag's names (--sizes, --tasks): given empty, it is refused, not taken as the default.
std::vector<std::string> name_list(const std::string& flag, const std::string& spec) {
  if (spec.empty())
    throw UsageError(fmt::format("{}: '' names nothing (give comma-separated names)", flag));
  return name_list(spec);
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
      throw UsageError(
          fmt::format("[evolve] --plan-cores: '{}' is not a core count (1 to 10000000)", c));
    out.push_back(n);
  }
  return out;
}

// --plan: the study's plan on this machine, printed; nothing is trained or written.
void print_plan(const EvolveOptions& o) {
  const std::vector<int> cores = core_counts(o.plan_cores);  // before the timing, not after it
  const int workers = omp_get_max_threads();
  // (With --json the header goes to stderr: the output is the JSON alone.)
  fmt::print(o.json ? stderr : stdout,
             "ffnlab evolve --plan: timing the sizes' steps on one thread of this machine ({})\n",
             this_machine().describe());
  std::fflush(stderr);
  const study::StudyPlan plan = study::plan_study(o.study, workers);
  if (o.json)
    fmt::print("{}\n", study::plan_to_json(plan, workers, cores).dump(2));
  else
    fmt::print("{}", study::plan_text(plan, workers, cores));
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
  // A list or a duration, given, is read (a list that names nothing is refused, not taken as
  // the default).
  for (const study::OptionRow& row : study::option_rows()) {
    if (o.given.at(row.flag)->count() == 0) continue;
    const std::string& text = o.texts[row.flag];
    if (row.value == study::OptionRow::Value::duration) try {
        o.study.*std::get<double study::Options::*>(row.field) = study::parse_duration(text);
      } catch (const Error& e) {  // a flag's value: a usage error, as the others' are
        throw UsageError(e.what());
      }
    if (row.value == study::OptionRow::Value::names)
      o.study.*std::get<std::vector<std::string> study::Options::*>(row.field) =
          row.flag == "--variants" ? variant_list(text) : name_list(row.flag, text);
  }
  if (o.plan) {
    require_one_process("evolve --plan");  // it trains nothing
    print_plan(o);
    return;
  }
  run_launched(o.dist_timeout, [&](ProcessGroup* ranks) {
    if (ranks == nullptr && o.dist_timeout_given)
      throw UsageError(
          "[evolve] --dist-timeout bounds the silence of an MPI run's ranks, which one process "
          "does not have: leave it out, or start the study with mpirun -np N (N > 1)");
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
  // The study's options, one flag per row of study::option_rows (Python's evolve reads the
  // same rows); a list or a duration is kept as written and read once the command line is.
  for (const study::OptionRow& row : study::option_rows()) {
    using V = study::OptionRow::Value;
    CLI::Option* flag = nullptr;
    switch (row.value) {
      case V::on:
        flag = cmd->add_flag(row.flag, o->study.*std::get<bool study::Options::*>(row.field),
                             row.help);
        break;
      case V::path:
        flag = cmd->add_option(
            row.flag, o->study.*std::get<std::string study::Options::*>(row.field), row.help);
        flag->check(named_path());
        if (!(o->study.*std::get<std::string study::Options::*>(row.field)).empty())
          flag->capture_default_str();
        break;
      case V::count:
        flag = std::visit(
            [&]<class T>(T study::Options::*field) -> CLI::Option* {
              if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
                return cmd->add_option(row.flag, o->study.*field, row.help);
              else
                throw std::logic_error("a count row's field is not an integer");
            },
            row.field);
        flag->check(int_in(static_cast<std::int64_t>(row.lo), static_cast<std::int64_t>(row.hi)));
        break;
      case V::real:
        flag = cmd->add_option(row.flag, o->study.*std::get<double study::Options::*>(row.field),
                               row.help)
                   ->capture_default_str()
                   ->check(real_in(row.lo, row.hi, /*hi_open=*/false, /*lo_open=*/true));
        break;
      case V::names:
      case V::duration:
        flag = cmd->add_option(row.flag, o->texts[row.flag], row.help);
        break;
    }
    o->given[row.flag] = flag;
  }
  CLI::Option* plan =
      cmd->add_flag("--plan", o->plan,
                    "print the plan and exit: each size's runs, their time on this machine, the "
                    "core-hours, and the wall time here and on --plan-cores cores; trains nothing");
  cmd->add_option("--plan-cores", o->plan_cores,
                  "with --plan: core counts the plan's wall time is given for, comma-separated")
      ->capture_default_str()
      ->needs(plan);
  cmd->add_flag("--json", o->json,
                "with --plan: print the plan as JSON, the dict of Python's ffnlab.plan "
                "(docs/python.md)")
      ->needs(plan);
  add_threads_option(*cmd, o->threads);
  auto* timeout =
      cmd->add_option(
             "--dist-timeout", o->dist_timeout,
             "under mpirun: seconds a rank may stay silent while it trains a run (or in an "
             "exchange) before the study fails, naming the run")
          ->capture_default_str()
          ->check(real_in(0.001, 1e6));
  cmd->callback([o, timeout] {
    o->dist_timeout_given = timeout->count() > 0;
    run_evolve(*o);
  });
}

}  // namespace ffnlab::cli
