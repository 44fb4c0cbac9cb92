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

std::string_view verdict_text(Verdict v) {
  switch (v) {
    case Verdict::reference:
      return "reference";
    case Verdict::better:
      return "better than ReLU";
    case Verdict::worse:
      return "worse than ReLU";
    case Verdict::equivalent:
      return "equivalent to ReLU within the margin";
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
  for (const auto& r : st.runs)
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
    std::vector<double> last, drop, gmean;
    ToyVariant tv;
    tv.variant = v;
    for (int i = 0; i < r.seeds; ++i) {
      ToyConfig tc = r.config;
      tc.seed = 42 + static_cast<std::uint64_t>(i);
      const auto steps = ffnlab::run_toy(variant_config(v, kToyD, kToyF, true), tc);
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
                              const std::vector<double>& reference, double margin) {
  VariantOutcome o;
  o.variant = std::move(name);
  o.val_bits_per_byte = std::move(values);
  std::vector<double> diff;
  for (std::size_t i = 0; i < o.val_bits_per_byte.size() && i < reference.size(); ++i)
    diff.push_back(o.val_bits_per_byte[i] - reference[i]);
  o.mean = mean(o.val_bits_per_byte);
  o.std = sample_std(o.val_bits_per_byte);
  o.diff_mean = mean(diff);
  o.diff_std = sample_std(diff);
  const PairedComparison c = compare_paired(diff, margin);
  o.diff_low = c.ci95.low;
  o.diff_high = c.ci95.high;
  o.diff_low90 = c.ci90.low;
  o.diff_high90 = c.ci90.high;
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
      o.seeds_to_decide = values_to_decide(diff, margin);
      break;
    case Comparison::one_value:
      o.verdict = Verdict::one_seed;
      break;
  }
  return o;
}

void set_throughput(VariantOutcome& o, const std::vector<double>& tokens_per_second,
                    const std::vector<double>& relu_tokens_per_second) {
  if (tokens_per_second.empty()) return;
  o.tokens_per_second = mean(tokens_per_second);
  std::vector<double> ratio;
  for (std::size_t i = 0; i < tokens_per_second.size() && i < relu_tokens_per_second.size(); ++i)
    if (relu_tokens_per_second[i] > 0)
      ratio.push_back(tokens_per_second[i] / relu_tokens_per_second[i]);
  if (ratio.empty()) return;
  const auto [lo, hi] = std::minmax_element(ratio.begin(), ratio.end());
  o.tokens_per_second_over_relu = median(ratio);
  o.tokens_per_second_spread =
      o.tokens_per_second_over_relu > 0 ? (*hi - *lo) / o.tokens_per_second_over_relu : 0.0;
  o.tokens_per_second_noisy = o.tokens_per_second_spread > kMaxSpread;
}

std::string tokens_per_second_cell(const VariantOutcome& o) {
  const std::string n = thousands(static_cast<std::int64_t>(o.tokens_per_second));
  if (o.tokens_per_second_noisy)
    return fmt::format("{} (noisy: ratio to ReLU spread {})", n,
                       percent(o.tokens_per_second_spread, 0));
  return fmt::format("{} ({:.2f}×)", n, o.tokens_per_second_over_relu);
}

std::string verdict_cell(const VariantOutcome& o) {
  if (o.verdict != Verdict::inconclusive || o.seeds_to_decide == 0)
    return std::string(verdict_text(o.verdict));
  if (o.seeds_to_decide > 1000) return "inconclusive (the spread hides any difference)";
  return fmt::format("inconclusive (about {} seeds would decide it)", o.seeds_to_decide);
}

std::string difference_cell(const VariantOutcome& o) {
  if (o.verdict == Verdict::one_seed) return fmt::format("{:+.4f}", o.diff_mean);
  return fmt::format("{:+.4f} [{:+.4f}, {:+.4f}]", o.diff_mean, o.diff_low, o.diff_high);
}

std::int64_t training_steps(const Study& st) {
  std::int64_t runs = 0;
  for (const auto& v : st.options.variants) runs += seeds_of(st.scale, v);
  return st.scale.train.steps * runs;
}

void run_training(Study& st) {
  st.stage(fmt::format(
      "training {} variants × {} seeds ({} for relu and swiglu), {} steps each{}",
      st.options.variants.size(), st.scale.seeds, st.scale.headline_seeds, st.scale.train.steps,
      st.has_variant("moe") ? ", with the runs of MoE at equal compute and the routing families"
                            : ""));
  std::vector<RunJob> jobs;
  for (const auto& v : st.options.variants) {  // (the hooks below fill existing entries only)
    st.census_init[v];
    st.census_trained[v];
  }
  for (int seed = 1; seed <= st.scale.headline_seeds; ++seed)
    for (const auto& v : st.options.variants) {
      if (seed > seeds_of(st.scale, v)) continue;
      RunJob job;
      job.model = st.scale.model;
      job.model.ffn = study_ffn(v, job.model.d_model);
      job.seed = static_cast<std::uint64_t>(seed);
      job.label = v;
      // Seed 1 of each variant also takes the activation census, before and after training.
      if (seed == 1) {
        auto& init = st.census_init[v];
        auto& trained = st.census_trained[v];
        job.hooks.on_start = [&st, &init](TransformerLM& lm) { init = census(st, lm); };
        job.hooks.on_end = [&st, &trained, moe = v == "moe"](TransformerLM& lm) {
          trained = census(st, lm);
          if (moe) st.expert_classes = expert_census(st, lm);
        };
      }
      jobs.push_back(std::move(job));
    }
  // One pool with the moe_axes and routing stages' runs, longest first (MoE at equal compute and
  // the routing families, then the dense runs, the cheaper MoE at equal parameters last), so the
  // two cores stay busy to the end. The order changes no run's numbers (train_runs), only when
  // each starts.
  const std::size_t own = jobs.size();
  for (RunJob& j : moe_axes_jobs(st)) jobs.push_back(std::move(j));
  const std::size_t axes_end = jobs.size();
  for (RunJob& j : routing_jobs(st)) jobs.push_back(std::move(j));
  std::vector<std::size_t> order;
  for (std::size_t i = own; i < jobs.size(); ++i) order.push_back(i);
  for (int moe_last = 0; moe_last < 2; ++moe_last)
    for (std::size_t i = 0; i < own; ++i)
      if ((jobs[i].model.ffn.kind == FFNKind::moe) == (moe_last == 1)) order.push_back(i);
  std::vector<RunJob> pool;
  for (std::size_t i : order) pool.push_back(std::move(jobs[i]));
  std::vector<RunRecord> trained = train_runs(st, std::move(pool));
  std::vector<RunRecord> records(order.size());
  for (std::size_t k = 0; k < order.size(); ++k) records[order[k]] = std::move(trained[k]);
  for (std::size_t i = 0; i < records.size(); ++i)
    (i < own        ? st.runs
     : i < axes_end ? st.axes_runs
                    : st.routing_runs)
        .push_back(std::move(records[i]));

  // Per variant: validation over seeds, and the difference to ReLU paired by seed.
  TrainingResult out;
  out.model = st.scale.model;
  out.train = st.scale.train;
  out.seeds = st.scale.seeds;
  out.headline_seeds = st.scale.headline_seeds;
  out.margin = st.options.margin;
  out.validation_bytes = static_cast<std::int64_t>(st.corpus.validation().size());
  const std::vector<double> relu = per_seed(st, "relu", &RunRecord::val_bits_per_byte);
  const std::vector<double> relu_tps = per_seed(st, "relu", &RunRecord::median_tokens_per_second);
  for (const auto& v : st.options.variants) {
    VariantOutcome o =
        paired_outcome(v, per_seed(st, v, &RunRecord::val_bits_per_byte), relu, out.margin);
    for (const auto& r : st.runs)
      if (r.variant == v) {
        o.d_ff = r.d_ff;
        o.params = r.params;
        break;
      }
    set_throughput(o, per_seed(st, v, &RunRecord::median_tokens_per_second), relu_tps);
    std::vector<double> utilisation;
    for (const auto& r : st.runs)
      if (r.variant == v && r.bare_products_gflops > 0)
        utilisation.push_back(r.matrix_gflops / r.bare_products_gflops);
    o.flop_utilisation = utilisation.empty() ? 0.0 : median(utilisation);
    if (v == "relu" || relu.empty()) o.verdict = Verdict::reference;
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
                     {"seeds", t.seeds},
                     {"headline_seeds", t.headline_seeds},
                     {"equivalence_margin", t.margin},
                     {"validation_bytes", t.validation_bytes}};
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
          {"seeds_to_decide", o.seeds_to_decide},
          {"median_tokens_per_second", o.tokens_per_second},
          {"tokens_per_second_over_relu", o.tokens_per_second_over_relu},
          {"tokens_per_second_spread", o.tokens_per_second_spread},
          {"tokens_per_second_noisy", o.tokens_per_second_noisy},
          {"model_flop_utilisation", o.flop_utilisation}};
    return out;
  });
}

std::string training_markdown(const Study& st, const Sections& sec) {
  if (!st.results.training) return "";
  const TrainingResult& t = *st.results.training;
  std::vector<std::vector<std::string>> rows;
  for (const VariantOutcome& o : t.variants) {
    std::string seeds;
    for (double b : o.val_bits_per_byte) seeds += (seeds.empty() ? "" : ", ") + fixed(b, 3);
    rows.push_back({o.variant, thousands(o.d_ff), thousands(o.params), seeds,
                    fmt::format("{} ± {}", fixed(o.mean, 4), fixed(o.std, 4)),
                    o.verdict == Verdict::reference ? "—" : difference_cell(o), verdict_cell(o),
                    tokens_per_second_cell(o),
                    o.flop_utilisation > 0 ? percent(o.flop_utilisation) : "—"});
  }
  std::string md = fmt::format(
      "### Language modelling on real text\n\n"
      "Every variant as the FFN of a byte-level Transformer LM ({} layers, d_model {}, {} heads, "
      "sequence {}, pre-norm, tied head), at about equal parameters (the widths of {}'s "
      "study table; moe: 8 experts, top-2, balancing loss 0.01, router z-loss 0.001), trained {} "
      "steps of batch {} with "
      "AdamW (lr {}, linear warm-up over {} steps, then cosine), on the corpus of {}. Validation: "
      "bits per byte over "
      "the whole validation part ({} bytes) after the last step. Every variant trains seeds 1 "
      "to {} (MoE at equal compute too, {}); ReLU and SwiGLU, whose paired spread is the widest of "
      "the headline comparisons, seeds 1 to {}. Seeds are "
      "paired: seed s gives every variant the same batches and the same initial embedding, "
      "attention and head (each matrix drawn from its own stream of the seed), so a variant is "
      "compared with ReLU's runs of its own seeds. **Rules, fixed before the run:** the paired "
      "difference to ReLU (variant − ReLU, per seed) is shown as its mean and its 95 % "
      "confidence interval from Student's t with n − 1 degrees of freedom. A variant is better "
      "(worse) than ReLU when that interval lies below (above) 0; equivalent when it is neither "
      "and the 90 % interval lies within ±{} bits/byte (the equivalence margin: two one-sided "
      "tests at 5 %); otherwise inconclusive: these seeds cannot tell (with about how many seeds "
      "would decide it if the mean and spread stayed as seen: a planning figure, not a "
      "promise). Not measurably worse is never read as as good.\n\n",
      t.model.layers, t.model.d_model, t.model.heads, t.train.seq, sec.ref("costs"), t.train.steps,
      t.train.batch, t.train.optimizer.lr, t.train.warmup, sec.ref("data"), t.validation_bytes,
      t.seeds, sec.ref("moe_axes"), t.headline_seeds, t.margin);
  md += markdown_table(
      {"variant", "d_ff", "parameters", "bits/byte per seed", "mean ± std",
       "paired difference to ReLU [95 % CI]", "verdict", "tokens/s (÷ ReLU's)", "FLOP utilisation"},
      rows, "lrrrrrlrr");
  md += fmt::format(
      "\nFLOP utilisation: the matrix work of a run's median step per second over the rate of "
      "the bare products of its own shapes (every weight product and attention's score "
      "products, forward and backward), timed at the run's start on its thread while the other "
      "runs trained; the median over seeds. A whole step cannot outrun its own products, so a "
      "value above 100 % means the short start-up timing was disturbed.\n"
      "\ntraining_dynamics.png draws the runs over training: validation at the periodic "
      "evaluations (on the first {} bytes of the validation part, so its last values differ "
      "from this table's), the training loss and the gradient norm, each the mean over seeds "
      "with a band from the lowest to the highest seed.\n",
      t.train.eval_tokens);
  return md + "\n";
}

}  // namespace ffnlab::study
