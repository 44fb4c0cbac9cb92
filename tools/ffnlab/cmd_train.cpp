// ffnlab train: a byte-level Transformer language model with any FFN variant, trained on real
// text (the fortunes corpus by default), with logs, evaluation, checkpoints and a sample.
#include <fmt/format.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.hpp"
#include "common.hpp"
#include "ffn_flags.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/io/ffn_io.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/parallel/mpi.hpp"
#include "ffnlab/train/run.hpp"
#include "ffnlab/train/run_folder.hpp"
#include "ffnlab/train/trainer.hpp"
#include "interrupt.hpp"
#include "progress.hpp"

namespace ffnlab::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct TrainOptions {
  // model
  std::string variant = "relu", model_config;
  FFNFlags ffn;  // d_model is the model's width
  std::int64_t heads = 4, context = 0;
  int layers = 4;
  std::string positions = "learned", norm = "layernorm";
  bool post_norm = false, no_final_norm = false, untied = false, no_attn_bias = false;
  float dropout = 0.f, init_std = 0.02f;
  // training
  TrainConfig train;
  std::string optimizer = "adamw", decay = "cosine", dtype = "f32", objective = "causal";
  // data and output
  std::string data = kDefaultCorpus, out = "runs/train", resume;
  double val_fraction = 0.1;
  std::int64_t sample = 300;
  float temperature = 0.8f;
  std::string prompt = "\n";
  std::int64_t print_every = 0;
  int threads = 0;
  bool force = false;
  // data parallelism (under mpirun)
  double dist_timeout = 300, bucket_mb = 4;
  bool expert_parallel = false;
  int expert_group = 0;  // --expert-group (0: every rank)
  // Each model flag with what it sets, read back from a model: when resuming, a given flag must
  // agree with the checkpoint's model, and flags not given are the checkpoint's.
  std::vector<std::pair<CLI::Option*, std::function<json(const LMConfig&)>>> model_flags;
  std::vector<std::pair<CLI::Option*, const char*>> train_flags;  // flag, its train-config key
  CLI::Option *out_flag = nullptr, *data_flag = nullptr, *val_fraction_flag = nullptr;
  CLI::Option* objective_flag = nullptr;
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

LMConfig read_model_config(const std::string& path) {
  const auto bytes = read_regular_file(path, "train", std::uint64_t{1} << 24);
  json j;
  try {
    j = json::parse(bytes.begin(), bytes.end());
  } catch (const json::exception&) {
    throw Error(fmt::format("[train] {}: not valid JSON", path));
  }
  try {
    return lm_config_from_json(j);
  } catch (const Error& e) {
    throw Error(fmt::format("{} (in {})", e.what(), path));
  }
}

bool flag_given(const TrainOptions& o, std::string_view flag) {
  for (const auto& [opt, read] : o.model_flags)
    if (opt->get_name() == flag) return opt->count() > 0;
  return false;
}

LMConfig model_from_flags(const TrainOptions& o) {
  if (!o.model_config.empty()) {
    // The file sets the whole model: a model flag beside it would be silently overridden.
    for (const auto& [opt, read] : o.model_flags)
      if (opt->count() > 0 && opt->get_name() != "--model-config")
        throw UsageError(fmt::format(
            "{}: does not apply with --model-config, whose file describes the whole model (set "
            "it there)",
            opt->get_name()));
    return read_model_config(o.model_config);
  }
  if (!o.ffn.config_file.empty() && flag_given(o, "--variant"))
    throw UsageError(
        "--variant: does not apply with --ffn-config, whose file describes the whole layer (set "
        "it there)");
  FFNFlags ffn = o.ffn;
  // The load-balancing loss's default is for top-k and top-p routing; ReLU routing balances with
  // its L1 penalty, expert choice by construction, and Soft MoE chooses nothing: they refuse it.
  const RoutingKind routing = parse_enum<RoutingKind>(ffn.routing);
  if (routing != RoutingKind::topk && routing != RoutingKind::top_p && !flag_given(o, "--aux-coef"))
    ffn.aux_coef = 0;
  LMConfig c;
  c.d_model = o.ffn.d_model;
  c.layers = o.layers;
  c.heads = o.heads;
  c.context = o.context > 0 ? o.context : o.train.seq;
  c.positions = parse_enum<PositionKind>(o.positions);
  c.norm = parse_enum<NormKind>(o.norm);
  c.pre_norm = !o.post_norm;
  c.final_norm = !o.no_final_norm;
  c.tied_head = !o.untied;
  c.attn_bias = !o.no_attn_bias;
  c.dropout = o.dropout;
  c.init_std = o.init_std;
  // The masked objective trains a bidirectional model with [MASK] after the bytes.
  // Its positions default to RoPE: with learned ones the default model sat at the unigram
  // entropy for its 600 steps (4.79 bits per masked byte on the fortunes; 3.88 with RoPE).
  if (parse_enum<Objective>(o.objective) == Objective::masked) {
    c.causal = false;
    c.vocab = kMaskToken + 1;
    if (!flag_given(o, "--positions")) c.positions = PositionKind::rope;
  }
  c.ffn = ffn_config_from_flags(ffn, o.variant);
  validate(c);
  return c;
}

// The model options as the checkpoint's model sets them (the inverse of model_from_flags), for
// the flags the user did not give; a file flag (--model-config, --ffn-config) is left as it is.
TrainOptions options_from_model(TrainOptions o, const LMConfig& c) {
  auto set = [&](const char* flag, auto& field, auto value) {
    if (!flag_given(o, flag)) field = value;
  };
  set("--variant", o.variant, variant_name(c.ffn));
  set("--d-model", o.ffn.d_model, c.d_model);
  set("--d-ff", o.ffn.d_ff, c.ffn.d_ff);
  set("--no-bias", o.ffn.no_bias, !c.ffn.bias);
  set("--branches", o.ffn.branches, c.ffn.branches);
  set("--experts", o.ffn.experts, c.ffn.moe.num_experts);
  set("--top-k", o.ffn.top_k, c.ffn.moe.top_k);
  set("--routing", o.ffn.routing, std::string(enum_name(c.ffn.moe.routing)));
  set("--top-p", o.ffn.top_p, static_cast<double>(c.ffn.moe.top_p));
  set("--slots", o.ffn.slots, c.ffn.moe.slots);
  set("--entropy-coef", o.ffn.entropy_coef, static_cast<double>(c.ffn.moe.entropy_coef));
  set("--target-sparsity", o.ffn.target_sparsity, static_cast<double>(c.ffn.moe.target_sparsity));
  set("--l1-coef-init", o.ffn.l1_coef_init, static_cast<double>(c.ffn.moe.l1_coef_init));
  set("--constant-experts", o.ffn.constant_experts, c.ffn.moe.constant_experts);
  set("--copy-experts", o.ffn.copy_experts, c.ffn.moe.copy_experts);
  set("--zero-experts", o.ffn.zero_experts, c.ffn.moe.zero_experts);
  set("--zc-balance-weight", o.ffn.zc_balance_weight,
      static_cast<double>(c.ffn.moe.zc_balance_weight));
  set("--gating-residual", o.ffn.gating_residual, c.ffn.moe.gating_residual);
  set("--shared-experts", o.ffn.shared, c.ffn.moe.num_shared);
  set("--expert-d-ff", o.ffn.expert_d_ff, c.ffn.moe.expert_d_ff);
  set("--aux-coef", o.ffn.aux_coef, static_cast<double>(c.ffn.moe.aux_coef));
  set("--z-coef", o.ffn.z_coef, static_cast<double>(c.ffn.moe.z_coef));
  set("--capacity", o.ffn.capacity, c.ffn.moe.capacity_factor);
  set("--layers", o.layers, c.layers);
  set("--heads", o.heads, c.heads);
  set("--context", o.context, c.context);
  set("--positions", o.positions, enum_name(c.positions));
  set("--norm", o.norm, enum_name(c.norm));
  set("--post-norm", o.post_norm, !c.pre_norm);
  set("--no-final-norm", o.no_final_norm, !c.final_norm);
  set("--untied", o.untied, !c.tied_head);
  set("--no-attn-bias", o.no_attn_bias, !c.attn_bias);
  set("--dropout", o.dropout, c.dropout);
  set("--init-std", o.init_std, c.init_std);
  if (o.objective_flag->count() == 0) o.objective = c.causal ? "causal" : "masked";
  return o;
}

// When resuming, the model is the checkpoint's: a model flag that was given must agree with it
// (one not given is not compared: its default is not the user's word). The given flags are laid
// over the checkpoint's model, so that they are judged with its other settings, not defaults.
void check_model_flags(const TrainOptions& o, const LMConfig& saved) {
  bool given = false;
  for (const auto& [opt, read] : o.model_flags) given |= opt->count() > 0;
  if (!given) return;
  LMConfig flags;
  try {
    flags = model_from_flags(options_from_model(o, saved));
  } catch (const Error& e) {
    throw Error(fmt::format(
        "[train] resuming {}: the model flags do not fit the checkpoint's model: {} (a resumed "
        "run keeps its model; leave the model flags out)",
        o.resume, e.what()));
  }
  std::string diff;
  for (const auto& [opt, read] : o.model_flags)
    if (opt->count() > 0 && read(flags) != read(saved))
      diff += fmt::format("{}{} gives {}, the checkpoint has {}", diff.empty() ? "" : "; ",
                          opt->get_name(), read(flags).dump(), read(saved).dump());
  if (!diff.empty())
    throw Error(fmt::format(
        "[train] resuming {}: the model flags do not match the checkpoint's model: {} (a resumed "
        "run keeps its model; leave the model flags out)",
        o.resume, diff));
}

// The run the flags ask for: the model from the flags, or, when resuming, the checkpoint's
// (model flags, if given, must then match it); the training settings given, which the driver
// compares with a resumed checkpoint's.
RunRequest request_of(const TrainOptions& o, ProcessGroup* group) {
  RunRequest rq;
  rq.train = o.train;
  rq.train.optimizer.kind = parse_enum<OptimizerKind>(o.optimizer);
  rq.train.decay = parse_enum<DecayKind>(o.decay);
  rq.train.precision = parse_enum<Precision>(o.dtype);
  rq.train.objective = parse_enum<Objective>(o.objective);
  if (o.resume.empty()) {
    rq.model = model_from_flags(o);
  } else {
    rq.model = read_resume_point(o.resume).model;
    check_model_flags(o, rq.model);
  }
  for (const auto& [opt, key] : o.train_flags)
    if (opt->count() > 0)
      rq.given.push_back({key, fmt::format("{} {}", opt->get_name(), opt->as<std::string>())});
  rq.data = o.data;
  rq.data_given = o.data_flag->count() > 0;
  rq.val_fraction = o.val_fraction;
  rq.val_fraction_given = o.val_fraction_flag->count() > 0;
  // --resume DIR continues in DIR unless --out names another folder (an empty name is refused:
  // to the driver it means no folder).
  if (o.out.empty()) check_writable_dir(o.out, "train");
  rq.out = o.resume.empty() || o.out_flag->count() > 0 ? o.out : "";
  rq.resume = o.resume;
  rq.force = o.force;
  rq.sample = o.sample;
  rq.temperature = o.temperature;
  rq.prompt = o.prompt;
  const auto bucket = static_cast<std::int64_t>(o.bucket_mb * (1 << 20) / sizeof(float));
  rq.parallel = {group, std::max<std::int64_t>(1, bucket), o.expert_parallel,
                 agreed_flags(*o.command), o.expert_group};
  return rq;
}

// "; expert parallel: 4 experts per rank" (and ", in 2 groups of 2 ranks" with expert groups).
std::string expert_layout(int experts, int ranks, int group) {
  const int G = group > 0 ? group : ranks;
  return fmt::format("; expert parallel: {} experts per rank{}", experts / G,
                     G < ranks ? fmt::format(", in {} groups of {} ranks", ranks / G, G) : "");
}

void print_header(const LMConfig& m, const TrainConfig& t, const Corpus& corpus,
                  std::int64_t params, std::int64_t from_step) {
  fmt::print("ffnlab train: {} FFN ({}), d_model {}, {} layers, {} heads, {} parameters\n",
             variant_name(m.ffn), enum_name(m.ffn.kind), m.d_model, m.layers, m.heads, params);
  fmt::print(
      "data: {} ({} files, {} bytes, {}; {} train, {} validation; unigram entropy {:.2f} "
      "bits/byte)\n",
      corpus.source, corpus.files.size(), corpus.bytes.size(), corpus.fingerprint,
      corpus.train().size(), corpus.validation().size(), unigram_entropy_bits(corpus.train()));
  fmt::print(
      "training: {} steps from step {}, batch {} x seq {} x accumulate {}, {} lr {} "
      "(warm-up {}, {} to {}x), clip {}, {}, seed {}\n",
      t.steps, from_step, t.batch, t.seq, t.accumulate, enum_name(t.optimizer.kind), t.optimizer.lr,
      t.warmup, enum_name(t.decay), t.min_lr_ratio, t.clip, enum_name(t.precision), t.seed);
  if (t.objective == Objective::masked)
    fmt::print(
        "objective: masked bytes, {} of each sequence's {} replaced by [MASK] and predicted "
        "(bidirectional attention); validation in bits per masked byte\n",
        masked_per_sequence(t.seq, t.mask_fraction), t.seq);
  std::fflush(stdout);
}

// What the command shows as the run goes: its header, log lines, progress, evaluations.
class PrintingObserver final : public RunObserver {
 public:
  PrintingObserver(const TrainOptions& o, const ProcessGroup* group) : o_(o), group_(group) {}

  void started(const RunStart& s, TransformerLM& /*model*/) override {
    print_header(s.model, s.train, s.corpus, s.params, s.from_step);
    if (group_)
      fmt::print("data parallel: {} ranks, {} sequences each per micro-batch{}\n", group_->size(),
                 s.train.batch / group_->size(),
                 o_.expert_parallel
                     ? expert_layout(s.model.ffn.moe.num_experts, group_->size(), o_.expert_group)
                     : "");
    fmt::print(
        "matrix work: {:.2f} MFLOP a token (forward and backward); the bare products of "
        "this model's shapes run at {:.1f} GFLOP/s{} here (the yardstick of its FLOP "
        "utilisation)\n",
        s.bare.flops / static_cast<double>(s.tokens) / 1e6, s.bare.gflops(),
        group_ ? " a rank" : "");
    tokens_per_step_ = static_cast<double>(s.train.batch * s.train.seq * s.train.accumulate);
    total_ = s.train.steps;
    masked_ = s.train.objective == Objective::masked;
    progress_.emplace("step", s.train.steps,
                      o_.print_every > 0 ? o_.print_every : s.train.steps / 20);
  }

  void step(const StepLog& s, const TransformerLM& /*model*/) override {
    tokens_ += tokens_per_step_;
    seconds_ += s.seconds;
    const double mean_tps = tokens_ / seconds_;
    const double eta =
        mean_tps > 0 ? static_cast<double>(total_ - s.step) * tokens_per_step_ / mean_tps : 0;
    const std::string val =
        std::isnan(last_val_) ? ""
                              : fmt::format(" val {:.3f} {}", last_val_, masked_ ? "bpmb" : "bpb");
    progress_->update(s.step,
                      fmt::format("loss {:.4f} grad_norm {:.3f} lr {:.3g}{} | {:.0f} tok/s", s.loss,
                                  s.grad_norm, s.lr, val, mean_tps),
                      eta);
  }

  void evaluated(const EvalLog& e) override {
    last_val_ = e.bits_per_byte;
    progress_->message(fmt::format(
        "step {}: validation loss {:.4f} ({:.4f} bits per {}byte, {} {})", e.step, e.loss,
        e.bits_per_byte, masked_ ? "masked " : "", e.tokens, masked_ ? "masked bytes" : "tokens"));
  }

  bool stop() override { return InterruptGuard::requested(); }

  // Ends the progress line (before anything else is printed, or on error).
  void finish() {
    if (progress_) progress_->finish();
  }

 private:
  const TrainOptions& o_;
  const ProcessGroup* group_;
  std::optional<Progress> progress_;
  double tokens_per_step_ = 0, tokens_ = 0, seconds_ = 0, last_val_ = std::nan("");
  std::int64_t total_ = 0;
  bool masked_ = false;
};

// What rank 0 handed to the exchanges of the group and of the groups split from it (expert
// groups, their replicas) per step, by exchange, and the time spent in them (waiting for the
// other ranks included): what docs/distributed.md's model is checked against.
void print_traffic(const RunTraffic& t) {
  fmt::print("data parallel: rank 0 sent {:.3f} MB per step ({:.2f} ms per step in exchanges):",
             t.bytes_per_step / 1e6, t.seconds_per_step * 1e3);
  for (const auto& [what, v] : t.by_exchange)
    fmt::print(" {} {:.3f} MB {:.2f} ms;", what, v.first / 1e6, v.second * 1e3);
  fmt::print("\n");
}

// Started by mpirun: the MPI world (every rank a slice of each batch); else null.
std::unique_ptr<MpiWorld> join_world(const TrainOptions& o) {
  if (!mpi_launched()) return nullptr;
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!mpi_available() && size != nullptr && std::string_view(size) != "1")
    throw Error(fmt::format(
        "[dist] started by mpirun as one of {} processes, but this ffnlab was built without MPI: "
        "each would train alone; rebuild with -DFFNLAB_MPI=ON (the release preset does)",
        size));
  if (!mpi_available()) return nullptr;
  return mpi_world(o.dist_timeout);
}

void train(TrainOptions& o, ProcessGroup* group);

void run_train(TrainOptions& o) {
  InterruptGuard interrupts;
  apply_threads(o.threads);
  const std::unique_ptr<MpiWorld> world = join_world(o);
  if (!world || world->size() == 1) return train(o, nullptr);
  // When mpirun ends the job it stops reading the ranks' output and sends SIGTERM a second
  // later: the stop signal makes the output non-blocking (a line that cannot go out is
  // dropped: Progress), so that rank 0 reaches its checkpoint instead of blocking on a full
  // pipe, and a closed output ends no rank (docs/distributed.md, "Ctrl-C or SIGTERM").
  InterruptGuard::nonblocking_output_on_stop();
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGHUP, SIG_IGN);
  try {
    train(o, world.get());
  } catch (...) {
    // One rank failed: say why, then end every rank (they would wait for this one). Interrupted
    // too: mpirun, which forwarded the signal, is ending the job and does not let MPI finalise
    // (a finalising rank's message would be lost); the checkpoint is written by then.
    const int status = report_error(std::current_exception());
    world->abort(status);
  }
}

// One process, or one rank of a data-parallel run (group): rank 0 alone checks and writes the
// output folder, prints and samples; every rank trains.
void train(TrainOptions& o, ProcessGroup* group) {
  if (o.expert_parallel && group == nullptr)
    throw UsageError(
        "[train] --expert-parallel splits the experts over the ranks of an MPI run: "
        "start it with mpirun -np N (N > 1)");
  if (o.expert_group > 0 && !o.expert_parallel)
    throw UsageError("[train] --expert-group sizes the groups of --expert-parallel: give both");
  const bool lead = group == nullptr || group->rank() == 0;
  const RunRequest rq = request_of(o, group);
  PrintingObserver observer(o, group);
  RunOutcome r;
  try {
    r = run_training(rq, observer);
  } catch (const Error&) {
    observer.finish();  // end the progress line before the error
    throw;
  }
  observer.finish();
  if (r.already_finished) {  // resumed in its own folder: nothing of it changed
    if (lead)
      fmt::print(
          "{} is finished at step {} of {}: nothing to do (--steps N continues it; --out OTHER "
          "--sample N samples from it)\n",
          r.out, r.step, r.train.steps);
    return;
  }
  if (!r.finished) {
    if (!lead)
      throw Interrupted(fmt::format("{} after step {}", InterruptGuard::signal_name(), r.step));
    throw Interrupted(fmt::format(
        "{} after step {} of {}; checkpoint written to {}; continue with: ffnlab train --resume {}",
        InterruptGuard::signal_name(), r.step, r.train.steps,
        (fs::path(r.out) / "checkpoint").string(), r.out));
  }
  if (!lead) return;
  if (r.traffic) print_traffic(*r.traffic);
  if (!r.sample_skipped.empty())
    fmt::print(
        "no sample: no rank holds every expert (--expert-parallel); the checkpoint in {} samples "
        "in one process: ffnlab train --resume {} --out OTHER --sample {}\n",
        (fs::path(r.out) / "checkpoint").string(), r.out, o.sample);
  else if (!r.sample.empty())
    fmt::print("sample (temperature {}):\n{}\n", o.temperature, r.sample);
  if (r.median_tokens_per_second > 0) {
    if (std::isnan(r.utilisation))
      // A step cannot outrun its own products: the timing was disturbed, and no number is given.
      fmt::print(
          "model FLOP utilisation not measured: {:.1f} GFLOP/s of matrix work{} came out above "
          "the {:.1f} of the bare products of its shapes (a disturbed timing)\n",
          r.matrix_gflops, group ? " a rank" : "", r.bare.gflops());
    else
      fmt::print(
          "model FLOP utilisation {:.0f} %: {:.1f} GFLOP/s of matrix work{} against {:.1f} for "
          "the bare products of its shapes\n",
          100.0 * r.utilisation, r.matrix_gflops, group ? " a rank" : "", r.bare.gflops());
  }
  fmt::print("median {:.0f} tokens/s; logs, checkpoint and summary in {}\n",
             r.median_tokens_per_second, r.out);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  o->ffn.d_model = 128;
  o->ffn.d_ff = 0;         // default_d_ff of the variant
  o->ffn.aux_coef = 0.01;  // 0 with --routing relu (model_from_flags)
  auto* cmd = app.add_subcommand(
      "train",
      "Train a byte-level Transformer language model with a chosen FFN on real text.\n"
      "Writes OUT/train_log.csv (every step), OUT/eval_log.csv, OUT/checkpoint/, OUT/sample.txt "
      "and OUT/summary.json.");
  using Read = std::function<json(const LMConfig&)>;
  auto model = [&](CLI::Option* opt, Read read) {
    o->model_flags.emplace_back(opt, std::move(read));
    return opt;
  };
  const char* M = "Model";
  model(add_variant_flag(*cmd, o->variant), [](const LMConfig& c) {
    return variant_name(c.ffn);
  })->group(M);
  model(cmd->add_option("--model-config", o->model_config,
                        "whole-model JSON (docs/config.md) instead of the model flags"),
        [](const LMConfig& c) { return lm_config_to_json(c); })
      ->group(M);
  // What each FFN flag sets (add_ffn_flags names them).
  const std::map<std::string, Read> ffn_reads = {
      {"--d-model", [](const LMConfig& c) { return json(c.d_model); }},
      {"--d-ff", [](const LMConfig& c) { return json(c.ffn.d_ff); }},
      {"--no-bias", [](const LMConfig& c) { return json(!c.ffn.bias); }},
      {"--branches", [](const LMConfig& c) { return json(c.ffn.branches); }},
      {"--experts", [](const LMConfig& c) { return json(c.ffn.moe.num_experts); }},
      {"--top-k", [](const LMConfig& c) { return json(c.ffn.moe.top_k); }},
      {"--routing", [](const LMConfig& c) { return json(enum_name(c.ffn.moe.routing)); }},
      {"--top-p", [](const LMConfig& c) { return json(c.ffn.moe.top_p); }},
      {"--slots", [](const LMConfig& c) { return json(c.ffn.moe.slots); }},
      {"--entropy-coef", [](const LMConfig& c) { return json(c.ffn.moe.entropy_coef); }},
      {"--target-sparsity", [](const LMConfig& c) { return json(c.ffn.moe.target_sparsity); }},
      {"--l1-coef-init", [](const LMConfig& c) { return json(c.ffn.moe.l1_coef_init); }},
      {"--constant-experts", [](const LMConfig& c) { return json(c.ffn.moe.constant_experts); }},
      {"--copy-experts", [](const LMConfig& c) { return json(c.ffn.moe.copy_experts); }},
      {"--zero-experts", [](const LMConfig& c) { return json(c.ffn.moe.zero_experts); }},
      {"--zc-balance-weight", [](const LMConfig& c) { return json(c.ffn.moe.zc_balance_weight); }},
      {"--gating-residual", [](const LMConfig& c) { return json(c.ffn.moe.gating_residual); }},
      {"--shared-experts", [](const LMConfig& c) { return json(c.ffn.moe.num_shared); }},
      {"--expert-d-ff", [](const LMConfig& c) { return json(c.ffn.moe.expert_d_ff); }},
      {"--aux-coef", [](const LMConfig& c) { return json(c.ffn.moe.aux_coef); }},
      {"--z-coef", [](const LMConfig& c) { return json(c.ffn.moe.z_coef); }},
      {"--capacity", [](const LMConfig& c) { return json(c.ffn.moe.capacity_factor); }},
      {"--ffn-config", [](const LMConfig& c) { return config_to_json(c.ffn); }}};
  for (auto* opt : add_ffn_flags(*cmd, o->ffn, M)) {
    const auto read = ffn_reads.find(opt->get_name());
    if (read == ffn_reads.end())  // a new FFN flag needs its entry above
      throw std::logic_error("train: no model read-back for " + opt->get_name());
    if (opt->get_name() == "--aux-coef")  // model_from_flags
      opt->description(opt->get_description() +
                       " (default 0 with --routing relu, expert_choice or soft, which refuse it)");
    model(opt, read->second);
  }
  model(cmd->add_option("--layers", o->layers, "Transformer blocks"),
        [](const LMConfig& c) { return json(c.layers); })
      ->capture_default_str()
      ->check(int_in(1, limits::kLayers))
      ->group(M);
  model(cmd->add_option("--heads", o->heads, "attention heads"),
        [](const LMConfig& c) { return json(c.heads); })
      ->capture_default_str()
      ->check(int_in(1, limits::kWidth))
      ->group(M);
  model(cmd->add_option("--context", o->context, "longest sequence (default: --seq)"),
        [](const LMConfig& c) { return json(c.context); })
      ->check(int_in(0, limits::kWidth))
      ->group(M);
  model(cmd->add_option("--positions", o->positions,
                        join_names(enum_names<PositionKind>(), ", ") +
                            " (default with --objective masked: rope)"),
        [](const LMConfig& c) { return json(enum_name(c.positions)); })
      ->capture_default_str()
      ->group(M);
  model(cmd->add_option("--norm", o->norm, join_names(enum_names<NormKind>(), " or ")),
        [](const LMConfig& c) { return json(enum_name(c.norm)); })
      ->capture_default_str()
      ->group(M);
  model(cmd->add_flag("--post-norm", o->post_norm,
                      "norm after each residual add (default: pre-norm)"),
        [](const LMConfig& c) { return json(!c.pre_norm); })
      ->group(M);
  model(cmd->add_flag("--no-final-norm", o->no_final_norm, "no norm before the LM head"),
        [](const LMConfig& c) { return json(!c.final_norm); })
      ->group(M);
  model(cmd->add_flag("--untied", o->untied,
                      "an LM head of its own (default: tied to the embedding)"),
        [](const LMConfig& c) { return json(!c.tied_head); })
      ->group(M);
  model(cmd->add_flag("--no-attn-bias", o->no_attn_bias, "no biases in q/k/v/o"),
        [](const LMConfig& c) { return json(!c.attn_bias); })
      ->group(M);
  model(cmd->add_option("--dropout", o->dropout, "dropout on embeddings and residual branches"),
        [](const LMConfig& c) { return json(c.dropout); })
      ->capture_default_str()
      ->check(real_in(0, 1, true))
      ->group(M);
  model(cmd->add_option("--init-std", o->init_std,
                        "matrices N(0, s), biases 0 (GPT-2); 0: torch.nn defaults"),
        [](const LMConfig& c) { return json(c.init_std); })
      ->capture_default_str()
      ->check(real_in(0, 1e3))
      ->group(M);

  const char* T = "Training";
  TrainConfig& t = o->train;
  // A training flag: when resuming, one that differs from the checkpoint needs --force.
  auto train = [&](const char* key, CLI::Option* opt) {
    o->train_flags.emplace_back(opt, key);
    return opt->capture_default_str()->group(T);
  };
  train("steps", cmd->add_option("--steps", t.steps,
                                 "optimizer steps in all (with --resume: the checkpoint's, unless "
                                 "given)"))
      ->check(int_in(0, limits::kSteps));
  train("batch", cmd->add_option("--batch", t.batch, "sequences per micro-batch"))
      ->check(int_in(1, 1 << 20));
  train("seq", cmd->add_option("--seq", t.seq, "tokens (bytes) per sequence"))
      ->check(int_in(1, limits::kWidth));
  train("accumulate", cmd->add_option("--accumulate", t.accumulate, "micro-batches per step"))
      ->check(int_in(1, 1 << 20));
  train("optimizer", cmd->add_option("--optimizer", o->optimizer,
                                     join_names(enum_names<OptimizerKind>(), ", ")));
  train("lr", cmd->add_option("--lr", t.optimizer.lr, "peak learning rate"))
      ->check(real_in(0, 1e30));
  train("beta1", cmd->add_option("--beta1", t.optimizer.beta1, "Adam β1"))
      ->check(real_in(0, 1, true));
  train("beta2", cmd->add_option("--beta2", t.optimizer.beta2, "Adam β2"))
      ->check(real_in(0, 1, true));
  train("eps", cmd->add_option("--eps", t.optimizer.eps, "Adam ε"))->check(real_in(1e-30, 1));
  train("weight_decay",
        cmd->add_option("--weight-decay", t.optimizer.weight_decay,
                        "weight decay on matrices (AdamW: decoupled; Adam, SGD: L2)"))
      ->check(real_in(0, 1e3));
  train("momentum", cmd->add_option("--momentum", t.optimizer.momentum, "SGD momentum"))
      ->check(real_in(0, 1, true));
  train("warmup", cmd->add_option("--warmup", t.warmup, "linear warm-up steps"))
      ->check(int_in(0, limits::kSteps));
  train("decay", cmd->add_option("--decay", o->decay,
                                 "after warm-up: " + join_names(enum_names<DecayKind>(), " or ")));
  train("min_lr_ratio",
        cmd->add_option("--min-lr-ratio", t.min_lr_ratio, "cosine floor as a fraction of --lr"))
      ->check(real_in(0, 1));
  train("clip", cmd->add_option("--clip", t.clip, "max global gradient norm (0: off)"))
      ->check(real_in(0, 1e30));
  train("seed", cmd->add_option("--seed", t.seed, "initialisation, batches and dropout"));
  o->objective_flag = train(
      "objective",
      cmd->add_option("--objective", o->objective,
                      "causal (the next byte; a causal model) or masked (masked bytes, like BERT: "
                      "a bidirectional model with [MASK] as id 256; validation in bits per masked "
                      "byte; positions default to rope). Expert-choice and Soft MoE routing need "
                      "masked"));
  train("mask_fraction", cmd->add_option("--mask-fraction", t.mask_fraction,
                                         "masked: the share of each sequence's bytes masked"))
      ->check(real_in(0, 1, /*hi_open=*/false, /*lo_open=*/true));
  train("precision", cmd->add_option("--dtype", o->dtype,
                                     "product precision: f32, or bf16 with f32 master weights"));
  add_threads_option(*cmd, o->threads);

  const char* D = "Data and output";
  o->data_flag = cmd->add_option("--data", o->data,
                                 "a text file or a folder of them (skips .dat and .u8); with "
                                 "--resume: the checkpoint's")
                     ->capture_default_str()
                     ->group(D);
  o->val_fraction_flag =
      cmd->add_option("--val-fraction", o->val_fraction,
                      "last fraction of the bytes for validation (with --resume: the checkpoint's)")
          ->capture_default_str()
          ->check(real_in(0, 1, true))
          ->group(D);
  train("eval_every", cmd->add_option("--eval-every", t.eval_every,
                                      "validate every N steps (0: only at the end)"))
      ->check(int_in(0, limits::kSteps))
      ->group(D);
  train("eval_tokens", cmd->add_option("--eval-tokens", t.eval_tokens,
                                       "validation tokens per evaluation (0: all)"))
      ->check(int_in(0, limits::kSteps))
      ->group(D);
  train("checkpoint_every", cmd->add_option("--checkpoint-every", t.checkpoint_every,
                                            "checkpoint every N steps (0: only at the end)"))
      ->check(int_in(0, limits::kSteps))
      ->group(D);
  train("diagnostics_every",
        cmd->add_option("--diagnostics", t.diagnostics_every,
                        "every N steps (and at step 1), per layer into layer_log.csv: activation "
                        "RMS, attention entropy, gradient norms, router entropy, logit spread, "
                        "expert output RMS (0: none)"))
      ->check(int_in(0, limits::kSteps))
      ->group(D);
  o->out_flag = cmd->add_option("--out", o->out, "output folder (with --resume: that folder)")
                    ->capture_default_str()
                    ->group(D);
  cmd->add_option("--resume", o->resume,
                  "continue the run whose output folder this is (from its checkpoint/), in it")
      ->group(D);
  cmd->add_flag("--force", o->force,
                "with --resume: continue even on other data or with other training settings")
      ->group(D);
  cmd->add_option("--sample", o->sample, "bytes of text to sample at the end (0: none)")
      ->capture_default_str()
      ->check(int_in(0, 1000000))
      ->group(D);
  cmd->add_option("--temperature", o->temperature, "sampling temperature (0: greedy)")
      ->capture_default_str()
      ->check(real_in(0, 1000))
      ->group(D);
  cmd->add_option("--prompt", o->prompt, "text the sample continues")->group(D);
  cmd->add_option("--print-every", o->print_every,
                  "without a terminal: a progress line every N steps (default: steps/20)")
      ->check(int_in(0, limits::kSteps))
      ->group(D);
  const char* P = "Data parallel (mpirun -np N ffnlab train ...; docs/distributed.md)";
  cmd->add_option("--dist-timeout", o->dist_timeout,
                  "seconds a rank waits for the others in one exchange before it ends the run")
      ->capture_default_str()
      ->check(real_in(0.001, 1e6))
      ->group(P);
  cmd->add_option("--bucket-mb", o->bucket_mb,
                  "gradient all-reduce bucket, MiB: sums start as backward finishes this much")
      ->capture_default_str()
      ->check(real_in(0.001, 1e5))
      ->group(P);
  cmd->add_flag("--expert-parallel", o->expert_parallel,
                "MoE: split the experts over the ranks too (tokens exchanged by all-to-all)")
      ->group(P);
  cmd->add_option("--expert-group", o->expert_group,
                  "MoE, with --expert-parallel: split the experts over groups of G ranks, each "
                  "group a data-parallel replica of the others (G divides the ranks and the "
                  "experts; 0: one group of every rank)")
      ->capture_default_str()
      ->check(int_in(0, 1 << 20))
      ->group(P);
  o->command = cmd;
  cmd->callback([o] { run_train(*o); });
}

}  // namespace ffnlab::cli
