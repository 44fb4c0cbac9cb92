// ffnlab train: a byte-level Transformer language model with any FFN variant, trained on real
// text (the fortunes corpus by default), with logs, evaluation, checkpoints and a sample.
// The model's and the training settings' flags are generated from the config key rows
// (key_flags.hpp); the run is the library's driver (ffnlab/train/run.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "common.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/train/run.hpp"
#include "ffnlab/train/run_folder.hpp"
#include "interrupt.hpp"
#include "key_flags.hpp"
#include "launch.hpp"
#include "model_flags.hpp"
#include "train_printer.hpp"

namespace ffnlab::cli {

namespace {

using json = nlohmann::json;

struct TrainOptions {
  ModelFlags model;   // the model's flags, its FFN's, and its files
  KeyFlags training;  // the training settings (train_config_to_json's keys)
  std::string data = kDefaultCorpus, out = "runs/train", resume;
  double val_fraction = kDefaultValFraction;
  TrainPrinting printing{.sample = 300, .temperature = 0.8f};
  std::string prompt = "\n";
  int threads = 0;
  bool force = false;
  double dist_timeout = 300, bucket_mb = 4;  // data parallelism (under mpirun)
  CLI::Option *out_flag = nullptr, *data_flag = nullptr, *val_fraction_flag = nullptr;
  std::vector<CLI::Option*> sample_flags;  // --sample, --temperature, --prompt
  CLI::App* command = nullptr;
};

// Flags a rank of a data-parallel run may set for itself; every other flag must be the same on
// every rank (the data is compared by its fingerprint, not its path; only rank 0 writes --out).
bool rank_local(const std::string& flag) {
  return flag == "--threads" || flag == "--print-every" || flag == "--data" || flag == "--out" ||
         flag == "--help";
}

// Every flag of the command as given ("" when not given) but the rank-local ones: derived from
// the command's own list, so that a new flag is compared without anyone adding it here.
std::map<std::string, std::string> agreed_flags(const CLI::App& command) {
  std::map<std::string, std::string> out;
  for (const CLI::Option* opt : command.get_options()) {
    const std::string name = opt->get_name();
    if (name.empty() || rank_local(name)) continue;
    std::string given;
    for (const auto& r : opt->results()) given += (given.empty() ? "" : ",") + r;
    out[name] = opt->count() > 0 ? "given: " + given : "";
  }
  return out;
}

// The run the flags ask for: the model from the flags, or, when resuming, the checkpoint's
// (model flags, if given, must then match it); the training settings given, which the driver
// compares with a resumed checkpoint's.
RunRequest request_of(const TrainOptions& o, ProcessGroup* group) {
  RunRequest rq;
  rq.train = train_config_from_json(o.training.values());
  if (o.resume.empty()) {
    rq.model = o.model.model(rq.train);
  } else {
    const ResumePoint point = read_resume_point(o.resume);
    rq.model = point.model;
    // The model flags are read with the settings the run will have (the checkpoint's, where
    // none was given): its objective and sequence length.
    std::vector<std::string> given;
    for (const ConfigFlag* f : o.training.given_flags()) given.push_back(f->key);
    std::vector<SettingChange> changes;
    o.model.check_resumed(rq.model, resumed_settings(point, rq.train, given, changes), o.resume);
  }
  for (const ConfigFlag* f : o.training.given_flags())
    rq.given.push_back({f->key, o.training.as_written(*f)});
  rq.data = o.data;
  rq.data_given = o.data_flag->count() > 0;
  rq.val_fraction = o.val_fraction;
  rq.val_fraction_given = o.val_fraction_flag->count() > 0;
  // --resume DIR continues in DIR unless --out names another folder (an empty name is refused by
  // the flag's check: to the driver it means no folder).
  rq.out = o.resume.empty() || o.out_flag->count() > 0 ? o.out : "";
  rq.out_named = o.out_flag->count() > 0;
  rq.resume = o.resume;
  rq.force = o.force;
  rq.sample = o.printing.sample;
  rq.temperature = o.printing.temperature;
  rq.prompt = o.prompt;
  // (--sample 0, which asks for none, is no sample setting.)
  rq.names.sample.clear();
  for (const CLI::Option* f : o.sample_flags)
    if (f->count() > 0 && !(f->get_name() == "--sample" && o.printing.sample == 0))
      rq.names.sample += (rq.names.sample.empty() ? "" : ", ") + f->get_name();
  rq.sample_given = !rq.names.sample.empty();
  const auto bucket = static_cast<std::int64_t>(o.bucket_mb * (1 << 20) / sizeof(float));
  rq.parallel = {group, std::max<std::int64_t>(1, bucket), o.printing.expert_parallel,
                 agreed_flags(*o.command), o.printing.expert_group};
  return rq;
}

// One process, or one rank of a data-parallel run (group): rank 0 alone checks and writes the
// output folder, prints and samples; every rank trains.
void train(TrainOptions& o, ProcessGroup* group) {
  if (o.printing.expert_parallel && group == nullptr)
    throw UsageError(
        "[train] --expert-parallel splits the experts over the ranks of an MPI run: "
        "start it with mpirun -np N (N > 1)");
  for (const char* flag : {"--dist-timeout", "--bucket-mb"})
    if (group == nullptr && o.command->get_option(flag)->count() > 0)
      throw UsageError(fmt::format(
          "[train] {} sets the exchanges between the ranks of an MPI run, which one process "
          "does not make: leave it out, or start the run with mpirun -np N (N > 1)",
          flag));
  // (A rank whose flags or checkpoint are refused here fails every rank, as the driver's own
  // checks do.)
  RunRequest rq;
  fail_together_around(group, "run checks", kRankFailedItsChecks, [&] {
    if (o.printing.expert_group > 0 && !o.printing.expert_parallel)
      throw UsageError("[train] --expert-group sizes the groups of --expert-parallel: give both");
    rq = request_of(o, group);
  });
  PrintingObserver observer(o.printing, group);
  RunOutcome r;
  try {
    r = run_training(rq, observer);
  } catch (const Error&) {
    observer.finish();  // end the progress line before the error
    throw;
  }
  observer.finish();
  print_outcome(r, o.printing, group);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  auto* cmd = app.add_subcommand(
      "train",
      "Train a byte-level Transformer language model with a chosen FFN on real text.\n"
      "Writes OUT/train_log.csv (every step), OUT/eval_log.csv, OUT/checkpoint/, OUT/sample.txt "
      "and OUT/summary.json.");
  const std::string M = "Model", T = "Training", D = "Data and output";
  o->model.add(*cmd, M);
  const auto training = train_config_flags();
  const auto data_from = std::find_if(training.begin(), training.end(),
                                      [](const ConfigFlag& f) { return f.key == "eval_every"; });
  o->training.add(*cmd, {training.begin(), data_from}, T);
  add_threads_option(*cmd, o->threads);
  o->data_flag = cmd->add_option("--data", o->data,
                                 "a text file or a folder of them (skips .dat and .u8); with "
                                 "--resume: the checkpoint's")
                     ->capture_default_str()
                     ->check(named_path())
                     ->group(D);
  o->val_fraction_flag =
      cmd->add_option("--val-fraction", o->val_fraction,
                      "last fraction of the bytes for validation (with --resume: the checkpoint's)")
          ->capture_default_str()
          ->check(real_in(0, 1, true, true))
          ->group(D);
  o->training.add(*cmd, {data_from, training.end()}, D);
  o->out_flag = cmd->add_option("--out", o->out,
                                "output folder (with --resume: that folder); one that holds "
                                "an earlier run is refused without --force. The default is a "
                                "scratch folder each run without --out starts over in")
                    ->capture_default_str()
                    ->check(named_path())
                    ->group(D);
  cmd->add_option("--resume", o->resume,
                  "continue the run whose output folder this is (from its checkpoint/), in it")
      ->check(named_path())
      ->group(D);
  cmd->add_flag("--force", o->force,
                "with --resume: continue even on other data or with other training settings; "
                "without: start over in an --out that holds an earlier run")
      ->group(D);
  o->sample_flags = {
      cmd->add_option("--sample", o->printing.sample,
                      "bytes of text to sample at the end (0: none; a causal model's)")
          ->capture_default_str()
          ->check(int_in(0, 1000000))
          ->group(D),
      cmd->add_option("--temperature", o->printing.temperature, "sampling temperature (0: greedy)")
          ->capture_default_str()
          ->check(real_in(0, 1000))
          ->group(D),
      cmd->add_option("--prompt", o->prompt, "text the sample continues")->group(D)};
  cmd->add_option("--print-every", o->printing.print_every,
                  "without a terminal: a progress line every N steps (0, the default: steps/20)")
      ->check(int_in(0, limits::kSteps))
      ->group(D);
  const char* P = "Data parallel (mpirun -np N ffnlab train ...; docs/distributed.md)";
  cmd->add_option("--dist-timeout", o->dist_timeout,
                  "seconds a rank waits for the others in one exchange before it ends the run "
                  "(for a checkpoint's write or read, a second longer for every 10 MB of it)")
      ->capture_default_str()
      ->check(real_in(0.001, 1e6))
      ->group(P);
  cmd->add_option("--bucket-mb", o->bucket_mb,
                  "gradient all-reduce bucket, MiB: sums start as backward finishes this much")
      ->capture_default_str()
      ->check(real_in(0.001, 1e5))
      ->group(P);
  cmd->add_flag("--expert-parallel", o->printing.expert_parallel,
                "MoE: split the experts over the ranks too (tokens exchanged by all-to-all)")
      ->group(P);
  cmd->add_option("--expert-group", o->printing.expert_group,
                  "MoE, with --expert-parallel: split the experts over groups of G ranks, each "
                  "group a data-parallel replica of the others (G divides the ranks and the "
                  "experts; 0: one group of every rank)")
      ->capture_default_str()
      ->check(int_in(0, 1 << 20))
      ->group(P);
  o->command = cmd;
  cmd->callback([o] {
    InterruptGuard interrupts;
    apply_threads(o->threads);
    run_launched(o->dist_timeout, [&](ProcessGroup* group) { train(*o, group); });
  });
}

}  // namespace ffnlab::cli
