// The study's plan before it runs: what each LM run will cost on this machine, how the runs fall
// into rounds, the wall time on a number of workers, and, with a budget, the sizes, seeds and
// steps that fit. The cost model is timed, not assumed: a few training steps of each size's
// ReLU LM on one thread (as every run trains), and an evaluation; each run's time is its size's,
// scaled by its FLOPs per token over ReLU's and by its steps.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <thread>

#include "check.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/interrupt.hpp"
#include "ffnlab/report/markdown.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

namespace {

// The stages that train nothing, as measured on a 2-core AVX2 EPYC (Zen 3): the toy run
// (about 50 s; quick 6 s), the speed stage (about 25 s a variant; quick 1.5 s) and the figures
// (2 s; quick 1 s). A small share of any study but a quick one.
double other_stages_seconds(const Options& o) {
  const auto variants = static_cast<double>(o.variants.size());
  return o.quick ? 7 + 1.5 * variants : 52 + 25 * variants;
}

struct Timing {
  double start_seconds = 0;       // building the model and its first step, beyond a step
  double step_seconds = 0;        // one training step
  double eval_token_seconds = 0;  // one evaluated token
};

// Times a size's ReLU LM on one thread: one warm-up step, then steps until 0.3 s (at least 2),
// then an evaluation of 4 batches.
Timing time_size(const LMConfig& model, const TrainConfig& settings, const Corpus& corpus) {
  Timing t;
  std::exception_ptr error;
  std::thread([&] {
    omp_set_num_threads(1);
    try {
      using clock = std::chrono::steady_clock;
      const auto built = clock::now();
      TransformerLM lm(model, 1);
      TrainConfig c = settings;
      c.steps = 1000000;
      c.eval_every = 0;
      Trainer trainer(lm, corpus, c);
      trainer.train_step();
      const double first = std::chrono::duration<double>(clock::now() - built).count();
      int steps = 0;
      const auto start = clock::now();
      double seconds = 0;
      while (steps < 2 || seconds < 0.3) {
        trainer.train_step();
        ++steps;
        seconds = std::chrono::duration<double>(clock::now() - start).count();
      }
      t.step_seconds = seconds / steps;
      t.start_seconds = std::max(0.0, first - t.step_seconds);
      const std::int64_t tokens = 4 * c.batch * c.seq;
      const auto eval_start = clock::now();
      trainer.evaluate(tokens);
      t.eval_token_seconds = std::chrono::duration<double>(clock::now() - eval_start).count() /
                             static_cast<double>(tokens);
    } catch (...) {
      error = std::current_exception();
    }
  }).join();
  if (error) std::rethrow_exception(error);
  return t;
}

// The predicted seconds of a run, from its size's timing.
double run_seconds(const Study& st, const RunJob& job, const Timing& timing,
                   const LMConfig& relu_model, std::int64_t validation_bytes) {
  const TrainConfig t = job.settings ? *job.settings : st.scale.train;
  const double flops = transformer_cost(job.model, t.seq).forward_flops /
                       transformer_cost(relu_model, t.seq).forward_flops;
  const double evaluated =
      static_cast<double>(t.eval_every > 0 ? (t.steps / t.eval_every) * t.eval_tokens : 0) +
      static_cast<double>(st.scale.validation_tokens > 0
                              ? std::min<std::int64_t>(st.scale.validation_tokens, validation_bytes)
                              : validation_bytes);
  return flops * (timing.start_seconds + static_cast<double>(t.steps) * timing.step_seconds +
                  evaluated * timing.eval_token_seconds);
}

// The wall time of one round: the runs handed out longest first, each to the worker that frees
// first (the study's queue).
double round_seconds(std::vector<double> runs, int workers) {
  std::sort(runs.begin(), runs.end(), std::greater<>());
  std::vector<double> load(static_cast<std::size_t>(std::max(1, workers)), 0.0);
  for (double r : runs) *std::min_element(load.begin(), load.end()) += r;
  return *std::max_element(load.begin(), load.end());
}

}  // namespace

void check_corpus_holds(const Corpus& corpus, std::int64_t seq) {
  const auto need = static_cast<std::size_t>(seq + 1);
  if (corpus.train().size() < need || corpus.validation().size() < need)
    throw Error(fmt::format(
        "[evolve] '{}' has {} bytes: its training part and its validation part (the last {:g} "
        "%) need at least {} bytes each (one sequence of {} and its next byte)",
        corpus.source, corpus.bytes.size(), 100 * corpus.val_fraction, need, seq));
}

namespace {

// Plans the study of `options` with the sizes' timings.
StudyPlan plan_with(const Options& options, const Corpus& corpus,
                    std::map<std::string, Timing>& timings) {
  StudyPlan plan;
  Study st;
  st.options = options;
  st.options.variants = study_variants(options);
  check_options(st.options);
  st.scale = make_scale(st.options);
  // (the corpus is read where it is, not copied into the study: the budget plans many times)
  const auto validation_bytes = static_cast<std::int64_t>(corpus.validation().size());
  check_corpus_holds(corpus, st.scale.train.seq);
  plan.options = st.options;
  plan.scale = st.scale;
  plan.other_seconds = other_stages_seconds(st.options);
  const SequentialDesign& design = st.scale.design;

  // Every size that trains: the study's own ("s") and the ladder's.
  std::vector<ModelSize> sizes =
      trains_scaling(st.options) ? scaling_sizes(st.options) : std::vector<ModelSize>{};
  if (std::none_of(sizes.begin(), sizes.end(), [](const ModelSize& s) { return s.name == "s"; }))
    for (const ModelSize& s : size_ladder(options.quick))
      if (s.name == "s") sizes.insert(sizes.begin(), s);
  std::sort(sizes.begin(), sizes.end(),
            [](const ModelSize& a, const ModelSize& b) { return a.d_model < b.d_model; });
  std::map<std::string, PlannedSize*> by_name;
  for (const ModelSize& s : sizes) {
    PlannedSize p;
    p.name = std::string(s.name);
    p.model = size_model(st.scale, s);
    const TrainConfig settings = size_settings(st.scale, s);
    p.steps = s.name == "s" ? st.scale.train.steps : settings.steps;
    if (!timings.contains(p.name)) {
      if (stop_requested())  // (each size's timing takes a second or more)
        throw Interrupted(stop_reason() + ": the plan stopped while it timed the sizes");
      timings[p.name] = time_size(p.model, settings, corpus);
    }
    p.step_seconds = timings[p.name].step_seconds;
    plan.sizes.push_back(std::move(p));
  }
  for (PlannedSize& p : plan.sizes) by_name[p.name] = &p;
  PlannedSize& own = *by_name.at("s");
  auto cost = [&](const RunJob& job, const std::string& size) {
    return run_seconds(st, job, timings.at(size), by_name.at(size)->model, validation_bytes);
  };
  {
    RunJob relu;
    relu.model = own.model;
    own.run_seconds = cost(relu, "s");
  }

  // The training stage's pool (its comparisons, MoE at equal compute, the routing families):
  // the first look's seeds, then at the cap one more seed a round for every comparison.
  const std::vector<std::string> labels = comparison_labels(st);
  auto own_job = [&](const std::string& label) {
    RunJob job;
    const auto axes = moe_axes_labels(st);
    if (std::find(axes.begin(), axes.end(), label) != axes.end()) return moe_axes_job(st, label, 1);
    job.model = st.scale.model;
    job.model.ffn = study_ffn(label, job.model.d_model);
    return job;
  };
  std::vector<double> first;
  for (int seed = 1; seed <= design.first; ++seed)
    for (const std::string& l : labels) first.push_back(cost(own_job(l), "s"));
  for (const RunJob& j : routing_jobs(st)) first.push_back(cost(j, "s"));
  own.runs_first += static_cast<int>(first.size());
  own.runs_cap += static_cast<int>(first.size());
  plan.first.push_back(first);
  plan.cap.push_back(first);
  for (int seed = design.first + 1; seed <= design.cap; ++seed) {
    std::vector<double> round;
    for (const std::string& l : labels) round.push_back(cost(own_job(l), "s"));
    own.runs_cap += static_cast<int>(round.size());
    plan.cap.push_back(std::move(round));
  }
  // The MoE stage's balancing runs (and with --full the z-loss ablation over the seeds the
  // training stage's MoE trained), then the ladder.
  if (moe_steps(st) > 0) {
    RunJob balancing = own_job("moe");
    balancing.settings = balancing_settings(st);
    std::vector<double> first_round(3, cost(balancing, "s")), cap_round = first_round;
    if (st.options.full) {
      first_round.insert(first_round.end(), static_cast<std::size_t>(design.first),
                         cost(own_job("moe"), "s"));
      cap_round.insert(cap_round.end(), static_cast<std::size_t>(design.cap),
                       cost(own_job("moe"), "s"));
    }
    own.runs_first += static_cast<int>(first_round.size());
    own.runs_cap += static_cast<int>(cap_round.size());
    plan.first.push_back(std::move(first_round));
    plan.cap.push_back(std::move(cap_round));
  }
  if (trains_scaling(st.options)) {
    std::vector<double> ladder_first;
    std::vector<std::vector<double>> ladder_rounds(
        static_cast<std::size_t>(design.cap - design.first));
    for (const ModelSize& s : scaling_sizes(st.options))
      for (const std::string& task : scaling_tasks(st.options)) {
        if (s.name == "s" && task == "causal") continue;  // the training stage's runs
        PlannedSize& p = *by_name.at(std::string(s.name));
        for (const std::string& l : scaling_labels(st, task)) {
          const double seconds = cost(scaling_job(st, s, task, l, 1), p.name);
          for (int seed = 1; seed <= design.first; ++seed) ladder_first.push_back(seconds);
          for (auto& round : ladder_rounds) round.push_back(seconds);
          p.runs_first += design.first;
          p.runs_cap += design.cap;
          if (l == "relu" && task == "causal") p.run_seconds = seconds;
          if (l == "relu" && p.run_seconds == 0) p.run_seconds = seconds;
        }
      }
    plan.first.push_back(ladder_first);
    plan.cap.push_back(ladder_first);
    for (auto& round : ladder_rounds) plan.cap.push_back(std::move(round));
  }
  if (st.options.sweep) {
    std::vector<double> round;
    for (const RunJob& j : sweep_jobs(st)) round.push_back(cost(j, "s"));
    own.runs_first += static_cast<int>(round.size());
    own.runs_cap += static_cast<int>(round.size());
    plan.first.push_back(round);
    plan.cap.push_back(round);
  }
  return plan;
}

std::string duration_text(double seconds) {
  if (seconds < 10) return fmt::format("{:.1f} s", seconds);
  if (seconds < 90) return fmt::format("{:.0f} s", seconds);
  if (seconds < 90 * 60) return fmt::format("{:.0f} min", seconds / 60);
  if (seconds < 48 * 3600) return fmt::format("{:.1f} h", seconds / 3600);
  return fmt::format("{:.1f} days", seconds / 86400);
}

std::string choice_text(const StudyPlan& p) {
  std::vector<std::string> sizes;
  for (const PlannedSize& s : p.sizes) sizes.push_back(s.name);
  return fmt::format("sizes {}, {}, {} steps", fmt::join(sizes, ","), seeds_text(p.scale.design),
                     p.scale.train.steps);
}

// The core counts a plan gives the wall time for: this machine's workers, then each of `cores`
// but that one.
std::vector<int> wall_core_counts(int workers, const std::vector<int>& cores) {
  std::vector<int> all{workers};
  for (int c : cores)
    if (c != workers) all.push_back(c);
  return all;
}

}  // namespace

double StudyPlan::core_seconds(bool at_cap) const {
  double total = other_seconds;
  for (const auto& round : at_cap ? cap : first)
    for (double r : round) total += r;
  return total;
}

double StudyPlan::wall_seconds(int workers, bool at_cap) const {
  double total = other_seconds;
  for (const auto& round : at_cap ? cap : first) total += round_seconds(round, workers);
  return total;
}

StudyPlan plan_study(const Options& options, int workers) {
  return plan_study(options, workers,
                    load_corpus(options.data, kDefaultValFraction));  // as run_study
}

StudyPlan plan_study(const Options& options, int workers, const Corpus& corpus) {
  std::map<std::string, Timing> timings;
  if (!(options.budget_seconds > 0)) return plan_with(options, corpus, timings);
  // With a budget: the largest choice that ends within it even if no comparison decides before
  // the cap. Seeds come first (a verdict needs them), then sizes, then steps: the study's
  // default seeds with the largest ladder that fits; else fewer seeds at the cap; else, with
  // the study's LM alone and the fewest seeds, fewer steps (down to a quarter).
  const double budget = options.budget_seconds;
  const Scale defaults = make_scale(options);
  std::vector<std::vector<std::string>> ladders;
  if (!options.sizes.empty()) {
    ladders.push_back(options.sizes);
  } else {
    std::vector<std::string> ladder;
    for (const ModelSize& s : size_ladder(options.quick)) {
      ladder.emplace_back(s.name);
      if (s.name != "xs") ladders.insert(ladders.begin(), ladder);  // from xs,s up
    }
    ladders.push_back({});  // the study's LM alone
  }
  const int first = defaults.design.first;
  std::vector<int> caps;
  for (int cap = defaults.design.cap; cap >= first; --cap) caps.push_back(cap);
  std::vector<std::string> tried;
  auto fits = [&](Options o, StudyPlan& out) {
    out = plan_with(o, corpus, timings);
    const double wall = out.wall_seconds(workers, true);
    tried.push_back(fmt::format("{}: {}", choice_text(out), duration_text(wall)));
    return wall <= budget;
  };
  StudyPlan plan;
  for (int cap : caps)
    for (const auto& ladder : ladders) {
      // Seeds before sizes: below the study's cap, only the smallest ladder.
      if (cap != caps.front() && &ladder != &ladders.back()) continue;
      Options o = options;
      o.sizes = ladder;
      if (options.max_seeds == 0)
        o.max_seeds = cap;
      else if (cap != caps.front())
        continue;  // the cap was given
      if (fits(o, plan)) {
        plan.why = fmt::format(
            "a budget of {} on {} worker{}: {} ({} if no comparison decides before the cap, {} "
            "if every one decides at its first look){}",
            duration_text(budget), workers, workers == 1 ? "" : "s", choice_text(plan),
            duration_text(plan.wall_seconds(workers, true)),
            duration_text(plan.wall_seconds(workers, false)),
            tried.size() > 1 ? fmt::format("; larger choices did not fit: {}",
                                           fmt::join(tried.begin(), tried.end() - 1, "; "))
                             : "");
        return plan;
      }
    }
  const std::string smallest_at_full_steps = tried.empty() ? "" : tried.back();
  if (options.steps == 0)
    for (double share : {0.75, 0.5, 0.25}) {
      Options o = options;
      if (options.max_seeds == 0) o.max_seeds = first;
      o.steps = std::max<std::int64_t>(
          1, std::llround(share * static_cast<double>(defaults.train.steps)));
      if (fits(o, plan)) {
        plan.why = fmt::format(
            "a budget of {} on {} worker{}: {} ({} at the cap); with the study's {} steps even "
            "the smallest choice took longer ({}), and fewer steps leave the runs earlier in "
            "training",
            duration_text(budget), workers, workers == 1 ? "" : "s", choice_text(plan),
            duration_text(plan.wall_seconds(workers, true)), defaults.train.steps,
            smallest_at_full_steps);
        return plan;
      }
    }
  throw Error(fmt::format(
      "[evolve] a budget of {} on {} worker{} cannot hold the study: the smallest choice, {}, "
      "takes about {} (a larger {}, fewer {}{})",
      duration_text(budget), workers, workers == 1 ? "" : "s", choice_text(plan),
      duration_text(plan.wall_seconds(workers, true)), option_name(options, "--budget"),
      option_name(options, "--variants"),
      options.front_end == FrontEnd::command_line ? ", or more workers under mpirun" : ""));
}

std::string plan_text(const StudyPlan& p, int workers, const std::vector<int>& cores) {
  std::vector<std::vector<std::string>> rows;
  for (const PlannedSize& s : p.sizes)
    rows.push_back({s.name,
                    fmt::format("{} / {} / {}", s.model.d_model, s.model.layers, s.model.heads),
                    thousands(s.steps), fmt::format("{:.3f} s", s.step_seconds),
                    duration_text(s.run_seconds), fmt::format("{} to {}", s.runs_first, s.runs_cap),
                    // its runs at the first look and at the cap, each at about ReLU's time
                    fmt::format("{:.2f} to {:.2f}", s.runs_first * s.run_seconds / 3600,
                                s.runs_cap * s.run_seconds / 3600)});
  std::string out = p.why.empty() ? "" : "chosen for " + p.why + "\n\n";
  out += fmt::format("The study as planned: {}, tasks {}.\n\n", choice_text(p),
                     fmt::join(scaling_tasks(p.options), ","));
  out += markdown_table({"size", "d_model / layers / heads", "steps", "ReLU step (1 core)",
                         "ReLU run", "runs", "core-hours"},
                        rows, "lrrrrrr");
  out += fmt::format(
      "\nIn all: {:.2f} core-hours if every comparison decides at its first look, {:.2f} if none "
      "decides before the cap (with the stages that train nothing, about {}).\n",
      p.core_seconds(false) / 3600, p.core_seconds(true) / 3600, duration_text(p.other_seconds));
  out += "\n";
  std::vector<std::vector<std::string>> wall;
  for (int c : wall_core_counts(workers, cores))
    wall.push_back({fmt::format("{}{}", c, c == workers ? " (this machine)" : ""),
                    duration_text(p.wall_seconds(c, false)),
                    duration_text(p.wall_seconds(c, true))});
  out += markdown_table({"cores (one run each)", "first look", "at the cap"}, wall, "lrr");
  out +=
      "\nEach run trains on one core; the rounds of the sequential rule run one after another, "
      "so beyond as many cores as a round has runs, more cores do not help (the largest size's "
      "run sets the floor). Predictions come from steps timed on this machine: another CPU "
      "times its own (`ffnlab evolve --plan` there).\n";
  return out;
}

nlohmann::json plan_to_json(const StudyPlan& p, int workers, const std::vector<int>& cores) {
  nlohmann::json sizes = nlohmann::json::array();
  for (const PlannedSize& s : p.sizes)
    sizes.push_back({{"size", s.name},
                     {"d_model", s.model.d_model},
                     {"layers", s.model.layers},
                     {"heads", s.model.heads},
                     {"steps", s.steps},
                     {"relu_step_seconds", s.step_seconds},
                     {"relu_run_seconds", s.run_seconds},
                     {"runs_first_look", s.runs_first},
                     {"runs_at_cap", s.runs_cap}});
  nlohmann::json wall = nlohmann::json::array();
  for (int c : wall_core_counts(workers, cores))
    wall.push_back({{"cores", c},
                    {"this_machine", c == workers},
                    {"first_look", p.wall_seconds(c, false)},
                    {"at_cap", p.wall_seconds(c, true)}});
  // The arguments a budget chooses, as evolve takes them: given with the others in place of
  // the budget, they train this study (None for a list: the study's LM alone, causal only).
  const auto names = [](const std::vector<std::string>& list) {
    return list.empty() ? nlohmann::json(nullptr) : nlohmann::json(list);
  };
  return {{"arguments",
           {{"sizes", names(p.options.sizes)},
            {"tasks", names(p.options.tasks)},
            {"seeds", p.scale.seeds},
            {"max_seeds", p.scale.design.cap},
            {"steps", p.scale.train.steps}}},
          {"sizes", std::move(sizes)},
          {"core_hours",
           {{"first_look", p.core_seconds(false) / 3600}, {"at_cap", p.core_seconds(true) / 3600}}},
          {"other_seconds", p.other_seconds},
          {"wall_seconds", std::move(wall)},
          {"chosen", p.why},
          {"text", plan_text(p, workers, cores)}};
}

}  // namespace ffnlab::study
