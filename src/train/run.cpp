// The run driver: one training run from its request to its summary (run.hpp).
#include "ffnlab/train/run.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/failure.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/train/checkpoint.hpp"
#include "ffnlab/train/run_folder.hpp"

namespace ffnlab {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The checkpoint's training settings, except where the caller set one: a setting that differs
// from the checkpoint's changes the run, which needs force (`steps` sets the new total).
// A setting the caller gave that the run never reads (unread_setting) is refused: it is most
// likely meant for another optimizer, objective or schedule than the run's.
void refuse_unread_settings(const RunRequest& rq, const TrainConfig& train) {
  for (const GivenSetting& g : rq.given)
    if (const std::string why = unread_setting(train, g.key); !why.empty())
      throw UsageError(fmt::format("[train] {}: {}", g.as_written, why));
}

TrainConfig resumed_train(const RunRequest& rq, const ResumePoint& point) {
  std::vector<std::string> keys;
  for (const GivenSetting& g : rq.given) keys.push_back(g.key);
  std::vector<SettingChange> changes;
  TrainConfig merged = resumed_settings(point, rq.train, keys, changes);
  refuse_unread_settings(rq, merged);  // (before the changes: force would not make it read)
  std::string conflicts;
  for (const SettingChange& c : changes)
    for (const GivenSetting& g : rq.given)
      if (c.key == g.key)
        conflicts += fmt::format("{}{} (the checkpoint has {})", conflicts.empty() ? "" : "; ",
                                 g.as_written, c.saved.dump());
  if (!conflicts.empty() && !rq.force)
    throw UsageError(
        fmt::format("[train] resuming {} with other training settings: {}; {} to change them",
                    rq.resume, conflicts, rq.names.force));
  return merged;
}

// Why a run resumed with another number of steps will not equal an uninterrupted one ("" when it
// will): the checkpoint's steps took the rates of its own schedule, which a decaying schedule's
// length changes.
std::string schedule_note(const ResumePoint& point, const TrainConfig& train,
                          std::int64_t trained) {
  TrainConfig before = train;  // the checkpoint's schedule (its steps alone, when it cannot be
  try {                        // read as settings of today's ranges)
    before = train_config_from_json(point.info["train"]);
  } catch (const std::exception&) {
    before.steps = point.info["train"].value("steps", train.steps);
  }
  const Schedule was = schedule_of(before), is = schedule_of(train);
  const std::int64_t s = first_rate_change(was, is, trained);
  if (s < 0) return "";
  const std::string goes_on =
      trained < train.steps
          ? fmt::format(
                "the run goes on under the {}-step schedule (lr {:.3g} at step {}, after "
                "{:.3g} at step {}), so it will not equal {} uninterrupted steps",
                train.steps, is.lr(trained), trained + 1, was.lr(trained - 1), trained, train.steps)
          : fmt::format("so it is not the run {} uninterrupted steps give", train.steps);
  return fmt::format(
      "the checkpoint's {} steps followed a {}-step {} schedule, which from step {} on gave "
      "them other learning rates than a {}-step run's; {}",
      trained, before.steps, enum_name(before.decay), s + 1, train.steps, goes_on);
}

// What a resume onto another kind of optimizer state does ("" when the state is read): Adam's
// and AdamW's moments against SGD's momentum (Trainer::load starts the state afresh).
std::string optimizer_note(const ResumePoint& point, const TrainConfig& train) {
  const bool sgd = train.optimizer.kind == OptimizerKind::sgd;
  const std::string kind = other_optimizer_state(point.info["train"], sgd);
  if (kind.empty()) return "";
  return fmt::format(
      "the checkpoint's optimizer state is {}'s ({}), which {} does not read: {}", kind,
      kind == "sgd" ? "a momentum buffer" : "two moments", enum_name(train.optimizer.kind),
      sgd ? "its momentum buffer starts at zero"
          : "its moments start at zero, and its bias correction counts steps from 1 again");
}

// Whether the checkpoint was saved with these training settings (as written, so that a float
// read back compares equal).
bool checkpoint_holds_settings(const ResumePoint& point, const TrainConfig& train) {
  try {
    return train_settings_as_written(point.info["train"]) ==
           train_settings_as_written(train_config_to_json(train));
  } catch (const std::exception&) {  // settings of an older format: saved again, as they are now
    return false;
  }
}

// A resumed run must see the bytes it was trained on, split the same way (its batches are a
// function of them): other data is refused unless forced.
void check_same_data(const RunRequest& rq, const ResumePoint& point, const Corpus& corpus) {
  if (rq.force) return;
  const DataMismatch m = data_mismatch(point, corpus);
  if (m.what.empty()) return;
  if (m.split_only)
    throw UsageError(fmt::format(
        "[train] {}{}; {} to continue anyway", m.what,
        rq.names.val_fraction.empty() ? "" : fmt::format(" (another {}?)", rq.names.val_fraction),
        rq.names.force));
  throw UsageError(fmt::format("[train] {} {}; {} to continue on other data", rq.names.data, m.what,
                               rq.names.force));
}

// What an earlier run, or anything else under a run's own names (which a new run would remove
// or write over), left in `dir`: "an earlier run (a checkpoint at step N)", "'sample.txt', a
// name a run writes or removes", or "". A link counts as what it is, dangling or not.
std::string earlier_run(const std::string& dir) {
  const fs::path checkpoint = fs::path(dir) / "checkpoint";
  std::error_code ec;
  if (fs::exists(checkpoint / kCheckpointInfo, ec)) {
    try {
      return fmt::format("an earlier run (a checkpoint at step {})",
                         read_checkpoint_info(checkpoint.string())["step"].get<std::int64_t>());
    } catch (const std::exception&) {
      return "an earlier run (a checkpoint)";
    }
  }
  for (const std::string& name : run_file_names())
    if (fs::exists(fs::symlink_status(fs::path(dir) / name, ec)))
      return fmt::format("'{}', a name a run writes or removes", name);
  return "";
}

RunTraffic traffic_of(const ProcessGroup& group, const std::vector<const ProcessGroup*>& subgroups,
                      std::int64_t steps) {
  const double per = 1.0 / static_cast<double>(std::max<std::int64_t>(1, steps));
  RunTraffic t;
  double bytes = group.payload_bytes(), seconds = group.seconds_in_collectives();
  std::map<std::string, std::pair<double, double>> by = group.by_exchange();
  for (const ProcessGroup* g : subgroups) {
    bytes += g->payload_bytes();
    seconds += g->seconds_in_collectives();
    for (const auto& [what, v] : g->by_exchange()) {
      by[what].first += v.first;
      by[what].second += v.second;
    }
  }
  t.bytes_per_step = bytes * per;
  t.seconds_per_step = seconds * per;
  for (const auto& [what, v] : by) t.by_exchange[what] = {v.first * per, v.second * per};
  return t;
}

}  // namespace

HeldExperts held_by_this_rank(const LMConfig& model, const ProcessGroup& group, int expert_group) {
  const int P = group.size(), G = expert_group > 0 ? expert_group : P;
  if (model.ffn.kind != FFNKind::moe || !splits_experts(model.ffn.moe.routing)) return {};
  const int E = model.ffn.moe.num_experts;
  if (G == 1 || G > P || P % G != 0 || E % G != 0) return {};  // (G = 1: every rank holds all)
  return held_by_rank(E, G, group.rank() % G);
}

RunOutcome run_training(const RunRequest& rq, RunObserver& observer, TransformerLM* given_model) {
  ProcessGroup* const group = rq.parallel.group;
  const bool lead = group == nullptr || group->rank() == 0;
  const int ranks = group ? group->size() : 1;
  RunOutcome o;
  o.out = rq.out.empty() ? rq.resume : rq.out;
  o.model = given_model ? given_model->config() : rq.model;
  o.train = rq.train;

  // What each rank checks alone, before the ranks' first exchange (the settings, the folder, the
  // data): a rank that fails here fails every rank (fail_together_around).
  std::optional<ResumePoint> point;
  std::string data = rq.data;
  double val_fraction = rq.val_fraction;
  bool resumed_here = false;
  std::optional<Corpus> loaded;
  const Corpus* corpus_in_use = rq.corpus;
  fail_together_around(group, "run checks", kRankFailedItsChecks, [&] {
    // A resumed run: the checkpoint's model, settings and data, unless the caller set them.
    if (!rq.resume.empty()) {
      point = read_resume_point(rq.resume);
      if (!given_model) o.model = point->model;
      o.train = resumed_train(rq, *point);
      if (!rq.data_given) data = checkpoint_data_path(*point, data);
      if (!rq.val_fraction_given) val_fraction = checkpoint_val_fraction(*point, val_fraction);
    } else {
      refuse_unread_settings(rq, o.train);
    }
    // Without a folder (a library caller's run), what writes or overwrites one means nothing.
    if (o.out.empty()) {
      for (const GivenSetting& g : rq.given)
        if (g.key == "checkpoint_every" && o.train.checkpoint_every != 0)
          throw UsageError(fmt::format(
              "[train] {}: checkpoints are written into a run folder, and this run writes none "
              "(name one with {} or {})",
              g.as_written, rq.names.out, rq.names.resume));
      if (rq.force)
        throw UsageError(fmt::format(
            "[train] nothing to force: this run writes no folder (name one with {} or {})",
            rq.names.out, rq.names.resume));
    }
    // The sample's settings: a bidirectional (masked) model fills bytes in and draws no sample;
    // the prompt's bytes must be in the vocabulary (known now, not after the training).
    if (rq.sample_given && !o.model.causal)
      throw UsageError(fmt::format(
          "[train] {}: a masked (bidirectional) model fills bytes in; it draws no sample",
          rq.names.sample));
    // Continuing the run in its own folder (its logs go on), not into another one.
    // (A path that cannot be resolved is not the same folder: the checks below name it.)
    std::error_code resolve_a, resolve_b;
    resumed_here =
        point && !o.out.empty() &&
        fs::weakly_canonical(rq.resume, resolve_a) == fs::weakly_canonical(o.out, resolve_b) &&
        !resolve_a && !resolve_b;
    if (lead && !o.out.empty()) {
      check_writable_dir(o.out, "train");
      if (const std::string why = run_folder_conflict(o.out, data, rq.names.out, rq.names.data);
          !why.empty())
        throw UsageError(why);
      // Another run's folder is not written over unless asked: its logs, checkpoint and summary
      // would be lost, or mixed with this run's.
      if (rq.out_named && !resumed_here && !rq.force)
        if (const std::string held = earlier_run(o.out); !held.empty())
          throw UsageError(fmt::format(
              "[train] {} '{}' holds {}: resume it ({}), give another {}, or {} "
              "to start over in it",
              rq.names.out, o.out, held, rq.names.resume, rq.names.out, rq.names.force));
    }
    // A resumed run reads the data its checkpoint names unless given other: data that moved, or
    // whose name JSON could not keep (not UTF-8), is given again.
    const auto load = [&] {
      try {
        return load_corpus(data, val_fraction);
      } catch (const Error& e) {
        const Failure f = Failure::of(e);
        if (!point || rq.data_given || f.kind != Failure::Kind::input) throw;
        f.raise({},
                fmt::format(" (the data the checkpoint names: give it with {})", rq.names.data));
      }
    };
    if (!corpus_in_use) corpus_in_use = &loaded.emplace(load());
    const Corpus& corpus = *corpus_in_use;
    if (point) check_same_data(rq, *point, corpus);
    check_training_setup(o.model, corpus, o.train);
    // The sample's prompt within the vocabulary, known now rather than after the training.
    if (rq.sample > 0 && o.model.causal)
      for (const unsigned char c : rq.prompt)
        if (c >= o.model.vocab)
          throw UsageError(fmt::format(
              "[train] the sample's prompt holds byte {}, outside the model's vocab = {}: give "
              "another {} (the default is a newline) or {}",
              static_cast<int>(c), o.model.vocab, rq.names.prompt, rq.names.no_sample));
  });
  const Corpus& corpus = *corpus_in_use;

  // Expert parallel: this rank builds only its experts, of a layout checked first (a model that
  // would never split is not built, nor its memory counted).
  if (group) {  // ranks started alike first (else a rank's own layout error hides that)
    check_same_setup(*group, o.model, o.train, corpus, rq.parallel);
    check_parallel_layout(o.model.ffn, o.train.batch, group->size(), rq.parallel);
  }
  o.held = rq.parallel.expert_parallel && group
               ? held_by_this_rank(o.model, *group, rq.parallel.expert_group)
               : HeldExperts{};
  o.params = transformer_cost(o.model, 1).params;
  // Weights, gradients and the optimizer's state (Adam's two moments, SGD's one buffer): 16 or
  // 12 bytes a parameter, before any activation (checked for a caller's model too: its
  // optimizer state is allocated here).
  const bool sgd = o.train.optimizer.kind == OptimizerKind::sgd;
  const std::string state = sgd ? "SGD state" : "Adam state";
  const std::int64_t here = o.held.count > 0 ? held_params(o.model, o.held.count) : o.params;
  // (Each rank's own memory: a rank whose check fails, or that cannot build its model, fails
  // every rank.)
  std::optional<TransformerLM> built;
  const auto build = [&] {
    check_memory(
        (sgd ? 12.0 : 16.0) * static_cast<double>(here), "train",
        o.held.count > 0
            ? fmt::format("this rank's part of the model ({} of its {} parameters: the "
                          "dense part and {} experts a layer; weights, gradients, {})",
                          here, o.params, o.held.count, state)
            : fmt::format("a model of {} parameters (weights, gradients, {})", o.params, state));
    if (!given_model) built.emplace(o.model, o.train.seed, o.held);
  };
  fail_together_around(group, "run checks",
                       "[train] rank {} could not build its model (its message says why)", build);
  TransformerLM& model = given_model ? *given_model : *built;

  // Under mpirun this checks that the ranks agree (model, settings, data, the split of the
  // batch and of the experts) before any rank writes.
  Trainer trainer(model, corpus, o.train, rq.parallel);
  if (point) trainer.load(point->checkpoint_dir);
  o.first_step = o.step = trainer.step();
  if (point) {
    o.schedule_note = schedule_note(*point, o.train, trainer.step());
    if (const std::string n = optimizer_note(*point, o.train); !n.empty())
      o.schedule_note += (o.schedule_note.empty() ? "" : "; ") + n;
  }
  if (trainer.step() > o.train.steps)
    throw UsageError(fmt::format("[train] the checkpoint is at step {}, past {} {}", trainer.step(),
                                 rq.names.steps, o.train.steps));
  // (Rank 0 decides from its folder: the ranks take the same path, whose evaluation is
  // collective, whatever the others' folders hold.)
  // The folder's checkpoint may already be this run's last, its settings as they are now (a run
  // stopped between its last checkpoint and its summary): the run trains no step and leaves
  // that checkpoint as it is, as a save would only rewrite it. Another --steps or a forced
  // setting is saved.
  std::vector<std::int64_t> decided{
      lead && resumed_here && run_finished(o.out, trainer.step(), o.train.steps) ? 1 : 0,
      lead && resumed_here && trainer.step() == o.train.steps &&
              checkpoint_holds_settings(*point, o.train)
          ? 1
          : 0};
  if (group) group->allreduce_max(decided, "finished run");
  const bool already_finished = decided[0] != 0, checkpoint_is_last = decided[1] != 0;
  if (already_finished) {
    // A finished run, resumed in its own folder: nothing to train, and nothing of it changes.
    o.already_finished = o.finished = true;
    if (rq.validate_at_end) o.validation = trainer.evaluate(rq.validation_tokens);
    if (lead) o.summary = read_summary(o.out);  // as the run wrote it (null: unreadable)
    return o;
  }
  // Everything is checked: from here on, the output folder is written (rank 0 opens it and its
  // logs; a failure there fails every rank before the first step).
  std::optional<TrainLogs> logs;
  const auto open = [&] {
    if (!lead || o.out.empty()) return;
    open_run_folder(o.out, resumed_here);
    logs.emplace(o.out, resumed_here, trainer.step(), o.train.diagnostics_every > 0);
  };
  fail_together_around(group, "run checks",
                       "[train] rank {} could not open the run's folder (its message says why)",
                       open);
  const std::string checkpoint =
      o.out.empty() || checkpoint_is_last ? "" : (fs::path(o.out) / "checkpoint").string();
  // Model FLOP utilisation's yardstick: the bare products of this model's shapes, on this
  // rank's micro-batch, at the run's precision and threads; every rank times its own at once,
  // as the ranks of a step compute at once.
  // Then rank 0's observer hears that the run starts, once every rank has timed its products.
  // (Each rank's part alone: a rank that fails either fails every rank before the first step.)
  const std::int64_t sequences = o.train.batch / ranks;
  const char* const not_started = "[train] rank {} could not start the run (its message says why)";
  const auto time_products = [&] {
    if (rq.bare)
      o.bare = *rq.bare;
    else if (rq.measure_bare)
      o.bare = measure_model_products(o.model, sequences, o.train.seq, o.train.precision,
                                      kBareProductsBudget);
  };
  fail_together_around(group, "run checks", not_started, time_products);
  const auto start = [&] {
    if (lead)
      observer.started({o.model, o.train, corpus, o.params, trainer.step(), o.bare,
                        sequences * o.train.seq, o.held, o.schedule_note},
                       model);
  };
  fail_together_around(group, "run checks", not_started, start);
  const auto stop = [&] { return observer.stop(); };
  // The final validation: the last step's evaluation when it read the same tokens (Python's
  // train at its defaults: the whole validation part both times), else one more. An evaluation
  // is collective: every rank decides alike (from the same evaluations) and takes part.
  const auto validation = [&](const std::vector<EvalLog>& evaluations) {
    if (!evaluations.empty() && evaluations.back().step == trainer.step() &&
        o.train.eval_tokens == rq.validation_tokens)
      return evaluations.back();
    return trainer.evaluate(rq.validation_tokens);
  };
  if (!lead) {  // another rank: trains, and leaves the output to rank 0
    std::vector<EvalLog> evaluations;
    o.finished = trainer.run(
        {}, [&](const EvalLog& e) { evaluations.push_back(e); }, checkpoint, stop);
    o.step = trainer.step();
    if (o.finished && rq.validate_at_end) o.validation = validation(evaluations);
    return o;
  }

  std::vector<EvalLog> evaluations;
  o.finished = trainer.run(
      [&](const StepLog& s) {
        if (logs) logs->add(s);
        o.steps.push_back(s);
        o.steps.back().layers.clear();  // (the diagnostics are in their log and with the caller)
        observer.step(s, model);
      },
      [&](const EvalLog& e) {
        if (logs) logs->add(e);
        evaluations.push_back(e);
        observer.evaluated(e);
      },
      checkpoint, stop);
  o.step = trainer.step();
  if (!o.finished) return o;
  if (group)
    o.traffic = traffic_of(*group, trainer.plan().subgroups(), trainer.step() - o.first_step);

  o.last_step_stats = trainer.last_step_stats();
  o.routing = routing_summary(o.steps, o.last_step_stats);
  // (Before the sample, which rank 0 draws alone: the other ranks wait in this evaluation.)
  if (rq.validate_at_end) o.validation = validation(evaluations);

  std::vector<double> tps;
  for (const StepLog& s : o.steps) tps.push_back(s.tokens_per_second);
  o.median_tokens_per_second = tps.empty() ? 0 : median(tps);
  // The matrix work of the median step, per rank: its FLOPs per token at the tokens a rank ran,
  // the experts' at the experts a token measured to take (top-p, ReLU routing, MoE++ and a
  // capacity take fewer than the closed form the products were timed at, or more).
  // (A dense model has no routing summary: its closed form counts, -1.)
  const double experts_per_token = o.routing.is_null() ? -1.0 : late_experts_per_token(o.steps);
  o.matrix_gflops =
      run_matrix_gflops(o.bare, experts_per_token, static_cast<double>(sequences * o.train.seq),
                        o.median_tokens_per_second / ranks);
  o.utilisation = flop_utilisation(o.matrix_gflops, o.bare.gflops());
  // Every evaluation of the run: those of the part before a resume (kept in eval_log.csv), then
  // this part's.
  o.evaluations = logs ? logs->earlier_evaluations() : std::vector<EvalLog>{};
  o.evaluations.insert(o.evaluations.end(), evaluations.begin(), evaluations.end());
  o.summary = summary_json({o.model, o.train, o.params, trainer.step(), o.median_tokens_per_second,
                            o.matrix_gflops, o.bare.gflops(), o.evaluations, o.sample, o.routing},
                           corpus);
  // The summary before the sample, which may take long: a run killed while it samples is
  // finished and summed up (a resume in its folder has nothing to do), not summed up again
  // later from its logs without this part's speed and routing.
  if (!o.out.empty()) write_summary(o.out, o.summary);
  if (rq.sample > 0 && o.model.causal && o.held.count > 0) {
    o.sample_skipped = "no rank holds every expert (expert parallel)";
  } else if (rq.sample > 0 && o.model.causal) {  // a masked model fills in; it does not generate
    // A stop while sampling cuts the sample short; the run is written whole all the same, and
    // the caller says it stopped.
    o.sample = sample_text(model, rq.prompt, rq.sample, rq.temperature, o.train.seed, stop);
    o.sample_stopped = static_cast<std::int64_t>(o.sample.size()) < rq.sample;  // only a stop
    o.summary["sample"] = o.sample;
    if (!o.out.empty()) {
      write_file_atomic((fs::path(o.out) / "sample.txt").string(), o.sample.data(),
                        o.sample.size());
      write_summary(o.out, o.summary);
    }
  }
  return o;
}

}  // namespace ffnlab
