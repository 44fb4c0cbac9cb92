// Stage "moe": MoE behaviour. The study's MoE LM trained three times on seed 1, for half the
// study's steps, with a capacity factor (so that overflow is dropped and counted): no balancing,
// the load-balancing loss, and the aux-loss-free balancing bias. Tokens per expert over training
// per layer, load CV, max/mean, dropped assignments, router entropy, and what each setting costs
// in validation. Then the warm-up ablation: the training stage's MoE LM over every seed at the
// short warm-up, paired with its runs at the study's.
#include <fmt/format.h>

#include <cmath>

#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/report/markdown.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

namespace {

constexpr double kCapacity = 1.25;

struct Setting {
  const char* name;
  const char* what;
  float aux;
  bool bias;
};

const std::vector<Setting> kSettings{
    {"none", "no balancing", 0.0f, false},
    {"loss", "load-balancing loss, coefficient 0.01", 0.01f, false},
    {"bias", "aux-loss-free bias (rate 1e-3)", 0.0f, true}};

std::int64_t short_warmup(const Study& st) {
  return std::min<std::int64_t>(50, st.scale.train.steps / 10);
}

// The balancing runs: half the study's steps (load settles long before), warm-up in proportion.
TrainConfig balancing_settings(const Study& st) {
  TrainConfig t = st.scale.train;
  t.steps = std::max<std::int64_t>(1, t.steps / 2);
  t.warmup /= 2;
  t.eval_every = 0;  // no periodic evaluations: the stage reads the final one
  return t;
}

}  // namespace

std::int64_t moe_steps(const Study& st) {
  if (!st.has_variant("moe")) return 0;
  return balancing_settings(st).steps * static_cast<std::int64_t>(kSettings.size()) +
         st.scale.train.steps * st.scale.seeds;
}

void run_moe(Study& st) {
  if (!st.has_variant("moe")) return;
  st.stage("MoE load balancing: none, loss, bias");
  const FFNConfig c = study_ffn("moe", st.scale.model.d_model);
  MoEResult out;
  out.capacity_factor = kCapacity;
  out.balancing_steps = balancing_settings(st).steps;
  out.experts = c.moe.num_experts;
  out.top_k = c.moe.top_k;
  out.expert_d_ff = c.expert_d_ff();
  const TrainConfig balancing = balancing_settings(st);
  const std::int64_t every = std::max<std::int64_t>(1, balancing.steps / 60);
  // What each setting's run gathers as it trains (its hook writes only its own).
  struct Tally {
    double cv = 0, max_mean = 0, dropped = 0, entropy = 0;
    std::int64_t tail = 0;
    std::string wide;  // layer 0, one column per expert: the figure's data
    std::string csv;   // every layer
  };
  std::vector<Tally> tallies(kSettings.size());
  std::vector<RunJob> jobs;
  for (std::size_t i = 0; i < kSettings.size(); ++i) {
    const Setting& s = kSettings[i];
    Tally& t = tallies[i];
    RunJob job;
    job.model = st.scale.model;
    job.model.ffn = c;
    job.model.ffn.moe.aux_coef = s.aux;
    job.model.ffn.moe.balance_bias = s.bias;
    job.model.ffn.moe.capacity_factor = kCapacity;
    job.label = std::string("moe/") + s.name;
    job.settings = balancing;
    t.wide = "step";
    for (int e = 0; e < out.experts; ++e) t.wide += fmt::format(",expert_{}", e);
    t.wide += "\n";
    job.hooks.on_step = [&t, &balancing, every, name = s.name](const TransformerLM& lm,
                                                               const StepLog& log) {
      if (log.step > balancing.steps / 2) {  // the second half: settled behaviour
        t.cv += log.load_cv;
        t.max_mean += log.max_over_mean;
        t.dropped += log.dropped_fraction;
        t.entropy += log.router_entropy;
        ++t.tail;
      }
      if (log.step % every != 0 && log.step != 1) return;
      for (int l = 0; l < lm.config().layers; ++l) {
        const FFNStats fs = lm.ffn(l).stats();
        std::int64_t total = 0;
        for (auto n : fs.tokens_per_expert) total += n;
        if (l == 0) t.wide += std::to_string(log.step);
        for (std::size_t e = 0; e < fs.tokens_per_expert.size(); ++e) {
          const double share = total ? static_cast<double>(fs.tokens_per_expert[e]) / total : 0.0;
          t.csv += fmt::format("{},{},{},{},{:.5f}\n", name, log.step, l, e, share);
          if (l == 0) t.wide += fmt::format(",{:.5f}", share);
        }
        if (l == 0) t.wide += "\n";
      }
    };
    jobs.push_back(std::move(job));
  }
  const std::vector<RunRecord> runs = train_runs(st, std::move(jobs));
  std::string csv = "setting,step,layer,expert,load_fraction\n";
  for (std::size_t i = 0; i < kSettings.size(); ++i) {
    const Setting& s = kSettings[i];
    const Tally& t = tallies[i];
    st.write(std::string("moe_load_") + s.name + ".csv", t.wide);
    csv += t.csv;
    const double n = static_cast<double>(std::max<std::int64_t>(1, t.tail));
    out.settings.push_back({s.name, s.what, runs[i].val_bits_per_byte, t.cv / n, t.max_mean / n,
                            t.dropped / n, t.entropy / n, runs[i].median_tokens_per_second});
  }
  st.write("moe_load.csv", csv);

  // The warm-up ablation: the training stage's MoE LM, every seed, at the short warm-up.
  out.warmup = st.scale.train.warmup;
  out.short_warmup = short_warmup(st);
  const std::vector<double> study_runs = per_seed(st, "moe", &RunRecord::val_bits_per_byte);
  std::vector<double> short_runs;
  if (!study_runs.empty()) {
    LMConfig m = st.scale.model;
    m.ffn = c;
    TrainConfig settings = st.scale.train;
    settings.warmup = out.short_warmup;
    settings.eval_every = 0;
    std::vector<RunJob> jobs;
    for (int seed = 1; seed <= st.scale.seeds; ++seed) {
      RunJob job;
      job.model = m;
      job.seed = static_cast<std::uint64_t>(seed);
      job.label = fmt::format("moe, warm-up {}", out.short_warmup);
      job.settings = settings;
      jobs.push_back(std::move(job));
    }
    for (const RunRecord& r : train_runs(st, std::move(jobs)))
      short_runs.push_back(r.val_bits_per_byte);
    out.study_warmup_bits_per_byte = study_runs;
    out.short_warmup_outcome =
        paired_outcome("moe, short warm-up", short_runs, study_runs, st.options.margin);
  }
  st.results.moe = std::move(out);
}

json moe_json(const Results& res) {
  return json_if(res.moe, [](const MoEResult& m) {
    json out{{"capacity_factor", m.capacity_factor}, {"balancing_steps", m.balancing_steps}};
    if (m.short_warmup_outcome) {
      const VariantOutcome& o = *m.short_warmup_outcome;
      out["warmup_ablation"] = {
          {"warmup", m.warmup},
          {"short_warmup", m.short_warmup},
          {"val_bits_per_byte", m.study_warmup_bits_per_byte},
          {"short_warmup_val_bits_per_byte", o.val_bits_per_byte},
          {"paired_difference_mean", o.diff_mean},
          {"paired_difference_ci95", interval_json(o.diff_low, o.diff_high)},
          {"verdict", o.verdict == Verdict::better       ? "short warm-up better"
                      : o.verdict == Verdict::worse      ? "short warm-up worse"
                      : o.verdict == Verdict::equivalent ? "equivalent within the margin"
                      : o.verdict == Verdict::one_seed   ? "one seed: no interval"
                                                         : "inconclusive"}};
    }
    for (const MoESetting& s : m.settings)
      out["settings"][s.name] = {{"description", s.description},
                                 {"val_bits_per_byte", s.val_bits_per_byte},
                                 {"load_cv", s.load_cv},
                                 {"max_over_mean", s.max_over_mean},
                                 {"dropped_fraction", s.dropped_fraction},
                                 {"router_entropy", s.router_entropy},
                                 {"tokens_per_second", s.tokens_per_second}};
    return out;
  });
}

std::string moe_markdown(const Study& st, const Sections& sec) {
  if (!st.results.moe) return "";
  const MoEResult& m = *st.results.moe;
  std::vector<std::vector<std::string>> rows;
  for (const MoESetting& s : m.settings)
    rows.push_back({s.description, fixed(s.val_bits_per_byte, 4), fixed(s.load_cv, 3),
                    fixed(s.max_over_mean, 2), percent(s.dropped_fraction, 2),
                    fixed(s.router_entropy, 3),
                    thousands(static_cast<std::int64_t>(s.tokens_per_second))});
  std::string md = fmt::format(
      "The study's MoE LM ({} experts of width {}, top-{}, softmax router) trained on seed 1 "
      "for {} steps (half the study's: the load settles long before) with capacity factor {} (an "
      "expert takes at most ⌈{}·k·T/E⌉ assignments per batch; the "
      "rest are dropped and their tokens pass through the residual only), three ways. Load "
      "statistics are means over layers and over the second half of training; entropy is the "
      "router's softmax entropy in nats (ln {} = {:.3f} is uniform). moe_expert_load.png shows "
      "each expert's share of the assignments over training.\n\n",
      m.experts, m.expert_d_ff, m.top_k, m.balancing_steps, m.capacity_factor, m.capacity_factor,
      m.experts, std::log(static_cast<double>(m.experts)));
  md += markdown_table({"balancing", "val bits/byte", "load CV", "max / mean", "dropped",
                        "router entropy", "tokens/s"},
                       rows, "lrrrrrr");
  if (m.short_warmup_outcome) {
    const VariantOutcome& o = *m.short_warmup_outcome;
    auto list = [](const std::vector<double>& x) {
      std::string s;
      for (double v : x) s += (s.empty() ? "" : ", ") + fixed(v, 3);
      return s;
    };
    md += fmt::format(
        "\n**Warm-up (an ablation of the recipe).** The study warms the learning rate up over "
        "{} steps, a quarter of the run. The usual short warm-up, a tenth of the steps and at "
        "most 50 ({} here), can stall this MoE LM on some initialisations: docs/training.md "
        "shows one that sat on a loss plateau for hundreds of steps, in ffnlab and in PyTorch "
        "given the same weights and batches alike, and the per-layer diagnostics that showed "
        "why (layer 0's attention grows large early and drowns the byte's own embedding). This "
        "run measures it on its own seeds: the same MoE LM (equal total parameters, dropless) at "
        "{} steps of "
        "warm-up, every seed, against {}'s runs at {}:\n\n"
        "| warm-up | bits/byte per seed | mean |\n|---|---|---|\n"
        "| {} (the study's) | {} | {} |\n| {} | {} | {} |\n\n"
        "Paired difference (short − the study's): {} bits/byte; {}.\n",
        m.warmup, m.short_warmup, m.short_warmup, sec.ref("training"), m.warmup, m.warmup,
        list(m.study_warmup_bits_per_byte), fixed(mean(m.study_warmup_bits_per_byte), 4),
        m.short_warmup, list(o.val_bits_per_byte), fixed(o.mean, 4), difference_cell(o),
        o.verdict == Verdict::worse        ? "in this run the short warm-up is worse"
        : o.verdict == Verdict::better     ? "in this run the short warm-up is better"
        : o.verdict == Verdict::equivalent ? "in this run the two are equivalent within the margin"
        : o.verdict == Verdict::one_seed   ? "one seed: no interval"
                                           : "in this run these seeds cannot tell them apart");
  }
  return md + "\n";
}

}  // namespace ffnlab::study
