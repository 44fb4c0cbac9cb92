// Data parallelism in the library, without MPI: ranks are threads (ThreadGroup). The router
// over a group decides what one process holding every rank's tokens decides (loads, losses,
// capacity in the position order, the aux-loss gradient), and a Trainer over 2 or 3 ranks ends
// where one process does. The MPI runs of the same are tests/parallel/.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <random>
#include <system_error>
#include <typeinfo>

#include "../common/test_util.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/failure.hpp"
#include "ffnlab/interrupt.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/io/safetensors.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/ops/router.hpp"
#include "ffnlab/train/trainer.hpp"
#include "thread_group.hpp"

using namespace ffnlab;
using ffnlab::test::ThreadGroup;
using json = nlohmann::json;

namespace {

Tensor random_logits(std::int64_t T, int E, std::uint64_t seed) {
  Tensor t({T, E});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = n(rng);
  return t;
}

Tensor rows_of(const Tensor& t, std::int64_t first, std::int64_t count) {
  Tensor r({count, t.dim(1)});
  std::copy_n(t.f32() + first * t.dim(1), count * t.dim(1), r.f32());
  return r;
}

// Splits 37 tokens unevenly over the ranks and compares every rank's part with one process.
void expect_group_routes_as_one(int ranks, const RouterConfig& m) {
  const std::int64_t T = 37;
  const int E = m.routed_experts(), K = m.routing == RoutingKind::relu ? E : m.top_k;
  const float l1_coef = 0.2f;  // relu routing's penalty (the others ignore it)
  const Tensor logits = random_logits(T, E, 7);
  std::vector<float> dweight(T * K);
  for (std::int64_t i = 0; i < T * K; ++i) dweight[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;

  Routing one;
  route(one, logits, nullptr, m);
  assign_rows(one, m);
  Tensor dl_one({T, E});
  route_backward(dl_one, one, dweight.data(), m, 1.f, l1_coef);

  std::vector<std::int64_t> cut{0};
  for (int r = 1; r < ranks; ++r) cut.push_back(T * r / ranks + r);  // uneven parts
  cut.push_back(T);
  ThreadGroup::run(ranks, [&](ThreadGroup& g) {
    const std::int64_t first = cut[g.rank()], count = cut[g.rank() + 1] - first;
    Routing r;
    route(r, rows_of(logits, first, count), nullptr, m, &g);
    assign_rows(r, m, &g);
    Tensor dl({count, E});
    route_backward(dl, r, dweight.data() + first * K, m, 1.f, l1_coef);
    EXPECT_EQ(r.total_tokens, T);
    EXPECT_EQ(r.load, one.load);
    EXPECT_EQ(r.first, one.first);
    EXPECT_EQ(r.per_token, one.per_token);
    EXPECT_EQ(r.capacity, one.capacity);
    EXPECT_NEAR(r.balance_loss, one.balance_loss, 1e-12);
    EXPECT_NEAR(r.z_loss, one.z_loss, 1e-9);
    EXPECT_NEAR(r.entropy, one.entropy, 1e-12);
    EXPECT_NEAR(r.l1_loss, one.l1_loss, 1e-12);
    std::vector<std::int64_t> kept_one(m.num_experts);  // the FFN experts' rows
    for (int e = 0; e < m.num_experts; ++e) kept_one[e] = one.rows_of(e);
    EXPECT_EQ(r.kept_total, kept_one);
    for (std::int64_t t = 0; t < count; ++t)
      for (int j = 0; j < K; ++j)
        EXPECT_EQ(r.slot[t * K + j] >= 0, one.slot[(first + t) * K + j] >= 0)
            << "rank " << g.rank() << " token " << first + t << " choice " << j;
    for (std::int64_t i = 0; i < count * E; ++i)
      EXPECT_NEAR(dl.f32()[i], dl_one.f32()[first * E + i], 1e-7) << "rank " << g.rank();
  });
}

RouterConfig router(double capacity) {
  RouterConfig m;
  m.num_experts = 4;
  m.top_k = 2;
  m.capacity_factor = capacity;
  m.aux_coef = 0.02f;
  m.z_coef = 0.001f;
  return m;
}

}  // namespace

TEST(DataParallel, RouterOverAGroupDecidesAsOneProcess) {
  for (int ranks : {2, 3}) {
    expect_group_routes_as_one(ranks, router(0.0));   // dropless
    expect_group_routes_as_one(ranks, router(0.75));  // drops, by position over the ranks
    RouterConfig top1 = router(1.0);
    top1.balance_loss = BalanceLoss::top1;
    expect_group_routes_as_one(ranks, top1);
    for (double capacity : {0.0, 0.75}) {  // top-p: 1 to 3 experts a token, the dynamic loss
      RouterConfig p = router(capacity);
      p.top_k = 3;
      p.routing = RoutingKind::top_p;
      p.top_p = 0.6f;
      p.entropy_coef = 0.01f;
      expect_group_routes_as_one(ranks, p);
    }
    RouterConfig relu = router(0.0);  // ReLU routing: 0 to 4 experts a token, the L1 penalty
    relu.routing = RoutingKind::relu;
    relu.normalize = false;
    relu.aux_coef = relu.z_coef = 0.0f;
    relu.scaling = 1.5f;
    expect_group_routes_as_one(ranks, relu);
    RouterConfig zc = router(0.0);  // MoE++: zero-computation experts take no rows
    zc.constant_experts = zc.copy_experts = zc.zero_experts = 1;
    zc.zc_balance_weight = 0.75f;
    expect_group_routes_as_one(ranks, zc);
  }
}

TEST(DataParallel, ProbabilityDropIsRefusedOverAGroup) {
  RouterConfig m = router(1.0);
  m.drop = DropPolicy::probability;
  const Tensor logits = random_logits(8, 4, 3);
  EXPECT_THROW(ThreadGroup::run(2,
                                [&](ThreadGroup& g) {
                                  Routing r;
                                  route(r, logits, nullptr, m, &g);
                                  assign_rows(r, m, &g);
                                }),
               Error);
}

// A whole Trainer over the MoE `ffn`, with dropout: 6 steps of 2 micro-batches, on 1, 2 and 3
// ranks (batch 6), and expert parallel on 2; or on the `layouts` given (batch 8).
namespace {

struct Layout {
  int ranks;
  bool expert_parallel;
  int expert_group = 0;   // 0: every rank
  bool own_only = false;  // each rank's model holds its own experts only
};

void expect_ranks_train_as_one_process(const FFNConfig& ffn,
                                       Objective objective = Objective::causal,
                                       bool expert_parallel = true,
                                       const std::vector<Layout>& layouts = {}) {
  Corpus corpus;
  corpus.source = "test";
  const std::string text = "It is a far, far better thing that I do, than I have ever done. ";
  for (int i = 0; i < 30; ++i) corpus.bytes.insert(corpus.bytes.end(), text.begin(), text.end());
  corpus.split = static_cast<std::int64_t>(corpus.bytes.size() * 9 / 10);
  LMConfig c;
  c.d_model = 16;
  c.layers = 2;
  c.heads = 2;
  c.context = 16;
  c.dropout = 0.1f;
  c.ffn = ffn;
  TrainConfig t;
  t.objective = objective;
  if (objective == Objective::masked) {
    c.causal = false;
    c.vocab = kMaskToken + 1;
  }
  t.steps = 6;
  t.batch = layouts.empty() ? 6 : 8;
  t.seq = 16;
  t.accumulate = 2;
  t.warmup = 2;
  t.optimizer.lr = 3e-3f;

  std::int64_t params = 0, expert_params = 0;
  auto train = [&](ProcessGroup* g, bool expert_parallel, int expert_group, bool own_only) {
    const int G = g == nullptr ? 1 : expert_group > 0 ? expert_group : g->size();
    const HeldExperts held =
        own_only ? held_by_rank(ffn.moe.num_experts, G, g->rank() % G) : HeldExperts{};
    TransformerLM model(c, t.seed, held);
    // Small buckets: several per backward.
    Trainer trainer(model, corpus, t, {g, 300, expert_parallel, {}, expert_group});
    StepLog last;
    for (int s = 0; s < t.steps; ++s) last = trainer.train_step();
    // A checkpoint's view: expert parallel ranks first take their copies from the holders.
    if (g)
      trainer.save(
          (std::filesystem::temp_directory_path() / ("ffnlab_dp_" + std::to_string(::getpid())))
              .string());
    if (g == nullptr) {  // once, by the one process: the ranks' threads only read them
      params = model.parameters().count();
      expert_params = 0;
      for (const auto& s : model.expert_spans()) expert_params += s.end - s.begin;
    }
    // Every parameter this model holds, by name.
    std::map<std::string, std::vector<float>> w;
    for (const Parameter& p : model.parameters().list())
      w[p.name].assign(p.value.f32(), p.value.f32() + p.value.numel());
    return std::make_pair(w, last);
  };
  const auto [one, log_one] = train(nullptr, false, 0, false);
  if (ffn.moe.capacity_factor > 0) {
    EXPECT_GT(log_one.dropped_fraction, 0.0);  // the capacity is exercised
  }
  const std::vector<Layout> runs =
      layouts.empty() ? std::vector<Layout>{{2, false}, {3, false}, {2, true}} : layouts;
  for (const Layout& run : runs) {
    const int ranks = run.ranks;
    const bool ep = run.expert_parallel;
    if (ep && !expert_parallel) continue;
    SCOPED_TRACE(::testing::Message() << ranks << " ranks, expert group " << run.expert_group);
    std::vector<std::map<std::string, std::vector<float>>> weights(ranks);
    std::vector<StepLog> logs(ranks);
    ThreadGroup::run(ranks, [&](ThreadGroup& g) {
      std::tie(weights[g.rank()], logs[g.rank()]) = train(&g, ep, run.expert_group, run.own_only);
      EXPECT_GT(g.buckets(), 6) << "the gradients went in one piece";
      // Expert parallel: the experts' gradients are not all-reduced over the whole group (one
      // holder in each expert group; the replicas sum theirs among themselves).
      EXPECT_EQ(g.gradient_elements(), t.steps * (params - (ep ? expert_params : 0)));
    });
    std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                ("ffnlab_dp_" + std::to_string(::getpid())));
    for (int r = 0; r < ranks; ++r) {
      if (!run.own_only) {
        ASSERT_EQ(weights[r].size(), one.size());
      }
      double gap = 0;
      for (const auto& [name, w] : weights[r]) {
        ASSERT_TRUE(one.count(name)) << name;
        // The ranks agree on every tensor they both hold.
        if (weights[0].count(name)) {
          EXPECT_EQ(w, weights[0].at(name)) << "rank " << r << ": " << name;
        }
        const std::vector<float>& ref = one.at(name);
        ASSERT_EQ(w.size(), ref.size()) << name;
        for (std::size_t i = 0; i < ref.size(); ++i)
          gap = std::max(gap, std::abs(static_cast<double>(w[i]) - ref[i]) /
                                  (1.0 + std::abs(static_cast<double>(ref[i]))));
      }
      EXPECT_LT(gap, 1e-5) << ranks << " ranks" << (ep ? ", expert parallel" : "");
      EXPECT_NEAR(logs[r].loss, log_one.loss, 1e-5);
      EXPECT_NEAR(logs[r].aux_loss, log_one.aux_loss, 1e-6);
      EXPECT_NEAR(logs[r].grad_norm, log_one.grad_norm, 1e-4);
      EXPECT_NEAR(logs[r].dropped_fraction, log_one.dropped_fraction, 1e-12);
      EXPECT_NEAR(logs[r].load_cv, log_one.load_cv, 1e-9);
    }
  }
}

}  // namespace

// A small MoE: 4 experts of width 16, top-k.
FFNConfig small_moe(int top_k) {
  FFNConfig ffn = variant_config("moe", 16, 16, false);
  ffn.moe.num_experts = 4;
  ffn.moe.top_k = top_k;
  ffn.moe.aux_coef = 0.01f;
  return ffn;
}

// Noisy top-k, capacity and the balancing bias.
TEST(DataParallel, TrainerOverRanksEndsWithTheWeightsOfOneProcess) {
  FFNConfig ffn = small_moe(2);
  ffn.moe.noisy_topk = true;
  ffn.moe.jitter = 0.05f;
  ffn.moe.balance_bias = true;
  ffn.moe.capacity_factor = 1.0;
  expect_ranks_train_as_one_process(ffn);
}

// Each routing family, trained on 1, 2 and 3 ranks and expert parallel: top-p with its dynamic
// loss and capacity; ReLU routing, whose L1 coefficient follows the sparsity of the whole batch
// over every rank; MoE++'s zero-computation experts (their parameters replicated), with and
// without its gating residual.
TEST(DataParallel, RoutingFamiliesTrainOverRanksToTheWeightsOfOneProcess) {
  FFNConfig top_p = small_moe(3);
  top_p.moe.routing = RoutingKind::top_p;
  top_p.moe.top_p = 0.5f;
  top_p.moe.entropy_coef = 0.01f;
  top_p.moe.capacity_factor = 0.5;
  FFNConfig relu = small_moe(1);
  relu.moe.routing = RoutingKind::relu;
  relu.moe.normalize = false;
  relu.moe.aux_coef = 0.0f;
  relu.moe.l1_coef_init = 0.05f;
  FFNConfig zc = small_moe(2);
  zc.moe.constant_experts = zc.moe.copy_experts = zc.moe.zero_experts = 1;
  FFNConfig residual = zc;  // MoE++ with its gating residual: the second layer takes the first's
  residual.moe.gating_residual = true;
  FFNConfig hash = small_moe(2);  // chosen by the tokens' ids, with a capacity that drops
  hash.moe.routing = RoutingKind::hash;
  hash.moe.aux_coef = 0.0f;
  hash.moe.capacity_factor = 0.75;
  FFNConfig base = small_moe(1);  // the balanced assignment of every rank's tokens as one batch
  base.moe.routing = RoutingKind::base;
  base.moe.score = ScoreFunc::sigmoid;
  base.moe.normalize = false;
  base.moe.router_bias = false;
  base.moe.aux_coef = 0.0f;
  for (const auto& [name, ffn] : {std::pair{"top_p", top_p},
                                  {"relu", relu},
                                  {"zc", zc},
                                  {"zc_gating_residual", residual},
                                  {"hash", hash},
                                  {"base", base}}) {
    SCOPED_TRACE(name);
    expect_ranks_train_as_one_process(ffn);
  }
}

namespace {

// A corpus of 2000 bytes, and a one-layer model of `ffn` with one head over sequences of 8
// (batch `batch`): the smallest run ranks can start.
Corpus tiny_corpus() {
  Corpus corpus;
  corpus.source = "test";
  corpus.bytes.assign(2000, 'a');
  corpus.split = 1800;
  return corpus;
}
LMConfig tiny_model(const FFNConfig& ffn) {
  LMConfig c;
  c.d_model = ffn.d_model;
  c.layers = 1;
  c.heads = 1;
  c.context = 8;
  c.ffn = ffn;
  return c;
}
// The tiny model's FFN for a checkpoint over 2 ranks: ReLU, or for expert parallelism an MoE of
// 2 experts (one a rank), top-1.
FFNConfig checkpoint_ffn(bool expert_parallel) {
  FFNConfig ffn = variant_config(expert_parallel ? "moe" : "relu", 8, 16, true);
  if (expert_parallel) {
    ffn.moe.num_experts = 2;
    ffn.moe.top_k = 1;
  }
  return ffn;
}
TrainConfig tiny_training(std::int64_t batch) {
  TrainConfig t;
  t.batch = batch;
  t.seq = 8;
  return t;
}

}  // namespace

// A one-layer model of `ffn` (masked objective for the routings that need it) on two ranks (or
// `ranks`, with `expert_group`), a batch of `batch` sequences of 8: the Trainer refuses it with
// `what`.
void expect_refused_on_ranks(const FFNConfig& ffn, std::int64_t batch, bool expert_parallel,
                             const std::string& what, int ranks = 2, int expert_group = 0) {
  const Corpus corpus = tiny_corpus();
  LMConfig c = tiny_model(ffn);
  TrainConfig t = tiny_training(batch);
  if (ffn.kind == FFNKind::moe && looks_at_whole_sequence(ffn.moe.routing)) {
    c.causal = false;
    c.vocab = kMaskToken + 1;
    t.objective = Objective::masked;
  }
  ThreadGroup::run(ranks, [&](ThreadGroup& g) {
    TransformerLM model(c, 1);
    try {
      Trainer trainer(model, corpus, t, {&g, 1000, expert_parallel, {}, expert_group});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  });
}

// The masked objective: each rank masks its own sequences as one process would, and the loss is
// the mean over the batch's masked bytes (every sequence has as many). With it, the routings
// that look at the whole sequence: expert choice routes each sequence on its own (a rank holds
// whole sequences), its statistics over the whole batch.
TEST(DataParallel, MaskedObjectiveTrainsOverRanksToTheWeightsOfOneProcess) {
  FFNConfig expert_choice = small_moe(2);
  expert_choice.moe.routing = RoutingKind::expert_choice;
  expert_choice.moe.normalize = false;
  expert_choice.moe.aux_coef = 0.0f;
  expert_choice.moe.z_coef = 0.01f;
  for (const auto& [name, ffn] :
       {std::pair{"top-k", small_moe(2)}, {"expert choice", expert_choice}}) {
    SCOPED_TRACE(name);
    expect_ranks_train_as_one_process(ffn, Objective::masked);
  }
  // Soft MoE mixes each sequence on its own (a rank holds whole sequences); it does not split
  // its experts over ranks.
  FFNConfig soft = small_moe(1);
  soft.moe.routing = RoutingKind::soft;
  soft.moe.top_k = MoEConfig{}.top_k;  // (not read: the slots set the compute)
  soft.moe.slots = 2;
  soft.moe.aux_coef = 0.0f;
  expect_ranks_train_as_one_process(soft, Objective::masked, /*expert_parallel=*/false);
  expect_refused_on_ranks(soft, 2, true, "routing 'soft' does not split its experts over ranks");
}

// Held experts: a model holding experts [2, 4) of 4 has those experts' tensors only, each with
// the value the model holding all gives it (GPT-2's per-name streams, and torch.nn.Linear's
// defaults drawn in one stream, init_std 0), and held_params counts what it holds.
TEST(DataParallel, HeldExpertsStartAsInTheWholeModel) {
  for (const float init_std : {0.02f, 0.0f}) {
    SCOPED_TRACE(init_std);
    LMConfig c;
    c.d_model = 16;
    c.layers = 2;
    c.heads = 2;
    c.context = 8;
    c.init_std = init_std;
    c.ffn = small_moe(2);
    c.ffn.bias = true;
    TransformerLM whole(c, 3), part(c, 3, HeldExperts{2, 2});
    EXPECT_EQ(part.held_experts().first, 2);
    EXPECT_EQ(part.held_experts().count, 2);
    EXPECT_EQ(whole.held_experts().count, 4);
    EXPECT_EQ(part.parameters().count(), held_params(c, 2));
    EXPECT_EQ(whole.parameters().count(), held_params(c, 4));
    EXPECT_LT(part.parameters().count(), whole.parameters().count());
    for (const Parameter& p : whole.parameters().list()) {
      const bool other = p.name.find("experts.0.") != std::string::npos ||
                         p.name.find("experts.1.") != std::string::npos;
      ASSERT_EQ(part.parameters().contains(p.name), !other) << p.name;
      if (other) continue;
      const Tensor& a = p.value;
      const Tensor& b = part.parameters().at(p.name).value;
      EXPECT_EQ(std::vector<float>(a.f32(), a.f32() + a.numel()),
                std::vector<float>(b.f32(), b.f32() + b.numel()))
          << p.name;
    }
    // It runs only where its expert group's other ranks hold the rest.
    std::vector<std::int32_t> ids(8, 'a');
    EXPECT_THROW(part.forward(ids, ids, 8, false), Error);
  }
}

// A whole Trainer on models that hold their own experts (each thread rank allocates its own
// experts): groups of 2 and of 4 end with one process's weights, the rank's experts' by name.
TEST(DataParallel, ModelsHoldingTheirOwnExpertsTrainAsOneProcess) {
  expect_ranks_train_as_one_process(small_moe(2), Objective::causal, true,
                                    {{4, true, 2, true}, {4, true, 4, true}, {2, true, 0, true}});
}

TEST(DataParallel, BatchMustSplitEvenly) {
  expect_refused_on_ranks(variant_config("relu", 8, 16, true), 5, false,
                          "batch = 5 sequences cannot be split evenly over 2");
}

// A stop that ends rank 0's checkpoint write (past the write's grace) stops every rank as
// interrupted (exit 130), not as a failed write: rank 0 tells the others which it was.
TEST(DataParallel, AStopDuringTheCheckpointStopsEveryRankAsInterrupted) {
  const Corpus corpus = tiny_corpus();
  const TrainConfig t = tiny_training(2);
  const auto dir =
      std::filesystem::temp_directory_path() / ("ffnlab_dp_stop_" + std::to_string(::getpid()));
  const double grace = write_stop_grace();
  // Rank 0 writes the whole checkpoint; expert parallel, each rank its part.
  for (const bool expert_parallel : {false, true}) {
    SCOPED_TRACE(expert_parallel ? "expert parallel" : "data parallel");
    const LMConfig c = tiny_model(checkpoint_ffn(expert_parallel));
    std::vector<std::string> caught(2);
    set_write_stop_grace(0);
    request_stop(0);
    ThreadGroup::run(2, [&](ThreadGroup& g) {
      const HeldExperts held = expert_parallel ? held_by_rank(2, 2, g.rank()) : HeldExperts{};
      TransformerLM model(c, 1, held);
      Trainer trainer(model, corpus, t, {&g, 1000, expert_parallel, {}, 0});
      try {
        trainer.save(dir.string());
      } catch (const Interrupted&) {
        caught[g.rank()] = "interrupted";
      } catch (const Error& e) {
        caught[g.rank()] = e.what();
      }
    });
    clear_stop();
    set_write_stop_grace(grace);
    std::filesystem::remove_all(dir);
    EXPECT_EQ(caught, (std::vector<std::string>{"interrupted", "interrupted"}));
  }
}

// A failure crosses from rank to rank as its kind (the exit status: 1 input, 2 usage, 3 the
// system, 130 a stop) and errno, through the JSON the study's work queue sends (its MPI
// messages themselves are tested by tests/parallel only when a run succeeds or a rank hangs).
TEST(DataParallel, AFailureCrossesRanksWithItsKindAndErrno) {
  const auto crossed = [](const std::exception& e) {
    const Failure f = Failure::from_json(Failure::of(e).to_json());
    try {
      f.raise("[evolve] rank 1: ");
    } catch (const std::exception&) {
      return std::current_exception();
    }
    return std::exception_ptr();
  };
  const auto expect_raised = [&](const std::exception& e, const std::string& message,
                                 auto is_kind) {
    const std::exception_ptr p = crossed(e);
    ASSERT_TRUE(p) << e.what();
    try {
      std::rethrow_exception(p);
    } catch (const std::exception& raised) {
      EXPECT_TRUE(is_kind(raised)) << raised.what();
      EXPECT_EQ(std::string(raised.what()), "[evolve] rank 1: " + message);
    }
  };
  expect_raised(SystemError("[io] cannot write 'x'", EFBIG), "[io] cannot write 'x'",
                [](const std::exception& r) {
                  const auto* s = dynamic_cast<const SystemError*>(&r);
                  return s && s->error_number() == EFBIG;
                });
  expect_raised(std::bad_alloc(), "out of memory", [](const std::exception& r) {
    const auto* s = dynamic_cast<const SystemError*>(&r);
    return s && s->error_number() == ENOMEM;
  });
  expect_raised(UsageError("[train] --steps conflicts"), "[train] --steps conflicts",
                [](const std::exception& r) { return dynamic_cast<const UsageError*>(&r); });
  expect_raised(Interrupted("[train] stopped"), "[train] stopped",
                [](const std::exception& r) { return dynamic_cast<const Interrupted*>(&r); });
  expect_raised(Error("[moe] top_k = 9 exceeds num_experts = 8"),
                "[moe] top_k = 9 exceeds num_experts = 8",
                [](const std::exception& r) { return typeid(r) == typeid(Error); });
  // A file-system error: a path that leads nowhere is refused input, another the system's.
  const std::filesystem::filesystem_error missing(
      "open", "/nowhere/x", std::make_error_code(std::errc::no_such_file_or_directory));
  expect_raised(missing, filesystem_error_text(missing),
                [](const std::exception& r) { return typeid(r) == typeid(Error); });
  const std::filesystem::filesystem_error full("write", "/x",
                                               std::make_error_code(std::errc::no_space_on_device));
  expect_raised(full, filesystem_error_text(full), [](const std::exception& r) {
    const auto* s = dynamic_cast<const SystemError*>(&r);
    return s && s->error_number() == ENOSPC;
  });
  // A kind this build does not know (a rank of another build) is the system's.
  const Failure unknown = Failure::from_json({{"kind", 99}, {"errno", 0}, {"message", "[x] y"}});
  EXPECT_EQ(unknown.kind, Failure::Kind::system);
}

// A checkpoint that cannot be written fails every rank as the writer failed: the system's
// error (exit 3) with its errno, whether rank 0 writes it all or each rank its experts' part.
TEST(DataParallel, AFailedCheckpointWriteFailsEveryRankWithTheWritersErrno) {
  const Corpus corpus = tiny_corpus();
  const TrainConfig t = tiny_training(2);
  const test::ScratchDir scratch("dp-write");
  std::ofstream(scratch.path / "file") << "x";
  const std::string dir = (scratch.path / "file" / "checkpoint").string();  // under a file
  for (const bool expert_parallel : {false, true}) {
    SCOPED_TRACE(expert_parallel ? "expert parallel" : "data parallel");
    const LMConfig c = tiny_model(checkpoint_ffn(expert_parallel));
    std::vector<int> errnos(2, -1);
    ThreadGroup::run(2, [&](ThreadGroup& g) {
      const HeldExperts held = expert_parallel ? held_by_rank(2, 2, g.rank()) : HeldExperts{};
      TransformerLM model(c, 1, held);
      Trainer trainer(model, corpus, t, {&g, 1000, expert_parallel, {}, 0});
      try {
        trainer.save(dir);
      } catch (const SystemError& e) {
        errnos[g.rank()] = e.error_number();
      }
    });
    EXPECT_EQ(errnos, (std::vector<int>{ENOTDIR, ENOTDIR}));
  }
}

// A resume over ranks, data or expert parallel: ranks that read the same checkpoint go on from
// its step; a rank that cannot read its own fails every rank (none is left waiting in the first
// step for it), and ranks that read checkpoints of other steps, or other weights, fail together.
TEST(DataParallel, RanksThatCannotResumeTheSameStateFailTogether) {
  const Corpus corpus = tiny_corpus();
  const test::ScratchDir scratch("dp-resume");
  for (const bool expert_parallel : {false, true}) {
    SCOPED_TRACE(expert_parallel ? "expert parallel" : "data parallel");
    const LMConfig c = tiny_model(checkpoint_ffn(expert_parallel));
    const std::string mode = expert_parallel ? "ep-" : "dp-";
    // One process's run of `steps` steps from `seed`, its checkpoint in `name`.
    const auto saved = [&](const std::string& name, std::uint64_t seed, std::int64_t steps) {
      TrainConfig t = tiny_training(2);
      t.steps = steps;
      t.eval_every = 0;
      TransformerLM model(c, seed);
      Trainer trainer(model, corpus, t);
      const std::string dir = (scratch.path / (mode + name)).string();
      trainer.run(nullptr, nullptr, dir);
      return dir;
    };
    const std::string at2 = saved("at2", 1, 2), at4 = saved("at4", 1, 4),
                      other = saved("other", 2, 2), none = (scratch.path / "none").string();
    std::filesystem::create_directories(none);
    // Each rank resumes its folder; what each caught ("" when it resumed), and its step.
    const auto resume = [&](const std::string& zero, const std::string& one) {
      std::vector<std::string> caught(2);
      std::vector<std::int64_t> steps(2, -1);
      ThreadGroup::run(2, [&](ThreadGroup& g) {
        TrainConfig t = tiny_training(2);
        t.steps = 6;
        const HeldExperts held = expert_parallel ? held_by_rank(2, 2, g.rank()) : HeldExperts{};
        TransformerLM model(c, 3, held);
        Trainer trainer(model, corpus, t, {&g, 1000, expert_parallel, {}, 0});
        try {
          trainer.load(g.rank() == 0 ? zero : one);
          steps[g.rank()] = trainer.step();
        } catch (const Error& e) {
          caught[g.rank()] = e.what();
        }
      });
      return std::pair{caught, steps};
    };
    const auto contains = [](const std::string& text, const std::string& part) {
      return text.find(part) != std::string::npos;
    };
    {
      const auto [caught, steps] = resume(at2, at2);
      EXPECT_EQ(caught, (std::vector<std::string>{"", ""}));
      EXPECT_EQ(steps, (std::vector<std::int64_t>{2, 2}));
    }
    {
      const auto [caught, steps] = resume(at2, none);
      EXPECT_TRUE(contains(caught[0], "rank 1 could not read its checkpoint")) << caught[0];
      EXPECT_TRUE(contains(caught[1], "no checkpoint in")) << caught[1];
    }
    {
      const auto [caught, steps] = resume(at2, at4);
      for (const std::string& line : caught)
        EXPECT_TRUE(contains(line, "resumed checkpoints of different steps (2 to 4)")) << line;
    }
    {
      const auto [caught, steps] = resume(other, at2);
      for (const std::string& line : caught)
        EXPECT_TRUE(contains(line, "resumed checkpoints of step 2 whose weights differ")) << line;
    }
  }
}

// What a rank sets up alone before the ranks first meet (its settings checked, its model's
// experts, its optimizer and that state): a rank that fails there fails every rank, in the kind
// of its failure, rather than leaving the others waiting in the setup exchange.
TEST(DataParallel, ARankThatCannotSetUpItsTrainingFailsEveryRank) {
  const Corpus corpus = tiny_corpus();
  const LMConfig c = tiny_model(checkpoint_ffn(true));
  // Rank 1 with Adam's beta1 at 1 (refused), or holding rank 0's experts (refused).
  const auto outcomes = [&](bool bad_beta, bool wrong_experts) {
    return ThreadGroup::outcomes(
        2,
        [&](ThreadGroup& g) {
          TrainConfig t = tiny_training(2);
          if (bad_beta && g.rank() == 1) t.optimizer.beta1 = 1.f;
          const int place = wrong_experts && g.rank() == 1 ? 0 : g.rank();
          TransformerLM model(c, 1, held_by_rank(2, 2, place));
          Trainer trainer(model, corpus, t, {&g, 1000, true, {}, 0});
        },
        "set up");
  };
  EXPECT_EQ(outcomes(false, false), (std::vector<std::string>{"set up", "set up"}));
  const std::string others =
      "1 0 [train] rank 1 could not set up its training (its message says why)";
  for (const auto& [bad_beta, wrong_experts, says] :
       {std::tuple{true, false, "beta1"}, std::tuple{false, true, "holds experts [0, 1)"}}) {
    const std::vector<std::string> lines = outcomes(bad_beta, wrong_experts);
    EXPECT_EQ(lines[0], others);
    EXPECT_TRUE(lines[1].starts_with("1 0 ") && lines[1].find(says) != std::string::npos)
        << lines[1];
  }
}

// The caller's callbacks are each rank's own: a rank whose step or evaluation callback, or stop
// request, fails goes on to the step's evaluation and then fails every rank, the others naming it
// and the step, instead of leaving them waiting in the next step's exchanges.
TEST(DataParallel, ARankWhoseCallbackFailsFailsEveryRankAfterTheStep) {
  const Corpus corpus = tiny_corpus();
  const LMConfig c = tiny_model(checkpoint_ffn(false));
  TrainConfig t = tiny_training(2);
  t.steps = 4;
  t.eval_every = 2;
  // Rank `who` fails in its `where` callback ("step", "eval" or "stop") at step `when`.
  const auto outcomes = [&](int who, const std::string& where, std::int64_t when) {
    return ThreadGroup::outcomes(
        2,
        [&](ThreadGroup& g) {
          TransformerLM model(c, 1);
          Trainer trainer(model, corpus, t, {&g, 1000, false, {}, 0});
          const auto fails = [&](const std::string& here, std::int64_t step) {
            if (g.rank() == who && here == where && step == when)
              throw Error("[test] the " + where + " callback failed");
          };
          trainer.run([&](const StepLog& s) { fails("step", s.step); },
                      [&](const EvalLog& e) { fails("eval", e.step); }, "",
                      [&] {
                        fails("stop", trainer.step());
                        return false;
                      });
        },
        "trained");
  };
  EXPECT_EQ(outcomes(-1, "", 0), (std::vector<std::string>{"trained", "trained"}));
  struct Case {
    int who;
    std::string where;
    std::int64_t when;
  };
  // The first step, a step with an evaluation, and the last step (with the run's last
  // evaluation).
  for (const Case& f :
       {Case{0, "step", 2}, Case{1, "eval", 2}, Case{0, "stop", 2}, Case{1, "step", 1},
        Case{0, "stop", 1}, Case{1, "step", 4}, Case{0, "eval", 4}}) {
    SCOPED_TRACE(fmt::format("rank {}, {} callback, step {}", f.who, f.where, f.when));
    const std::vector<std::string> lines = outcomes(f.who, f.where, f.when);
    EXPECT_EQ(lines[f.who], "1 0 [test] the " + f.where + " callback failed");
    EXPECT_EQ(lines[1 - f.who],
              fmt::format("1 0 [train] rank {} failed after step {} (its message says why)", f.who,
                          f.when));
  }
  // The last step asks no stop: the run ends there.
  EXPECT_EQ(outcomes(0, "stop", 4), (std::vector<std::string>{"trained", "trained"}));
}

// Expert groups of 2 on 4 ranks: the experts are compared over their holders too. Ranks 2 and
// 3 (the second group) resume a checkpoint whose dense part is the first group's and whose
// expert 0 of layer 0 is not: every rank fails.
TEST(DataParallel, ReplicasThatResumeOtherExpertsFailTogether) {
  const Corpus corpus = tiny_corpus();
  const test::ScratchDir scratch("dp-resume-replicas");
  const LMConfig c = tiny_model(checkpoint_ffn(true));
  TrainConfig t = tiny_training(4);
  t.steps = 2;
  t.eval_every = 0;
  const std::string same = (scratch.path / "same").string(),
                    moved = (scratch.path / "moved").string();
  {
    TransformerLM model(c, 1);
    Trainer trainer(model, corpus, t);
    trainer.run(nullptr, nullptr, same);
    model.parameters().values().f32()[model.expert_spans().front().begin] += 1.0f;
    trainer.save(moved);
  }
  const auto resume = [&](const std::string& second_group) {
    std::vector<std::string> caught(4);
    ThreadGroup::run(4, [&](ThreadGroup& g) {
      TrainConfig more = t;
      more.steps = 4;
      TransformerLM model(c, 3, held_by_rank(2, 2, g.rank() % 2));
      Trainer trainer(model, corpus, more, {&g, 1000, true, {}, 2});
      try {
        trainer.load(g.rank() < 2 ? same : second_group);
      } catch (const Error& e) {
        caught[g.rank()] = e.what();
      }
    });
    return caught;
  };
  EXPECT_EQ(resume(same), std::vector<std::string>(4));
  for (const std::string& line : resume(moved))
    EXPECT_NE(line.find("resumed checkpoints of step 2 whose weights differ"), std::string::npos)
        << line;
}

// fail_together: with no failure every rank goes on; a rank's failure is raised on it as its own
// and on the others as its kind and errno with their message naming it; a stop anywhere is a
// stop everywhere, naming the rank it stopped.
TEST(DataParallel, FailTogetherRaisesARanksFailureOnEveryRankAsItsKind) {
  const auto outcomes = [](const std::vector<Failure>& failures) {
    return ThreadGroup::outcomes(
        3, [&](ThreadGroup& g) { fail_together(g, failures[g.rank()], "test", "rank {} failed"); },
        "went on");
  };
  const auto outcome = [&](int failing, const Failure& f) {
    std::vector<Failure> failures(3);
    if (failing >= 0) failures[failing] = f;
    return outcomes(failures);
  };
  EXPECT_EQ(outcome(-1, {}), (std::vector<std::string>{"went on", "went on", "went on"}));
  const std::string full = fmt::format("3 {} ", ENOSPC);
  EXPECT_EQ(outcome(1, {Failure::Kind::system, ENOSPC, "[io] full"}),
            (std::vector<std::string>{full + "rank 1 failed", full + "[io] full",
                                      full + "rank 1 failed"}));
  EXPECT_EQ(
      outcome(2, {Failure::Kind::usage, 0, "[train] --x"}),
      (std::vector<std::string>{"2 0 rank 2 failed", "2 0 rank 2 failed", "2 0 [train] --x"}));
  EXPECT_EQ(outcome(0, {Failure::Kind::interrupted, 0, "SIGINT"}),
            (std::vector<std::string>{"4 0 SIGINT", "4 0 rank 0 failed", "4 0 rank 0 failed"}));
  // A stop on rank 0 and a usage error on rank 1: each its own, rank 2 the stop, naming rank 0.
  EXPECT_EQ(outcomes({{Failure::Kind::interrupted, 0, "SIGINT"},
                      {Failure::Kind::usage, 0, "[train] --x"},
                      {}}),
            (std::vector<std::string>{"4 0 SIGINT", "2 0 [train] --x", "4 0 rank 0 failed"}));
}

// fail_together_around: a part that throws on one rank fails both, whatever it throws (a throw
// of something that is not an exception is the system's); without a group the throw goes on as
// it is.
TEST(DataParallel, FailTogetherAroundFailsEveryRankWhateverAPartThrows) {
  std::vector<std::string> lines(2);
  ThreadGroup::run(2, [&](ThreadGroup& g) {
    try {
      fail_together_around(&g, "test", "rank {} failed", [&] {
        if (g.rank() == 1) throw 42;
      });
      lines[g.rank()] = "went on";
    } catch (const SystemError& e) {
      lines[g.rank()] = e.what();
    }
  });
  EXPECT_EQ(lines, (std::vector<std::string>{"rank 1 failed", "unknown exception"}));
  EXPECT_THROW(fail_together_around(nullptr, "test", "rank {} failed", [] { throw 42; }), int);
  EXPECT_THROW(
      fail_together_around(nullptr, "test", "rank {} failed", [] { throw std::bad_alloc(); }),
      std::bad_alloc);
}

// Flags whose values are not UTF-8 (a folder's name) are compared over the ranks byte for byte:
// the same bytes start, bytes that differ only where JSON keeps U+FFFD are refused.
TEST(DataParallel, FlagsThatAreNotUtf8AreComparedByTheirBytes) {
  const Corpus corpus = tiny_corpus();
  const TrainConfig t = tiny_training(2);
  const auto refusal = [&](const std::string& rank1) {
    std::vector<std::string> caught(2);
    ThreadGroup::run(2, [&](ThreadGroup& g) {
      TransformerLM model(tiny_model(checkpoint_ffn(false)), 1);
      DataParallel parallel{&g, 1000, false, {}, 0};
      parallel.agreed["--resume"] = g.rank() == 0 ? "r\xff" : rank1;
      try {
        Trainer trainer(model, corpus, t, parallel);
      } catch (const Error& e) {
        caught[g.rank()] = e.what();
      }
    });
    return caught;
  };
  EXPECT_EQ(refusal("r\xff"), (std::vector<std::string>{"", ""}));
  const std::vector<std::string> caught = refusal("r\xfe");
  EXPECT_NE(caught[1].find("settings_bytes.--resume = \"fnv1a64:"), std::string::npos) << caught[1];
  EXPECT_NE(caught[0].find("rank 1 was started with another configuration"), std::string::npos)
      << caught[0];
}

// A failure during training names the checkpoint rank 0 keeps on every rank, whatever folder
// another rank was given (rank 0 writes it): every rank's line is the same, the folder whole.
// Before the run's first checkpoint, that is the one rank 0's folder held when the run began.
TEST(DataParallel, AFailedRunNamesRankZerosCheckpointOnEveryRank) {
  const Corpus corpus = tiny_corpus();
  TrainConfig t = tiny_training(2);
  t.steps = 4;
  t.checkpoint_every = 2;
  t.eval_every = 0;
  const test::ScratchDir scratch("dp-kept");
  // (relative: the line names it whole)
  const std::string dir = std::filesystem::relative(scratch.path / "checkpoint").string();
  ASSERT_TRUE(std::filesystem::path(dir).is_relative()) << dir;
  const auto failed_at = [&](std::int64_t step) {
    std::vector<std::string> caught(2);
    std::vector<int> errnos(2, -1);
    ThreadGroup::run(2, [&](ThreadGroup& g) {
      TransformerLM model(tiny_model(checkpoint_ffn(false)), 1);
      Trainer trainer(model, corpus, t, {&g, 1000, false, {}, 0});
      const std::string mine = g.rank() == 0 ? dir : (scratch.path / "elsewhere").string();
      try {
        trainer.run(
            [&](const StepLog& s) {
              if (s.step == step) throw std::bad_alloc();
            },
            nullptr, mine);
      } catch (const SystemError& e) {
        caught[g.rank()] = e.what();
        errnos[g.rank()] = e.error_number();
      }
    });
    EXPECT_EQ(errnos, (std::vector<int>{ENOMEM, ENOMEM}));
    return caught;
  };
  const std::string line = "out of memory; the last good checkpoint (step 2) is kept in " +
                           std::filesystem::absolute(dir).string();
  EXPECT_EQ(failed_at(3), (std::vector<std::string>{line, line}));  // the run's own, step 2
  EXPECT_EQ(failed_at(1), (std::vector<std::string>{line, line}));  // the folder's, from before
}

// Expert parallel: one rank's part that cannot be written (a folder stands at its name) fails
// that rank with its own error, and every other rank with its kind and errno, naming the rank.
TEST(DataParallel, ARanksFailedPartFailsEveryRankWithItsKindAndErrno) {
  const Corpus corpus = tiny_corpus();
  const TrainConfig t = tiny_training(2);
  const test::ScratchDir scratch("dp-part");
  const std::string dir = (scratch.path / "checkpoint").string();
  // rank 1's part at step 0; a file in it keeps the checkpoint's clean-up from removing it
  std::filesystem::create_directories(std::filesystem::path(dir) /
                                      "weights-00000000-experts-1.safetensors" / "x");
  const LMConfig c = tiny_model(checkpoint_ffn(true));
  std::vector<std::string> caught(2);
  std::vector<int> errnos(2, -1);
  ThreadGroup::run(2, [&](ThreadGroup& g) {
    TransformerLM model(c, 1, held_by_rank(2, 2, g.rank()));
    Trainer trainer(model, corpus, t, {&g, 1000, true, {}, 0});
    try {
      trainer.save(dir);
    } catch (const SystemError& e) {
      caught[g.rank()] = e.what();
      errnos[g.rank()] = e.error_number();
    } catch (const std::exception& e) {
      caught[g.rank()] = e.what();
    }
  });
  EXPECT_EQ(errnos, (std::vector<int>{EISDIR, EISDIR}))
      << "rank 1's errno on every rank: " << caught[0] << " / " << caught[1];
  EXPECT_NE(caught[0].find("rank 1 could not write its experts"), std::string::npos) << caught[0];
  EXPECT_NE(caught[1].find("weights-00000000-experts-1.safetensors"), std::string::npos)
      << caught[1];
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir) / "checkpoint.json"));
}

// Two ranks of one expert-parallel model, each with a Trainer of `t` running `f`: what each
// threw ("" for nothing).
std::vector<std::string> on_expert_ranks(const Corpus& corpus, const LMConfig& c,
                                         const TrainConfig& t,
                                         const std::function<void(Trainer&)>& f) {
  std::vector<std::string> caught(2);
  ThreadGroup::run(2, [&](ThreadGroup& g) {
    TransformerLM model(c, 1, held_by_rank(2, 2, g.rank()));
    Trainer trainer(model, corpus, t, {&g, 1000, true, {}, 0});
    try {
      f(trainer);
    } catch (const std::exception& e) {
      caught[g.rank()] = e.what();
    }
  });
  return caught;
}

// An expert-parallel checkpoint saved again at its own step (a resume that saves its changed
// settings, here another optimizer) that fails, here rank 1's part, leaves the committed
// checkpoint whole: the new save's files take other names (-r1), so no committed file is
// replaced, and the committed checkpoint still loads on every rank with its own settings. A save
// that succeeds then takes the -r1 names, removes the old ones, and the next returns to the
// plain names.
TEST(DataParallel, AFailedSaveAtTheCommittedStepKeepsTheCommittedCheckpoint) {
  namespace fs = std::filesystem;
  const Corpus corpus = tiny_corpus();
  const TrainConfig adam = tiny_training(2);
  TrainConfig sgd = adam;
  sgd.optimizer.kind = OptimizerKind::sgd;
  const test::ScratchDir scratch("dp-same-step");
  const std::string dir = (scratch.path / "checkpoint").string();
  const LMConfig c = tiny_model(checkpoint_ffn(true));
  const auto save = [&](Trainer& tr) { tr.save(dir); };
  const auto load = [&](Trainer& tr) { tr.load(dir); };
  const std::vector<std::string> fine{"", ""};
  EXPECT_EQ(on_expert_ranks(corpus, c, adam, save), fine);
  const fs::path main = fs::path(dir) / "weights-00000000.safetensors";
  const fs::path part = fs::path(dir) / "weights-00000000-experts-1.safetensors";
  ASSERT_TRUE(fs::exists(main) && fs::exists(part));
  const auto bytes = [](const fs::path& f) {
    return read_regular_file(f.string(), "test", std::uint64_t{1} << 30);
  };
  const auto committed = bytes(main);
  // Rank 1's next write of its part cannot open its temporary (a directory with a file in it,
  // which the clean-up of leftovers cannot remove).
  const fs::path next_part = fs::path(dir) / "weights-00000000-r1-experts-1.safetensors";
  const fs::path blocked(next_part.string() + ".tmp." + std::to_string(::getpid()));
  fs::create_directories(blocked / "x");
  const auto failed = on_expert_ranks(corpus, c, sgd, save);
  EXPECT_NE(failed[0].find("rank 1 could not write its experts"), std::string::npos) << failed[0];
  EXPECT_TRUE(fs::exists(part)) << "the committed checkpoint's part was removed";
  EXPECT_TRUE(bytes(main) == committed) << "rank 0's committed file was replaced";
  // (Adam's second moments are in the committed files: the SGD save's would have none.)
  EXPECT_EQ(on_expert_ranks(corpus, c, adam, load), fine);
  fs::remove_all(blocked);
  EXPECT_EQ(on_expert_ranks(corpus, c, sgd, save), fine);
  const json info = read_checkpoint_info(dir);
  EXPECT_EQ(info["weights"], "weights-00000000-r1.safetensors");
  EXPECT_EQ(info["shards"], json::array({next_part.filename().string()}));
  EXPECT_FALSE(fs::exists(main) || fs::exists(part)) << "the replaced save's files are kept";
  EXPECT_EQ(on_expert_ranks(corpus, c, sgd, load), fine);
  EXPECT_EQ(on_expert_ranks(corpus, c, sgd, save), fine);
  EXPECT_EQ(read_checkpoint_info(dir)["weights"], "weights-00000000.safetensors");
}

// Every file of an expert-parallel checkpoint carries its save's "attempt", which
// checkpoint.json names: a load refuses a folder whose files are not all of the save it names.
TEST(DataParallel, ALoadRefusesFilesOfAnotherSave) {
  const Corpus corpus = tiny_corpus();
  const TrainConfig t = tiny_training(2);
  const test::ScratchDir scratch("dp-attempt");
  const std::string dir = (scratch.path / "checkpoint").string();
  const LMConfig c = tiny_model(checkpoint_ffn(true));
  EXPECT_EQ(on_expert_ranks(corpus, c, t, [&](Trainer& tr) { tr.save(dir); }),
            (std::vector<std::string>{"", ""}));
  json info = read_checkpoint_info(dir);
  ASSERT_TRUE(info.contains("attempt") && info["attempt"].is_string());
  for (const std::string& name :
       {info["weights"].get<std::string>(), info["shards"][0].get<std::string>()}) {
    const SafeTensors f = SafeTensors::load((std::filesystem::path(dir) / name).string());
    EXPECT_EQ(f.metadata().at("attempt"), info["attempt"]) << name;
  }
  {  // one process reads every file of the save (and holds every expert)
    TransformerLM whole(c, 1);
    Trainer one(whole, corpus, t);
    EXPECT_NO_THROW(one.load(dir));
  }
  info["attempt"] = "0123456789abcdef";  // another save's
  const std::string text = info.dump();
  write_file_atomic((std::filesystem::path(dir) / "checkpoint.json").string(), text.data(),
                    text.size());
  const auto caught = on_expert_ranks(corpus, c, t, [&](Trainer& tr) { tr.load(dir); });
  for (const auto& e : caught) EXPECT_NE(e.find("is not of the save"), std::string::npos) << e;
}

// While a checkpoint is written or read, the ranks wait for the writers or readers longer than
// the deadline (by a second for every 10 MB of the model's checkpoint), and the deadline is back
// after: data and expert parallel.
TEST(DataParallel, RanksWaitForACheckpointWriteBeyondTheDeadline) {
  const Corpus corpus = tiny_corpus();
  const TrainConfig t = tiny_training(2);
  const test::ScratchDir scratch("dp-patience");
  for (const bool expert_parallel : {false, true}) {
    SCOPED_TRACE(expert_parallel ? "expert parallel" : "data parallel");
    const LMConfig c = tiny_model(checkpoint_ffn(expert_parallel));
    std::vector<std::vector<double>> waits(2);
    std::vector<std::int64_t> params(2);
    ThreadGroup::run(2, [&](ThreadGroup& g) {
      const HeldExperts held = expert_parallel ? held_by_rank(2, 2, g.rank()) : HeldExperts{};
      TransformerLM model(c, 1, held);
      Trainer trainer(model, corpus, t, {&g, 1000, expert_parallel, {}, 0});
      trainer.save((scratch.path / (expert_parallel ? "ep" : "dp")).string());
      TransformerLM again(c, 2, held);
      Trainer resumed(again, corpus, t, {&g, 1000, expert_parallel, {}, 0});
      resumed.load((scratch.path / (expert_parallel ? "ep" : "dp")).string());
      waits[g.rank()] = g.extra_waits;
      params[g.rank()] = model.parameters().count();
    });
    for (int r = 0; r < 2; ++r) {  // the save's wait and the load's, each ended
      ASSERT_EQ(waits[r].size(), 4u) << r;
      for (int i : {0, 2})
        EXPECT_DOUBLE_EQ(waits[r][i], 12.0 * static_cast<double>(params[r]) / 10e6) << r;
      for (int i : {1, 3}) EXPECT_EQ(waits[r][i], 0.0) << r;
    }
  }
}

// An expert-parallel run finds a checkpoint folder its ranks cannot share before its first step,
// not at its first checkpoint (by default after the last step); the check leaves no file behind.
TEST(DataParallel, AnExpertParallelRunChecksItsFolderBeforeTheFirstStep) {
  const Corpus corpus = tiny_corpus();
  const test::ScratchDir scratch("dp-probe");
  std::ofstream(scratch.path / "file") << "x";
  const LMConfig c = tiny_model(checkpoint_ffn(true));
  // 3 steps on 2 ranks into `dir`: what each rank caught ("": nothing) and its step after;
  // `hook` (when set) is rank 1's on_allreduce_max.
  const auto train_into = [&](const std::string& dir,
                              const std::function<void(const std::string&)>& hook) {
    std::vector<std::string> caught(2);
    std::vector<std::int64_t> steps(2, -1);
    ThreadGroup::run(2, [&](ThreadGroup& g) {
      TrainConfig t = tiny_training(2);
      t.steps = 3;
      t.eval_every = 0;
      TransformerLM model(c, 1, held_by_rank(2, 2, g.rank()));
      Trainer trainer(model, corpus, t, {&g, 1000, true, {}, 0});
      if (g.rank() == 1) g.on_allreduce_max = hook;
      try {
        trainer.run(nullptr, nullptr, dir);
      } catch (const std::exception& e) {
        caught[g.rank()] = e.what();
      }
      steps[g.rank()] = trainer.step();
    });
    return std::pair{caught, steps};
  };
  for (const std::string& dir :
       {(scratch.path / "file" / "checkpoint").string(), (scratch.path / "good").string()}) {
    SCOPED_TRACE(dir);
    const auto [caught, steps] = train_into(dir, nullptr);
    const bool bad = dir.find("file") != std::string::npos;
    EXPECT_EQ(steps, (std::vector<std::int64_t>(2, bad ? 0 : 3)));
    for (const std::string& e : caught) EXPECT_EQ(e.empty(), !bad) << e;
    if (bad) continue;
    for (const auto& f : std::filesystem::directory_iterator(dir))
      EXPECT_EQ(f.path().filename().string().find(".ffnlab-shared"), std::string::npos) << f.path();
  }
  // A folder rank 0 does not see as rank 1 does: rank 1's file is gone (as if written to its own
  // machine's folder of that name) by the time rank 0 looks.
  const std::string dir = (scratch.path / "unshared").string();
  const auto [caught, steps] = train_into(dir, [&](const std::string& what) {
    if (what != "checkpoint folder" || !std::filesystem::exists(dir)) return;
    for (const auto& f : std::filesystem::directory_iterator(dir))
      if (f.path().filename().string().starts_with(".ffnlab-shared"))
        std::filesystem::remove(f.path());
  });
  EXPECT_EQ(steps, (std::vector<std::int64_t>{0, 0}));
  for (const std::string& e : caught)
    EXPECT_NE(e.find("rank 1 of the expert group wrote a file into '" + dir +
                     "' that rank 0 does not see there"),
              std::string::npos)
        << e;
}

// Expert groups on 4 ranks: the experts split over groups of 2 (2 replicas) or of 4, or each
// rank holding them all (groups of 1: data parallelism through the expert path); with capacity,
// whose drops are decided over the whole batch. Refused: a group that does not divide the ranks
// or the experts.
TEST(DataParallel, ExpertGroupsTrainOverRanksToTheWeightsOfOneProcess) {
  FFNConfig ffn = small_moe(2);
  ffn.moe.capacity_factor = 1.0;
  expect_ranks_train_as_one_process(ffn, Objective::causal, true,
                                    {{4, true, 2}, {4, true, 4}, {4, true, 1}, {2, true, 2}});
  FFNConfig two = small_moe(1);
  two.moe.num_experts = 2;
  expect_refused_on_ranks(two, 4, true,
                          "2 experts cannot be split evenly over an expert group of 4 ranks", 4, 4);
  expect_refused_on_ranks(ffn, 4, true, "an expert group of 3 ranks does not divide the 4 ranks", 4,
                          3);
}

// Models that hold every expert on some ranks and only their own on others would call different
// exchanges (a refresh's broadcasts against all-to-alls): refused on every rank at the start.
TEST(DataParallel, RanksWhoseModelsHoldDifferentExpertsAreRefused) {
  const Corpus corpus = tiny_corpus();
  const TrainConfig t = tiny_training(2);
  const LMConfig c = tiny_model(small_moe(2));
  std::vector<std::string> caught(2);
  ThreadGroup::run(2, [&](ThreadGroup& g) {
    const int E = c.ffn.moe.num_experts;
    const HeldExperts held = g.rank() == 1 ? held_by_rank(E, 2, 1) : HeldExperts{};
    TransformerLM model(c, 1, held);
    caught[g.rank()] = test::error_of([&] { Trainer(model, corpus, t, {&g, 1000, true, {}, 0}); });
  });
  for (const std::string& message : caught)
    EXPECT_NE(message.find("some ranks' models hold every expert and others only their own"),
              std::string::npos)
        << message;
}
