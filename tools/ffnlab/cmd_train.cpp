// ffnlab train: a byte-level Transformer language model with any FFN variant, trained on real
// text (the fortunes corpus by default), with logs, evaluation, checkpoints and a sample.
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/io/ffn_io.hpp"
#include "ffnlab/train/trainer.hpp"

namespace ffnlab::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct TrainOptions {
  // model
  std::string variant = "relu", ffn_config, model_config;
  std::int64_t d_model = 128, d_ff = 0, heads = 4, context = 0;
  int layers = 4;
  std::string positions = "learned", norm = "layernorm";
  bool post_norm = false, no_final_norm = false, untied = false, no_attn_bias = false,
       no_ffn_bias = false;
  float dropout = 0.f, init_std = 0.02f;
  int experts = 8, top_k = 2, shared = 0;
  std::int64_t expert_d_ff = 0;
  double aux_coef = 0.01, z_coef = 0.0, capacity = 0.0;
  // training
  TrainConfig train;
  std::string optimizer = "adamw", decay = "cosine", dtype = "f32";
  // data and output
  std::string data = kDefaultCorpus, out = "runs/train", resume;
  double val_fraction = 0.1;
  std::int64_t sample = 300;
  float temperature = 0.8f;
  std::string prompt = "\n";
  std::int64_t print_every = 0;
  int threads = 0;
  std::vector<CLI::Option*> model_flags;
};

// d_ff when none is given: 4·D, and 2/3 of that (rounded up to a multiple of 8) for the gated
// variants, so that dense variants have about equal parameters (the seeds' rule).
std::int64_t default_d_ff(const std::string& variant, std::int64_t D) {
  const bool gated = variant == "glu" || variant == "bilinear" || variant == "reglu" ||
                     variant == "geglu" || variant == "swiglu";
  return gated ? (8 * D / 3 + 7) / 8 * 8 : 4 * D;
}

LMConfig model_from_flags(const TrainOptions& o) {
  if (!o.model_config.empty()) {
    std::ifstream in(o.model_config);
    if (!in.good()) throw Error(fmt::format("[train] cannot read '{}'", o.model_config));
    json j;
    try {
      in >> j;
    } catch (const json::exception& e) {
      throw Error(fmt::format("[train] {}: {}", o.model_config, e.what()));
    }
    return lm_config_from_json(j);
  }
  LMConfig c;
  c.d_model = o.d_model;
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
  if (!o.ffn_config.empty()) {
    c.ffn = read_ffn_config_file(o.ffn_config);
  } else {
    const std::int64_t F = o.d_ff > 0 ? o.d_ff : default_d_ff(o.variant, o.d_model);
    c.ffn = variant_config(o.variant, o.d_model, F, !o.no_ffn_bias);
    c.ffn.moe.num_experts = o.experts;
    c.ffn.moe.top_k = o.top_k;
    c.ffn.moe.num_shared = o.shared;
    c.ffn.moe.expert_d_ff = o.expert_d_ff;
    c.ffn.moe.aux_coef = o.aux_coef;
    c.ffn.moe.z_coef = o.z_coef;
    c.ffn.moe.capacity_factor = o.capacity;
  }
  validate(c);
  return c;
}

std::string duration(double seconds) {
  const auto s = static_cast<std::int64_t>(std::max(0.0, seconds));
  return s >= 3600 ? fmt::format("{}:{:02d}:{:02d}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{}:{:02d}", s / 60, s % 60);
}

// Progress: a bar redrawn in place on a terminal, plain lines otherwise.
class Progress {
 public:
  Progress(std::int64_t total, std::int64_t every)
      : total_(total), every_(every), tty_(isatty(fileno(stdout)) != 0) {}

  void step(const StepLog& s, double mean_tps, double last_val) {
    const double eta = mean_tps > 0 ? static_cast<double>(total_ - s.step) * tokens_ / mean_tps : 0;
    const std::string val = std::isnan(last_val) ? "" : fmt::format(" val {:.3f} bpb", last_val);
    if (tty_) {
      const int width = 24;
      const int done = static_cast<int>(width * s.step / std::max<std::int64_t>(1, total_));
      fmt::print("\r[{}{}] {}/{} loss {:.4f}{} | {:.0f} tok/s | ETA {}   ", std::string(done, '#'),
                 std::string(width - done, '.'), s.step, total_, s.loss, val, mean_tps,
                 duration(eta));
      std::fflush(stdout);
    } else if (s.step % every_ == 0 || s.step == total_) {
      fmt::print("step {}/{} loss {:.4f} grad_norm {:.3f} lr {:.3g}{} | {:.0f} tok/s | ETA {}\n",
                 s.step, total_, s.loss, s.grad_norm, s.lr, val, mean_tps, duration(eta));
      std::fflush(stdout);
    }
  }
  void message(const std::string& line) {
    fmt::print("{}{}\n", tty_ ? "\r\033[K" : "", line);
    std::fflush(stdout);
  }
  void finish() {
    if (tty_) fmt::print("\n");
  }
  void set_tokens_per_step(double t) { tokens_ = t; }

 private:
  std::int64_t total_, every_;
  bool tty_;
  double tokens_ = 0;
};

void run_train(TrainOptions& o) {
  apply_threads(o.threads);
  o.train.optimizer.kind = parse_enum<OptimizerKind>(o.optimizer);
  o.train.decay = parse_enum<DecayKind>(o.decay);
  o.train.precision = parse_enum<Precision>(o.dtype);

  LMConfig model_config;
  TrainConfig train = o.train;
  const std::string ckpt_dir = (fs::path(o.out) / "checkpoint").string();
  const bool resuming = !o.resume.empty();
  std::string resume_dir;
  if (resuming) {
    resume_dir = (fs::path(o.resume) / "checkpoint").string();
    const json info = read_checkpoint_info(resume_dir);
    bool explicit_model = false;
    for (auto* f : o.model_flags) explicit_model |= f->count() > 0;
    // The checkpoint defines the model unless model flags are given (then they must match it).
    model_config = explicit_model ? model_from_flags(o) : lm_config_from_json(info["model"]);
    // The run's settings come from the checkpoint; --steps sets the new total.
    const std::int64_t steps = train.steps;
    train = train_config_from_json(info["train"]);
    train.steps = steps;
  } else {
    model_config = model_from_flags(o);
  }

  const Corpus corpus = load_corpus(o.data, o.val_fraction);
  TransformerLM model(model_config, train.seed);
  Trainer trainer(model, corpus, train);
  if (resuming) trainer.load(resume_dir);
  if (trainer.step() > train.steps)
    throw Error(fmt::format("[train] the checkpoint is at step {}, past --steps {}", trainer.step(),
                            train.steps));

  fs::create_directories(o.out);
  const std::string log_path = (fs::path(o.out) / "train_log.csv").string();
  const std::string eval_path = (fs::path(o.out) / "eval_log.csv").string();
  const bool append = resuming && fs::path(o.resume) == fs::path(o.out);
  std::ofstream log(log_path, append ? std::ios::app : std::ios::trunc);
  std::ofstream evals(eval_path, append ? std::ios::app : std::ios::trunc);
  if (!log.good() || !evals.good())
    throw Error(fmt::format("[train] cannot write logs into '{}'", o.out));
  if (!append) {
    log << "step,loss,aux_loss,grad_norm,lr,tokens_per_s,seconds,load_cv,max_over_mean,"
           "dropped_fraction,router_entropy\n";
    evals << "step,val_loss,val_bits_per_byte,tokens\n";
  }

  const std::int64_t params = model.parameters().count();
  fmt::print("ffnlab train: {} FFN ({}), d_model {}, {} layers, {} heads, {} parameters\n",
             variant_name(model_config.ffn), enum_name(model_config.ffn.kind), model_config.d_model,
             model_config.layers, model_config.heads, params);
  fmt::print(
      "data: {} ({} files, {} bytes; {} train, {} validation; unigram entropy {:.2f} "
      "bits/byte)\n",
      corpus.source, corpus.files.size(), corpus.bytes.size(), corpus.train().size(),
      corpus.validation().size(), unigram_entropy_bits(corpus.train()));
  fmt::print(
      "training: {} steps from step {}, batch {} x seq {} x accumulate {}, {} lr {} "
      "(warm-up {}, {} to {}x), clip {}, {}, seed {}\n",
      train.steps, trainer.step(), train.batch, train.seq, train.accumulate,
      enum_name(train.optimizer.kind), train.optimizer.lr, train.warmup, enum_name(train.decay),
      train.min_lr_ratio, train.clip, enum_name(train.precision), train.seed);
  std::fflush(stdout);

  const std::int64_t every =
      o.print_every > 0 ? o.print_every : std::max<std::int64_t>(1, train.steps / 20);
  Progress progress(train.steps, every);
  progress.set_tokens_per_step(static_cast<double>(train.batch * train.seq * train.accumulate));
  double tokens = 0, seconds = 0, last_val = std::nan("");
  json eval_list = json::array();
  std::vector<double> step_tps;
  auto on_step = [&](const StepLog& s) {
    log << fmt::format("{},{:.6f},{:.6f},{:.6f},{:.6g},{:.1f},{:.4f},{:.5f},{:.5f},{:.5f},{:.5f}\n",
                       s.step, s.loss, s.aux_loss, s.grad_norm, s.lr, s.tokens_per_second,
                       s.seconds, s.load_cv, s.max_over_mean, s.dropped_fraction, s.router_entropy);
    log.flush();
    tokens += static_cast<double>(train.batch * train.seq * train.accumulate);
    seconds += s.seconds;
    step_tps.push_back(s.tokens_per_second);
    progress.step(s, tokens / seconds, last_val);
  };
  auto on_eval = [&](const EvalLog& e) {
    evals << fmt::format("{},{:.6f},{:.6f},{}\n", e.step, e.loss, e.bits_per_byte, e.tokens);
    evals.flush();
    last_val = e.bits_per_byte;
    eval_list.push_back({{"step", e.step},
                         {"loss", e.loss},
                         {"bits_per_byte", e.bits_per_byte},
                         {"tokens", e.tokens}});
    progress.message(fmt::format("step {}: validation loss {:.4f} ({:.4f} bits/byte, {} tokens)",
                                 e.step, e.loss, e.bits_per_byte, e.tokens));
  };
  try {
    trainer.run(on_step, on_eval, ckpt_dir);
  } catch (const Error&) {
    progress.finish();  // end the progress line before the error
    throw;
  }
  progress.finish();

  std::string text;
  if (o.sample > 0) {
    text = sample_text(model, o.prompt, o.sample, o.temperature, train.seed);
    std::ofstream(fs::path(o.out) / "sample.txt") << text;
    fmt::print("sample (temperature {}):\n{}\n", o.temperature, text);
  }
  std::sort(step_tps.begin(), step_tps.end());
  const double median_tps = step_tps.empty() ? 0 : step_tps[step_tps.size() / 2];
  const json summary = {{"model", lm_config_to_json(model_config)},
                        {"train", train_config_to_json(train)},
                        {"parameters", params},
                        {"data",
                         {{"source", corpus.source},
                          {"files", corpus.files.size()},
                          {"bytes", corpus.bytes.size()},
                          {"train_bytes", corpus.train().size()},
                          {"validation_bytes", corpus.validation().size()}}},
                        {"steps", trainer.step()},
                        {"median_tokens_per_second", median_tps},
                        {"evaluations", eval_list},
                        {"sample", text}};
  // The sample is raw bytes; JSON needs UTF-8, so invalid sequences become U+FFFD there.
  const std::string s = summary.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  write_file_atomic((fs::path(o.out) / "summary.json").string(), s.data(), s.size());
  fmt::print("median {:.0f} tokens/s; logs, checkpoint and summary in {}\n", median_tps, o.out);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  auto* cmd = app.add_subcommand(
      "train",
      "Train a byte-level Transformer language model with a chosen FFN on real text.\n"
      "Writes OUT/train_log.csv (every step), OUT/eval_log.csv, OUT/checkpoint/, OUT/sample.txt "
      "and OUT/summary.json.");
  auto model = [&](CLI::Option* opt) {
    o->model_flags.push_back(opt);
    return opt;
  };
  const char* M = "Model";
  model(cmd->add_option("--variant", o->variant,
                        "FFN: relu, gelu, glu, bilinear, reglu, geglu, swiglu, gated, moe"))
      ->capture_default_str()
      ->group(M);
  model(cmd->add_option("--ffn-config", o->ffn_config,
                        "FFN config file instead of --variant (ffnlab JSON or HF config.json)"))
      ->group(M);
  model(cmd->add_option("--model-config", o->model_config,
                        "whole-model JSON (docs/config.md) instead of the model flags"))
      ->group(M);
  model(cmd->add_option("--d-model", o->d_model, "model width D"))->capture_default_str()->group(M);
  model(cmd->add_option("--d-ff", o->d_ff, "FFN hidden width (default 4·D; 8/3·D for GLU kinds)"))
      ->group(M);
  model(cmd->add_option("--layers", o->layers, "Transformer blocks"))
      ->capture_default_str()
      ->group(M);
  model(cmd->add_option("--heads", o->heads, "attention heads"))->capture_default_str()->group(M);
  model(cmd->add_option("--context", o->context, "longest sequence (default: --seq)"))->group(M);
  model(cmd->add_option("--positions", o->positions, "learned, sinusoidal, rope or none"))
      ->capture_default_str()
      ->group(M);
  model(cmd->add_option("--norm", o->norm, "layernorm or rmsnorm"))
      ->capture_default_str()
      ->group(M);
  model(cmd->add_flag("--post-norm", o->post_norm,
                      "norm after each residual add (default: pre-norm)"))
      ->group(M);
  model(cmd->add_flag("--no-final-norm", o->no_final_norm, "no norm before the LM head"))->group(M);
  model(cmd->add_flag("--untied", o->untied,
                      "an LM head of its own (default: tied to the embedding)"))
      ->group(M);
  model(cmd->add_flag("--no-attn-bias", o->no_attn_bias, "no biases in q/k/v/o"))->group(M);
  model(cmd->add_flag("--no-ffn-bias", o->no_ffn_bias, "no biases in the FFN"))->group(M);
  model(cmd->add_option("--dropout", o->dropout, "dropout on embeddings and residual branches"))
      ->capture_default_str()
      ->group(M);
  model(cmd->add_option("--init-std", o->init_std,
                        "matrices N(0, s), biases 0 (GPT-2); 0: torch.nn defaults"))
      ->capture_default_str()
      ->group(M);
  model(cmd->add_option("--experts", o->experts, "MoE: routed experts"))
      ->capture_default_str()
      ->group(M);
  model(cmd->add_option("--top-k", o->top_k, "MoE: experts per token"))
      ->capture_default_str()
      ->group(M);
  model(cmd->add_option("--shared-experts", o->shared, "MoE: shared experts"))
      ->capture_default_str()
      ->group(M);
  model(cmd->add_option("--expert-d-ff", o->expert_d_ff, "MoE: expert width (0: --d-ff)"))
      ->group(M);
  model(cmd->add_option("--aux-coef", o->aux_coef, "MoE: load-balancing loss coefficient"))
      ->capture_default_str()
      ->group(M);
  model(cmd->add_option("--z-coef", o->z_coef, "MoE: router z-loss coefficient"))
      ->capture_default_str()
      ->group(M);
  model(cmd->add_option("--capacity", o->capacity, "MoE: capacity factor (0: dropless)"))
      ->capture_default_str()
      ->group(M);

  const char* T = "Training";
  TrainConfig& t = o->train;
  cmd->add_option("--steps", t.steps, "optimizer steps (in total, when resuming)")
      ->capture_default_str()
      ->group(T);
  cmd->add_option("--batch", t.batch, "sequences per micro-batch")->capture_default_str()->group(T);
  cmd->add_option("--seq", t.seq, "tokens (bytes) per sequence")->capture_default_str()->group(T);
  cmd->add_option("--accumulate", t.accumulate, "micro-batches per step")
      ->capture_default_str()
      ->group(T);
  cmd->add_option("--optimizer", o->optimizer, "sgd, adam or adamw")
      ->capture_default_str()
      ->group(T);
  cmd->add_option("--lr", t.optimizer.lr, "peak learning rate")->capture_default_str()->group(T);
  cmd->add_option("--beta1", t.optimizer.beta1, "Adam β1")->capture_default_str()->group(T);
  cmd->add_option("--beta2", t.optimizer.beta2, "Adam β2")->capture_default_str()->group(T);
  cmd->add_option("--eps", t.optimizer.eps, "Adam ε")->capture_default_str()->group(T);
  cmd->add_option("--weight-decay", t.optimizer.weight_decay,
                  "weight decay on matrices (AdamW: decoupled; Adam, SGD: L2)")
      ->capture_default_str()
      ->group(T);
  cmd->add_option("--momentum", t.optimizer.momentum, "SGD momentum")
      ->capture_default_str()
      ->group(T);
  cmd->add_option("--warmup", t.warmup, "linear warm-up steps")->capture_default_str()->group(T);
  cmd->add_option("--decay", o->decay, "after warm-up: cosine or constant")
      ->capture_default_str()
      ->group(T);
  cmd->add_option("--min-lr-ratio", t.min_lr_ratio, "cosine floor as a fraction of --lr")
      ->capture_default_str()
      ->group(T);
  cmd->add_option("--clip", t.clip, "max global gradient norm (0: off)")
      ->capture_default_str()
      ->group(T);
  cmd->add_option("--seed", t.seed, "initialisation, batches and dropout")
      ->capture_default_str()
      ->group(T);
  cmd->add_option("--dtype", o->dtype, "product precision: f32, or bf16 with f32 master weights")
      ->capture_default_str()
      ->group(T);
  add_threads_option(*cmd, o->threads);

  const char* D = "Data and output";
  cmd->add_option("--data", o->data, "a text file or a folder of them (skips .dat and .u8)")
      ->capture_default_str()
      ->group(D);
  cmd->add_option("--val-fraction", o->val_fraction, "last fraction of the bytes for validation")
      ->capture_default_str()
      ->group(D);
  cmd->add_option("--eval-every", t.eval_every, "validate every N steps (0: only at the end)")
      ->capture_default_str()
      ->group(D);
  cmd->add_option("--eval-tokens", t.eval_tokens, "validation tokens per evaluation (0: all)")
      ->capture_default_str()
      ->group(D);
  cmd->add_option("--checkpoint-every", t.checkpoint_every,
                  "checkpoint every N steps (0: only at the end)")
      ->capture_default_str()
      ->group(D);
  cmd->add_option("--out", o->out, "output folder")->capture_default_str()->group(D);
  cmd->add_option("--resume", o->resume,
                  "continue the run whose output folder this is (from its checkpoint/)")
      ->group(D);
  cmd->add_option("--sample", o->sample, "bytes of text to sample at the end (0: none)")
      ->capture_default_str()
      ->group(D);
  cmd->add_option("--temperature", o->temperature, "sampling temperature (0: greedy)")
      ->capture_default_str()
      ->group(D);
  cmd->add_option("--prompt", o->prompt, "text the sample continues")->group(D);
  cmd->add_option("--print-every", o->print_every,
                  "without a terminal: a progress line every N steps (default: steps/20)")
      ->group(D);
  cmd->callback([o] { run_train(*o); });
}

}  // namespace ffnlab::cli
