// The study's scale, shared state, one training run, and run_study: the stages of the table in
// order, then the figures, the report and results.json, all in a staged folder.
#include "ffnlab/study/study.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <variant>

#include "check.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/failure.hpp"
#include "ffnlab/interrupt.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/io/json_text.hpp"
#include "ffnlab/layers/moe_ffn.hpp"
#include "ffnlab/report/figure.hpp"
#include "ffnlab/report/markdown.hpp"
#include "ffnlab/report/staged_dir.hpp"
#include "ffnlab/train/run.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

std::vector<std::string> default_variants(bool full) {
  if (full) return variant_names();
  return {"relu", "gelu", "glu", "swiglu", "gated", "moe"};
}

std::vector<std::string> study_variants(const Options& options) {
  std::vector<std::string> v =
      options.variants.empty() ? default_variants(options.full) : options.variants;
  std::stable_partition(v.begin(), v.end(), [](const std::string& s) { return s == "relu"; });
  return v;
}

Scale make_scale(const Options& o) {
  Scale s;
  // The study's LM: the reference configuration, measured against PyTorch (docs/training.md).
  // It is the size "s" of the ladder that --sizes picks from (scaling.cpp).
  const auto own = std::find_if(size_ladder(o.quick).begin(), size_ladder(o.quick).end(),
                                [](const ModelSize& m) { return m.name == "s"; });
  s.model.d_model = own->d_model;
  s.model.layers = own->layers;
  s.model.heads = own->heads;
  s.model.ffn = study_ffn("relu", s.model.d_model);  // the reference; each run sets its own
  s.train.seq = o.quick ? 32 : 128;
  s.model.context = s.train.seq;
  s.train.batch = o.quick ? 8 : 16;
  // 600 steps: by then every variant is past the loss plateau of early training (at 400 the runs
  // are still leaving it, at different steps per seed, and the seeds spread accordingly).
  s.train.steps = o.steps > 0 ? o.steps : (o.quick ? 40 : 600);
  // A quarter of the steps: with a tenth (50 of 600), the MoE LM stalls on most seeds (layer 0's
  // attention grows large and sharp early and drowns the byte's own embedding;
  // docs/results-training.md).
  s.train.warmup = s.train.steps / 4;
  s.train.eval_every = std::max<std::int64_t>(1, s.train.steps / 4);
  s.eval_tokens = o.quick ? 2048 : 16384;
  s.train.eval_tokens = s.eval_tokens;
  s.census_tokens = o.quick ? 2048 : 65536;
  s.validation_tokens = o.quick ? 32768 : 0;
  // The sequential design of the comparisons against ReLU: 3 paired seeds, then one more per
  // round while a comparison is undecided, up to 6. Paired differences to ReLU spread by
  // 0.015–0.03 bits/byte between seeds (docs/evolve.md); at 6 seeds the design decides a
  // difference of 2.97 paired standard deviations over √6 (its last bound on |t|):
  // 0.03 at a spread of 0.025 (2.97 × 0.025 / √6). The cap keeps the default run near 45 minutes
  // on 2 cores.
  s.seeds = o.seeds > 0 ? o.seeds : (o.quick ? 2 : 3);
  s.design.cap = std::max(s.seeds, o.max_seeds > 0 ? o.max_seeds : (o.quick ? 3 : 6));
  // The first look needs two seeds (an interval); with --seeds 1 the second seed comes before it,
  // unless the cap is 1 (one seed, no interval, no look).
  s.design.first = std::min(std::max(s.seeds, 2), s.design.cap);
  // One seed of each routing family by default: they add a run a seed for each causal family but
  // top-k (and, with --full, one for every family on the masked objective); --full trains the
  // study's seeds.
  s.routing_seeds = o.routing_seeds > 0 ? o.routing_seeds : (o.full ? s.seeds : 1);
  s.toy_seeds = o.quick ? 2 : 5;
  s.toy_iterations = o.quick ? 20 : 100;
  s.speed_budget = o.quick ? 0.02 : 0.3;
  s.speed_tokens = o.quick ? 64 : 2048;
  s.sweep_ratios = {1, 2, 4, 8};
  return s;
}

bool Study::has_variant(std::string_view v) const {
  return std::find(options.variants.begin(), options.variants.end(), v) != options.variants.end();
}

void Study::stage(const std::string& what) const {
  check_stop();
  message(fmt::format("== {}", what));
}

void Study::message(const std::string& line) const {
  if (observer) observer->message(line);
}

void Study::step_done(const StepLog& s, const std::string& what, std::int64_t steps) {
  done_steps += steps;
  // Runs go side by side, so the time per step is the wall time of training over the steps done.
  const double per_step =
      training_seconds / static_cast<double>(std::max<std::int64_t>(1, done_steps - kept_steps));
  // Evaluations and the stages after training add about a tenth to the steps' time.
  const double eta = 1.1 * per_step * static_cast<double>(planned_steps - done_steps);
  if (observer)
    observer->step(done_steps, planned_steps,
                   fmt::format("{} step {} loss {:.3f}", what, s.step, s.loss), eta);
}

void Study::write(const std::string& name, const std::string& text) const {
  write_file_atomic(dir + "/" + name, text.data(), text.size());
}

namespace {
// Called in a catch block: rethrows the exception in flight, a stop or an error (a full disk, a
// failed figure), of its own kind, with what it kept: the finished runs, which a resumed study
// takes instead of training them again. A usage error, or anything else, goes on as it is.
[[noreturn]] void rethrow_with_kept_runs(const RunStore& store, const Options& o) {
  try {
    throw;
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    const std::int64_t kept = store.size();
    if (kept == 0) throw;
    Failure::of(e).raise(
        {}, fmt::format("; the {} finished run{} kept in {}: {} continues from them", kept,
                        kept == 1 ? " is" : "s are", store.dir(), resume_call(o)));
  }
}
}  // namespace

void check_stop() {
  if (stop_requested())
    throw Interrupted(
        fmt::format("{}: the study stopped before its report (an earlier report in the "
                    "output folder is unchanged)",
                    stop_reason()));
}

FFNConfig study_ffn(const std::string& variant, std::int64_t D) {
  FFNConfig c = variant_config(variant, D, 4 * D, true);
  if (variant == "relu" || variant == "gelu") return c;
  if (c.kind == FFNKind::moe) {
    c.moe.aux_coef = kTrainAuxCoef;  // the usual coefficient (Switch, Mixtral)
    // ST-MoE's router z-loss at its coefficient: without it, two seeds in five of the
    // study's MoE LM end 0.045-0.11 bits/byte behind (docs/results-training.md; the MoE stage
    // measures it again as an ablation).
    c.moe.z_coef = 1e-3f;
  }
  const std::int64_t target = count_params(variant_config("relu", D, 4 * D, true));
  return match_params(c, target, /*active=*/false);
}

namespace {

// The census tokens (the first census_tokens of the validation part, in windows of the training
// sequence), one inference forward per batch; `visit(batch)` reads the layers after each.
template <typename Visit>
void census_forwards(const Study& st, TransformerLM& lm, Visit visit) {
  const auto val = st.corpus.validation();
  const std::int64_t S = st.scale.train.seq, B = st.scale.train.batch;
  const std::int64_t windows =
      std::min(window_count(val, S), std::max<std::int64_t>(1, st.scale.census_tokens / S));
  for (std::int64_t first = 0; first < windows; first += B) {
    const Batch b = sequential_batch(val, std::min(B, windows - first), S, first);
    lm.forward(b.ids, {}, S, false);
    visit(b);
  }
}

}  // namespace

std::vector<UnitSparsity> census(const Study& st, TransformerLM& lm) {
  std::vector<UnitSparsity> layers(static_cast<std::size_t>(lm.config().layers));
  census_forwards(st, lm, [&](const Batch&) {
    for (int l = 0; l < lm.config().layers; ++l) {
      if (const auto* moe = dynamic_cast<const MoEFFN*>(&lm.ffn(l)))
        add_expert_hidden(layers[l], moe->hidden(), moe->routing().offsets);
      else
        add_hidden(layers[l], lm.ffn(l).hidden());
    }
  });
  return layers;
}

std::vector<ExpertSpecialisation> expert_census(const Study& st, TransformerLM& lm) {
  std::vector<ExpertSpecialisation> layers(static_cast<std::size_t>(lm.config().layers));
  census_forwards(st, lm, [&](const Batch& b) {
    for (int l = 0; l < lm.config().layers; ++l) {
      const auto* moe = dynamic_cast<const MoEFFN*>(&lm.ffn(l));
      check(moe != nullptr, "[study] the expert census needs an MoE FFN in every layer");
      const Routing& r = moe->routing();
      layers[l].experts = r.experts;
      layers[l].add(r.taken(), r.k, b.ids, st.scale.train.seq);
    }
  });
  return layers;
}

namespace {

json sparsity_json(const std::vector<UnitSparsity>& layers) {
  json out = json::array();
  for (const UnitSparsity& s : layers)
    out.push_back({{"tokens", s.tokens},
                   {"values", s.values},
                   {"zeros", s.zeros},
                   {"near_zeros", s.near_zeros},
                   {"nonzero", s.nonzero},
                   {"clear", s.clear},
                   {"rows", s.rows}});
  return out;
}

std::vector<UnitSparsity> sparsity_from_json(const nlohmann::json& j) {
  std::vector<UnitSparsity> out;
  for (const auto& l : j) {
    UnitSparsity& s = out.emplace_back();
    s.tokens = l.at("tokens");
    s.values = l.at("values");
    s.zeros = l.at("zeros");
    s.near_zeros = l.at("near_zeros");
    s.nonzero = l.at("nonzero").get<std::vector<std::int64_t>>();
    s.clear = l.at("clear").get<std::vector<std::int64_t>>();
    s.rows = l.at("rows").get<std::vector<std::int64_t>>();
  }
  return out;
}

// The training stage's seed 1 of each variant: the census at initialisation and after
// training, and for the MoE variant which byte classes each expert takes.
class CensusProbe final : public RunProbe {
 public:
  CensusProbe(const Study& st, bool experts) : st_(st), experts_(experts) {}
  void start(TransformerLM& lm) override { init_ = census(st_, lm); }
  void end(TransformerLM& lm) override {
    trained_ = census(st_, lm);
    if (experts_) classes_ = expert_census(st_, lm);
  }
  nlohmann::json gathered() const override {
    nlohmann::json out{{"init", sparsity_json(init_)}, {"trained", sparsity_json(trained_)}};
    if (experts_) {
      nlohmann::json layers = nlohmann::json::array();
      for (const ExpertSpecialisation& e : classes_)
        layers.push_back({{"experts", e.experts}, {"counts", e.counts}});
      out["expert_classes"] = std::move(layers);
    }
    return out;
  }

 private:
  const Study& st_;
  bool experts_;
  std::vector<UnitSparsity> init_, trained_;
  std::vector<ExpertSpecialisation> classes_;
};

}  // namespace

std::unique_ptr<RunProbe> census_probe(const Study& st, const RunJob& job) {
  return std::make_unique<CensusProbe>(st, job.label == "moe");
}

void take_census(Study& st, const RunRecord& r) {
  const nlohmann::json& g = r.gathered;
  st.census_init[r.variant] = sparsity_from_json(g.at("init"));
  st.census_trained[r.variant] = sparsity_from_json(g.at("trained"));
  if (g.contains("expert_classes")) {
    st.expert_classes.clear();
    for (const auto& l : g.at("expert_classes")) {
      ExpertSpecialisation& e = st.expert_classes.emplace_back();
      e.experts = l.at("experts");
      e.counts = l.at("counts").get<std::vector<std::int64_t>>();
    }
  }
}

json to_json(const Results& r) {
  json out = json::object();
  for (const Stage& s : stages())
    if (json j = s.to_json(r); !j.is_null()) out[std::string(s.key)] = std::move(j);
  out["machine"] = {{"cpu", r.machine.cpu},     {"family", r.machine.family},
                    {"model", r.machine.model}, {"isa", r.machine.isa},
                    {"bf16", r.machine.bf16},   {"processors", r.machine.processors}};
  // The build: per-seed numbers move with it (float rounding), verdicts must not.
#ifdef FFNLAB_MARCH_NATIVE
  out["build"] = {{"march_native", true}};
#else
  out["build"] = {{"march_native", false}};
#endif
  out["threads"] = r.threads;
  out["ranks"] = r.ranks;
  out["quick"] = r.quick;
  out["full"] = r.full;
  out["seconds"] = r.seconds;
  json stage_seconds = json::object();
  for (const auto& [key, seconds] : r.stage_seconds) stage_seconds[key] = seconds;
  out["stage_seconds"] = std::move(stage_seconds);
  return out;
}

namespace {
std::string report_header(const Study& st) {
  const auto& o = st.options;
  std::string md = "# The evolution of the Transformer FFN, measured\n\n";
  const Sections sec(stages());
  md += fmt::format(
      "Written by `{}` in {} with {} OpenMP thread{}{} on {}. Every number below was "
      "computed or measured by this run: results.json holds them all, APPENDIX.md the long "
      "tables, and the CSV beside each figure its data. The language models train side by "
      "side, one thread each, so their numbers depend on the seed and the build, not on the "
      "thread count; only the measured times vary (the speeds of {}, the training tokens/s).\n\n",
      scale_call(o),
      // A resumed study's time is its own, not that of the runs it reused.
      elapsed(st.results.seconds) +
          (st.kept_runs > 0
               ? fmt::format(" (resumed with `{}`, reusing {} run{} already "
                             "trained)",
                             option_name(o, "--resume"), st.kept_runs, st.kept_runs == 1 ? "" : "s")
               : ""),
      st.results.threads, st.results.threads == 1 ? "" : "s",
      st.results.ranks > 1
          ? fmt::format(" and {} MPI ranks (the language models trained on all of them)",
                        st.results.ranks)
          : "",
      st.results.machine.describe(), sec.ref("speed"));
  if (!st.plan_why.empty())
    md += fmt::format("The seeds, steps and sizes above were chosen by `--budget`, for {}.\n\n",
                      st.plan_why);
  if (o.quick)
    md +=
        "**This is a --quick run:** small models and few steps, to check the pipeline; its "
        "training numbers say nothing about the variants.\n\n";
  return md;
}

// The figures a stage drew, each below its section's text with its caption.
std::string figures_of(const Study& st, const Stage& s) {
  std::string md;
  for (const Figure& f : s.figures)
    if (std::filesystem::exists(std::filesystem::path(st.dir) / (std::string(f.name) + ".png")))
      md += fmt::format("![{0}]({0}.png)\n\n*{0}.png: {1}.*\n\n", f.name, f.caption);
  return md;
}

bool blank(std::string_view text) {
  return text.find_first_not_of(" \n") == std::string_view::npos;
}

// The report and its appendix: each stage's section, its text then its figures; what a stage
// marks as detail (kDetails) goes to the appendix (APPENDIX.md), under the section it belongs to.
struct Rendered {
  std::string report, appendix;  // appendix empty: no stage had details
};

Rendered render_report(const Study& st) {
  const Sections sec(stages());
  Rendered out{report_header(st), ""};
  std::string_view appendix_title;
  for (const Stage& s : stages()) {
    const std::string body = s.markdown(st, sec);
    if (body.empty()) continue;
    const std::size_t cut = body.find(kDetails);
    const std::string main = body.substr(0, cut);
    const std::string figures = figures_of(st, s);
    if (!blank(main) || !figures.empty())
      out.report += sec.heading(s.key) + main + (blank(main) ? "" : "\n") + figures;
    if (cut == std::string::npos) continue;
    const std::string_view title = sec.title(s.key);
    if (title != appendix_title) {
      const bool numbered = s.numbered || s.section.empty();
      out.appendix += numbered ? fmt::format("## {}. {}\n\n", sec.number(s.key), title)
                               : fmt::format("## {}\n\n", title);
      appendix_title = title;
    }
    out.appendix += body.substr(cut + kDetails.size());
  }
  if (!out.appendix.empty()) {
    out.report +=
        "## Appendix\n\nThe long tables, the one-seed material and how each section was "
        "measured are in [APPENDIX.md](APPENDIX.md), under the section they belong to.\n";
    out.appendix =
        "# Appendix to the report: details\n\nThe long tables, the one-seed material and how "
        "each section of [REPORT.md](REPORT.md) was measured, under the section they belong to. "
        "results.json holds every number.\n\n" +
        out.appendix;
  }
  return out;
}

}  // namespace

void check_options(const Options& o) {
  if (o.variants.empty() ||
      std::find(o.variants.begin(), o.variants.end(), "relu") == o.variants.end())
    throw UsageError("[evolve] the variants must include relu: every comparison is against it");
  const auto known = variant_names();
  for (std::size_t i = 0; i < o.variants.size(); ++i) {
    const std::string& v = o.variants[i];
    if (std::find(known.begin(), known.end(), v) == known.end())
      throw UsageError(
          fmt::format("[evolve] variant '{}' is not one of {}", v, fmt::join(known, ", ")));
    if (std::find(o.variants.begin(), o.variants.begin() + static_cast<std::ptrdiff_t>(i), v) !=
        o.variants.begin() + static_cast<std::ptrdiff_t>(i))
      throw UsageError(fmt::format("[evolve] variant '{}' is listed twice", v));
  }
  // The numbers by their rows: a count in its range (0: the default), a real in (lo, hi].
  for (const OptionRow& row : option_rows()) {
    if (row.value == OptionRow::Value::count) {
      const std::int64_t n = std::visit(
          [&]<class T>(T Options::*field) -> std::int64_t {
            if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
              return static_cast<std::int64_t>(o.*field);
            else
              throw std::logic_error("a count row's field is not an integer");
          },
          row.field);
      if (n < 0 || n > static_cast<std::int64_t>(row.hi))
        throw UsageError(fmt::format("[evolve] {} = {} must be in [{}, {}] (0: the default)",
                                     argument_name(row.flag), n, static_cast<std::int64_t>(row.lo),
                                     static_cast<std::int64_t>(row.hi)));
    }
    if (row.value == OptionRow::Value::real) {
      const double x = o.*std::get<double Options::*>(row.field);
      if (!(x > row.lo && x <= row.hi))
        throw UsageError(fmt::format("[evolve] {} = {} must be in ({}, {}]",
                                     argument_name(row.flag), x, row.lo, row.hi));
    }
  }
  std::vector<std::string> ladder;
  for (const ModelSize& s : size_ladder(o.quick)) ladder.emplace_back(s.name);
  auto check_list = [](const std::vector<std::string>& given, const std::vector<std::string>& known,
                       std::string_view what) {
    for (std::size_t i = 0; i < given.size(); ++i) {
      if (std::find(known.begin(), known.end(), given[i]) == known.end())
        throw UsageError(fmt::format("[evolve] {} '{}' is not one of {}", what, given[i],
                                     fmt::join(known, ", ")));
      if (std::count(given.begin(), given.begin() + static_cast<std::ptrdiff_t>(i), given[i]) > 0)
        throw UsageError(fmt::format("[evolve] {} '{}' is listed twice", what, given[i]));
    }
  };
  check_list(o.sizes, ladder, "size");
  check_list(o.tasks, task_names(), "task");
  if (!(o.budget_seconds >= 0) || o.budget_seconds > option_row("--budget").hi)
    throw UsageError(
        fmt::format("[evolve] budget = {} s must be positive (0: none)", o.budget_seconds));
  if (o.resume && o.force)
    throw UsageError(fmt::format(
        "[evolve] {0} with {1}: {0} discards the runs that {1} would take; give one of them",
        option_name(o, "--force"), option_name(o, "--resume")));
  if (o.budget_seconds > 0 && o.resume)
    throw UsageError(fmt::format(
        "[evolve] {} with {}: the planner times this machine on every start and may choose "
        "other sizes, seeds or steps, whose runs the store does not hold; resume with what it "
        "chose (its first line, \"chosen for a budget of ...\", names the sizes, seeds and "
        "steps: give them as {}, {} and {})",
        option_name(o, "--budget"), option_name(o, "--resume"), option_name(o, "--sizes"),
        option_name(o, "--max-seeds"), option_name(o, "--steps")));
  // The seeds, as make_scale sets them from the options (--plan plans only what would run).
  const Scale scale = make_scale(o);
  if (o.max_seeds > 0 && o.max_seeds < scale.seeds)
    throw UsageError(fmt::format(
        "[evolve] max seeds = {} must not be below the seeds of the first "
        "look, {}{}",
        o.max_seeds, scale.seeds,
        o.seeds > 0 ? "" : fmt::format(" (the default; {} sets it)", option_name(o, "--seeds"))));
  if (scale.routing_seeds > scale.seeds)
    throw UsageError(fmt::format(
        "[evolve] routing seeds = {} must not exceed seeds = {}: the causal routing families are "
        "paired with the runs of the fine-grained MoE, which trains that many",
        scale.routing_seeds, scale.seeds));
}

std::string runs_dir(const Options& o) {
  if (!o.runs.empty()) return o.runs;
  std::filesystem::path out = std::filesystem::path(o.out).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "report/"
  return out.string() + ".runs";
}

Results run_study(const Options& options, Observer& observer, ProcessGroup* ranks,
                  double rank_timeout) {
  const auto t0 = std::chrono::steady_clock::now();
  Study st;
  st.options = options;
  st.options.variants = study_variants(options);
  check_options(st.options);
  st.scale = make_scale(options);
  st.observer = &observer;
  st.concurrent_runs = omp_get_max_threads();
  st.ranks = ranks;
  st.rank_timeout = rank_timeout;
  if (!gnuplot_available())
    throw Error(
        "[evolve] gnuplot is not on the PATH (Debian package gnuplot-nox; "
        "scripts/install-deps.sh installs it)");
  // The output place is checked (and staged) before anything is read or computed.
  // Refused in the caller's words: `--out` or Python's `out`.
  StagedDirectory out(options.out, {options.data},
                      options.front_end == FrontEnd::command_line
                          ? FolderOption{}
                          : FolderOption{"out", "out='report'"});
  check_output_apart(runs_dir(options), {options.data, options.out}, "evolve",
                     option_name(options, "--runs").c_str());
  check_run_store(options);
  st.corpus = load_corpus(options.data, kDefaultValFraction);
  // Checked before any stage runs, so that a corpus too small fails at once, not minutes in.
  check_corpus_holds(st.corpus, st.scale.train.seq);
  st.dir = out.path();
  if (options.budget_seconds > 0) {
    // The planner times the sizes on this machine and chooses what fits (plan.cpp).
    const int workers = st.concurrent_runs + (ranks != nullptr ? ranks->size() - 1 : 0);
    StudyPlan plan = plan_study(st.options, workers, st.corpus);
    st.options = plan.options;
    st.scale = plan.scale;
    st.plan_why = plan.why;
  }
  st.store = RunStore(runs_dir(options), options.resume, st.corpus.fingerprint);
  st.results.data = DataResult{st.corpus.source, st.corpus.fingerprint,
                               static_cast<std::int64_t>(st.corpus.files.size()),
                               static_cast<std::int64_t>(st.corpus.bytes.size()),
                               static_cast<std::int64_t>(st.corpus.validation().size())};
  st.results.threads = omp_get_max_threads();
  st.results.ranks = ranks != nullptr ? ranks->size() : 1;
  st.results.machine = this_machine();
  st.results.quick = options.quick;
  st.results.full = options.full;

  for (const Stage& s : stages()) st.planned_steps += s.planned_steps(st);
  observer.begin(st.planned_steps,
                 fmt::format("{} variants, {}{} × {} steps (at most {} training steps in all), "
                             "into {}",
                             st.options.variants.size(), seeds_text(st.scale.design),
                             st.scale.design.cap > st.scale.design.first
                                 ? " (more while a comparison is undecided)"
                                 : "",
                             st.scale.train.steps, st.planned_steps, out.final_path()));
  if (!st.plan_why.empty()) st.message("chosen for " + st.plan_why);
  try {
    using clock = std::chrono::steady_clock;
    for (const Stage& s : stages()) {
      const auto start = clock::now();
      s.run(st);
      if (!s.to_json(st.results).is_null())
        st.results.stage_seconds.emplace_back(
            s.key, std::chrono::duration<double>(clock::now() - start).count());
    }
    // What would decide what is still undecided: the seeds to give --max-seeds with --resume.
    if (const std::vector<std::string> open = undecided_comparisons(st); !open.empty()) {
      st.message(
          fmt::format("undecided against ReLU at the cap ({} seeds); a planning figure "
                      "each, for {} with {}:",
                      st.scale.design.cap, option_name(options, "--max-seeds"),
                      option_name(options, "--resume")));
      for (const std::string& line : open) st.message("  " + line);
    }
    st.stage("figures (gnuplot)");
    const auto start = clock::now();
    for (const Stage& s : stages())
      if (!s.to_json(st.results).is_null())
        for (const Figure& f : s.figures) f.draw(st);
    st.results.stage_seconds.emplace_back(
        "figures", std::chrono::duration<double>(clock::now() - start).count());
  } catch (...) {
    observer.end();
    rethrow_with_kept_runs(st.store, st.options);
  }
  observer.end();
  st.results.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  try {
    // (A path's bytes that are not UTF-8, the data's name, become U+FFFD, as in summary.json.)
    st.write("results.json", json_text(to_json(st.results), 2) + "\n");
    const Rendered report = render_report(st);
    st.write("REPORT.md", report.report);
    if (!report.appendix.empty()) st.write("APPENDIX.md", report.appendix);
    // The last look before the report replaces an earlier one: a stop that came during the
    // figures or the writing keeps the earlier report.
    check_stop();
  } catch (...) {
    rethrow_with_kept_runs(st.store, st.options);
  }
  out.commit();
  return st.results;
}

}  // namespace ffnlab::study
