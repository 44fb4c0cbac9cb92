// Stage 4: training dynamics. The seeds' toy run (memorising 8 random vectors) over toy seeds,
// and the real study: every variant trained as a byte-level LM at equal parameters over paired
// seeds (a seed gives every variant the same initialisation stream and the same batches).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "../common.hpp"
#include "../interrupt.hpp"
#include "ffnlab/report/markdown.hpp"
#include "ffnlab/train/toy.hpp"
#include "study.hpp"

namespace ffnlab::cli::evolve {

namespace {

double mean_of(const std::vector<double>& v) {
  return v.empty() ? NAN : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// Sample standard deviation (n − 1); 0 for one value.
double std_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

struct ToySummary {
  double first, last, drop, grad_mean, grad_std;
};

ToySummary summarise(const std::vector<ToyStep>& steps) {
  std::vector<double> g;
  for (const auto& s : steps) g.push_back(s.grad_norm);
  // Population std over iterations, as the seeds' table reports it.
  const double m = mean_of(g);
  double sq = 0;
  for (double x : g) sq += (x - m) * (x - m);
  return {steps.front().loss, steps.back().loss, 1.0 - steps.back().loss / steps.front().loss, m,
          std::sqrt(sq / static_cast<double>(g.size()))};
}

}  // namespace

void run_toy(Study& st) {
  st.stage("the seeds' toy run (each layer alone memorising 8 random vectors)");
  json& out = st.results["toy"];
  ToyConfig tc;
  tc.iterations = st.scale.toy_iterations;
  out["config"] = {{"d_model", 512},
                   {"d_ff", 2048},
                   {"batch", tc.batch},
                   {"seq", tc.seq},
                   {"dropout", tc.dropout},
                   {"lr", tc.lr},
                   {"iterations", tc.iterations},
                   {"seeds", st.scale.toy_seeds}};
  std::string csv = "variant,iteration,loss,grad_norm\n";
  std::vector<std::vector<std::string>> rows;
  for (const std::string v : {"relu", "gelu", "glu", "gated", "moe"}) {
    std::vector<double> last, drop, gmean;
    ToySummary s42{};
    for (int i = 0; i < st.scale.toy_seeds; ++i) {
      tc.seed = 42 + static_cast<std::uint64_t>(i);
      const auto steps = ffnlab::run_toy(variant_config(v, 512, 2048, true), tc);
      const ToySummary s = summarise(steps);
      if (i == 0) {
        s42 = s;
        for (std::size_t k = 0; k < steps.size(); ++k)
          csv += fmt::format("{},{},{:.6f},{:.6f}\n", v, k + 1, steps[k].loss, steps[k].grad_norm);
      }
      last.push_back(s.last);
      drop.push_back(s.drop);
      gmean.push_back(s.grad_mean);
    }
    out["variants"][v] = {{"seed42",
                           {{"initial_loss", s42.first},
                            {"final_loss", s42.last},
                            {"drop", s42.drop},
                            {"grad_norm_mean", s42.grad_mean},
                            {"grad_norm_std", s42.grad_std}}},
                          {"over_seeds",
                           {{"final_loss_mean", mean_of(last)},
                            {"final_loss_std", std_of(last)},
                            {"drop_mean", mean_of(drop)},
                            {"drop_std", std_of(drop)},
                            {"grad_norm_mean_mean", mean_of(gmean)},
                            {"grad_norm_mean_std", std_of(gmean)}}}};
    rows.push_back({v, fixed(s42.first, 4), fixed(s42.last, 4), percent(s42.drop),
                    fixed(s42.grad_mean, 4), fixed(s42.grad_std, 4),
                    fmt::format("{} ± {}", fixed(mean_of(last), 4), fixed(std_of(last), 4)),
                    fmt::format("{} ± {}", fixed(mean_of(gmean), 3), fixed(std_of(gmean), 3))});
  }
  write_text(st.dir + "/toy_loss.csv", csv);
  st.report += "## 4. Training dynamics\n\n### The seeds' toy run\n\n";
  st.report += fmt::format(
      "Each layer alone, Adam (lr {}) on one fixed batch of {} random vectors against random "
      "targets with MSE, dropout {} on the input, {} iterations, d_model 512, d_ff 2048 for "
      "every variant (so the variants differ in size). **It measures how fast a layer memorises "
      "8 random vectors, nothing about language.** Seed 42 is the seeds' own; the last two "
      "columns are mean ± standard deviation over {} seeds (42 to {}).\n\n",
      tc.lr, tc.batch * tc.seq, tc.dropout, tc.iterations, st.scale.toy_seeds,
      41 + st.scale.toy_seeds);
  st.report +=
      markdown_table({"variant", "initial loss", "final loss", "drop", "mean grad norm",
                      "std grad norm", "final loss over seeds", "mean grad norm over seeds"},
                     rows, "lrrrrrrr");
  st.report += "\n";
}

RunRecord train_run(Study& st, const LMConfig& model, std::uint64_t seed, const std::string& label,
                    const RunHooks& hooks) {
  RunRecord r;
  r.variant = label;
  r.seed = static_cast<int>(seed);
  r.d_ff = model.ffn.kind == FFNKind::moe ? model.ffn.expert_d_ff() : model.ffn.d_ff;
  TrainConfig tc = st.scale.train;
  tc.seed = seed;
  TransformerLM lm(model, seed);
  r.params = lm.parameters().count();
  Trainer trainer(lm, st.corpus, tc);
  if (hooks.on_start) hooks.on_start(lm);
  trainer.run(
      [&](const StepLog& s) {
        r.steps.push_back(s);
        if (hooks.on_step) hooks.on_step(lm, s);
        st.step_done(s, fmt::format("{} seed {}", label, seed));
      },
      [&](const EvalLog& e) { r.evals.push_back(e); }, "",
      [] { return InterruptGuard::requested(); });
  check_interrupt();
  r.val_bits_per_byte = trainer.evaluate(0).bits_per_byte;
  if (hooks.on_end) hooks.on_end(lm);
  std::vector<double> tps;
  for (const auto& s : r.steps) tps.push_back(s.tokens_per_second);
  std::sort(tps.begin(), tps.end());
  r.median_tokens_per_second = tps.empty() ? 0 : tps[tps.size() / 2];
  return r;
}

void run_training(Study& st) {
  st.stage(fmt::format("training {} variants × {} seeds, {} steps each", st.variants.size(),
                       st.scale.seeds, st.scale.train.steps));
  for (int seed = 1; seed <= st.scale.seeds; ++seed)
    for (const auto& v : st.variants) {
      LMConfig m = st.scale.model;
      m.ffn = study_ffn(v, m.d_model);
      // Seed 1 of each variant also takes the activation census, before and after training.
      RunHooks hooks;
      if (seed == 1) {
        hooks.on_start = [&](TransformerLM& lm) { st.census_init[v] = census(st, lm); };
        hooks.on_end = [&](TransformerLM& lm) { st.census_trained[v] = census(st, lm); };
      }
      st.runs.push_back(train_run(st, m, static_cast<std::uint64_t>(seed), v, hooks));
      const RunRecord& r = st.runs.back();
      st.progress->message(fmt::format("  {} seed {}: {:.4f} bits/byte, {:.0f} tokens/s", v, seed,
                                       r.val_bits_per_byte, r.median_tokens_per_second));
    }

  // Per variant: validation over seeds, and the difference to ReLU paired by seed.
  json& out = st.results["training"];
  const auto& tc = st.scale.train;
  out["config"] = {{"model", lm_config_to_json(st.scale.model)},
                   {"steps", tc.steps},
                   {"batch", tc.batch},
                   {"seq", tc.seq},
                   {"lr", tc.optimizer.lr},
                   {"seeds", st.scale.seeds},
                   {"validation_bytes", st.corpus.validation().size()}};
  auto bpb = [&](const std::string& v) {
    std::vector<double> x;
    for (const auto& r : st.runs)
      if (r.variant == v) x.push_back(r.val_bits_per_byte);
    return x;
  };
  const std::vector<double> relu = bpb("relu");
  std::vector<std::vector<std::string>> rows;
  for (const auto& v : st.variants) {
    const std::vector<double> x = bpb(v);
    std::vector<double> diff, tps;
    for (std::size_t i = 0; i < x.size() && i < relu.size(); ++i) diff.push_back(x[i] - relu[i]);
    for (const auto& r : st.runs)
      if (r.variant == v) tps.push_back(r.median_tokens_per_second);
    const double dm = mean_of(diff), ds = std_of(diff);
    std::string verdict;
    if (v == "relu" || relu.empty())
      verdict = "reference";
    else if (diff.size() < 2)
      verdict = "one seed: no spread to compare with";
    else if (std::fabs(dm) > ds)
      verdict = dm < 0 ? "better than ReLU" : "worse than ReLU";
    else
      verdict = "no difference measurable at this scale";
    const RunRecord* first = nullptr;
    for (const auto& r : st.runs)
      if (r.variant == v && !first) first = &r;
    json per_seed = json::array();
    for (double b : x) per_seed.push_back(b);
    out["variants"][v] = {{"d_ff", first->d_ff},
                          {"params", first->params},
                          {"val_bits_per_byte", per_seed},
                          {"mean", mean_of(x)},
                          {"std", std_of(x)},
                          {"paired_difference_to_relu_mean", dm},
                          {"paired_difference_to_relu_std", ds},
                          {"verdict", verdict},
                          {"median_tokens_per_second", mean_of(tps)}};
    std::string seeds;
    for (double b : x) seeds += (seeds.empty() ? "" : ", ") + fixed(b, 3);
    rows.push_back({v, thousands(first->d_ff), thousands(first->params), seeds,
                    fmt::format("{} ± {}", fixed(mean_of(x), 4), fixed(std_of(x), 4)),
                    v == "relu" ? "—" : fmt::format("{:+.4f} ± {}", dm, fixed(ds, 4)), verdict,
                    thousands(static_cast<std::int64_t>(mean_of(tps)))});
  }
  st.report += fmt::format(
      "\n### Language modelling on real text\n\n"
      "Every variant as the FFN of a byte-level Transformer LM ({} layers, d_model {}, {} heads, "
      "sequence {}, pre-norm, tied head), at about equal parameters (the widths of section 1's "
      "study table; moe: 8 experts, top-2, balancing loss 0.01), trained {} steps of batch {} with "
      "AdamW (lr {}, warm-up and cosine), on "
      "the corpus of section 0. Validation: bits per byte over the whole validation part ({} "
      "bytes) after the last step. Seeds 1 to {} are paired: seed s gives every variant the "
      "same batches. **Rule:** a variant is called better or worse than ReLU only where the "
      "mean of its paired differences is larger than their standard deviation over seeds; "
      "otherwise: no difference measurable at this scale.\n\n",
      st.scale.model.layers, st.scale.model.d_model, st.scale.model.heads, tc.seq, tc.steps,
      tc.batch, tc.optimizer.lr, st.corpus.validation().size(), st.scale.seeds);
  st.report += markdown_table({"variant", "d_ff", "parameters", "bits/byte per seed", "mean ± std",
                               "paired difference to ReLU", "verdict", "tokens/s"},
                              rows, "lrrrrrlr");
  st.report += "\n";
}

}  // namespace ffnlab::cli::evolve
