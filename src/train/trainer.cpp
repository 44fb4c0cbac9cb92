// The training loop: the setup checks, one step, evaluation, run, and sampling. The settings'
// JSON is train_config.cpp, checkpoints checkpoint.cpp, how the ranks share the work
// parallel_plan.cpp.
#include "ffnlab/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "check.hpp"
#include "ffnlab/failure.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/names.hpp"
#include "ffnlab/ops/loss.hpp"
#include "ranges.hpp"

namespace ffnlab {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
constexpr std::uint64_t kValidationMaskSeed = 0x76616c6964ull;

void check_validation_part(const Corpus& corpus, std::int64_t seq) {
  check(window_count(corpus.validation(), seq) > 0,
        "[data] the validation part of '{}' ({} bytes) is shorter than one sequence of {} bytes "
        "(seq {} + 1); use more data, a larger validation fraction or a shorter seq",
        corpus.source, corpus.validation().size(), seq + 1, seq);
}
// Tokens are bytes: a model with a smaller vocabulary cannot take every byte of the data.
void check_bytes_in_vocab(const Corpus& corpus, std::int64_t vocab) {
  if (vocab >= 256 || corpus.bytes.empty()) return;
  const auto top = *std::max_element(corpus.bytes.begin(), corpus.bytes.end());
  check(top < vocab,
        "[data] '{}' holds byte {}, outside the model's vocab = {} (byte-level models need 256)",
        corpus.source, static_cast<int>(top), vocab);
}
}  // namespace

void check_training_setup(const LMConfig& model, const Corpus& corpus, const TrainConfig& config,
                          bool evaluates) {
  validate(config);
  check(config.seq <= model.context, "[train] sequence length {} exceeds the model's context {}",
        config.seq, model.context);
  const auto routing = model.ffn.moe.routing;
  check(!(model.ffn.kind == FFNKind::moe && looks_at_whole_sequence(routing) && config.seq < 2),
        "[train] routing '{}' works on whole sequences: sequence length {} is one token (seq "
        "must be at least 2)",
        enum_name(routing), config.seq);
  if (config.objective == Objective::masked) {
    check(!model.causal,
          "[train] the masked objective predicts bytes from both sides: the model must be "
          "bidirectional (causal false)");
    check(model.vocab > kMaskToken,
          "[train] the masked objective needs a vocabulary of {} (the bytes and [MASK]); the "
          "model has {}",
          kMaskToken + 1, model.vocab);
  } else {
    check(model.causal,
          "[train] a bidirectional model (causal false) sees the byte the causal objective asks "
          "it to predict; train it with objective masked (--objective masked)");
  }
  const auto n = static_cast<std::int64_t>(corpus.train().size());
  check(n >= config.seq + 1,
        "[data] sequence length {} needs at least {} bytes of training data; '{}' has {}",
        config.seq, config.seq + 1, corpus.source, n);
  if (evaluates) {
    check_validation_part(corpus, config.seq);
    check_bytes_in_vocab(corpus, model.vocab);
  }
}

namespace {
// What each rank does alone before the ranks first meet (ParallelPlan's setup exchange): the
// model and data checked for the config, the model set to its precision, whether it holds the
// experts it may, and the optimizer with its state allocated. Under a group a rank that fails
// here (its memory, a caller's setup) fails every rank, rather than leaving them waiting.
Optimizer set_up_alone(TransformerLM& model, const Corpus& corpus, const TrainConfig& config,
                       const DataParallel& parallel) {
  std::optional<Optimizer> optimizer;
  const auto set_up = [&] {
    check_training_setup(model.config(), corpus, config, false);
    check_holds_its_experts(model, parallel);
    model.set_precision(config.precision);
    optimizer.emplace(config.optimizer, model.parameters(), TransformerLM::is_decayed);
  };
  fail_together_around(parallel.group, "trainer setup",
                       "[train] rank {} could not set up its training (its message says why)",
                       set_up);
  return std::move(*optimizer);
}

std::string kept_note(std::int64_t step, const std::string& dir) {
  return fmt::format("the last good checkpoint (step {}) is kept in {}", step, dir);
}

// What a run that failed leaves to resume from, before it wrote a checkpoint: the one in the
// directory is the last good one (a checkpoint is written with its checkpoint.json last).
std::string kept_checkpoint(const std::string& dir) {
  try {
    if (fs::exists(fs::path(dir) / kCheckpointInfo))
      return kept_note(read_checkpoint_info(dir)["step"].get<std::int64_t>(), dir);
  } catch (const std::exception&) {
    return fmt::format("the checkpoint in {} cannot be read", dir);
  }
  return "no checkpoint was written";
}
}  // namespace

Trainer::Trainer(TransformerLM& model, const Corpus& corpus, const TrainConfig& config,
                 DataParallel parallel)
    : model_(model),
      corpus_(corpus),
      config_(config),
      schedule_(schedule_of(config)),
      optimizer_(set_up_alone(model_, corpus_, config_, parallel)),
      plan_(model_, optimizer_, corpus_, config_, std::move(parallel)),
      checkpoints_(model_, optimizer_, plan_, corpus_, config_) {}

StepLog Trainer::train_step() {
  // A data-parallel rank takes its slice of every micro-batch.
  const std::int64_t rows = config_.batch / plan_.ranks();
  const std::int64_t first = plan_.rank() * rows;
  std::vector<Batch> batches;
  for (std::int64_t micro = 0; micro < config_.accumulate; ++micro) {
    batches.push_back(sample_batch(corpus_.train(), config_.batch, config_.seq, config_.seed,
                                   static_cast<std::uint64_t>(step_),
                                   static_cast<std::uint64_t>(micro), first, rows));
    if (config_.objective == Objective::masked)  // positions: a function of (seed, step, micro)
      mask_batch(batches.back(), config_.seq, config_.mask_fraction, config_.seed,
                 static_cast<std::uint64_t>(step_ * config_.accumulate + micro), first);
  }
  return train_step(batches);
}

StepLog Trainer::train_step(std::span<const Batch> batches) {
  check(!batches.empty(), "[train] a step needs at least one batch (given none)");
  const auto t0 = std::chrono::steady_clock::now();
  StepLog log;
  ParameterSet& ps = model_.parameters();
  // (Expert parallel: the other ranks' experts' gradients stay untouched zeros.)
  for_each_outside(0, ps.count(), plan_.unheld(),
                   [&](std::int64_t b, std::int64_t e) { ps.grads().view(b, {e - b}).zero(); });
  const auto count = static_cast<std::int64_t>(batches.size());
  const float weight = 1.f / static_cast<float>(count);
  std::int64_t tokens = 0;
  ProcessGroup* group = plan_.group();
  // Data parallel: the loss is the mean over the whole batch, each rank's share 1/ranks of it;
  // the MoE aux losses are already the whole batch's (their backward divides by its tokens).
  const float share = group ? 1.f / static_cast<float>(group->size()) : 1.f;
  const std::int64_t every = config_.diagnostics_every;
  const bool diagnose = every > 0 && (step_ == 0 || (step_ + 1) % every == 0);
  model_.set_diagnostics(diagnose);
  const auto non_finite = [&] {
    return fmt::format("[train] step {}: the loss is {}; training stopped before the update",
                       step_ + 1, log.loss + log.aux_loss);
  };
  for (std::int64_t micro = 0; micro < count; ++micro) {
    const Batch& b = batches[micro];
    tokens += static_cast<std::int64_t>(b.ids.size());
    model_.set_dropout_stream(config_.seed, static_cast<std::uint64_t>(step_ * count + micro));
    log.loss += model_.forward(b.ids, b.targets, config_.seq, true) * weight * share;
    log.aux_loss += model_.aux_loss() * weight;
    // Over a group the check waits for the summed loss, so that every rank stops together.
    if (!group) check(std::isfinite(log.loss) && std::isfinite(log.aux_loss), "{}", non_finite());
    const bool last = micro + 1 == count;
    if (group && last)
      model_.backward(weight * share, weight,
                      [&](std::int64_t first) { plan_.gradients_ready(first); });
    else
      model_.backward(weight * share, weight);
  }
  if (group) {
    plan_.finish_gradients();
    std::vector<double> sums{log.loss, static_cast<double>(tokens)};
    group->allreduce_sum(sums, "loss");
    log.loss = sums[0];
    tokens = static_cast<std::int64_t>(sums[1]);
    check(std::isfinite(log.loss) && std::isfinite(log.aux_loss), "{}", non_finite());
  }
  log.grad_norm = plan_.gradient_norm();
  check(std::isfinite(log.grad_norm),
        "[train] step {}: the gradient norm is {}; training stopped before the update", step_ + 1,
        log.grad_norm);
  if (diagnose) log.layers = model_.diagnostics();
  if (config_.clip > 0.f) {
    // torch.nn.utils.clip_grad_norm_: scale by min(1, max_norm / (norm + 1e-6)).
    const double factor = config_.clip / (log.grad_norm + 1e-6);
    if (factor < 1.0)
      for_each_outside(0, ps.count(), plan_.unheld(), [&](std::int64_t b, std::int64_t e) {
        Tensor part = ps.grads().view(b, {e - b});
        scale_buffer(part, static_cast<float>(factor));
      });
  }
  log.lr = schedule_.lr(step_);
  optimizer_.step(static_cast<float>(log.lr));
  model_.after_optimizer_step();
  ++step_;
  log.step = step_;

  int moe_layers = 0;
  last_step_stats_ = model_.ffn_stats();
  for (const FFNStats& s : last_step_stats_) {
    if (s.num_experts == 0) continue;
    ++moe_layers;
    log.load_cv += s.load_cv;
    log.max_over_mean += s.max_over_mean;
    log.dropped_fraction += s.dropped_fraction;
    log.router_entropy += s.router_entropy;
    log.experts_per_token += s.experts_per_token;
    log.l1_coef = s.l1_coef;  // one coefficient for the model
  }
  if (moe_layers > 0) {
    log.load_cv /= moe_layers;
    log.max_over_mean /= moe_layers;
    log.dropped_fraction /= moe_layers;
    log.router_entropy /= moe_layers;
    log.experts_per_token /= moe_layers;
  }
  log.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log.tokens_per_second = static_cast<double>(tokens) / log.seconds;
  return log;
}

EvalLog Trainer::evaluate(std::int64_t max_tokens) {
  const auto val = corpus_.validation();
  const std::int64_t S = config_.seq;
  std::int64_t windows = window_count(val, S);
  check(windows > 0, "[data] the validation part ({} bytes) is shorter than one sequence of {}",
        val.size(), S + 1);
  if (max_tokens > 0) windows = std::max<std::int64_t>(1, std::min(windows, max_tokens / S));
  // Evaluation runs every expert on every rank; a model holding only this rank's experts exchanges
  // rows instead, and so make the same number of forwards (those without a chunk left repeat the
  // first and drop its loss).
  const bool own_only = plan_.own_experts_only();
  if (!own_only) plan_.refresh_experts(ExpertState::weights);
  EvalLog log;
  log.step = step_;
  // Data parallel: rank r evaluates chunks r, r + ranks, ...; each chunk is the forward one
  // process would run, so the sum does not depend on the number of ranks.
  ProcessGroup* group = plan_.group();
  const std::int64_t ranks = plan_.ranks(), rank = plan_.rank();
  std::vector<double> sum{0.0, 0.0};  // loss · bytes predicted, bytes predicted
  const std::int64_t chunks = (windows + config_.batch - 1) / config_.batch;
  const std::int64_t rounds = own_only ? (chunks + ranks - 1) / ranks : chunks;
  for (std::int64_t round = 0; round < rounds; ++round) {
    const std::int64_t chunk = own_only ? round * ranks + rank : round;
    if (!own_only && chunk % ranks != rank) continue;
    const bool counted = chunk < chunks;
    const std::int64_t w = counted ? chunk * config_.batch : 0;
    Batch b = sequential_batch(val, std::min(config_.batch, windows - w), S, w);
    // The masked objective's validation masks depend on the window alone (not on the run's
    // seed): every run is scored on the same positions.
    if (config_.objective == Objective::masked)
      mask_batch(b, S, config_.mask_fraction, kValidationMaskSeed, 0, w);
    const double loss = model_.forward(b.ids, b.targets, S, false);
    if (!counted) continue;
    const auto predicted = static_cast<double>(counted_targets(b.targets));
    sum[0] += loss * predicted;
    sum[1] += predicted;
  }
  if (!own_only) plan_.release_unheld_experts(ExpertState::weights, step_);
  if (group) group->allreduce_sum(sum, "evaluation");
  log.tokens = static_cast<std::int64_t>(sum[1]);
  log.loss = sum[0] / sum[1];
  log.bits_per_byte = log.loss / std::log(2.0);
  return log;
}

bool Trainer::run(const std::function<void(const StepLog&)>& on_step,
                  const std::function<void(const EvalLog&)>& on_eval,
                  const std::string& checkpoint_dir, const std::function<bool()>& stop) {
  check_validation_part(corpus_, config_.seq);  // fail now, not after the last step
  check_bytes_in_vocab(corpus_, model_.config().vocab);
  const std::int64_t first_step = step_;
  // Whatever fails - a non-finite loss, memory, a log's write, a full disk - the error says what
  // the run kept to resume from (the checkpoint before a failed write is whole), as rank 0, which
  // writes it, sees it: every rank's line says the same, naming the folder whole.
  ProcessGroup* group = plan_.group();
  const bool writer = !group || group->rank() == 0;
  std::string dir = writer ? checkpoint_dir : std::string();
  if (group && !dir.empty()) dir = absolute_or_as_given(dir);
  std::string kept = dir.empty() ? std::string() : kept_checkpoint(dir);
  if (group) {
    group->broadcast(dir, "checkpoint");
    group->broadcast(kept, "checkpoint");
  }
  try {
    if (!dir.empty()) checkpoints_.check_shared_folder(dir);  // rank 0's, on every rank
    while (step_ < config_.steps) {
      const StepLog log = train_step();
      // The caller's callbacks and stop request are this rank's alone: under a group a rank
      // that fails in one goes on to the step's evaluation, which every rank takes, and then
      // fails every rank (instead of leaving them waiting in the next step).
      Failure mine;
      const auto alone = [&](const auto& part) {
        if (!mine.failed()) mine = failure_of(group, part);
      };
      alone([&] {
        if (on_step) on_step(log);
      });
      const bool last = step_ == config_.steps;
      if (last || (config_.eval_every > 0 && step_ % config_.eval_every == 0)) {
        const EvalLog e = evaluate(config_.eval_tokens);
        alone([&] {
          if (on_eval) on_eval(e);
        });
      }
      bool stopping = false;
      alone([&] { stopping = !last && stop && stop(); });
      // One exchange a step: a rank that stops stops every rank at this step, and one that
      // failed fails every rank (fail_together's exchanges run only then, on every rank).
      if (group) {
        std::vector<std::int64_t> any{stopping ? 1 : 0, mine.failed() ? 1 : 0};
        group->allreduce_max(any, "stop");
        if (any[1] > 0)
          fail_together(
              *group, mine, "stop",
              fmt::format("[train] rank {{}} failed after step {} (its message says why)", step_));
        stopping = any[0] > 0;
      }
      if (!dir.empty() &&
          (last || stopping ||
           (config_.checkpoint_every > 0 && step_ % config_.checkpoint_every == 0))) {
        save(dir);
        kept = kept_note(step_, dir);
      }
      if (stopping) return false;
    }
    // A run that trained no step (--steps 0, or a finished run continued into another folder)
    // still leaves its model to resume from, as its summary says.
    if (!dir.empty() && step_ == first_step) save(dir);
  } catch (const std::exception& e) {
    if (kept.empty()) throw;  // a run without a checkpoint folder (the study's) has nothing to say
    // The error in flight, of its own kind (a stop stays a stop, a system failure one, with its
    // errno: memory ENOMEM).
    Failure::of(e).raise({}, fmt::format("; {}", kept));
  }
  return true;
}

std::string sample_text(TransformerLM& model, const std::string& prompt, std::int64_t n,
                        float temperature, std::uint64_t seed, const std::function<bool()>& stop) {
  std::vector<std::int32_t> ctx;
  for (unsigned char c : prompt) {
    check(c < model.config().vocab, "[sample] the prompt holds byte {}, outside vocab = {}",
          static_cast<int>(c), model.config().vocab);
    ctx.push_back(c);
  }
  if (ctx.empty()) ctx.push_back('\n');
  std::mt19937_64 rng(seed);
  std::string out;
  const std::int64_t V = model.config().vocab, S = model.config().context;
  // The text is bytes: ids from 256 up (a vocab made larger than the bytes) are never drawn.
  const std::int64_t bytes = std::min<std::int64_t>(V, 256);
  // A causal model's logits at position i do not depend on later positions, so every step runs
  // one window of the full context, zero-padded on the right while the text is shorter: one
  // shape, so the products' primitives are created once instead of once per length.
  check(model.config().causal,
        "[sample] a bidirectional model (causal false) does not generate text one byte at a "
        "time: it was trained to fill in masked bytes");
  std::vector<std::int32_t> window;
  std::vector<double> p(static_cast<std::size_t>(bytes));
  for (std::int64_t i = 0; i < n && !(stop && stop()); ++i) {
    const std::int64_t len = std::min<std::int64_t>(S, static_cast<std::int64_t>(ctx.size()));
    window.assign(ctx.end() - len, ctx.end());
    window.resize(static_cast<std::size_t>(S), 0);
    model.forward(window, {}, static_cast<std::int64_t>(window.size()), false);
    const float* logits = model.logits().f32() + (len - 1) * V;
    std::int32_t next = 0;
    if (temperature <= 0.f) {
      next = static_cast<std::int32_t>(std::max_element(logits, logits + bytes) - logits);
    } else {
      const float mx = *std::max_element(logits, logits + bytes);
      for (std::int64_t v = 0; v < bytes; ++v) p[v] = std::exp((logits[v] - mx) / temperature);
      std::discrete_distribution<std::int32_t> dist(p.begin(), p.end());
      next = dist(rng);
    }
    ctx.push_back(next);
    out.push_back(static_cast<char>(next));
  }
  return out;
}

}  // namespace ffnlab
