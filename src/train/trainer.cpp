// The training loop, evaluation, checkpoints and sampling.
#include "ffnlab/train/trainer.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "check.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/io/safetensors.hpp"
#include "ffnlab/limits.hpp"
#include "hash.hpp"
#include "json_keys.hpp"
#include "ranges.hpp"

namespace ffnlab {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
constexpr const char* kFormat = "ffnlab-checkpoint-1";
constexpr const char* kInfo = "checkpoint.json";

bool is_checkpoint_file(std::string_view name) {
  return name == kInfo || (name.starts_with("weights-") && name.ends_with(".safetensors"));
}

Schedule schedule_of(const TrainConfig& c) {
  return {c.optimizer.lr, c.warmup, c.steps, c.min_lr_ratio, c.decay};
}
}  // namespace

void validate(const TrainConfig& c) {
  check_range(c.steps, 0, limits::kSteps, "train", "steps");
  check_range(c.batch, 1, limits::kTokens, "train", "batch");
  check_range(c.seq, 1, limits::kWidth, "train", "seq");
  check_range(c.accumulate, 1, limits::kTokens, "train", "accumulate");
  check(checked_mul(c.batch, c.seq, "[train] batch × seq") <= limits::kTokens,
        "[train] batch × seq = {} × {} tokens is more than 2^32", c.batch, c.seq);
  check_range(c.warmup, 0, limits::kSteps, "train", "warmup");
  check_range(c.eval_every, 0, limits::kSteps, "train", "eval_every");
  check_range(c.eval_tokens, 0, limits::kSteps, "train", "eval_tokens");
  check_range(c.checkpoint_every, 0, limits::kSteps, "train", "checkpoint_every");
  check(c.min_lr_ratio >= 0.f && c.min_lr_ratio <= 1.f,
        "[train] min_lr_ratio = {} must be in [0, 1]", c.min_lr_ratio);
  check(std::isfinite(c.clip) && c.clip >= 0.f, "[train] clip = {} must be >= 0", c.clip);
  const OptimizerConfig& o = c.optimizer;
  check(std::isfinite(o.lr) && o.lr >= 0.f, "[train] lr = {} must be >= 0", o.lr);
  check(std::isfinite(o.eps) && o.eps > 0.f, "[train] eps = {} must be positive", o.eps);
  check(std::isfinite(o.weight_decay) && o.weight_decay >= 0.f,
        "[train] weight_decay = {} must be >= 0", o.weight_decay);
  check(o.beta1 >= 0.f && o.beta1 < 1.f && o.beta2 >= 0.f && o.beta2 < 1.f,
        "[train] beta1 = {} and beta2 = {} must be in [0, 1)", o.beta1, o.beta2);
  check(o.momentum >= 0.f && o.momentum < 1.f, "[train] momentum = {} must be in [0, 1)",
        o.momentum);
}

namespace {

// The optimizer's fields sit inside TrainConfig::optimizer; in JSON they are top-level keys.
template <auto Member>
constexpr JsonKey<TrainConfig> optimizer_field(const char* name) {
  return {name,
          [](TrainConfig& c, const json& j) {
            auto& f = c.optimizer.*Member;
            f = json_value<std::remove_cvref_t<decltype(f)>>(j);
          },
          [](const TrainConfig& c) { return json_of(c.optimizer.*Member); }};
}

constexpr std::array kTrainKeys{
    field<TrainConfig, &TrainConfig::steps>("steps"),
    field<TrainConfig, &TrainConfig::batch>("batch"),
    field<TrainConfig, &TrainConfig::seq>("seq"),
    field<TrainConfig, &TrainConfig::accumulate>("accumulate"),
    optimizer_field<&OptimizerConfig::kind>("optimizer"),
    optimizer_field<&OptimizerConfig::lr>("lr"),
    optimizer_field<&OptimizerConfig::beta1>("beta1"),
    optimizer_field<&OptimizerConfig::beta2>("beta2"),
    optimizer_field<&OptimizerConfig::eps>("eps"),
    optimizer_field<&OptimizerConfig::weight_decay>("weight_decay"),
    optimizer_field<&OptimizerConfig::momentum>("momentum"),
    field<TrainConfig, &TrainConfig::warmup>("warmup"),
    field<TrainConfig, &TrainConfig::min_lr_ratio>("min_lr_ratio"),
    field<TrainConfig, &TrainConfig::decay>("decay"),
    field<TrainConfig, &TrainConfig::clip>("clip"),
    field<TrainConfig, &TrainConfig::seed>("seed"),
    field<TrainConfig, &TrainConfig::precision>("precision"),
    field<TrainConfig, &TrainConfig::eval_every>("eval_every"),
    field<TrainConfig, &TrainConfig::eval_tokens>("eval_tokens"),
    field<TrainConfig, &TrainConfig::checkpoint_every>("checkpoint_every"),
};

}  // namespace

json train_config_to_json(const TrainConfig& c) {
  return write_keys(kTrainKeys, c);
}

TrainConfig train_config_from_json(const json& j) {
  TrainConfig c;
  read_keys(kTrainKeys, c, j, "train");
  validate(c);
  return c;
}

namespace {
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
        {"expert_parallel", parallel.expert_parallel}}},
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
  std::vector<double> odd{diff.empty() ? 0.0 : 1.0, diff.empty() ? -1.0 : group.rank()};
  group.allreduce_max(odd, "configuration check");
  check(diff.empty(), "[dist] rank {} was started with another configuration than rank 0: {}",
        group.rank(), diff);
  check(odd[0] == 0,
        "[dist] rank {} was started with another configuration than rank 0 (its "
        "own message says what differs)",
        static_cast<int>(odd[1]));
}

// The elements of one MoE layer's experts (s.experts equal slices) that the experts of `share`
// occupy: [begin, end).
std::pair<std::int64_t, std::int64_t> held_range(const TransformerLM::ExpertSpan& s,
                                                 const ExpertShare& share) {
  const std::int64_t per_expert = (s.end - s.begin) / s.experts;
  return {s.begin + share.first * per_expert, s.begin + (share.first + share.count) * per_expert};
}

// FNV-1a of the weights' bytes, as two exact halves.
std::vector<double> weights_hash(const Tensor& values) {
  const std::uint64_t h = fnv1a64(values.f32(), static_cast<std::size_t>(values.nbytes()));
  return {static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffull)};
}

// Gives the whole pages inside the ranges back to the system (their values become zeros, and
// cost no memory until written again).
void release(Tensor& buffer, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  for (const auto& [b, e] : ranges) {
    const auto first = reinterpret_cast<std::uintptr_t>(buffer.f32() + b);
    const auto last = reinterpret_cast<std::uintptr_t>(buffer.f32() + e);
    const std::uintptr_t from = (first + page - 1) / page * page, to = last / page * page;
    if (to > from) madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
  }
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
  if (ProcessGroup* g = parallel_.group) {
    check_same_setup(*g, model.config(), config_, corpus, parallel_);
    check(config_.batch % g->size() == 0,
          "[dist] batch = {} sequences cannot be split evenly over {} ranks; use a multiple of {}",
          config_.batch, g->size(), g->size());
    if (parallel_.expert_parallel) {
      const FFNConfig& f = model.config().ffn;
      check(f.kind == FFNKind::moe,
            "[dist] expert parallelism needs an MoE model (this one's is {})", variant_name(f));
      const ExpertShare here = expert_share(f.moe.num_experts, g->size(), g->rank());
      expert_spans_ = model_.expert_spans();
      for (const auto& s : expert_spans_) {
        expert_ranges_.emplace_back(s.begin, s.end);
        const auto [mine, end] = held_range(s, here);
        if (mine > s.begin) foreign_.emplace_back(s.begin, mine);
        if (end < s.end) foreign_.emplace_back(end, s.end);
      }
      // The other ranks' experts: neither trained nor kept in memory here (until a refresh).
      optimizer_->exclude(foreign_);
      release_foreign_experts(ExpertState::with_moments);
    }
    model_.set_data_parallel(g, g->rank() * (config_.batch / g->size()) * config_.seq,
                             parallel_.expert_parallel);
    sync_ = std::make_unique<GradientSync>(*g, model_.parameters().grads(),
                                           parallel_.bucket_elements, expert_ranges_);
  }
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
  parallel_.group->allreduce_sum(experts, "gradient norm");
  return std::sqrt(rest + experts[0]);
}

void Trainer::release_foreign_experts(ExpertState what) {
  if (foreign_.empty() || step_ >= config_.steps) return;  // at the end, every rank keeps all
  release(model_.parameters().values(), foreign_);
  release(model_.parameters().grads(), foreign_);
  if (what == ExpertState::with_moments) {
    release(optimizer_->m(), foreign_);
    if (optimizer_->v().defined()) release(optimizer_->v(), foreign_);
  }
}

void Trainer::refresh_experts(ExpertState what) {
  if (expert_spans_.empty()) return;
  ProcessGroup& g = *parallel_.group;
  auto refresh = [&](Tensor& buffer) {
    for (const auto& s : expert_spans_)
      for (int q = 0; q < g.size(); ++q) {  // rank q's experts, from rank q
        const auto [begin, end] = held_range(s, expert_share(s.experts, g.size(), q));
        g.broadcast({buffer.f32() + begin, static_cast<std::size_t>(end - begin)}, q,
                    "expert refresh");
      }
  };
  refresh(model_.parameters().values());
  if (what == ExpertState::with_moments) {
    refresh(optimizer_->m());
    if (optimizer_->v().defined()) refresh(optimizer_->v());
  }
}

StepLog Trainer::train_step() {
  // A data-parallel rank takes its slice of every micro-batch.
  const int ranks = parallel_.group ? parallel_.group->size() : 1;
  const std::int64_t rows = config_.batch / ranks;
  const std::int64_t first = parallel_.group ? parallel_.group->rank() * rows : 0;
  std::vector<Batch> batches;
  for (std::int64_t micro = 0; micro < config_.accumulate; ++micro)
    batches.push_back(sample_batch(corpus_.train(), config_.batch, config_.seq, config_.seed,
                                   static_cast<std::uint64_t>(step_),
                                   static_cast<std::uint64_t>(micro), first, rows));
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
  for (const FFNStats& s : model_.ffn_stats()) {
    if (s.num_experts == 0) continue;
    ++moe_layers;
    log.load_cv += s.load_cv;
    log.max_over_mean += s.max_over_mean;
    log.dropped_fraction += s.dropped_fraction;
    log.router_entropy += s.router_entropy;
  }
  if (moe_layers > 0) {
    log.load_cv /= moe_layers;
    log.max_over_mean /= moe_layers;
    log.dropped_fraction /= moe_layers;
    log.router_entropy /= moe_layers;
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
  refresh_experts(ExpertState::weights);  // evaluation runs every expert on every rank
  EvalLog log;
  log.step = step_;
  // Data parallel: rank r evaluates chunks r, r + ranks, ...; each chunk is the forward one
  // process would run, so the sum does not depend on the number of ranks.
  ProcessGroup* group = parallel_.group;
  const std::int64_t ranks = group ? group->size() : 1, rank = group ? group->rank() : 0;
  std::vector<double> sum{0.0, 0.0};  // loss · tokens, tokens
  for (std::int64_t w = 0, chunk = 0; w < windows; w += config_.batch, ++chunk) {
    if (chunk % ranks != rank) continue;
    const Batch b = sequential_batch(val, std::min(config_.batch, windows - w), S, w);
    const double loss = model_.forward(b.ids, b.targets, S, false);
    sum[0] += loss * static_cast<double>(b.ids.size());
    sum[1] += static_cast<double>(b.ids.size());
  }
  release_foreign_experts(ExpertState::weights);
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
      const bool kept = !checkpoint_dir.empty() && fs::exists(fs::path(checkpoint_dir) / kInfo);
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
      std::vector<double> any{stopping ? 1.0 : 0.0};
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

void Trainer::save(const std::string& dir) {
  ProcessGroup* group = parallel_.group;
  if (!group) return write_checkpoint(dir);
  // Every rank must hold the same weights (they make the same updates from the same summed
  // gradients); a checkpoint of one rank's would otherwise hide a divergence.
  refresh_experts(ExpertState::with_moments);
  std::vector<double> lo = weights_hash(model_.parameters().values()), hi = lo;
  group->allreduce_min(lo, "weights check");
  group->allreduce_max(hi, "weights check");
  check(lo == hi, "[dist] step {}: the ranks' weights differ; no checkpoint written", step_);
  // Rank 0 writes; every rank learns whether it could, so that all stop on a failed write.
  std::string failure;
  if (group->rank() == 0) try {
      write_checkpoint(dir);
    } catch (const Error& e) {
      failure = e.what();
    }
  group->broadcast(failure, "checkpoint");
  release_foreign_experts(ExpertState::with_moments);
  if (!failure.empty()) throw SystemError(failure);
}

void Trainer::write_checkpoint(const std::string& dir) const {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail_system("[checkpoint] cannot create '{}': {}", dir, ec.message());
  remove_stale_temporaries(dir, is_checkpoint_file);
  const std::string weights = fmt::format("weights-{:08d}.safetensors", step_);
  SafeTensorsWriter w;
  for (const Parameter& p : model_.parameters().list()) w.add(p.name, p.value);
  w.add("optimizer.m", optimizer_->m());
  if (optimizer_->v().defined()) w.add("optimizer.v", optimizer_->v());
  w.set_metadata("format", kFormat);
  w.set_metadata("step", std::to_string(step_));
  w.write((fs::path(dir) / weights).string());

  const json info = {{"format", kFormat},
                     {"step", step_},
                     {"optimizer_steps", optimizer_->steps()},
                     {"weights", weights},
                     {"data",
                      {{"source", corpus_.source},
                       {"path", resolved_path(corpus_.source)},
                       {"val_fraction", corpus_.val_fraction},
                       {"bytes", corpus_.bytes.size()},
                       {"fingerprint", corpus_.fingerprint},
                       {"train_bytes", corpus_.train().size()}}},
                     {"model", lm_config_to_json(model_.config())},
                     {"train", train_config_to_json(config_)}};
  const std::string text = info.dump(2) + "\n";
  write_file_atomic((fs::path(dir) / kInfo).string(), text.data(), text.size());
  // The commit point has passed: older weights files are no longer referenced.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    if (name != weights && name.rfind("weights-", 0) == 0 && e.path().extension() == ".safetensors")
      fs::remove(e.path(), ec);
  }
}

json read_checkpoint_info(const std::string& dir) {
  const fs::path path = fs::path(dir) / kInfo;
  check(fs::exists(path), "[checkpoint] no checkpoint in '{}' ({} is missing)", dir, path.string());
  const auto bytes = read_regular_file(path.string(), "checkpoint", std::uint64_t{1} << 24);
  json info;
  try {
    info = json::parse(bytes.begin(), bytes.end());
  } catch (const json::exception& e) {
    fail("[checkpoint] {} is corrupt: not valid JSON", path.string());
  }
  // Every field is type-checked before it is read (the fuzzer found "format": true escaping as
  // nlohmann's type_error).
  check(info.is_object() && info.contains("format") && info["format"].is_string() &&
            info["format"] == kFormat && info.contains("weights") && info.contains("model") &&
            info.contains("train") && info.contains("step"),
        "[checkpoint] {} is not an ffnlab checkpoint", path.string());
  // Strict types and ranges: a hostile file must not set a negative step or name another file.
  const auto integer = [&](const char* key) {
    try {
      const auto v = json_value<std::int64_t>(info[key]);
      check_range(v, 0, limits::kSteps, "checkpoint", key);
      return v;
    } catch (const BadValue& e) {
      fail("[checkpoint] {}: '{}' {}", path.string(), key, e.problem);
    } catch (const Error& e) {
      fail("{} (in {})", e.what(), path.string());
    }
  };
  check(info["model"].is_object() && info["train"].is_object(),
        "[checkpoint] {}: 'model' and 'train' must be JSON objects", path.string());
  if (info.contains("data")) {
    const json& d = info["data"];
    const auto is = [&](const char* key, bool (json::*type)() const noexcept) {
      return !d.contains(key) || (d[key].*type)();
    };
    const bool fraction_ok =
        !d.contains("val_fraction") ||
        (d["val_fraction"].is_number() && d["val_fraction"].get<double>() >= 0.0 &&
         d["val_fraction"].get<double>() < 1.0);
    check(d.is_object() && is("source", &json::is_string) && is("path", &json::is_string) &&
              is("fingerprint", &json::is_string) && fraction_ok &&
              is("bytes", &json::is_number_unsigned) &&
              is("train_bytes", &json::is_number_unsigned),
          "[checkpoint] {}: 'data' must be an object of its source, fingerprint and byte counts",
          path.string());
  }
  integer("step");
  if (info.contains("optimizer_steps")) integer("optimizer_steps");
  const json& w = info["weights"];
  const std::string name = w.is_string() ? w.get<std::string>() : "";
  check(name.starts_with("weights-") && name.ends_with(".safetensors") &&
            name.find('/') == std::string::npos && name.size() < 64,
        "[checkpoint] {}: 'weights' must name a weights-*.safetensors file beside it",
        path.string());
  return info;
}

void Trainer::load(const std::string& dir) {
  const json info = read_checkpoint_info(dir);
  remove_stale_temporaries(dir, is_checkpoint_file);  // files of a run killed while saving
  const json mine = lm_config_to_json(model_.config());
  std::string diff;
  for (const auto& [k, v] : mine.items())
    if (!info["model"].contains(k) || info["model"][k] != v)
      diff += fmt::format("{}{} {} in the checkpoint, {} here", diff.empty() ? "" : "; ", k,
                          info["model"].value(k, json()).dump(), v.dump());
  check(diff.empty(), "[checkpoint] '{}' holds a model of another shape: {}", dir, diff);
  const SafeTensors st =
      SafeTensors::load((fs::path(dir) / info["weights"].get<std::string>()).string());
  for (Parameter& p : model_.parameters().list()) {
    check(st.contains(p.name), "[checkpoint] {}: no tensor '{}'", st.source(), p.name);
    check(st.info(p.name).shape == p.shape, "[checkpoint] {}: '{}' is {}, the model has {}",
          st.source(), p.name, shape_string(st.info(p.name).shape), shape_string(p.shape));
    st.copy_f32(p.name, p.value);
  }
  auto load_state = [&](const char* name, Tensor& t) {
    check(st.contains(name) && shape_numel(st.info(name).shape) == t.numel(),
          "[checkpoint] {}: optimizer state '{}' is missing or of another size (optimizer {})",
          st.source(), name, enum_name(optimizer_->config().kind));
    st.copy_f32(name, t);
  };
  load_state("optimizer.m", optimizer_->m());
  if (optimizer_->v().defined()) load_state("optimizer.v", optimizer_->v());
  step_ = info["step"].get<std::int64_t>();
  release_foreign_experts(
      ExpertState::with_moments);  // expert parallel: this rank keeps its own experts only
  optimizer_->set_steps(
      info.contains("optimizer_steps") ? info["optimizer_steps"].get<std::int64_t>() : step_);
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
  const bool pad = model.config().causal;
  std::vector<std::int32_t> window;
  std::vector<double> p(static_cast<std::size_t>(V));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t len = std::min<std::int64_t>(S, static_cast<std::int64_t>(ctx.size()));
    window.assign(ctx.end() - len, ctx.end());
    if (pad) window.resize(static_cast<std::size_t>(S), 0);
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
