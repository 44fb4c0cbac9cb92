// Data loading and batching, checkpoints, exact resume, and the NaN stop.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <random>
#include <typeinfo>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/interrupt.hpp"
#include "ffnlab/io/safetensors.hpp"
#include "ffnlab/ops/loss.hpp"
#include "ffnlab/train/trainer.hpp"

using namespace ffnlab;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

Corpus text_corpus() {
  Corpus c;
  c.source = "test";
  const std::string text =
      "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. "
      "Never put off till tomorrow what you can do today. ";
  for (int i = 0; i < 20; ++i) c.bytes.insert(c.bytes.end(), text.begin(), text.end());
  c.split = static_cast<std::int64_t>(c.bytes.size() * 9 / 10);
  return c;
}

enum class Ffn { dense, moe, relu_routed };

LMConfig small_model(Ffn ffn) {
  LMConfig c;
  c.d_model = 16;
  c.layers = 2;
  c.heads = 2;
  c.context = 16;
  c.dropout = 0.1f;
  if (ffn == Ffn::moe) {
    c.ffn = variant_config("moe", 16, 16, false);
    c.ffn.moe.num_experts = 4;
    c.ffn.moe.top_k = 2;
    c.ffn.moe.noisy_topk = true;
    c.ffn.moe.balance_bias = true;
    c.ffn.moe.aux_coef = 0.01;
  } else if (ffn == Ffn::relu_routed) {
    c.ffn = variant_config("moe", 16, 16, false);
    c.ffn.moe.num_experts = 4;
    c.ffn.moe.top_k = 1;
    c.ffn.moe.routing = RoutingKind::relu;
    c.ffn.moe.normalize = false;
    c.ffn.moe.router_bias = false;
    c.ffn.moe.l1_coef_init = 1e-4f;
  } else {
    c.ffn = variant_config("swiglu", 16, 32, true);
  }
  return c;
}

TrainConfig small_train(std::int64_t steps) {
  TrainConfig t;
  t.steps = steps;
  t.batch = 3;
  t.seq = 16;
  t.accumulate = 2;
  t.warmup = 2;
  t.eval_every = 0;
  t.seed = 7;
  return t;
}

}  // namespace

TEST(Data, LoadsFoldersSkipsIndexesAndSplitsDeterministically) {
  const test::ScratchDir scratch_dir("data");
  const fs::path& dir = scratch_dir.path;
  write(dir / "b", "bbbb");
  write(dir / "a", "aaaaaa");
  write(dir / "a.dat", "BINARY");
  write(dir / "a.u8", "DUPLICATE");
  fs::create_directories(dir / "sub");
  write(dir / "sub" / "c", "cccccccccc");
  write(dir / "d", "dddddddddd");
  const Corpus c = load_corpus(dir.string(), 0.1);
  EXPECT_EQ(c.files.size(), 3u);  // not sub/c: subfolders are not read
  EXPECT_EQ(std::string(c.bytes.begin(), c.bytes.end()), "aaaaaabbbbdddddddddd");
  EXPECT_EQ(c.split, 18);
  EXPECT_EQ(c.validation().size(), 2u);
  // The fingerprint follows the bytes: the same text gives the same one, any change another.
  EXPECT_EQ(c.fingerprint.rfind("fnv1a64:", 0), 0u);
  EXPECT_EQ(load_corpus(dir.string(), 0.5).fingerprint, c.fingerprint);
  write(dir / "d", "ddddddddde");
  EXPECT_NE(load_corpus(dir.string(), 0.1).fingerprint, c.fingerprint);

  write(dir / "empty", "");
  EXPECT_THROW(load_corpus((dir / "empty").string()), Error);
  EXPECT_THROW(load_corpus((dir / "missing").string()), Error);
  fs::create_directories(dir / "only_dat");
  write(dir / "only_dat" / "x.dat", "1");
  EXPECT_THROW(load_corpus((dir / "only_dat").string()), Error);
}

TEST(Data, WindowsAreAFunctionOfSeedAndStep) {
  const Corpus c = text_corpus();
  const Batch a = sample_batch(c.train(), 4, 16, 1, 5, 0),
              b = sample_batch(c.train(), 4, 16, 1, 5, 0);
  const Batch other = sample_batch(c.train(), 4, 16, 1, 6, 0);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_NE(a.ids, other.ids);
  for (std::size_t i = 0; i + 1 < a.ids.size(); ++i)
    if ((i + 1) % 16 != 0) {
      EXPECT_EQ(a.targets[i], a.ids[i + 1]);  // shifted by one
    }
  EXPECT_THROW(sample_batch(c.train(), 1, static_cast<std::int64_t>(c.train().size()), 1, 0, 0),
               Error);
  const Batch v = sequential_batch(c.validation(), 100, 16, 0);
  EXPECT_EQ(static_cast<std::int64_t>(v.ids.size()), window_count(c.validation(), 16) * 16);
}

TEST(Trainer, ResumeIsBitIdenticalToAnUninterruptedRun) {
  const Corpus corpus = text_corpus();
  for (Ffn moe : {Ffn::dense, Ffn::moe, Ffn::relu_routed}) {
    const std::string name = std::vector<std::string>{"dense", "moe", "relu_routed"}[int(moe)];
    SCOPED_TRACE(name);
    const test::ScratchDir scratch_dir("resume_" + name);
    const fs::path& dir = scratch_dir.path;
    TransformerLM full(small_model(moe), 3);
    Trainer a(full, corpus, small_train(8));
    a.run(nullptr, nullptr);

    TransformerLM first(small_model(moe), 3);
    Trainer b(first, corpus, small_train(8));
    for (int i = 0; i < 4; ++i) b.train_step();
    b.save(dir.string());

    TransformerLM resumed(small_model(moe), 99);  // another initialisation: load must replace it
    Trainer c(resumed, corpus, small_train(8));
    c.load(dir.string());
    EXPECT_EQ(c.step(), 4);
    c.run(nullptr, nullptr);
    const Tensor& wa = full.parameters().values();
    const Tensor& wc = resumed.parameters().values();
    EXPECT_EQ(std::memcmp(wa.f32(), wc.f32(), wa.nbytes()), 0);
    EXPECT_EQ(
        std::memcmp(a.optimizer().v().f32(), c.optimizer().v().f32(), a.optimizer().v().nbytes()),
        0);
    // ... and the run did something: the weights moved from the initialisation.
    TransformerLM init(small_model(moe), 3);
    EXPECT_NE(std::memcmp(wa.f32(), init.parameters().values().f32(), wa.nbytes()), 0);
  }
}

// The moments are stored by parameter name (a checkpoint does not depend on the buffer's layout);
// a checkpoint of the earlier layout, the moments as two flat tensors in the buffer's order,
// still resumes to the same run.
TEST(Trainer, CheckpointKeepsMomentsByNameAndReadsTheFlatLayout) {
  const Corpus corpus = text_corpus();
  const test::ScratchDir scratch_dir("moments_by_name");
  const fs::path& dir = scratch_dir.path;
  TransformerLM full(small_model(Ffn::moe), 3);
  Trainer a(full, corpus, small_train(8));
  a.run(nullptr, nullptr);

  TransformerLM first(small_model(Ffn::moe), 3);
  Trainer b(first, corpus, small_train(8));
  for (int i = 0; i < 4; ++i) b.train_step();
  b.save(dir.string());
  const fs::path weights = dir / "weights-00000004.safetensors";
  {
    const SafeTensors st = SafeTensors::load(weights.string());
    EXPECT_FALSE(st.contains("optimizer.m"));
    int moments = 0;
    for (const Parameter& p : first.parameters().list()) {
      if (!p.trainable) continue;
      for (const char* m : {"optimizer.m.", "optimizer.v."}) {
        ASSERT_TRUE(st.contains(m + p.name)) << m << p.name;
        EXPECT_EQ(st.info(m + p.name).shape, p.shape) << m << p.name;
        ++moments;
      }
    }
    EXPECT_GT(moments, 20);
  }
  {  // the same checkpoint in the earlier layout
    SafeTensorsWriter w;
    for (const Parameter& p : first.parameters().list()) w.add(p.name, p.value);
    w.add("optimizer.m", b.optimizer().m());
    w.add("optimizer.v", b.optimizer().v());
    w.set_metadata("format", "ffnlab-checkpoint-1");
    w.write(weights.string());
  }
  TransformerLM resumed(small_model(Ffn::moe), 99);
  Trainer c(resumed, corpus, small_train(8));
  c.load(dir.string());
  c.run(nullptr, nullptr);
  const Tensor& wa = full.parameters().values();
  const Tensor& wc = resumed.parameters().values();
  EXPECT_EQ(std::memcmp(wa.f32(), wc.f32(), wa.nbytes()), 0);
}

// A save at the committed checkpoint's own step (a resume that saves its changed settings, here
// another optimizer) writes weights-<step>-r1: a save that fails there leaves the committed
// file untouched, and the committed checkpoint resumes with its own optimizer; one that succeeds
// names the new file and removes the old.
TEST(Trainer, ASaveAtTheCommittedStepReplacesNoCommittedFile) {
  const Corpus corpus = text_corpus();
  const test::ScratchDir scratch_dir("same_step");
  const fs::path& dir = scratch_dir.path;
  TransformerLM model(small_model(Ffn::dense), 3);
  Trainer adam(model, corpus, small_train(8));
  adam.train_step();
  adam.save(dir.string());
  const fs::path committed = dir / "weights-00000001.safetensors";
  ASSERT_TRUE(fs::exists(committed));
  TrainConfig sgd_config = small_train(8);
  sgd_config.optimizer.kind = OptimizerKind::sgd;
  Trainer sgd(model, corpus, sgd_config);
  sgd.load(dir.string());
  const fs::path next = dir / "weights-00000001-r1.safetensors";
  const fs::path blocked(next.string() + ".tmp." + std::to_string(::getpid()));
  fs::create_directories(blocked / "x");  // its temporary cannot be opened
  EXPECT_THROW(sgd.save(dir.string()), Error);
  EXPECT_TRUE(fs::exists(committed));
  TransformerLM again(small_model(Ffn::dense), 4);
  Trainer resumed(again, corpus, small_train(8));
  EXPECT_NO_THROW(resumed.load(dir.string()));  // (Adam's second moments are there)
  fs::remove_all(blocked);
  sgd.save(dir.string());
  EXPECT_EQ(read_checkpoint_info(dir.string())["weights"], next.filename().string());
  EXPECT_FALSE(fs::exists(committed));
}

// A resume onto the other kind of optimizer state (Adam's two moments, SGD's momentum) reads
// the weights and starts the state afresh: zero moments and step count, not Adam's mean taken
// as SGD's momentum, nor a refusal for SGD's missing second moment. Adam to AdamW reads it.
TEST(Trainer, AResumeOntoAnotherKindOfOptimizerStartsItsStateAfresh) {
  const Corpus corpus = text_corpus();
  const test::ScratchDir scratch_dir("other_optimizer");
  const fs::path& dir = scratch_dir.path;
  const auto all_zero = [](const Tensor& t) {
    return std::all_of(t.f32(), t.f32() + t.numel(), [](float x) { return x == 0.0f; });
  };
  for (const OptimizerKind saved : {OptimizerKind::adamw, OptimizerKind::sgd}) {
    SCOPED_TRACE(enum_name(saved));
    TrainConfig first = small_train(8);
    first.optimizer.kind = saved;
    first.optimizer.momentum = saved == OptimizerKind::sgd ? 0.9f : 0.f;
    TransformerLM model(small_model(Ffn::dense), 3);
    Trainer trainer(model, corpus, first);
    for (int i = 0; i < 2; ++i) trainer.train_step();
    trainer.save(dir.string());
    ASSERT_FALSE(all_zero(trainer.optimizer().m()));
    TrainConfig other = small_train(8);
    other.optimizer.kind = saved == OptimizerKind::sgd ? OptimizerKind::adamw : OptimizerKind::sgd;
    other.optimizer.momentum = other.optimizer.kind == OptimizerKind::sgd ? 0.9f : 0.f;
    TransformerLM again(small_model(Ffn::dense), 4);
    Trainer resumed(again, corpus, other);
    resumed.load(dir.string());
    EXPECT_EQ(resumed.step(), 2);
    EXPECT_EQ(std::memcmp(again.parameters().values().f32(), model.parameters().values().f32(),
                          model.parameters().values().nbytes()),
              0);
    EXPECT_TRUE(all_zero(resumed.optimizer().m()));
    EXPECT_EQ(resumed.optimizer().steps(), 0);
    fs::remove_all(dir);
  }
  // Adam's moments are AdamW's too: read, with the step count.
  TransformerLM model(small_model(Ffn::dense), 3);
  TrainConfig adam = small_train(8);
  adam.optimizer.kind = OptimizerKind::adam;
  Trainer trainer(model, corpus, adam);
  for (int i = 0; i < 2; ++i) trainer.train_step();
  trainer.save(dir.string());
  TransformerLM again(small_model(Ffn::dense), 4);
  Trainer resumed(again, corpus, small_train(8));  // AdamW
  resumed.load(dir.string());
  EXPECT_EQ(resumed.optimizer().steps(), 2);
  EXPECT_EQ(std::memcmp(resumed.optimizer().m().f32(), trainer.optimizer().m().f32(),
                        trainer.optimizer().m().nbytes()),
            0);
}

// A step of no batches (the library's own caller's) is refused, the weights untouched: its
// weight 1/0 would still move them through the optimizer's momentum and decay.
TEST(Trainer, AStepOfNoBatchesIsRefused) {
  const Corpus corpus = text_corpus();
  TransformerLM model(small_model(Ffn::dense), 3);
  Trainer trainer(model, corpus, small_train(8));
  trainer.train_step();
  const Tensor before = model.parameters().values().clone();
  EXPECT_NE(test::error_of([&] {
              trainer.train_step(std::span<const Batch>{});
            }).find("a step needs at least one batch"),
            std::string::npos);
  EXPECT_EQ(std::memcmp(before.f32(), model.parameters().values().f32(), before.nbytes()), 0);
  EXPECT_EQ(trainer.step(), 1);
}

// A checkpoint with expert parts (an expert-parallel run's): each tensor is read from the file
// that holds it, and an error names that file, or every file when a tensor is in none.
TEST(Trainer, CheckpointErrorsNameTheExpertPartThatHoldsTheTensor) {
  const Corpus corpus = text_corpus();
  const test::ScratchDir scratch_dir("expert_part_errors");
  const fs::path& dir = scratch_dir.path;
  TransformerLM model(small_model(Ffn::moe), 3);
  Trainer trainer(model, corpus, small_train(4));
  for (int i = 0; i < 2; ++i) trainer.train_step();
  trainer.save(dir.string());
  const fs::path main = dir / "weights-00000002.safetensors";
  const fs::path part = dir / "weights-00000002-experts-1.safetensors";
  const std::string expert = "model.layers.0.mlp.experts.1.up_proj.weight";
  const std::string moment = "optimizer.v." + expert;
  const fs::path whole = dir / "whole.safetensors";  // the file as saved, before a split
  fs::copy_file(main, whole);
  // Splits the file: the expert and its moments go to the part (`in_part` changes them there);
  // `drop` is written to neither.
  const auto split = [&](const std::function<Tensor(const std::string&, Tensor)>& in_part,
                         const std::string& drop) {
    const SafeTensors all = SafeTensors::load(whole.string());
    SafeTensorsWriter m, p;
    for (const auto& [k, v] : all.metadata()) m.set_metadata(k, v);
    for (const std::string& name : all.names()) {
      if (name == drop) continue;
      if (name.ends_with(expert))
        p.add(name, in_part(name, all.f32(name)));
      else
        m.add(name, all.f32(name));
    }
    m.write(main.string());
    p.write(part.string());
    nlohmann::json info = read_checkpoint_info(dir.string());
    info["shards"] = {part.filename().string()};
    std::ofstream(dir / "checkpoint.json") << info.dump();
  };
  const auto same = [](const std::string&, Tensor t) { return t; };
  const auto message = [&] {
    TransformerLM other(small_model(Ffn::moe), 5);
    Trainer t(other, corpus, small_train(4));
    try {
      t.load(dir.string());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const SafeTensors before = SafeTensors::load(whole.string());
  ASSERT_TRUE(before.contains(expert)) << fmt::format("{}", fmt::join(before.names(), " "));
  ASSERT_TRUE(before.contains(moment));
  split(same, "");
  EXPECT_EQ(message(), "no error") << "every tensor is in one of the files";

  split([&](const std::string& name,
            Tensor t) { return name == moment ? Tensor(Shape{t.numel() + 1}) : t; },
        "");
  const std::string wrong_size = message();
  EXPECT_NE(wrong_size.find(part.string() + ": optimizer state '" + moment + "'"),
            std::string::npos)
      << wrong_size;

  split(same, expert);
  const std::string missing = message();
  EXPECT_NE(missing.find(main.string() + " and its 1 expert part: no tensor '" + expert + "'"),
            std::string::npos)
      << missing;
}

// ReLU routing in a Transformer: one L1 coefficient, shared by the layers, drives the gates from
// about half open at initialisation to the target (top_k = 1 of 4 experts: sparsity 0.75).
TEST(Trainer, ReluRoutingReachesItsSparsityTarget) {
  const Corpus corpus = text_corpus();
  const LMConfig config = small_model(Ffn::relu_routed);
  TransformerLM model(config, 3);
  TrainConfig t = small_train(200);
  t.optimizer.lr = 3e-3f;
  Trainer trainer(model, corpus, t);
  auto lambda = [&](int layer) {
    return model.parameters()
        .at("model.layers." + std::to_string(layer) + ".mlp.gate.l1_coef")
        .value.f32()[0];
  };
  auto experts_per_token = [&] {
    double sum = 0;
    for (const FFNStats& s : model.ffn_stats()) sum += s.experts_per_token / config.layers;
    return sum;
  };
  trainer.train_step();
  const double at_start = experts_per_token();
  EXPECT_GT(at_start, 1.5);  // about E/2 = 2 open gates a token
  double late = 0;
  float highest = 0;
  for (int step = 1; step < 200; ++step) {
    trainer.train_step();
    if (step >= 150) late += experts_per_token() / 50;
    highest = std::max(highest, lambda(0));
    ASSERT_EQ(lambda(0), lambda(1)) << "one coefficient for the model";
  }
  EXPECT_GT(highest, 10 * config.ffn.moe.l1_coef_init);  // it had to grow
  EXPECT_NEAR(late, 1.0, 0.35) << "from " << at_start;
}

TEST(Trainer, NaNStopsBeforeTheUpdateAndKeepsTheLastCheckpoint) {
  const Corpus corpus = text_corpus();
  const test::ScratchDir scratch_dir("nan");
  const fs::path& dir = scratch_dir.path;
  TransformerLM model(small_model(Ffn::dense), 3);
  TrainConfig t = small_train(6);
  t.checkpoint_every = 2;
  Trainer trainer(model, corpus, t);
  for (int i = 0; i < 2; ++i) trainer.train_step();
  trainer.save(dir.string());
  model.parameters().at("model.layers.1.mlp.up_proj.weight").value.f32()[3] = std::nanf("");
  const Tensor before = model.parameters().values().clone();
  try {
    trainer.run(nullptr, nullptr, dir.string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nan"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("last good checkpoint (step 2)"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(trainer.step(), 2);  // no update happened
  EXPECT_EQ(std::memcmp(before.f32(), model.parameters().values().f32(), before.nbytes()), 0);
  TransformerLM fresh(small_model(Ffn::dense), 5);
  Trainer reloaded(fresh, corpus, t);
  reloaded.load(dir.string());
  EXPECT_EQ(reloaded.step(), 2);
  EXPECT_EQ(read_checkpoint_info(dir.string())["step"], 2);
  EXPECT_TRUE(std::isfinite(global_norm(fresh.parameters().values())));
}

// Memory that runs out, a log that cannot be written, a stop, in any part of a step: the error
// says what the run kept to resume from, and stays the failure it was (memory: the system's,
// ENOMEM). A run without a checkpoint folder (the study's) has nothing to add.
TEST(Trainer, AFailureAnywhereInAStepSaysWhatTheRunKept) {
  const Corpus corpus = text_corpus();
  const test::ScratchDir scratch_dir("kept");
  const std::string dir = scratch_dir.path.string();
  // The failure `fail` throws at step `at` (in the step's callback, or the evaluation's), as
  // Trainer::run raises it: its message, and its errno or what it is.
  const auto failure_of = [&](int at, bool in_eval, const std::string& folder, auto fail) {
    TransformerLM model(small_model(Ffn::dense), 3);
    TrainConfig t = small_train(6);
    t.checkpoint_every = 2;
    t.eval_every = 1;
    Trainer trainer(model, corpus, t);
    try {
      trainer.run(
          [&](const StepLog& log) {
            if (!in_eval && log.step == at) fail();
          },
          [&](const EvalLog& log) {
            if (in_eval && log.step == at) fail();
          },
          folder);
    } catch (const std::exception& e) {
      EXPECT_EQ(trainer.step(), at);
      const auto* s = dynamic_cast<const SystemError*>(&e);
      const std::string kind = s ? std::to_string(s->error_number())
                               : dynamic_cast<const Interrupted*>(&e) ? "interrupted"
                               : typeid(e) == typeid(Error)           ? "input"
                               : typeid(e) == typeid(std::bad_alloc)  ? "bad_alloc"
                                                                      : "other";
      return std::make_pair(std::string(e.what()), kind);
    }
    ADD_FAILURE() << "no error";
    return std::make_pair(std::string(), std::string());
  };
  const std::string kept2 = "; the last good checkpoint (step 2) is kept in " + dir;
  EXPECT_EQ(failure_of(3, false, dir, [] { throw std::bad_alloc(); }),
            std::make_pair("out of memory" + kept2, std::to_string(ENOMEM)));
  EXPECT_EQ(failure_of(5, true, dir, [] { throw SystemError("[io] eval_log.csv", EFBIG); }),
            std::make_pair("[io] eval_log.csv; the last good checkpoint (step 4) is kept in " + dir,
                           std::to_string(EFBIG)));
  EXPECT_EQ(failure_of(3, false, dir, [] { throw Interrupted("[train] stopped"); }),
            std::make_pair("[train] stopped" + kept2, std::string("interrupted")));
  EXPECT_EQ(failure_of(3, true, dir, [] { throw Error("[train] refused"); }),
            std::make_pair("[train] refused" + kept2, std::string("input")));
  EXPECT_EQ(failure_of(3, false, "", [] { throw std::bad_alloc(); }),
            std::make_pair(std::string("std::bad_alloc"), std::string("bad_alloc")));
}

TEST(Trainer, CheckpointErrorsAreClear) {
  const Corpus corpus = text_corpus();
  const test::ScratchDir scratch_dir("ckpt");
  const fs::path& dir = scratch_dir.path;
  TransformerLM model(small_model(Ffn::dense), 3);
  Trainer trainer(model, corpus, small_train(2));
  auto message = [&](const std::string& d) {
    try {
      trainer.load(d);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message((dir / "none").string()).find("no checkpoint"), std::string::npos);
  trainer.save(dir.string());
  // Another model shape.
  LMConfig wide = small_model(Ffn::dense);
  wide.d_model = 32;
  wide.ffn.d_model = 32;
  TransformerLM other(wide, 3);
  Trainer t2(other, corpus, small_train(2));
  try {
    t2.load(dir.string());
    FAIL() << "loaded a checkpoint of another shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another shape"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("d_model"), std::string::npos) << e.what();
  }
  // A truncated weights file.
  std::string weights;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") weights = e.path().string();
  ASSERT_FALSE(weights.empty());
  fs::resize_file(weights, fs::file_size(weights) / 2);
  EXPECT_NE(message(dir.string()).find("safetensors"), std::string::npos);
  // A corrupt checkpoint.json.
  write(dir / "checkpoint.json", "{\"format\": ");
  EXPECT_NE(message(dir.string()).find("corrupt"), std::string::npos);
  // No temporary file is left behind by a save.
  trainer.save(dir.string());
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(Trainer, RejectsSequencesLongerThanTheData) {
  Corpus tiny;
  tiny.source = "tiny";
  tiny.bytes.assign(10, 'x');
  tiny.split = 9;
  TransformerLM model(small_model(Ffn::dense), 3);
  EXPECT_THROW(Trainer(model, tiny, small_train(1)), Error);
}

// The masked objective's batches: the same count of masked positions in every sequence, each
// [MASK] with its byte as target, every other target ignored; a function of (seed, stream, row).
TEST(Data, MaskedBatchesMaskTheSameCountInEverySequence) {
  const Corpus corpus = text_corpus();
  const std::int64_t S = 20;
  const Batch plain = sample_batch(corpus.train(), 4, S, 3, 5, 0);
  Batch b = plain;
  mask_batch(b, S, 0.15, 3, 9, 0);
  EXPECT_EQ(masked_per_sequence(S, 0.15), 3);
  EXPECT_EQ(masked_per_sequence(S, 0.001), 1);
  EXPECT_EQ(masked_per_sequence(S, 1.0), S);
  for (std::int64_t row = 0; row < 4; ++row) {
    int masked = 0;
    for (std::int64_t i = row * S; i < (row + 1) * S; ++i) {
      if (b.targets[i] == kIgnoreTarget) {
        EXPECT_EQ(b.ids[i], plain.ids[i]);
        continue;
      }
      ++masked;
      EXPECT_EQ(b.ids[i], kMaskToken);
      EXPECT_EQ(b.targets[i], plain.ids[i]);  // its own byte, not the next one
    }
    EXPECT_EQ(masked, 3) << "row " << row;
  }
  // Rows 2 and 3 alone, as a data-parallel rank holding them masks them: the same positions.
  Batch part = sample_batch(corpus.train(), 4, S, 3, 5, 0, 2, 2);
  mask_batch(part, S, 0.15, 3, 9, 2);
  EXPECT_TRUE(std::equal(part.ids.begin(), part.ids.end(), b.ids.begin() + 2 * S));
  // Another stream masks other positions.
  Batch other = plain;
  mask_batch(other, S, 0.15, 3, 10, 0);
  EXPECT_NE(other.ids, b.ids);
  EXPECT_THROW(mask_batch(other, S, 0.0, 3, 10, 0), Error);
}

// A bidirectional model trained on the masked objective learns (validation in bits per masked
// byte falls far below log2(257) = 8), evaluation counts only masked bytes, and the objective is
// refused with a model it does not fit.
TEST(Trainer, MaskedObjectiveTrainsABidirectionalModel) {
  const Corpus corpus = text_corpus();
  LMConfig c = small_model(Ffn::dense);
  c.causal = false;
  c.vocab = kMaskToken + 1;
  c.positions = PositionKind::rope;  // learned positions sit at the unigram plateau far longer
  c.dropout = 0.f;
  c.d_model = 32;
  c.ffn = variant_config("swiglu", 32, 32, true);
  TrainConfig t = small_train(300);
  t.objective = Objective::masked;
  t.mask_fraction = 0.25f;
  t.optimizer.lr = 1e-2f;
  TransformerLM model(c, 3);
  Trainer trainer(model, corpus, t);
  const EvalLog before = trainer.evaluate(0);
  // 4 of each window's 16 bytes predicted, over every validation window.
  EXPECT_EQ(before.tokens, 4 * window_count(corpus.validation(), t.seq));
  EXPECT_NEAR(before.bits_per_byte, std::log2(257.0), 0.6);
  for (int s = 0; s < t.steps; ++s) trainer.train_step();
  const EvalLog after = trainer.evaluate(0);
  // Below the bytes' unigram entropy (4.36 bits; 3.89 measured on an AVX-512 machine): the
  // model reads the masked byte's context.
  EXPECT_LT(after.bits_per_byte, unigram_entropy_bits(corpus.validation()) - 0.15)
      << unigram_entropy_bits(corpus.validation());
  EXPECT_EQ(trainer.evaluate(0).loss, after.loss);  // the same positions every time

  LMConfig causal = small_model(Ffn::dense);
  causal.vocab = kMaskToken + 1;
  TransformerLM causal_model(causal, 3);
  EXPECT_THROW(Trainer(causal_model, corpus, t), Error);  // masked needs bidirectional
  LMConfig bytes_only = c;
  bytes_only.vocab = 256;
  TransformerLM small_vocab(bytes_only, 3);
  EXPECT_THROW(Trainer(small_vocab, corpus, t), Error);  // no room for [MASK]
  t.objective = Objective::causal;
  try {
    Trainer(model, corpus, t);
    ADD_FAILURE() << "a bidirectional model trained on the causal objective";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--objective masked"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sample_text(model, "x", 4, 0.8f, 1), Error);

  // A routing that looks at the whole sequence in a causal model: refused, saying what to do.
  LMConfig ec = small_model(Ffn::moe);
  ec.ffn.moe.routing = RoutingKind::expert_choice;
  ec.ffn.moe.normalize = false;
  ec.ffn.moe.aux_coef = 0.0f;
  ec.ffn.moe.balance_bias = false;
  try {
    validate(ec);
    ADD_FAILURE() << "a causal model with expert choice";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--objective masked"), std::string::npos) << e.what();
  }
  ec.causal = false;
  EXPECT_NO_THROW(validate(ec));
}

TEST(Sampling, PadsToOneShapeWithoutChangingTheLogits) {
  LMConfig c = small_model(Ffn::dense);
  c.dropout = 0.f;
  c.init_std = 0.3f;
  TransformerLM model(c, 3);
  // The logits at the last real position of a right-padded full-context window equal those of
  // the exact-length window (causal attention), for every length up to the context.
  const std::vector<std::int32_t> text{'T', 'h', 'e', ' ', 'f', 'o', 'x', ' ', 'r', 'a', 'n'};
  for (std::size_t len = 1; len <= text.size(); ++len) {
    std::vector<std::int32_t> exact(text.begin(), text.begin() + static_cast<long>(len));
    model.forward(exact, {}, static_cast<std::int64_t>(len), false);
    const Tensor want =
        model.logits()
            .rows(static_cast<std::int64_t>(len) - 1, static_cast<std::int64_t>(len))
            .clone();
    std::vector<std::int32_t> padded = exact;
    padded.resize(static_cast<std::size_t>(c.context), 0);
    model.forward(padded, {}, c.context, false);
    const Tensor got =
        model.logits().rows(static_cast<std::int64_t>(len) - 1, static_cast<std::int64_t>(len));
    EXPECT_LT(test::scaled_error(got.f32(), want.f32(), want.numel()), 1e-5) << "length " << len;
  }
  // Sampling therefore creates its products' primitives once, whatever the text length.
  sample_text(model, "x", 2, 0.8f, 1);
  const std::int64_t before = matmul_primitive_count();
  const std::string s = sample_text(model, "x", 40, 0.8f, 1);
  EXPECT_EQ(matmul_primitive_count(), before);
  EXPECT_EQ(s.size(), 40u);
  EXPECT_EQ(s, sample_text(model, "x", 40, 0.8f, 1));  // seeded
}

// A causal model may be given a vocab larger than the bytes; the ids from 256 up are not text,
// and the sample never draws one, even where its logit is the largest.
TEST(Sampling, DrawsOnlyBytes) {
  LMConfig c = small_model(Ffn::dense);
  c.vocab = 300;
  c.tied_head = false;
  TransformerLM model(c, 3);
  float* head = model.parameters().at("lm_head.weight").value.f32();
  std::mt19937 rng(5);
  std::normal_distribution<float> large(0.f, 100.f);
  for (std::int64_t v = 0; v < c.vocab; ++v)
    for (std::int64_t d = 0; d < c.d_model; ++d)
      head[v * c.d_model + d] = v < 256 ? 0.f : large(rng);
  // Every byte's logit is 0, below the largest of the larger ids': greedy takes byte 0 each
  // time (drawing among all ids, it would take the largest, an id from 256 up)...
  EXPECT_EQ(sample_text(model, "x", 24, 0.f, 1), std::string(24, '\0'));
  // ...and sampling draws among the bytes alone, evenly: all 256 values turn up in 4096 draws
  // (drawing among all ids, nearly every draw is the largest id).
  const std::string s = sample_text(model, "x", 4096, 1.f, 1);
  std::vector<int> seen(256, 0);
  for (const char ch : s) seen[static_cast<unsigned char>(ch)] = 1;
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 256);
}

// Per-layer diagnostics: at step 1 and every N steps, one row per block, within their bounds,
// the gradient norms parts of the global one; and reading them changes nothing in training.
TEST(Trainer, DiagnosticsDescribeEveryLayerAndChangeNothing) {
  const Corpus corpus = text_corpus();
  for (bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "moe" : "dense");
    const LMConfig model = small_model(moe ? Ffn::moe : Ffn::dense);
    TrainConfig plain = small_train(5), with = small_train(5);
    with.diagnostics_every = 2;
    TransformerLM a(model, 3), b(model, 3);
    Trainer ta(a, corpus, plain), tb(b, corpus, with);
    for (std::int64_t step = 1; step <= 5; ++step) {
      const StepLog la = ta.train_step(), lb = tb.train_step();
      EXPECT_EQ(la.loss, lb.loss);
      EXPECT_TRUE(la.layers.empty());
      const bool due = step == 1 || step % 2 == 0;
      ASSERT_EQ(lb.layers.size(), due ? static_cast<std::size_t>(model.layers) : 0u) << step;
      double squares = 0;
      for (const LayerDiagnostics& d : lb.layers) {
        EXPECT_GT(d.residual_rms, 0.0);
        EXPECT_GT(d.attention_rms, 0.0);
        EXPECT_GT(d.ffn_rms, 0.0);
        // Causal attention over S positions: between 0 and the uniform's mean ln(i).
        double uniform = 0;
        for (int i = 1; i <= 16; ++i) uniform += std::log(static_cast<double>(i)) / 16.0;
        EXPECT_GE(d.attention_entropy, 0.0);
        EXPECT_LE(d.attention_entropy, uniform + 1e-6);
        EXPECT_GT(d.grad_attention, 0.0);
        EXPECT_GT(d.grad_ffn, 0.0);
        squares += d.grad_attention * d.grad_attention + d.grad_ffn * d.grad_ffn +
                   d.grad_router * d.grad_router;
        if (moe) {
          EXPECT_GT(d.grad_router, 0.0);
          EXPECT_GT(d.ffn.router_logit_std, 0.0);
          ASSERT_EQ(d.ffn.expert_output_rms.size(), 4u);
          EXPECT_GT(d.ffn.router_entropy, 0.0);
          EXPECT_LE(d.ffn.router_entropy, std::log(4.0) + 1e-6);
        } else {
          EXPECT_EQ(d.grad_router, 0.0);
        }
      }
      if (due) {  // the blocks' share of the global norm (embeddings and the final norm add)
        EXPECT_LE(std::sqrt(squares), lb.grad_norm * (1 + 1e-5));
        EXPECT_GT(std::sqrt(squares), 0.0);
      }
    }
    EXPECT_EQ(std::memcmp(a.parameters().values().f32(), b.parameters().values().f32(),
                          a.parameters().values().nbytes()),
              0);
  }
}
