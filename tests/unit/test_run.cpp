// The run driver (train/run.hpp) and the one serialisation of the step and evaluation logs
// (train/step_log.hpp): what every front end that trains goes through.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/failure.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/train/run.hpp"
#include "ffnlab/train/run_folder.hpp"
#include "ffnlab/train/step_log.hpp"
#include "thread_group.hpp"

using namespace ffnlab;
using ffnlab::test::ThreadGroup;
namespace fs = std::filesystem;

// `text` holds `part`.
#define EXPECT_THAT_CONTAINS(text, part)                         \
  do {                                                           \
    const std::string t_ = (text);                               \
    EXPECT_NE(t_.find(part), std::string::npos) << "in: " << t_; \
  } while (0)

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The CSV header's columns, split.
std::vector<std::string> columns(const std::string& header) {
  std::vector<std::string> out;
  std::stringstream s(header.substr(0, header.find('\n')));
  for (std::string c; std::getline(s, c, ',');) out.push_back(c);
  return out;
}

TEST(StepLogs, JsonAndCsvCarryTheSameFieldsInTheSameOrder) {
  StepLog s;
  s.step = 7;
  s.loss = 2.5;
  s.lr = 1e-3;
  s.tokens_per_second = 1234.56;
  s.experts_per_token = 1.75;
  s.l1_coef = 3e-8;
  const nlohmann::ordered_json j = to_json(s);
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  std::vector<std::string> cols = columns(step_csv_header());
  for (std::string& c : cols)
    if (c == "tokens_per_s") c = "tokens_per_second";  // the log's short name
  EXPECT_EQ(keys, cols);
  EXPECT_EQ(j["step"], 7);
  EXPECT_EQ(j["experts_per_token"], 1.75);
  EXPECT_FALSE(j.contains("layers"));  // only a step with diagnostics carries them
  EXPECT_EQ(step_csv_row(s),
            "7,2.500000,0.000000,0.000000,0.001,1234.6,0.0000,0.00000,0.00000,0.00000,0.00000,"
            "1.7500,3e-08\n");
  s.layers.resize(2);
  s.layers[1].ffn.expert_output_rms = {1.0, NAN, 3.0};
  EXPECT_EQ(to_json(s)["layers"].size(), 2u);
  EXPECT_EQ(to_json(s)["layers"][1]["expert_output_rms"].size(), 3u);
  // The per-layer log: a row per block, the experts' RMS as min, mean, max of those with rows.
  const std::string rows = layer_csv_rows(s);
  EXPECT_EQ(std::count(rows.begin(), rows.end(), '\n'), 2);
  EXPECT_NE(rows.find(",1,2,3\n"), std::string::npos) << rows;  // min 1, mean 2, max 3
  EXPECT_NE(rows.find(",2,3\n"), std::string::npos) << rows;

  EvalLog e{4, 1.5, 2.25, 512};
  const nlohmann::ordered_json ej = to_json(e);
  std::vector<std::string> ekeys;
  for (const auto& [k, v] : ej.items()) ekeys.push_back(k);
  EXPECT_EQ(ekeys, (std::vector<std::string>{"step", "loss", "bits_per_byte", "tokens"}));
  EXPECT_EQ(columns(eval_csv_header()),
            (std::vector<std::string>{"step", "val_loss", "val_bits_per_byte", "tokens"}));
  EXPECT_EQ(eval_csv_row(e), "4,1.500000,2.250000,512\n");
}

// A small model and a corpus file of real-looking text.
class RunDriver : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ffnlab_run_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::string text;
    for (int i = 0; i < 40; ++i)
      text += "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. ";
    std::ofstream(dir_ / "data.txt", std::ios::binary) << text;
    rq_.model.d_model = 16;
    rq_.model.layers = 1;
    rq_.model.heads = 2;
    rq_.model.context = 16;
    rq_.model.ffn = variant_config("moe", 16, 16, true);
    rq_.model.ffn.moe.num_experts = 4;
    rq_.model.ffn.moe.top_k = 2;
    rq_.train.steps = 4;
    rq_.train.batch = 2;
    rq_.train.seq = 16;
    rq_.train.warmup = 1;
    rq_.train.eval_every = 2;
    rq_.data = (dir_ / "data.txt").string();
    rq_.measure_bare = false;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // rq_ run into dir_/part and stopped at step 2, its checkpoint.json then changed by `edit`;
  // returns the request that resumes it in its own folder, with the checkpoint's model.
  RunRequest stopped_with_checkpoint(const std::function<void(nlohmann::json&)>& edit);
  fs::path info_path() const { return dir_ / "part" / "checkpoint" / "checkpoint.json"; }

  fs::path dir_;
  RunRequest rq_;
};

// The message of the UsageError that f throws ("" when it throws none; another error fails the
// test).
std::string usage_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// Counts what the observer hears, and stops after a given step.
struct Recorder : RunObserver {
  int starts = 0;
  std::int64_t from_step = -1, stop_after = -1;
  std::vector<StepLog> steps;
  std::vector<EvalLog> evals;
  void started(const RunStart& s, TransformerLM& /*model*/) override {
    ++starts;
    from_step = s.from_step;
  }
  void step(const StepLog& s, const TransformerLM& /*model*/) override { steps.push_back(s); }
  void evaluated(const EvalLog& e) override { evals.push_back(e); }
  bool stop() override {
    return stop_after >= 0 && !steps.empty() && steps.back().step >= stop_after;
  }
};

RunRequest RunDriver::stopped_with_checkpoint(const std::function<void(nlohmann::json&)>& edit) {
  rq_.out = (dir_ / "part").string();
  Recorder first;
  first.stop_after = 2;
  run_training(rq_, first);
  nlohmann::json info = nlohmann::json::parse(read(info_path()));
  edit(info);
  std::ofstream(info_path(), std::ios::binary | std::ios::trunc) << info.dump(2);
  RunRequest again = rq_;
  again.out.clear();
  again.resume = rq_.out;
  again.model = LMConfig{};
  return again;
}

// Over ranks the final validation is an evaluation that sums over them: every rank takes part
// (rank 0 alone would wait for the others forever) and gets the value one process gets.
TEST_F(RunDriver, FinalValidationOverRanksRunsOnEveryRank) {
  rq_.validate_at_end = true;
  rq_.train.eval_tokens = 64;
  rq_.validation_tokens = 0;  // the whole part, not the periodic evaluations': one more
  Recorder alone;
  const RunOutcome one = run_training(rq_, alone);
  ASSERT_TRUE(one.validation.has_value());
  std::vector<std::optional<EvalLog>> validations(2);
  ThreadGroup::run(2, [&](ThreadGroup& g) {
    RunRequest rq = rq_;
    rq.parallel.group = &g;
    Recorder heard;
    validations[g.rank()] = run_training(rq, heard).validation;
  });
  for (const auto& v : validations) {
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(v->tokens, one.validation->tokens);
    EXPECT_NEAR(v->loss, one.validation->loss, 1e-4);
  }
  EXPECT_EQ(validations[0]->loss, validations[1]->loss);
}

// What a rank checks alone (rank 0 its output folder, each its checkpoint), rank 0's opening
// of the folder and its observer's start fail every rank: the others name it with its kind and
// errno, instead of waiting for it in the next exchange.
TEST_F(RunDriver, WhatOneRankChecksAloneFailsEveryRank) {
  const auto outcome = [&](const std::function<void(RunRequest&, int)>& set) {
    return ThreadGroup::outcomes(
        2,
        [&](ThreadGroup& g) {
          RunRequest rq = rq_;
          rq.parallel.group = &g;
          set(rq, g.rank());
          Recorder heard;
          run_training(rq, heard);
        },
        "trained");
  };
  // Rank 0's --out holds an earlier run: usage (exit 2) on both ranks.
  RunRequest earlier = rq_;
  earlier.out = (dir_ / "earlier").string();
  Recorder first;
  run_training(earlier, first);
  std::vector<std::string> lines = outcome([&](RunRequest& rq, int) {
    rq.out = earlier.out;
    rq.out_named = true;
  });
  EXPECT_THAT_CONTAINS(lines[0], "2 0 [train] --out '");
  EXPECT_THAT_CONTAINS(lines[0], "holds an earlier run (a checkpoint at step 4)");
  EXPECT_EQ(lines[1],
            "2 0 [train] rank 0 failed its checks before the ranks compared their setup (its "
            "message says why)");
  // Rank 1's --resume holds no checkpoint: refused input (exit 1) on both ranks.
  lines = outcome([&](RunRequest& rq, int rank) {
    rq.resume = rank == 0 ? earlier.out : (dir_ / "nothing").string();
  });
  EXPECT_EQ(lines[0],
            "1 0 [train] rank 1 failed its checks before the ranks compared their setup (its "
            "message says why)");
  EXPECT_THAT_CONTAINS(lines[1], "1 0 [checkpoint] no checkpoint in");
  // Past the checks, rank 0 cannot open its folder (forced over a run whose 'sample.txt' is a
  // folder that holds a file): the system's failure (exit 3) with its errno on both ranks.
  const fs::path blocked = dir_ / "blocked";
  fs::create_directories(blocked / "sample.txt");
  std::ofstream(blocked / "sample.txt" / "x") << "x";
  lines = outcome([&](RunRequest& rq, int) {
    rq.out = blocked.string();
    rq.out_named = true;
    rq.force = true;
  });
  const std::string full = fmt::format("3 {} ", ENOTEMPTY);
  EXPECT_THAT_CONTAINS(lines[0], full + "[train] cannot remove the earlier run's '");
  EXPECT_EQ(lines[1],
            full + "[train] rank 0 could not open the run's folder (its message says why)");
  // Rank 0's observer fails as the run starts (its output cannot be written): the system's
  // failure with its errno on both ranks, before the first step.
  struct FailsToStart : Recorder {
    void started(const RunStart&, TransformerLM&) override {
      throw SystemError("[io] cannot write to standard output", EPIPE);
    }
  };
  lines = ThreadGroup::outcomes(
      2,
      [&](ThreadGroup& g) {
        RunRequest rq = rq_;
        rq.parallel.group = &g;
        FailsToStart heard;
        run_training(rq, heard);
      },
      "trained");
  const std::string pipe = fmt::format("3 {} ", EPIPE);
  EXPECT_EQ(lines[0], pipe + "[io] cannot write to standard output");
  EXPECT_EQ(lines[1], pipe + "[train] rank 0 could not start the run (its message says why)");
}

TEST_F(RunDriver, WritesTheFolderItsOutcomeDescribes) {
  rq_.out = (dir_ / "run").string();
  rq_.validate_at_end = true;
  Recorder heard;
  const RunOutcome r = run_training(rq_, heard);
  EXPECT_TRUE(r.finished);
  EXPECT_EQ(r.step, 4);
  EXPECT_EQ(heard.starts, 1);
  EXPECT_EQ(heard.from_step, 0);
  ASSERT_EQ(heard.steps.size(), 4u);
  ASSERT_EQ(r.evaluations.size(), 2u);  // steps 2 and 4
  ASSERT_TRUE(r.validation.has_value());
  // summary.json is the outcome's summary, with every evaluation the observer heard.
  const nlohmann::json written = nlohmann::json::parse(read(dir_ / "run" / "summary.json"));
  EXPECT_EQ(written, r.summary);
  EXPECT_EQ(written["evaluations"].size(), heard.evals.size());
  EXPECT_EQ(written["evaluations"][1]["loss"], heard.evals[1].loss);
  // The logs are the rows of what the observer heard.
  std::string expected = step_csv_header();
  for (const StepLog& s : heard.steps) expected += step_csv_row(s);
  EXPECT_EQ(read(dir_ / "run" / "train_log.csv"), expected);
  // MoE: the experts a token took, over the last quarter of the steps.
  EXPECT_DOUBLE_EQ(r.routing["experts_per_token"].get<double>(), heard.steps[3].experts_per_token);
  // Nothing timed (measure_bare off): no utilisation, and no number for it.
  EXPECT_FALSE(written.contains("utilisation"));
  EXPECT_TRUE(std::isnan(r.utilisation));
}

TEST_F(RunDriver, StoppedThenResumedIsTheUninterruptedRun) {
  Recorder whole;
  run_training(rq_, whole);  // no folder: nothing written

  rq_.out = (dir_ / "part").string();
  Recorder first;
  first.stop_after = 2;
  const RunOutcome stopped = run_training(rq_, first);
  EXPECT_FALSE(stopped.finished);
  EXPECT_EQ(stopped.step, 2);
  EXPECT_TRUE(fs::exists(dir_ / "part" / "checkpoint" / "checkpoint.json"));

  RunRequest again = rq_;
  again.out.clear();  // continues in the run's own folder
  again.resume = (dir_ / "part").string();
  again.model = LMConfig{};  // a resumed run's model is its checkpoint's
  again.data_given = false;  // and so is its data
  again.data = "/nonexistent";
  Recorder rest;
  const RunOutcome resumed = run_training(again, rest);
  EXPECT_TRUE(resumed.finished);
  EXPECT_EQ(rest.from_step, 2);
  ASSERT_EQ(rest.steps.size(), 2u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(rest.steps[i].loss, whole.steps[2 + i].loss) << i;
  // Every evaluation of the run, the part before the stop included.
  EXPECT_EQ(resumed.evaluations.size(), 2u);

  // Resumed again at its end: nothing to do, and the summary is the one written.
  Recorder none;
  const RunOutcome done = run_training(again, none);
  EXPECT_TRUE(done.already_finished);
  EXPECT_EQ(none.starts, 0);
  EXPECT_EQ(done.summary, nlohmann::json::parse(read(dir_ / "part" / "summary.json")));

  // A summary of fewer steps than the checkpoint's (the run extended with --steps, stopped after
  // its last checkpoint, before its new summary): not finished; the run writes its summary.
  nlohmann::json shorter = done.summary;
  shorter["steps"] = 2;
  { std::ofstream(dir_ / "part" / "summary.json") << shorter.dump(); }
  Recorder extended;
  const RunOutcome rewritten = run_training(again, extended);
  EXPECT_FALSE(rewritten.already_finished);
  EXPECT_TRUE(rewritten.finished);
  EXPECT_TRUE(extended.steps.empty());  // the checkpoint is the last step's: nothing to train
  EXPECT_EQ(nlohmann::json::parse(read(dir_ / "part" / "summary.json"))["steps"], 4);
}

TEST_F(RunDriver, ResumingWithOtherSettingsOrDataNeedsForce) {
  rq_.out = (dir_ / "run").string();
  Recorder heard;
  run_training(rq_, heard);
  RunRequest again = rq_;
  again.resume = again.out;
  again.train.steps = 6;
  again.train.optimizer.lr = 0.5f;
  again.given = {{"steps", "--steps 6"}, {"lr", "--lr 0.5"}};
  Recorder r1;
  // Steps set the new total; another learning rate is a change the user must insist on.
  const std::string refused = usage_error_of([&] { run_training(again, r1); });
  EXPECT_THAT_CONTAINS(refused, "[train] resuming " + again.resume +
                                    " with other training settings: --lr 0.5 (the checkpoint "
                                    "has 0.003)");  // the float as written, not as a double
  EXPECT_THAT_CONTAINS(refused, "; use --force to change them");
  EXPECT_EQ(refused.find("steps"), std::string::npos) << refused;
  again.names.force = "pass force=True";
  EXPECT_THAT_CONTAINS(usage_error_of([&] { run_training(again, r1); }),
                       "pass force=True to change them");
  std::string other;
  for (int i = 0; i < 40; ++i) other += "Completely different words fill this other file. ";
  std::ofstream(dir_ / "other.txt", std::ios::binary) << other;
  again.given = {{"steps", "--steps 6"}};
  again.data = (dir_ / "other.txt").string();
  EXPECT_THAT_CONTAINS(usage_error_of([&] { run_training(again, r1); }),
                       "is not the data the checkpoint");
  again.force = true;
  const RunOutcome forced = run_training(again, r1);
  EXPECT_TRUE(forced.finished);
  EXPECT_EQ(forced.step, 6);
}

// A float setting is written as the float it is (0.003, not 0.003000000026077032), and a
// checkpoint written the older way, every float as its double, still loads and resumes with its
// settings given as they were: no change to insist on, and the run the uninterrupted one.
TEST_F(RunDriver, FloatsAreWrittenShortAndOlderCheckpointsStillResume) {
  Recorder whole;
  run_training(rq_, whole);
  std::function<void(nlohmann::json&)> widen = [&](nlohmann::json& j) {
    if (j.is_number_float()) j = static_cast<double>(static_cast<float>(j.get<double>()));
    if (j.is_structured())
      for (auto& item : j) widen(item);
  };
  std::string text;  // as the run wrote it
  RunRequest again = stopped_with_checkpoint([&](nlohmann::json& info) {
    text = info.dump(2);
    widen(info["model"]);
    widen(info["train"]);
  });
  EXPECT_THAT_CONTAINS(text, "\"lr\": 0.003,");
  EXPECT_THAT_CONTAINS(text, "\"init_std\": 0.02,");
  // No number of 12 or more digits after its point (a float's double has 16 or 17).
  EXPECT_FALSE(std::regex_search(text, std::regex(R"([0-9]\.[0-9]{12,})"))) << text;
  ASSERT_EQ(nlohmann::json::parse(read(info_path()))["train"]["lr"].dump(), "0.003000000026077032");
  again.given = {{"lr", "--lr 0.003"}, {"clip", "--clip 1"}};  // as the run had them
  Recorder rest;
  const RunOutcome resumed = run_training(again, rest);
  EXPECT_TRUE(resumed.finished);
  ASSERT_EQ(rest.steps.size(), 2u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(rest.steps[i].loss, whole.steps[2 + i].loss) << i;
}

// A checkpoint may hold a setting outside its range (one written before the range held):
// resumed as it is, the run is refused naming the file; given a setting in range instead (and
// told to change it), the run goes on.
TEST_F(RunDriver, ACheckpointsSettingOutsideItsRangeCanBeReplaced) {
  RunRequest again =
      stopped_with_checkpoint([](nlohmann::json& info) { info["train"]["weight_decay"] = 5000; });
  Recorder rest;
  EXPECT_THAT_CONTAINS(test::error_of([&] { run_training(again, rest); }),
                       "[train] weight_decay = 5000 must be in [0, 1000] (in " +
                           info_path().string() +
                           "; a setting given with the resume replaces the file's)");
  again.train.optimizer.weight_decay = 0.01f;
  again.given = {{"weight_decay", "--weight-decay 0.01"}};
  again.force = true;
  EXPECT_TRUE(run_training(again, rest).finished);
}

// A setting the checkpoint lacks (written before the key existed) trained at its default: given
// otherwise, it is a change to insist on, and with force the run takes it.
TEST_F(RunDriver, ASettingTheCheckpointLacksIsAChangeFromItsDefault) {
  RunRequest again =
      stopped_with_checkpoint([](nlohmann::json& info) { info["train"].erase("clip"); });
  again.train.clip = 0.5f;
  again.given = {{"clip", "--clip 0.5"}};
  Recorder rest;
  EXPECT_THAT_CONTAINS(usage_error_of([&] { run_training(again, rest); }),
                       "--clip 0.5 (the checkpoint has 1.0)");
  again.force = true;
  EXPECT_TRUE(run_training(again, rest).finished);
  const auto resumed = nlohmann::json::parse(read(info_path()));
  EXPECT_EQ(resumed["train"]["clip"], 0.5);
}

TEST_F(RunDriver, SettingsTheRunNeverReadsAreRefused) {
  // Each a setting given for another optimizer, objective or schedule than the run's: refused
  // before anything is built or written, naming it as the caller wrote it.
  struct Case {
    std::function<void(TrainConfig&)> set;
    GivenSetting given;
    const char* why;
  };
  const std::vector<Case> cases = {
      {[](TrainConfig& t) {
         t.optimizer.kind = OptimizerKind::sgd;
         t.optimizer.beta1 = 0.8f;
       },
       {"beta1", "--beta1 0.8"},
       "[train] --beta1 0.8: an Adam setting, which the sgd optimizer does not read"},
      {[](TrainConfig& t) {
         t.optimizer.kind = OptimizerKind::sgd;
         t.optimizer.eps = 1e-6f;
       },
       {"eps", "eps = 1e-06"},
       "[train] eps = 1e-06: an Adam setting"},
      {[](TrainConfig& t) { t.optimizer.momentum = 0.9f; },
       {"momentum", "--momentum 0.9"},
       "an SGD setting, which the adamw optimizer does not read (its momentum is beta1)"},
      {[](TrainConfig& t) { t.mask_fraction = 0.2f; },
       {"mask_fraction", "--mask-fraction 0.2"},
       "a setting of the masked objective, which the causal objective does not read"},
      {[](TrainConfig& t) {
         t.decay = DecayKind::constant;
         t.min_lr_ratio = 0.2f;
       },
       {"min_lr_ratio", "--min-lr-ratio 0.2"},
       "the cosine decay's floor, which the constant decay does not read"},
  };
  rq_.out = (dir_ / "refused").string();
  for (const Case& c : cases) {
    RunRequest rq = rq_;
    c.set(rq.train);
    rq.given = {c.given};
    Recorder heard;
    EXPECT_THAT_CONTAINS(usage_error_of([&] { run_training(rq, heard); }), c.why);
    EXPECT_EQ(heard.starts, 0);
  }
  EXPECT_FALSE(fs::exists(dir_ / "refused"));
  // At its default a setting changes nothing: a run's stored settings, every key of them, can
  // be given back (momentum 0 under adamw, the default mask fraction under causal).
  {
    RunRequest replay = rq_;
    replay.out.clear();
    const nlohmann::json stored = train_config_to_json(replay.train);
    for (auto it = stored.begin(); it != stored.end(); ++it)
      replay.given.push_back({it.key(), it.key() + " = " + it.value().dump()});
    Recorder heard;
    EXPECT_TRUE(run_training(replay, heard).finished);
  }
  // The same settings read by the mode they belong to are taken.
  rq_.train.optimizer.kind = OptimizerKind::sgd;
  rq_.train.optimizer.momentum = 0.9f;
  rq_.given = {{"momentum", "--momentum 0.9"}};
  Recorder sgd;
  EXPECT_TRUE(run_training(rq_, sgd).finished);

  // Resumed, the checkpoint's optimizer decides (not the request's, which gives no optimizer),
  // and force does not make a setting read.
  RunRequest again = rq_;
  again.resume = again.out;
  again.out.clear();
  again.force = true;
  again.train.optimizer.kind = OptimizerKind::adamw;
  again.train.optimizer.beta2 = 0.99f;
  again.given = {{"beta2", "--beta2 0.99"}};
  Recorder r;
  EXPECT_THAT_CONTAINS(usage_error_of([&] { run_training(again, r); }),
                       "[train] --beta2 0.99: an Adam setting, which the sgd optimizer");

  // A sample: not of a masked model; its prompt's bytes within the vocabulary, before training.
  RunRequest masked = rq_;
  masked.out = (dir_ / "masked").string();
  masked.given.clear();
  set_objective_keys(masked.model, Objective::masked);
  masked.train.objective = Objective::masked;
  masked.sample = 20;
  masked.sample_given = true;
  Recorder m;
  EXPECT_THAT_CONTAINS(usage_error_of([&] { run_training(masked, m); }),
                       "[train] --sample: a masked (bidirectional) model fills bytes in");
  RunRequest prompt = rq_;
  prompt.out = (dir_ / "prompt").string();
  prompt.given.clear();
  prompt.model.vocab = 128;
  prompt.sample = 20;
  prompt.prompt = "\xc3\xa9";
  Recorder p;
  EXPECT_THAT_CONTAINS(usage_error_of([&] { run_training(prompt, p); }),
                       "[train] the sample's prompt holds byte 195, outside the model's vocab "
                       "= 128: give another --prompt (the default is a newline) or --sample 0");
  EXPECT_EQ(m.starts + p.starts, 0);
}

TEST_F(RunDriver, UtilisationIsTheOneFormulaAtTheMeasuredExperts) {
  rq_.measure_bare = true;
  Recorder heard;
  const RunOutcome r = run_training(rq_, heard);
  ASSERT_GT(r.bare.gflops(), 0);
  const double expected = run_matrix_gflops(r.bare, r.routing["experts_per_token"].get<double>(),
                                            static_cast<double>(rq_.train.batch * rq_.train.seq),
                                            r.median_tokens_per_second);
  EXPECT_EQ(r.matrix_gflops, expected);
  EXPECT_EQ(r.summary["utilisation"]["matrix_gflops_per_second"].get<double>(), expected);
}

}  // namespace

// A file-system exception that reaches a front end, in the words both front ends print: the path
// and the system's reason, and whether the path led nowhere (refused input: exit 1, Python's
// FileNotFoundError) or the system failed (exit 3).
TEST(Files, AFilesystemErrorNamesItsPathsAndWhoseFaultItIs) {
  using fs_error = std::filesystem::filesystem_error;
  const fs_error missing("stat", "/no/such",
                         std::make_error_code(std::errc::no_such_file_or_directory));
  EXPECT_EQ(filesystem_error_text(missing), "[io] '/no/such': No such file or directory");
  EXPECT_TRUE(path_leads_nowhere(missing));
  const fs_error denied("rename", "/a", "/b", std::make_error_code(std::errc::permission_denied));
  EXPECT_EQ(filesystem_error_text(denied), "[io] '/a' and '/b': Permission denied");
  EXPECT_FALSE(path_leads_nowhere(denied));
  for (const auto code : {std::errc::not_a_directory, std::errc::too_many_symbolic_link_levels,
                          std::errc::filename_too_long})
    EXPECT_TRUE(path_leads_nowhere(fs_error("open", "/x", std::make_error_code(code))));
  EXPECT_FALSE(path_leads_nowhere(
      fs_error("write", "/x", std::make_error_code(std::errc::no_space_on_device))));
}
