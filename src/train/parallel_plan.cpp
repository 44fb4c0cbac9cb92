// The parallel plan: the start-up checks every rank makes together, the expert groups, the
// gradient sums and norm, and expert parallelism's memory (a rank keeps the weights, gradients
// and optimizer moments of its own experts, held_by_rank, and gives the pages of the others'
// back to the system; a refresh brings every expert back on every rank).
#include "ffnlab/train/parallel_plan.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "check.hpp"
#include "ffnlab/io/json_text.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/names.hpp"
#include "ffnlab/ops/router.hpp"
#include "ffnlab/train/train_config.hpp"
#include "hash.hpp"
#include "ranges.hpp"

namespace ffnlab {

using json = nlohmann::json;

// What every rank of a data-parallel run must share: the model, the training settings and the
// data. Rank 0's is sent to all; each compares its own and says what differs.
void check_same_setup(ProcessGroup& group, const LMConfig& model, const TrainConfig& train,
                      const Corpus& corpus, const DataParallel& parallel) {
  const json raw = {
      {"model", lm_config_to_json(model)},
      {"train", train_config_to_json(train)},
      {"data", {{"fingerprint", corpus.fingerprint}, {"train_bytes", corpus.train().size()}}},
      {"parallel",
       {{"bucket_elements", parallel.bucket_elements},
        {"expert_parallel", parallel.expert_parallel},
        {"expert_group", parallel.expert_group}}},
      {"settings", parallel.agreed}};
  // A flag's bytes that are not UTF-8 - a folder's name - are compared as JSON keeps them, with
  // U+FFFD in their place, on every rank alike; and whole, by a fingerprint of each flag's bytes.
  json mine = json::parse(json_text(raw));
  mine["settings_bytes"] = json::object();
  for (const auto& [flag, value] : parallel.agreed)
    mine["settings_bytes"][flag] =
        fmt::format("fnv1a64:{:016x}", fnv1a64(value.data(), value.size()));
  std::string text = mine.dump();
  group.broadcast(text, "configuration check");
  const json first = json::parse(text);
  std::string diff;
  const json none;
  const auto value_of = [&](const json& j, const std::string& part, const std::string& key) {
    const json& p = j.contains(part) ? j.at(part) : none;
    return p.is_object() ? p.value(key, json()) : json();
  };
  const auto differs = [&](const std::string& part, const std::string& key) {
    const json here = value_of(mine, part, key), there = value_of(first, part, key);
    // (A flag whose value differs where JSON shows it is named once, not again by its bytes.)
    if (part == "settings_bytes" &&
        value_of(mine, "settings", key) != value_of(first, "settings", key))
      return;
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

namespace {

// The elements of one MoE layer's experts (s.experts equal slices) that the experts of `share`
// occupy: [begin, end).
std::pair<std::int64_t, std::int64_t> held_range(const TransformerLM::ExpertSpan& s,
                                                 const HeldExperts& share) {
  const std::int64_t per_expert = (s.end - s.begin) / s.experts;
  return {s.begin + share.first * per_expert, s.begin + (share.first + share.count) * per_expert};
}

// Gives the whole pages inside the ranges back to the system (their values become zeros, and
// cost no memory until written again).
void release(Tensor& buffer, const Ranges& ranges) {
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  for (const auto& [b, e] : ranges) {
    const auto first = reinterpret_cast<std::uintptr_t>(buffer.f32() + b);
    const auto last = reinterpret_cast<std::uintptr_t>(buffer.f32() + e);
    const std::uintptr_t from = (first + page - 1) / page * page, to = last / page * page;
    if (to > from) madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
  }
}

}  // namespace

void check_parallel_layout(const FFNConfig& f, std::int64_t batch, int ranks,
                           const DataParallel& parallel) {
  if (batch % ranks != 0)
    throw UsageError(fmt::format(
        "[dist] batch = {} sequences cannot be split evenly over {} ranks; use a multiple of {} "
        "(--batch)",
        batch, ranks, ranks));
  // Dropping by probability ranks an expert's assignments by score over the whole batch, which
  // no rank holds: refused here, before the output folder is opened (--force would have
  // removed the old run first).
  if (f.kind == FFNKind::moe && f.moe.drops() && f.moe.drop == DropPolicy::probability)
    throw UsageError(
        "[dist] capacity with drop = probability is not supported in data-parallel training (it "
        "needs every rank's scores); use drop = position, or capacity_factor = 0 (dropless)");
  if (!parallel.expert_parallel) return;
  if (f.kind != FFNKind::moe)
    throw UsageError(fmt::format(
        "[dist] expert parallelism needs an MoE model (this one's is {}; --expert-parallel)",
        variant_name(f)));
  if (!splits_experts(f.moe.routing))
    throw UsageError(
        fmt::format("[dist] routing '{}' {}: train it with data parallelism alone (without "
                    "--expert-parallel)",
                    enum_name(f.moe.routing), kSplitsExpertsRefusal));
  const int G = parallel.expert_group > 0 ? parallel.expert_group : ranks;
  if (G > ranks || ranks % G != 0)
    throw UsageError(fmt::format(
        "[dist] an expert group of {} ranks does not divide the {} ranks (--expert-group)", G,
        ranks));
  if (f.moe.num_experts % G != 0)
    throw UsageError(fmt::format(
        "[dist] {} experts cannot be split evenly over {}{} ranks (--experts: a multiple of {})",
        f.moe.num_experts, parallel.expert_group > 0 ? "an expert group of " : "", G, G));
}

void check_holds_its_experts(const TransformerLM& model, const DataParallel& parallel) {
  const HeldExperts held = model.held_experts();
  const FFNConfig& f = model.config().ffn;
  const int experts = f.kind == FFNKind::moe ? f.moe.num_experts : 0;
  if (held.count >= experts) return;  // every expert, or a model without experts
  ProcessGroup* g = parallel.group;
  check(g != nullptr && parallel.expert_parallel,
        "[train] this model holds experts [{}, {}) of {} only: it trains expert parallel "
        "(--expert-parallel under mpirun), with the other ranks holding the rest",
        held.first, held.first + held.count, experts);
  // Its place in its expert group: groups of G consecutive ranks (a layout that does not split
  // is refused by check_parallel_layout, on every rank alike).
  const int G = parallel.expert_group > 0 ? parallel.expert_group : g->size();
  if (G > g->size() || g->size() % G != 0 || experts % G != 0) return;
  const HeldExperts here = held_by_rank(experts, G, g->rank() % G);
  check(held.first == here.first && held.count == here.count,
        "[dist] this rank's model holds experts [{}, {}), but its place in an expert group of {} "
        "ranks holds [{}, {}) (build it with TransformerLM's held = held_by_rank(E, group size, "
        "rank in the group))",
        held.first, held.first + held.count, G, here.first, here.first + here.count);
}

ParallelPlan::ParallelPlan(TransformerLM& model, Optimizer& optimizer, const Corpus& corpus,
                           const TrainConfig& config, DataParallel parallel)
    : model_(model), optimizer_(optimizer), parallel_(std::move(parallel)), steps_(config.steps) {
  const HeldExperts held = model_.held_experts();
  const FFNConfig& f = model_.config().ffn;
  own_experts_only_ = held.count < (f.kind == FFNKind::moe ? f.moe.num_experts : 0);
  check_holds_its_experts(model_, parallel_);  // (alone: Trainer has checked it over the ranks)
  ProcessGroup* g = parallel_.group;
  if (!g) return;
  check_same_setup(*g, model_.config(), config, corpus, parallel_);
  check_parallel_layout(f, config.batch, g->size(), parallel_);
  // Every rank's model holds every expert, or every rank's its own: with a mix, ranks would
  // call different exchanges (a refresh's broadcasts against all-to-alls) and wait on each
  // other until the timeout.
  std::vector<std::int64_t> layouts{own_experts_only_ ? 1 : 0, own_experts_only_ ? 0 : 1};
  g->allreduce_max(layouts, "expert layout check");
  check(layouts[0] == 0 || layouts[1] == 0,
        "[dist] some ranks' models hold every expert and others only their own: build every "
        "rank's model alike (all experts, or each its share, held_by_rank)");
  if (parallel_.expert_parallel) {
    const int G = parallel_.expert_group > 0 ? parallel_.expert_group : g->size();
    if (G < g->size()) {  // groups of G consecutive ranks, each a replica of the others
      experts_group_ = g->split(g->rank() / G, "expert groups");
      replicas_ = g->split(g->rank() % G, "expert replicas");
    }
    const ProcessGroup& eg = expert_group();
    const HeldExperts here = held_by_rank(f.moe.num_experts, eg.size(), eg.rank());
    expert_spans_ = model_.expert_spans();
    for (const auto& s : expert_spans_) {
      expert_ranges_.emplace_back(s.begin, s.end);
      if (own_experts_only_) continue;  // every expert here is this rank's
      const auto [mine, end] = held_range(s, here);
      if (mine > s.begin) unheld_.emplace_back(s.begin, mine);
      if (end < s.end) unheld_.emplace_back(end, s.end);
    }
    // The other ranks' experts: neither trained nor kept in memory here (until a refresh).
    optimizer_.exclude(unheld_);
    release_unheld_experts(ExpertState::with_moments, 0);
  }
  model_.set_data_parallel(g, g->rank() * (config.batch / g->size()) * config.seq,
                           parallel_.expert_parallel, experts_group_.get());
  Tensor& grads = model_.parameters().grads();
  sync_ = std::make_unique<GradientSync>(*g, grads, parallel_.bucket_elements, expert_ranges_);
  if (replicas_) {  // this rank's experts' gradients, over their holders in every group
    Ranges others = unheld_;
    for_each_outside(0, grads.numel(), expert_ranges_,
                     [&](std::int64_t b, std::int64_t e) { others.emplace_back(b, e); });
    std::sort(others.begin(), others.end());
    expert_sync_ =
        std::make_unique<GradientSync>(*replicas_, grads, parallel_.bucket_elements, others);
  }
}

ParallelPlan::~ParallelPlan() {
  if (parallel_.group) model_.set_data_parallel(nullptr, 0);
}

std::vector<const ProcessGroup*> ParallelPlan::subgroups() const {
  std::vector<const ProcessGroup*> out;
  for (const auto* g : {experts_group_.get(), replicas_.get()})
    if (g) out.push_back(g);
  return out;
}

ProcessGroup& ParallelPlan::expert_group() const {
  return experts_group_ ? *experts_group_ : *parallel_.group;
}

bool ParallelPlan::is_expert(const Parameter& p) const {
  return std::any_of(expert_ranges_.begin(), expert_ranges_.end(),
                     [&](const auto& r) { return p.offset >= r.first && p.offset < r.second; });
}

void ParallelPlan::finish_gradients() {
  sync_->finish();
  if (expert_sync_) expert_sync_->finish();
}

double ParallelPlan::gradient_norm() const {
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

void ParallelPlan::release_unheld_experts(ExpertState what, std::int64_t step) {
  if (unheld_.empty() || step >= steps_) return;  // at the end, every rank keeps all
  release(model_.parameters().values(), unheld_);
  release(model_.parameters().grads(), unheld_);
  if (what == ExpertState::with_moments) {
    release(optimizer_.m(), unheld_);
    if (optimizer_.v().defined()) release(optimizer_.v(), unheld_);
  }
}

void ParallelPlan::refresh_experts(ExpertState what) {
  if (expert_spans_.empty()) return;
  ProcessGroup& g = expert_group();  // holds every expert once (each replica the same)
  auto refresh = [&](Tensor& buffer) {
    for (const auto& s : expert_spans_)
      for (int q = 0; q < g.size(); ++q) {  // rank q's experts, from rank q
        const auto [begin, end] = held_range(s, held_by_rank(s.experts, g.size(), q));
        g.broadcast({buffer.f32() + begin, static_cast<std::size_t>(end - begin)}, q,
                    "expert refresh");
      }
  };
  refresh(model_.parameters().values());
  if (what == ExpertState::with_moments) {
    refresh(optimizer_.m());
    if (optimizer_.v().defined()) refresh(optimizer_.v());
  }
}

}  // namespace ffnlab
