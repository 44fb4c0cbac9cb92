// Stages "toy" and "training": the tutorial's toy run (each layer alone memorising 8 random
// vectors) over toy seeds, and the study proper: every variant trained as a byte-level LM at
// equal parameters over paired seeds (a seed gives every variant the same initialisation stream
// and the same batches), judged against ReLU by a rule stated in the report.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/report/markdown.hpp"
#include "ffnlab/train/toy.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

std::string verdict_text(Verdict v, std::string_view reference) {
  switch (v) {
    case Verdict::reference:
      return "reference";
    case Verdict::better:
      return fmt::format("better than {}", reference);
    case Verdict::worse:
      return fmt::format("worse than {}", reference);
    case Verdict::equivalent:
      return fmt::format("equivalent to {} within the margin", reference);
    case Verdict::inconclusive:
      return "inconclusive";
    case Verdict::one_seed:
      return "one seed: no spread to compare with";
  }
  return "?";
}

const VariantOutcome* TrainingResult::find(std::string_view variant) const {
  for (const auto& v : variants)
    if (v.variant == variant) return &v;
  return nullptr;
}

json interval_json(double low, double high) {
  if (std::isnan(low) || std::isnan(high)) return nullptr;
  return json::array({low, high});
}

std::vector<double> per_seed(const Study& st, std::string_view label, double RunRecord::*value) {
  std::vector<double> x;
  for (const auto* runs : {&st.runs, &st.axes_runs})
    for (const auto& r : *runs)
      if (r.variant == label) x.push_back(r.*value);
  return x;
}

namespace {

const std::vector<std::string> kToyVariants{"relu", "gelu", "glu", "gated", "moe"};
constexpr std::int64_t kToyD = 512, kToyF = 2048;

ToySummary summarise(const std::vector<ToyStep>& steps) {
  std::vector<double> g;
  for (const auto& s : steps) g.push_back(s.grad_norm);
  // Population std over iterations, as the tutorial's table reports it.
  return {steps.front().loss, steps.back().loss, 1.0 - steps.back().loss / steps.front().loss,
          mean(g), population_std(g)};
}

}  // namespace

void run_toy(Study& st) {
  st.stage("the tutorial's toy run (each layer alone memorising 8 random vectors)");
  ToyResult r;
  r.config.iterations = st.scale.toy_iterations;
  r.d_model = kToyD;
  r.d_ff = kToyF;
  r.seeds = st.scale.toy_seeds;
  std::string csv = "variant,iteration,loss,grad_norm\n";
  for (const std::string& v : kToyVariants) {
    st.message(fmt::format("  toy: {}, {} seeds × {} iterations", v, r.seeds, r.config.iterations));
    std::vector<double> last, drop, gmean;
    ToyVariant tv;
    tv.variant = v;
    for (int i = 0; i < r.seeds; ++i) {
      ToyConfig tc = r.config;
      tc.seed = 42 + static_cast<std::uint64_t>(i);
      const auto steps = ffnlab::run_toy(variant_config(v, kToyD, kToyF, true), tc, [] {
        check_stop();  // the study's stop, in the study's words
        return false;
      });
      const ToySummary s = summarise(steps);
      if (i == 0) {
        tv.first_seed = s;
        for (std::size_t k = 0; k < steps.size(); ++k)
          csv += fmt::format("{},{},{:.6f},{:.6f}\n", v, k + 1, steps[k].loss, steps[k].grad_norm);
      }
      last.push_back(s.last);
      drop.push_back(s.drop);
      gmean.push_back(s.grad_mean);
    }
    tv.final_loss_mean = mean(last);
    tv.final_loss_std = sample_std(last);
    tv.drop_mean = mean(drop);
    tv.drop_std = sample_std(drop);
    tv.grad_norm_mean_mean = mean(gmean);
    tv.grad_norm_mean_std = sample_std(gmean);
    r.variants.push_back(tv);
  }
  st.write("toy_loss.csv", csv);
  st.results.toy = std::move(r);
}

json toy_json(const Results& res) {
  return json_if(res.toy, [](const ToyResult& r) {
    json out;
    out["config"] = {{"d_model", r.d_model},
                     {"d_ff", r.d_ff},
                     {"batch", r.config.batch},
                     {"seq", r.config.seq},
                     {"dropout", r.config.dropout},
                     {"lr", r.config.lr},
                     {"iterations", r.config.iterations},
                     {"seeds", r.seeds}};
    for (const ToyVariant& v : r.variants) {
      const ToySummary& s = v.first_seed;
      out["variants"][v.variant] = {{"seed42",
                                     {{"initial_loss", s.first},
                                      {"final_loss", s.last},
                                      {"drop", s.drop},
                                      {"grad_norm_mean", s.grad_mean},
                                      {"grad_norm_std", s.grad_std}}},
                                    {"over_seeds",
                                     {{"final_loss_mean", v.final_loss_mean},
                                      {"final_loss_std", v.final_loss_std},
                                      {"drop_mean", v.drop_mean},
                                      {"drop_std", v.drop_std},
                                      {"grad_norm_mean_mean", v.grad_norm_mean_mean},
                                      {"grad_norm_mean_std", v.grad_norm_mean_std}}}};
    }
    return out;
  });
}

std::string toy_markdown(const Study& st, const Sections&) {
  if (!st.results.toy) return "";
  const ToyResult& r = *st.results.toy;
  std::vector<std::vector<std::string>> rows;
  for (const ToyVariant& v : r.variants) {
    const ToySummary& s = v.first_seed;
    rows.push_back(
        {v.variant, fixed(s.first, 4), fixed(s.last, 4), percent(s.drop), fixed(s.grad_mean, 4),
         fixed(s.grad_std, 4),
         fmt::format("{} ± {}", fixed(v.final_loss_mean, 4), fixed(v.final_loss_std, 4)),
         fmt::format("{} ± {}", fixed(v.grad_norm_mean_mean, 3), fixed(v.grad_norm_mean_std, 3))});
  }
  std::string md = "### The tutorial's toy run\n\n";
  md += fmt::format(
      "Each layer alone, Adam (lr {}) on one fixed batch of {} random vectors against random "
      "targets with MSE, dropout {} on the input, {} iterations, d_model {}, d_ff {} for "
      "every variant (so the variants differ in size). **It measures how fast a layer memorises "
      "8 random vectors, nothing about language.** Seed 42 is the tutorial's own; the last two "
      "columns are mean ± standard deviation over {} seeds (42 to {}).\n\n",
      r.config.lr, r.config.batch * r.config.seq, r.config.dropout, r.config.iterations, r.d_model,
      r.d_ff, r.seeds, 41 + r.seeds);
  md += markdown_table({"variant", "initial loss", "final loss", "drop", "mean grad norm",
                        "std grad norm", "final loss over seeds", "mean grad norm over seeds"},
                       rows, "lrrrrrrr");
  return md + "\n";
}

VariantOutcome paired_outcome(std::string name, std::vector<double> values,
                              const std::vector<double>& reference, double margin,
                              const SequentialDesign* design) {
  VariantOutcome o;
  o.variant = std::move(name);
  if (values.size() > reference.size()) values.resize(reference.size());
  o.val_bits_per_byte = std::move(values);
  std::vector<double> diff;
  for (std::size_t i = 0; i < o.val_bits_per_byte.size(); ++i)
    diff.push_back(o.val_bits_per_byte[i] - reference[i]);
  o.mean = mean(o.val_bits_per_byte);
  o.std = sample_std(o.val_bits_per_byte);
  o.diff_mean = mean(diff);
  o.diff_std = sample_std(diff);
  const PairedComparison c =
      design ? compare_sequential(diff, margin, *design) : compare_paired(diff, margin);
  o.diff_low = c.ci95.low;
  o.diff_high = c.ci95.high;
  o.diff_low90 = c.ci90.low;
  o.diff_high90 = c.ci90.high;
  o.level = c.ci95.level;
  o.equivalence_level = c.ci90.level;
  if (design) o.sequential_seeds = static_cast<int>(diff.size());
  switch (c.verdict) {
    case Comparison::better:
      o.verdict = Verdict::better;
      break;
    case Comparison::worse:
      o.verdict = Verdict::worse;
      break;
    case Comparison::equivalent:
      o.verdict = Verdict::equivalent;
      break;
    case Comparison::inconclusive:
      o.verdict = Verdict::inconclusive;
      o.seeds_to_decide =
          design ? values_to_decide(diff, margin, *design) : values_to_decide(diff, margin);
      break;
    case Comparison::one_value:
      o.verdict = Verdict::one_seed;
      break;
  }
  return o;
}

void set_throughput(VariantOutcome& o, const std::vector<double>& tokens_per_second,
                    const std::vector<double>& reference_tokens_per_second, bool reference) {
  if (tokens_per_second.empty()) return;
  o.tokens_per_second = median(tokens_per_second);
  const double reference_median = median(reference_tokens_per_second);
  // The ratio to the reference run of the same seed, per seed; for the reference itself, its
  // runs against their median (the same noise test).
  std::vector<double> ratio;
  for (std::size_t i = 0; i < tokens_per_second.size(); ++i) {
    const double base = reference                                ? reference_median
                        : i < reference_tokens_per_second.size() ? reference_tokens_per_second[i]
                                                                 : 0.0;
    if (base > 0) ratio.push_back(tokens_per_second[i] / base);
  }
  if (ratio.empty() || !(reference_median > 0)) return;
  o.tokens_per_second_over_relu = reference ? 1.0 : o.tokens_per_second / reference_median;
  const auto [lo, hi] = std::minmax_element(ratio.begin(), ratio.end());
  const double mid = median(ratio);
  o.tokens_per_second_spread = mid > 0 ? (*hi - *lo) / mid : 0.0;
  o.tokens_per_second_noisy = o.tokens_per_second_spread > kMaxSpread;
  if (!reference) {
    o.tokens_per_second_ratio_low = *lo;
    o.tokens_per_second_ratio_high = *hi;
  }
}

std::string tokens_per_second_cell(const VariantOutcome& o) {
  const std::string n = thousands(static_cast<std::int64_t>(o.tokens_per_second));
  if (o.tokens_per_second_noisy)
    return fmt::format("{} (noisy: spread {} over seeds)", n,
                       percent(o.tokens_per_second_spread, 0));
  return fmt::format("{} ({:.2f}×)", n, o.tokens_per_second_over_relu);
}

std::string utilisation_cell(double utilisation) {
  return std::isnan(utilisation) ? "not measured" : percent(utilisation);
}

std::string verdict_cell(const VariantOutcome& o) {
  std::string cell(verdict_text(o.verdict));
  if (o.sequential_seeds > 0 && o.verdict != Verdict::reference && o.verdict != Verdict::one_seed) {
    if (o.verdict == Verdict::inconclusive)
      cell = fmt::format("inconclusive at the cap of {} seeds", o.sequential_seeds);
    else
      cell += fmt::format(" (decided at {} seeds{})", o.sequential_seeds,
                          o.holds_for_all_comparisons ? "" : "; not across all comparisons");
    if (o.narrow_by_chance) cell += "; narrow by chance";
    return cell;
  }
  if (o.verdict != Verdict::inconclusive || o.seeds_to_decide == 0) return cell;
  if (o.seeds_to_decide > 1000) return "inconclusive (the spread hides any difference)";
  return fmt::format("inconclusive (about {} seeds would decide it)", o.seeds_to_decide);
}

std::string difference_cell(const VariantOutcome& o) {
  if (o.verdict == Verdict::one_seed) return fmt::format("{:+.4f}", o.diff_mean);
  return fmt::format("{:+.4f} [{:+.4f}, {:+.4f}]", o.diff_mean, o.diff_low, o.diff_high);
}

std::int64_t training_steps(const Study& st) {
  // At most: every variant to the design's cap (the plan shrinks as comparisons are decided).
  return st.scale.train.steps * st.scale.design.cap *
         static_cast<std::int64_t>(st.options.variants.size());
}

std::vector<std::string> comparison_labels(const Study& st) {
  std::vector<std::string> labels{"relu"};
  for (const auto& v : st.options.variants)
    if (v != "relu") labels.push_back(v);
  for (const auto& a : moe_axes_labels(st)) labels.push_back(a);
  return labels;
}

namespace {

bool is_axes_label(const Study& st, const std::string& label) {
  const auto axes = moe_axes_labels(st);
  return std::find(axes.begin(), axes.end(), label) != axes.end();
}

// The paired differences to ReLU of a comparison, at the seeds both have.
std::vector<double> differences(const Study& st, const std::string& label) {
  const std::vector<double> v = per_seed(st, label, &RunRecord::val_bits_per_byte);
  const std::vector<double> relu = per_seed(st, "relu", &RunRecord::val_bits_per_byte);
  std::vector<double> d;
  for (std::size_t i = 0; i < v.size() && i < relu.size(); ++i) d.push_back(v[i] - relu[i]);
  return d;
}

// The paired spread of the run's comparisons but `label`, pooled.
double pooled_spread(const Study& st, const std::string& except) {
  std::vector<std::vector<double>> d;
  for (const std::string& l : comparison_labels(st))
    if (l != "relu" && l != except) d.push_back(differences(st, l));
  return pooled_paired_spread(d);
}

// The training stage's run of a variant for a seed; seed 1 also takes the activation census
// before and after training (take_census reads it).
RunJob variant_job(const Study& st, const std::string& v, int seed) {
  RunJob job;
  job.model = st.scale.model;
  job.model.ffn = study_ffn(v, job.model.d_model);
  job.seed = static_cast<std::uint64_t>(seed);
  job.label = v;
  job.utilisation = true;
  if (seed == 1) job.probe = Probe::census;
  return job;
}

// Trains one round's runs in one pool, the longest first (MoE at equal compute and the routing
// families, then the dense runs, the cheaper MoE at equal parameters last), so that the two
// cores stay busy to the end. The order changes no run's numbers (train_runs), only when each
// starts. Each record goes to its stage's list: the training stage's, the moe_axes stage's or
// (`routing` of them, the last jobs) the routing stage's.
void train_round(Study& st, std::vector<RunJob> jobs, std::size_t routing) {
  const std::size_t own = jobs.size() - routing;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    if (i >= own || is_axes_label(st, jobs[i].label)) order.push_back(i);
  for (int moe_last = 0; moe_last < 2; ++moe_last)
    for (std::size_t i = 0; i < own; ++i)
      if (!is_axes_label(st, jobs[i].label) &&
          (jobs[i].model.ffn.kind == FFNKind::moe) == (moe_last == 1))
        order.push_back(i);
  std::vector<RunJob> pool;
  for (std::size_t i : order) pool.push_back(std::move(jobs[i]));
  std::vector<RunRecord> trained = train_runs(st, std::move(pool));
  std::vector<RunRecord> records(order.size());
  for (std::size_t k = 0; k < order.size(); ++k) records[order[k]] = std::move(trained[k]);
  for (std::size_t i = 0; i < records.size(); ++i) {
    const bool variant = i < own && !is_axes_label(st, records[i].variant);
    if (variant && !records[i].gathered.is_null()) take_census(st, records[i]);
    (i >= own  ? st.routing_runs
     : variant ? st.runs
               : st.axes_runs)
        .push_back(std::move(records[i]));
  }
}

}  // namespace

double pooled_paired_spread(const std::vector<std::vector<double>>& differences) {
  double squares = 0, dof = 0;
  for (const std::vector<double>& d : differences) {
    if (d.size() < 2) continue;
    const double s = sample_std(d);
    squares += s * s * static_cast<double>(d.size() - 1);
    dof += static_cast<double>(d.size() - 1);
  }
  return dof > 0 ? std::sqrt(squares / dof) : 0.0;
}

VariantOutcome sequential_outcome(std::string label, std::vector<double> values,
                                  const std::vector<double>& relu, double margin,
                                  const SequentialDesign& design, double others_spread,
                                  int comparisons) {
  VariantOutcome o = paired_outcome(std::move(label), std::move(values), relu, margin, &design);
  std::vector<double> d;
  for (std::size_t i = 0; i < o.val_bits_per_byte.size() && i < relu.size(); ++i)
    d.push_back(o.val_bits_per_byte[i] - relu[i]);
  o.narrow_by_chance = narrow_by_chance(d, others_spread);
  // The same look's intervals with the error shared over every comparison (Bonferroni).
  SequentialDesign shared = design;
  shared.alpha = design.alpha / std::max(1.0, static_cast<double>(comparisons));
  const PairedComparison c = compare_sequential(d, margin, shared);
  o.holds_for_all_comparisons =
      (o.verdict == Verdict::better && c.verdict == Comparison::better) ||
      (o.verdict == Verdict::worse && c.verdict == Comparison::worse) ||
      (o.verdict == Verdict::equivalent && c.verdict == Comparison::equivalent);
  return o;
}

NextRound next_round(const std::vector<VariantOutcome>& outcomes, int relu_seeds,
                     const SequentialDesign& design) {
  NextRound next;
  int relu_needs = 0, relu_to = relu_seeds;
  for (const VariantOutcome& o : outcomes) {
    const int n = o.sequential_seeds;
    next.looked +=
        fmt::format("{}{} {}", next.looked.empty() ? "" : ", ", o.variant,
                    o.verdict == Verdict::inconclusive ? "undecided" : verdict_text(o.verdict));
    // One seed has no interval yet: the second comes before the first look.
    if ((o.verdict != Verdict::inconclusive && o.verdict != Verdict::one_seed) || n >= design.cap)
      continue;
    const int to = std::clamp(o.seeds_to_decide, std::max(n + 1, design.first), design.cap);
    next.planned_runs += to - n;
    relu_needs = std::max(relu_needs, to);
    next.runs.emplace_back(o.variant, n + 1);
    relu_to = std::max(relu_to, n + 1);
  }
  next.planned_runs += std::max(0, relu_needs - relu_seeds);
  for (int seed = relu_seeds + 1; seed <= relu_to; ++seed) next.runs.emplace_back("relu", seed);
  return next;
}

namespace {

std::string decide_text(const std::vector<double>& values, const std::vector<double>& relu,
                        double margin) {
  std::vector<double> d;
  for (std::size_t i = 0; i < values.size() && i < relu.size(); ++i)
    d.push_back(values[i] - relu[i]);
  const int n = values_to_decide(d, margin);
  if (n == 0) return "no spread to plan from";
  if (n > 1000) return "the spread hides any difference";
  return fmt::format("about {} seeds would decide it", n);
}

}  // namespace

std::vector<std::string> undecided_comparisons(const Study& st) {
  std::vector<std::string> out;
  if (!st.results.training) return out;
  const std::vector<double> relu = per_seed(st, "relu", &RunRecord::val_bits_per_byte);
  for (const std::string& l : comparison_labels(st)) {
    if (l == "relu") continue;
    const VariantOutcome o = comparison_outcome(st, l);
    if (o.verdict == Verdict::inconclusive)
      out.push_back(
          fmt::format("{}: {}", l, decide_text(o.val_bits_per_byte, relu, st.options.margin)));
  }
  if (const auto& s = st.results.scaling)
    for (const ScalingCell& c : s->cells) {
      if (c.from_training) continue;  // (above)
      for (const ScalingEntry& e : c.variants)
        if (e.outcome.verdict == Verdict::inconclusive)
          out.push_back(fmt::format(
              "{} at {}, {}: {}", e.outcome.variant, c.size, c.task,
              decide_text(e.outcome.val_bits_per_byte, c.variants.front().outcome.val_bits_per_byte,
                          st.options.margin)));
    }
  return out;
}

VariantOutcome comparison_outcome(const Study& st, const std::string& label) {
  const SequentialDesign& design = st.scale.design;
  const std::vector<double> relu = per_seed(st, "relu", &RunRecord::val_bits_per_byte);
  VariantOutcome o;
  if (label == "relu") {
    o = paired_outcome(label, per_seed(st, label, &RunRecord::val_bits_per_byte), relu,
                       st.options.margin);
    o.verdict = Verdict::reference;
    o.sequential_seeds = 0;
  } else {
    o = sequential_outcome(label, per_seed(st, label, &RunRecord::val_bits_per_byte), relu,
                           st.options.margin, design, pooled_spread(st, label),
                           static_cast<int>(comparison_labels(st).size() - 1));
  }
  set_throughput(o, per_seed(st, label, &RunRecord::median_tokens_per_second),
                 per_seed(st, "relu", &RunRecord::median_tokens_per_second), label == "relu");
  std::vector<double> utilisation;
  for (const auto* runs : {&st.runs, &st.axes_runs})
    for (const auto& r : *runs)
      if (r.variant == label)
        utilisation.push_back(flop_utilisation(r.matrix_gflops, r.bare_products_gflops));
  // NaN (not measured) when any run's is: a median must not hide a disturbed timing.
  o.flop_utilisation = utilisation.empty() ? NAN : median(utilisation);
  for (double u : utilisation)
    if (std::isnan(u)) o.flop_utilisation = NAN;
  return o;
}

void run_training(Study& st) {
  const SequentialDesign& design = st.scale.design;
  st.stage(fmt::format(
      "training {} variants{}, {} paired seeds each, then one more per round while a comparison "
      "with ReLU is undecided (at most {}), {} steps a run",
      st.options.variants.size(),
      st.has_variant("moe") ? " and MoE at equal compute, with the routing families" : "",
      design.first, design.cap, st.scale.train.steps));
  const std::vector<std::string> labels = comparison_labels(st);
  auto job_of = [&](const std::string& label, int seed) {
    return is_axes_label(st, label) ? moe_axes_job(st, label, seed) : variant_job(st, label, seed);
  };
  // The first look's seeds of every comparison, with the routing families' runs.
  std::vector<RunJob> jobs;
  for (int seed = 1; seed <= design.first; ++seed)
    for (const std::string& l : labels) jobs.push_back(job_of(l, seed));
  std::vector<RunJob> routing = routing_jobs(st);
  const std::size_t routing_count = routing.size();
  for (RunJob& j : routing) jobs.push_back(std::move(j));
  train_round(st, std::move(jobs), routing_count);

  // Then a round per look: one more seed for each undecided comparison below the cap (and for
  // ReLU, which every comparison pairs with).
  for (;;) {
    check_stop();
    std::vector<VariantOutcome> outcomes;
    for (const std::string& l : labels)
      if (l != "relu") outcomes.push_back(comparison_outcome(st, l));
    const int relu_has =
        static_cast<int>(per_seed(st, "relu", &RunRecord::val_bits_per_byte).size());
    const NextRound next = next_round(outcomes, relu_has, design);
    // The plan: the steps done, the stages after training, and the runs still planned.
    std::int64_t after = 0;
    for (const Stage& s : stages())
      if (s.key != "training" && s.key != "moe_axes" && s.key != "routing")
        after += s.planned_steps(st);
    st.planned_steps = st.done_steps + after + next.planned_runs * st.scale.train.steps;
    st.message(fmt::format("  look at {}: {}", counted(relu_has, "seed"), next.looked));
    if (next.runs.empty()) break;
    jobs.clear();
    for (const auto& [label, seed] : next.runs) jobs.push_back(job_of(label, seed));
    train_round(st, std::move(jobs), 0);
  }

  TrainingResult out;
  out.model = st.scale.model;
  out.train = st.scale.train;
  out.design = design;
  out.comparisons = static_cast<int>(labels.size()) - 1;
  out.pooled_spread = pooled_spread(st, "");
  out.margin = st.options.margin;
  out.validation_bytes = static_cast<std::int64_t>(st.corpus.validation().size());
  out.final_validation_tokens = st.scale.validation_tokens;
  for (const auto& v : st.options.variants) {
    VariantOutcome o = comparison_outcome(st, v);
    for (const auto& r : st.runs)
      if (r.variant == v) {
        o.d_ff = r.d_ff;
        o.params = r.params;
        break;
      }
    out.variants.push_back(std::move(o));
  }
  st.results.training = std::move(out);
}

json training_json(const Results& res) {
  return json_if(res.training, [](const TrainingResult& t) {
    json out;
    // The LM around the FFN; the FFN is each variant's (variants.<v>: d_ff, params).
    json model = lm_config_to_json(t.model);
    model.erase("ffn");
    out["config"] = {{"model", std::move(model)},
                     {"steps", t.train.steps},
                     {"batch", t.train.batch},
                     {"seq", t.train.seq},
                     {"lr", t.train.optimizer.lr},
                     {"warmup", t.train.warmup},
                     {"sequential",
                      {{"first_seeds", t.design.first},
                       {"max_seeds", t.design.cap},
                       {"alpha", t.design.alpha},
                       {"spending", "O'Brien-Fleming-type (Lan-DeMets)"},
                       {"comparisons", t.comparisons},
                       {"pooled_paired_spread", t.pooled_spread}}},
                     {"equivalence_margin", t.margin},
                     {"validation_bytes", t.validation_bytes},
                     {"final_validation_tokens", t.final_validation_tokens}};
    for (const VariantOutcome& o : t.variants)
      out["variants"][o.variant] = {
          {"d_ff", o.d_ff},
          {"params", o.params},
          {"val_bits_per_byte", o.val_bits_per_byte},
          {"mean", o.mean},
          {"std", o.std},
          {"paired_difference_to_relu_mean", o.diff_mean},
          {"paired_difference_to_relu_std", o.diff_std},
          // (ReLU against itself: no interval.)
          {"paired_difference_to_relu_ci95", o.verdict == Verdict::reference
                                                 ? json(nullptr)
                                                 : interval_json(o.diff_low, o.diff_high)},
          {"paired_difference_to_relu_ci90", o.verdict == Verdict::reference
                                                 ? json(nullptr)
                                                 : interval_json(o.diff_low90, o.diff_high90)},
          {"verdict", verdict_text(o.verdict)},
          {"seeds", o.val_bits_per_byte.size()},
          {"interval_levels", o.verdict == Verdict::reference
                                  ? json(nullptr)
                                  : json::array({o.level, o.equivalence_level})},
          {"holds_for_all_comparisons", o.holds_for_all_comparisons},
          {"narrow_by_chance", o.narrow_by_chance},
          {"seeds_to_decide", o.seeds_to_decide},
          {"median_tokens_per_second", o.tokens_per_second},
          {"tokens_per_second_over_relu", o.tokens_per_second_over_relu},
          {"tokens_per_second_spread", o.tokens_per_second_spread},
          {"tokens_per_second_noisy", o.tokens_per_second_noisy},
          {"model_flop_utilisation",
           std::isnan(o.flop_utilisation) ? json(nullptr) : json(o.flop_utilisation)}};
    return out;
  });
}

std::string training_markdown(const Study& st, const Sections& sec) {
  if (!st.results.training) return "";
  const TrainingResult& t = *st.results.training;
  std::vector<std::vector<std::string>> rows;
  // The verdicts in the section; each seed's value and the measured speed in the appendix.
  std::vector<std::vector<std::string>> per_seed_rows;
  for (const VariantOutcome& o : t.variants) {
    std::string seeds;
    for (double b : o.val_bits_per_byte) seeds += (seeds.empty() ? "" : ", ") + fixed(b, 3);
    rows.push_back({o.variant, thousands(o.d_ff), thousands(o.params),
                    // (One seed has no spread: its value alone.)
                    o.val_bits_per_byte.size() < 2
                        ? fixed(o.mean, 4)
                        : fmt::format("{} ± {}", fixed(o.mean, 4), fixed(o.std, 4)),
                    std::to_string(o.val_bits_per_byte.size())});
    per_seed_rows.push_back(
        {o.variant, seeds, tokens_per_second_cell(o), utilisation_cell(o.flop_utilisation)});
  }
  std::string md = fmt::format(
      "### Language modelling on real text\n\n"
      "Every variant as the FFN of a byte-level Transformer LM ({} layers, d_model {}, {} heads, "
      "sequence {}, pre-norm, tied head) at about equal parameters (the widths of the study table "
      "of {} in the appendix{}), trained {} steps of batch {} "
      "with AdamW (lr {}, linear warm-up over {} steps, then cosine), on {}. Validation: bits "
      "per byte over {} after the last step. Seeds are paired and added by the summary's rule; "
      "the summary gives each comparison's interval and verdict, the appendix the rule "
      "whole.\n\n",
      t.model.layers, t.model.d_model, t.model.heads, t.train.seq, sec.ref("costs"),
      t.find("moe") ? "; moe: 8 experts, top-2, balancing loss 0.01, router z-loss 0.001" : "",
      t.train.steps, t.train.batch, t.train.optimizer.lr, t.train.warmup,
      st.results.data ? fmt::format("`{}` ({} bytes; the appendix gives its fingerprint)",
                                    st.results.data->source, thousands(st.results.data->bytes))
                      : std::string("the study's corpus"),
      t.final_validation_tokens > 0 && t.final_validation_tokens < t.validation_bytes
          ? fmt::format("the first {} bytes of the validation part ({} in all; --quick reads "
                        "no more)",
                        thousands(t.final_validation_tokens), thousands(t.validation_bytes))
          : fmt::format("the whole validation part ({} bytes)", thousands(t.validation_bytes)));
  md += markdown_table({"variant", "d_ff", "LM parameters", "bits/byte, mean ± std", "seeds"}, rows,
                       "lrrrr");
  md += kDetails;
  md += "**Each seed, and the speed of training** (tokens/s and FLOP utilisation, below):\n\n";
  md += markdown_table({"variant", "bits/byte per seed", "tokens/s (÷ ReLU's)", "FLOP utilisation"},
                       per_seed_rows, "lrrr");
  md += "\n";
  md += fmt::format(
      "**How many seeds, and when a comparison is decided (fixed before the run):**\n\n"
      "- **The looks.** Each comparison with ReLU (here{}) trains {}, then looks; while "
      "undecided it trains one more seed (and ReLU too, when it has "
      "fewer) and looks again, up to {}, the cap. Seeds thus go where the decision is "
      "close.\n"
      "- **Decided** when its interval lies below 0 (better than ReLU), above 0 (worse) or, for "
      "equivalence, within ±{} bits/byte. Not measurably worse is never read as as good.\n"
      "- **The intervals** are wider than one-off 95 % intervals, since each look gives chance "
      "another try: over all the looks, two equal variants are called better or worse at most "
      "5 % of the time, and equivalence wrongly about 5 % of the time per side. The early "
      "looks are the strictest (an O'Brien–Fleming-type error spending, Lan & DeMets 1983, over "
      "the fraction of the cap trained; repeated confidence intervals, Jennison & Turnbull "
      "2000; the bounds on Student's t for these few seeds computed by simulation: "
      "docs/evolve.md). The summary's interval is each comparison's last look.\n"
      "- **† (not across all comparisons)**: the verdict holds at 5 % for itself, not when the "
      "5 % is shared among the run's {} (Bonferroni), so one of them may be wrong by "
      "chance.\n"
      "- **‡ (narrow by chance)**: its seeds agree far more closely than the run's other "
      "comparisons do (all of them pooled: a paired spread of {}; a chance below 5 % if its "
      "spread were theirs): its interval may be narrower than its precision.\n\n",
      // (MoE at equal compute where it trained: a run without the moe variant has no section.)
      st.results.moe_axes ? fmt::format(" and MoE at equal compute, {}", sec.ref("moe_axes"))
                          : std::string(),
      counted(t.design.first, "seed"), counted(t.design.cap, "seed"), t.margin,
      counted(t.comparisons, "comparison"), fixed(t.pooled_spread, 4));
  md += fmt::format(
      "**FLOP utilisation**: the matrix work of a run's median step per second over the rate of "
      "the bare products of its own shapes (every weight product and attention's score "
      "products, forward and backward), timed on one thread before the first runs started, "
      "with nothing beside them; the median over seeds. The runs train two at a time, so they "
      "share the machine and this is a lower bound on what a run alone reaches. A whole step "
      "cannot outrun its own products: a value above 100 % would mean a disturbed timing and is "
      "shown as \"not measured\". Tokens/s: the median over seeds of each run's median, and "
      "its ratio to ReLU's row; \"noisy\" when the ratio to ReLU's run of the same seed (for "
      "ReLU: its runs against their median) spreads by more than 10 % over seeds, and then no "
      "rule reads it.\n");
  return md + "\n";
}

}  // namespace ffnlab::study
