// The training loop: the setup checks, one step, evaluation, run, and sampling. The settings'
// JSON is train_config.cpp, checkpoints checkpoint.cpp, expert parallelism's memory
// expert_residency.cpp.
#include "ffnlab/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "check.hpp"
#include "expert_residency.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/names.hpp"
#include "ffnlab/ops/loss.hpp"
#include "ffnlab/ops/router.hpp"
#include "ranges.hpp"

namespace ffnlab {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
constexpr std::uint64_t kValidationMaskSeed = 0x76616c6964ull;

Schedule schedule_of(const TrainConfig& c) {
  return {c.optimizer.lr, c.warmup, c.steps, c.min_lr_ratio, c.decay};
}

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
  const RoutingKind routing = model.ffn.moe.routing;
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

// What every rank of a data-parallel run must share: the model, the training settings and the
// data. Rank 0's is sent to all; each compares its own and says what differs.
void check_same_setup(ProcessGroup& group, const LMConfig& model, const TrainConfig& train,
                      const Corpus& corpus, const DataParallel& parallel) {
  const json mine = {
      {"model", lm_config_to_json(model)},
      {"train", train_config_to_json(train)},
      {"data", {{"fingerprint", corpus.fingerprint}, {"train_bytes", corpus.train().size()}}},
      {"parallel",
       {{"bucket_elements", parallel.bucket_elements},
        {"expert_parallel", parallel.expert_parallel},
        {"expert_group", parallel.expert_group}}},
      {"settings", parallel.agreed}};
  std::string text = mine.dump();
  group.broadcast(text, "configuration check");
  const json first = json::parse(text);
  std::string diff;
  const auto differs = [&](const std::string& part, const std::string& key) {
    const json none;
    const json& theirs = first.contains(part) ? first.at(part) : none;
    const json here = mine[part].value(key, json()),
               there = theirs.is_object() ? theirs.value(key, json()) : json();
    if (here != there)
      diff += fmt::format("{}{}.{} = {} here, {} on rank 0", diff.empty() ? "" : "; ", part, key,
                          here.dump(), there.dump());
  };
  for (const auto& [part, values] : mine.items()) {
    for (const auto& [key, value] : values.items()) differs(part, key);
    if (first.contains(part) && first.at(part).is_object())
      for (const auto& [key, value] : first.at(part).items())  // rank 0's keys this rank lacks
        if (!values.contains(key)) differs(part, key);
  }
  std::vector<std::int64_t> odd{diff.empty() ? 0 : 1, diff.empty() ? -1 : group.rank()};
  group.allreduce_max(odd, "configuration check");
  check(diff.empty(), "[dist] rank {} was started with another configuration than rank 0: {}",
        group.rank(), diff);
  check(odd[0] == 0,
        "[dist] rank {} was started with another configuration than rank 0 (its "
        "own message says what differs)",
        static_cast<int>(odd[1]));
}

}  // namespace

Trainer::Trainer(TransformerLM& model, const Corpus& corpus, const TrainConfig& config,
                 DataParallel parallel)
    : model_(model),
      corpus_(corpus),
      config_(config),
      schedule_(schedule_of(config)),
      parallel_(parallel) {
  check_training_setup(model.config(), corpus, config_, false);
  model_.set_precision(config_.precision);
  optimizer_ = std::make_unique<Optimizer>(config_.optimizer, model_.parameters(),
                                           TransformerLM::is_decayed);
  const ExpertShare held = model_.held_experts();
  const int experts =
      model.config().ffn.kind == FFNKind::moe ? model.config().ffn.moe.num_experts : 0;
  sharded_ = held.count < experts;
  check(!sharded_ || (parallel_.group != nullptr && parallel_.expert_parallel),
        "[train] this model holds experts [{}, {}) of {} only: it trains expert parallel "
        "(--expert-parallel under mpirun), with the other ranks holding the rest",
        held.first, held.first + held.count, experts);
  if (ProcessGroup* g = parallel_.group) {
    check_same_setup(*g, model.config(), config_, corpus, parallel_);
    check(config_.batch % g->size() == 0,
          "[dist] batch = {} sequences cannot be split evenly over {} ranks; use a multiple of {}",
          config_.batch, g->size(), g->size());
    if (parallel_.expert_parallel) {
      const FFNConfig& f = model.config().ffn;
      check(f.kind == FFNKind::moe,
            "[dist] expert parallelism needs an MoE model (this one's is {})", variant_name(f));
      check(f.moe.routing != RoutingKind::soft,
            "[dist] Soft MoE does not split its experts over ranks (its slots mix every token of "
            "a sequence): train it with data parallelism alone (without --expert-parallel)");
      const int G = parallel_.expert_group > 0 ? parallel_.expert_group : g->size();
      check(G <= g->size() && g->size() % G == 0,
            "[dist] an expert group of {} ranks does not divide the {} ranks (--expert-group)", G,
            g->size());
      // (Without groups, expert_share below says that the experts do not split over the ranks.)
      check(parallel_.expert_group == 0 || f.moe.num_experts % G == 0,
            "[dist] {} experts cannot be split evenly over an expert group of {} ranks "
            "(--expert-group)",
            f.moe.num_experts, G);
      if (G < g->size()) {  // groups of G consecutive ranks, each a replica of the others
        experts_group_ = g->split(g->rank() / G, "expert groups");
        replicas_ = g->split(g->rank() % G, "expert replicas");
      }
      const ProcessGroup& eg = expert_group();
      const ExpertShare here = expert_share(f.moe.num_experts, eg.size(), eg.rank());
      check(!sharded_ || (held.first == here.first && held.count == here.count),
            "[dist] this rank's model holds experts [{}, {}), but its place in an expert group "
            "of {} ranks holds [{}, {}) (build it with TransformerLM's held = expert_share(E, "
            "group size, rank in the group))",
            held.first, held.first + held.count, eg.size(), here.first, here.first + here.count);
      expert_spans_ = model_.expert_spans();
      for (const auto& s : expert_spans_) {
        expert_ranges_.emplace_back(s.begin, s.end);
        if (sharded_) continue;  // every expert here is this rank's
        const auto [mine, end] = held_range(s, here);
        if (mine > s.begin) foreign_.emplace_back(s.begin, mine);
        if (end < s.end) foreign_.emplace_back(end, s.end);
      }
      // The other ranks' experts: neither trained nor kept in memory here (until a refresh).
      optimizer_->exclude(foreign_);
      release_foreign_experts(ExpertState::with_moments);
    }
    model_.set_data_parallel(g, g->rank() * (config_.batch / g->size()) * config_.seq,
                             parallel_.expert_parallel, experts_group_.get());
    sync_ = std::make_unique<GradientSync>(*g, model_.parameters().grads(),
                                           parallel_.bucket_elements, expert_ranges_);
    if (replicas_) {  // this rank's experts' gradients, over their holders in every group
      std::vector<std::pair<std::int64_t, std::int64_t>> others = foreign_;
      const Tensor& grads = model_.parameters().grads();
      for_each_outside(0, grads.numel(), expert_ranges_,
                       [&](std::int64_t b, std::int64_t e) { others.emplace_back(b, e); });
      std::sort(others.begin(), others.end());
      expert_sync_ = std::make_unique<GradientSync>(*replicas_, model_.parameters().grads(),
                                                    parallel_.bucket_elements, others);
    }
  }
}

Trainer::~Trainer() {
  if (parallel_.group) model_.set_data_parallel(nullptr, 0);
}

double Trainer::gradient_norm() const {
  Tensor& grads = model_.parameters().grads();
  if (expert_ranges_.empty()) return global_norm(grads);
  // The expert ranges hold this rank's experts' gradients only (zeros elsewhere): their squares
  // are summed over the ranks; the rest is the same everywhere.
  auto squares = [&](std::int64_t b, std::int64_t e) {
    const double n = global_norm(grads.view(b, {e - b}));
    return n * n;
  };
  double rest = 0;
  for_each_outside(0, grads.numel(), expert_ranges_,
                   [&](std::int64_t b, std::int64_t e) { rest += squares(b, e); });
  std::vector<double> experts{0.0};
  for (const auto& [b, e] : expert_ranges_) experts[0] += squares(b, e);
  // Over the expert group, which holds every expert once (its replicas hold the same sums).
  expert_group().allreduce_sum(experts, "gradient norm");
  return std::sqrt(rest + experts[0]);
}

StepLog Trainer::train_step() {
  // A data-parallel rank takes its slice of every micro-batch.
  const int ranks = parallel_.group ? parallel_.group->size() : 1;
  const std::int64_t rows = config_.batch / ranks;
  const std::int64_t first = parallel_.group ? parallel_.group->rank() * rows : 0;
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
  const auto t0 = std::chrono::steady_clock::now();
  StepLog log;
  ParameterSet& ps = model_.parameters();
  // (Expert parallel: the other ranks' experts' gradients stay untouched zeros.)
  for_each_outside(0, ps.count(), foreign_,
                   [&](std::int64_t b, std::int64_t e) { ps.grads().view(b, {e - b}).zero(); });
  const auto count = static_cast<std::int64_t>(batches.size());
  const float weight = 1.f / static_cast<float>(count);
  std::int64_t tokens = 0;
  ProcessGroup* group = parallel_.group;
  // Data parallel: the loss is the mean over the whole batch, each rank's share 1/ranks of it;
  // the MoE aux losses are already the whole batch's (their backward divides by its tokens).
  const float share = group ? 1.f / static_cast<float>(group->size()) : 1.f;
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
      model_.backward(weight * share, weight, [&](std::int64_t first) { sync_->ready(first); });
    else
      model_.backward(weight * share, weight);
  }
  if (group) {
    sync_->finish();
    if (expert_sync_) expert_sync_->finish();
    std::vector<double> sums{log.loss, static_cast<double>(tokens)};
    group->allreduce_sum(sums, "loss");
    log.loss = sums[0];
    tokens = static_cast<std::int64_t>(sums[1]);
    check(std::isfinite(log.loss) && std::isfinite(log.aux_loss), "{}", non_finite());
  }
  log.grad_norm = gradient_norm();
  check(std::isfinite(log.grad_norm),
        "[train] step {}: the gradient norm is {}; training stopped before the update", step_ + 1,
        log.grad_norm);
  const std::int64_t every = config_.diagnostics_every;
  if (every > 0 && (step_ == 0 || (step_ + 1) % every == 0)) log.layers = model_.diagnostics();
  if (config_.clip > 0.f) {
    // torch.nn.utils.clip_grad_norm_: scale by min(1, max_norm / (norm + 1e-6)).
    const double factor = config_.clip / (log.grad_norm + 1e-6);
    if (factor < 1.0)
      for_each_outside(0, ps.count(), foreign_, [&](std::int64_t b, std::int64_t e) {
        Tensor part = ps.grads().view(b, {e - b});
        scale_buffer(part, static_cast<float>(factor));
      });
  }
  log.lr = schedule_.lr(step_);
  optimizer_->step(static_cast<float>(log.lr));
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
  // Evaluation runs every expert on every rank; a sharded model's ranks exchange rows instead,
  // and so make the same number of forwards (those without a chunk left repeat the first and
  // drop its loss).
  if (!sharded_) refresh_experts(ExpertState::weights);
  EvalLog log;
  log.step = step_;
  // Data parallel: rank r evaluates chunks r, r + ranks, ...; each chunk is the forward one
  // process would run, so the sum does not depend on the number of ranks.
  ProcessGroup* group = parallel_.group;
  const std::int64_t ranks = group ? group->size() : 1, rank = group ? group->rank() : 0;
  std::vector<double> sum{0.0, 0.0};  // loss · bytes predicted, bytes predicted
  const std::int64_t chunks = (windows + config_.batch - 1) / config_.batch;
  const std::int64_t rounds = sharded_ ? (chunks + ranks - 1) / ranks : chunks;
  for (std::int64_t round = 0; round < rounds; ++round) {
    const std::int64_t chunk = sharded_ ? round * ranks + rank : round;
    if (!sharded_ && chunk % ranks != rank) continue;
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
  if (!sharded_) release_foreign_experts(ExpertState::weights);
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
  while (step_ < config_.steps) {
    StepLog log;
    try {
      log = train_step();
    } catch (const Error& e) {
      // Say what is left to resume from: the checkpoint in the directory is the last good one.
      const bool kept =
          !checkpoint_dir.empty() && fs::exists(fs::path(checkpoint_dir) / kCheckpointInfo);
      throw Error(
          kept ? fmt::format("{}; the last good checkpoint (step {}) is kept in {}", e.what(),
                             read_checkpoint_info(checkpoint_dir)["step"].get<std::int64_t>(),
                             checkpoint_dir)
               : fmt::format("{}; no checkpoint was written", e.what()));
    }
    if (on_step) on_step(log);
    const bool last = step_ == config_.steps;
    if (last || (config_.eval_every > 0 && step_ % config_.eval_every == 0)) {
      const EvalLog e = evaluate(config_.eval_tokens);
      if (on_eval) on_eval(e);
    }
    bool stopping = !last && stop && stop();
    if (parallel_.group && !last) {  // one rank interrupted: all stop, at the same step
      std::vector<std::int64_t> any{stopping ? 1 : 0};
      parallel_.group->allreduce_max(any, "stop");
      stopping = any[0] > 0;
    }
    if (!checkpoint_dir.empty() &&
        (last || stopping ||
         (config_.checkpoint_every > 0 && step_ % config_.checkpoint_every == 0)))
      save(checkpoint_dir);
    if (stopping) return false;
  }
  return true;
}

std::string sample_text(TransformerLM& model, const std::string& prompt, std::int64_t n,
                        float temperature, std::uint64_t seed) {
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
  // A causal model's logits at position i do not depend on later positions, so every step runs
  // one window of the full context, zero-padded on the right while the text is shorter: one
  // shape, so the products' primitives are created once instead of once per length.
  check(model.config().causal,
        "[sample] a bidirectional model (causal false) does not generate text one byte at a "
        "time: it was trained to fill in masked bytes");
  std::vector<std::int32_t> window;
  std::vector<double> p(static_cast<std::size_t>(V));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t len = std::min<std::int64_t>(S, static_cast<std::int64_t>(ctx.size()));
    window.assign(ctx.end() - len, ctx.end());
    window.resize(static_cast<std::size_t>(S), 0);
    model.forward(window, {}, static_cast<std::int64_t>(window.size()), false);
    const float* logits = model.logits().f32() + (len - 1) * V;
    std::int32_t next = 0;
    if (temperature <= 0.f) {
      next = static_cast<std::int32_t>(std::max_element(logits, logits + V) - logits);
    } else {
      const float mx = *std::max_element(logits, logits + V);
      for (std::int64_t v = 0; v < V; ++v) p[v] = std::exp((logits[v] - mx) / temperature);
      std::discrete_distribution<std::int32_t> dist(p.begin(), p.end());
      next = dist(rng);
    }
    ctx.push_back(next);
    out.push_back(static_cast<char>(next));
  }
  return out;
}

}  // namespace ffnlab
