// Stage "moe": MoE behaviour. The study's MoE LM trained three times on seed 1, for half the
// study's steps, with a capacity factor (so that overflow is dropped and counted): no balancing,
// the load-balancing loss, and the aux-loss-free balancing bias. Tokens per expert over training
// per layer and the step from which that load stays settled, load CV, max/mean, dropped
// assignments, router entropy, and what each setting costs in validation. Then, with --full, the
// z-loss ablation: the training stage's MoE LM over every seed without the router z-loss, paired
// with its runs with it.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/report/markdown.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

namespace {

constexpr double kCapacity = 1.25;
// How far (absolute share of the assignments) an expert's share may stray from its mean over
// the run's last 10 % once the load has settled: 0.05 is 40 % of the uniform share of 8 experts
// at top-2 (0.125), and some 3 binomial standard deviations of a --quick step's 512 assignments.
constexpr double kLoadTolerance = 0.05;

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

// Per expert and layer, the byte class it takes most over what the data has, and per layer the
// mutual information between expert and class.
std::string specialisation_markdown(const std::vector<ExpertSpecialisation>& layers) {
  std::vector<std::string> head{"expert"};
  for (std::size_t l = 0; l < layers.size(); ++l) head.push_back(fmt::format("layer {}", l));
  std::vector<std::vector<std::string>> rows;
  for (int e = 0; e < layers.front().experts; ++e) {
    std::vector<std::string> row{std::to_string(e)};
    for (const ExpertSpecialisation& layer : layers) {
      if (layer.of_expert(e) == 0) {
        row.push_back("no tokens");
        continue;
      }
      int best = 0;
      double best_lift = -1;
      // Among the classes that make up at least 1 % of the expert's assignments (a rare class
      // the expert took a handful of would otherwise top the list by chance).
      for (int c = 0; c < kByteClasses; ++c)
        if (layer.share(e, c) >= 0.01 && layer.share(e, c) / layer.base_share(c) > best_lift)
          best = c, best_lift = layer.share(e, c) / layer.base_share(c);
      row.push_back(fmt::format("{} {} (all: {})", byte_class_name(best),
                                percent(layer.share(e, best)), percent(layer.base_share(best))));
    }
    rows.push_back(std::move(row));
  }
  std::vector<std::string> mi{"I(expert; class)"};
  double entropy = 0;
  for (int c = 0; c < kByteClasses; ++c)
    if (const double p = layers.front().base_share(c); p > 0) entropy -= p * std::log2(p);
  for (const ExpertSpecialisation& layer : layers)
    mi.push_back(fmt::format("{:.3f} bits", layer.mutual_information_bits()));
  rows.push_back(std::move(mi));
  std::string md = fmt::format(
      "\n**Which bytes each expert takes.** The training stage's MoE LM (seed 1, after training) "
      "over the census tokens: every assignment of a byte to an expert is counted under the "
      "byte's class ({}). Each cell names the class the expert takes most often relative to the "
      "data (among the classes that make up at least 1 % of its assignments), with its share of "
      "the expert's assignments beside that class's share of all assignments. The last row is the "
      "mutual information between expert and class: 0 when "
      "the router ignores the class, at most the class entropy ({:.2f} bits). "
      "moe_specialisation.png shows every expert and class.\n\n",
      [] {
        std::string names;
        for (int c = 0; c < kByteClasses; ++c)
          names += (c ? ", " : "") + std::string(byte_class_name(c));
        return names;
      }(),
      entropy);
  return md + markdown_table(head, rows, "l" + std::string(layers.size(), 'l'));
}

// From which logged step a setting's load stays settled: "step 30", "step 1, the first logged",
// "not by step 100, the last logged", "not before the last 10 % (step 89 still moved)", "too
// short to tell (every logged step in its last 10 %)"; "—" when nothing was logged.
std::string settled_cell(const MoESetting& s, const MoEResult& m) {
  if (s.load.steps.empty()) return "—";
  const auto settled = s.load.settled_step(m.balancing_steps, m.load_tolerance);
  const std::int64_t moving = s.load.last_moving_step(m.balancing_steps, m.load_tolerance);
  if (settled)
    return moving == 0 ? fmt::format("step {}, the first logged", *settled)
                       : fmt::format("step {}", *settled);
  if (moving == s.load.steps.back()) return fmt::format("not by step {}, the last logged", moving);
  if (moving == 0) return "too short to tell (every logged step in its last 10 %)";
  return fmt::format("not before the last 10 % (step {} still moved)", moving);
}

// Whether logged step i lies in the window the shares' reference mean is taken over: the run's
// last 10 %, and the last logged step whatever it is.
bool in_tail(const LoadSeries& s, std::size_t i, std::int64_t run_steps) {
  return s.steps[i] > run_steps - run_steps / 10 || i + 1 == s.steps.size();
}

}  // namespace

// The balancing runs: half the study's steps, warm-up in proportion. Whether the load settles
// within them is measured (LoadSeries::settled_step), not assumed.
TrainConfig balancing_settings(const Study& st) {
  TrainConfig t = st.scale.train;
  t.steps = std::max<std::int64_t>(1, t.steps / 2);
  t.warmup /= 2;
  t.eval_every = 0;  // no periodic evaluations: the stage reads the final one
  return t;
}

std::int64_t LoadSeries::last_moving_step(std::int64_t run_steps, double tolerance) const {
  if (steps.empty()) return 0;
  // The mean of each share over the logged steps of the last 10 % (the last one at least).
  std::vector<double> tail(shares.front().size(), 0.0);
  int n = 0;
  for (std::size_t i = 0; i < steps.size(); ++i)
    if (in_tail(*this, i, run_steps)) {
      for (std::size_t k = 0; k < tail.size(); ++k) tail[k] += shares[i][k];
      ++n;
    }
  for (double& x : tail) x /= n;
  for (std::size_t i = steps.size(); i-- > 0;)
    for (std::size_t k = 0; k < tail.size(); ++k)
      if (std::fabs(shares[i][k] - tail[k]) > tolerance) return steps[i];
  return 0;
}

std::optional<std::int64_t> LoadSeries::settled_step(std::int64_t run_steps,
                                                     double tolerance) const {
  if (steps.empty()) return std::nullopt;
  const std::int64_t moving = last_moving_step(run_steps, tolerance);
  if (moving == steps.back()) return std::nullopt;
  // The first logged step after the last that moved (the first logged when none did). Held only
  // inside the window the mean is taken over is no settling: shares stay near their own mean.
  const auto i = static_cast<std::size_t>(
      moving == 0 ? 0 : std::upper_bound(steps.begin(), steps.end(), moving) - steps.begin());
  if (in_tail(*this, i, run_steps)) return std::nullopt;
  return steps[i];
}

namespace {

// What a balancing setting's run gathers as it trains: over the second half (settled
// behaviour) the sums of the load statistics, and at every logged step each layer's share of
// every expert.
struct Tally {
  double cv = 0, max_mean = 0, dropped = 0, entropy = 0;
  std::int64_t tail = 0;
  double peak = 0;   // the largest share drawn: one y range for every panel
  std::string wide;  // one column per layer and expert: the figure's data
  std::string csv;   // every layer
  LoadSeries load;   // the same shares, for when the load settles

  nlohmann::json to_json() const {
    return {{"cv", cv},
            {"max_mean", max_mean},
            {"dropped", dropped},
            {"entropy", entropy},
            {"tail", tail},
            {"peak", peak},
            {"wide", wide},
            {"csv", csv},
            {"steps", load.steps},
            {"shares", load.shares}};
  }
  static Tally from_json(const nlohmann::json& j) {
    Tally t;
    t.cv = j.at("cv");
    t.max_mean = j.at("max_mean");
    t.dropped = j.at("dropped");
    t.entropy = j.at("entropy");
    t.tail = j.at("tail");
    t.peak = j.at("peak");
    t.wide = j.at("wide");
    t.csv = j.at("csv");
    t.load.steps = j.at("steps").get<std::vector<std::int64_t>>();
    t.load.shares = j.at("shares").get<std::vector<std::vector<double>>>();
    return t;
  }
};

class LoadTraceProbe final : public RunProbe {
 public:
  explicit LoadTraceProbe(const RunJob& job)
      : steps_(job.settings->steps),
        every_(std::max<std::int64_t>(1, steps_ / 60)),
        name_(job.label.substr(job.label.find('/') + 1)) {
    t_.wide = "step";
    for (int l = 0; l < job.model.layers; ++l)
      for (int e = 0; e < job.model.ffn.moe.num_experts; ++e)
        t_.wide += fmt::format(",layer_{}_expert_{}", l, e);
    t_.wide += "\n";
  }
  void step(const TransformerLM& lm, const StepLog& log) override {
    if (log.step > steps_ / 2) {  // the second half: settled behaviour
      t_.cv += log.load_cv;
      t_.max_mean += log.max_over_mean;
      t_.dropped += log.dropped_fraction;
      t_.entropy += log.router_entropy;
      ++t_.tail;
    }
    if (log.step % every_ != 0 && log.step != 1) return;
    t_.wide += std::to_string(log.step);
    t_.load.steps.push_back(log.step);
    std::vector<double>& logged = t_.load.shares.emplace_back();
    for (int l = 0; l < lm.config().layers; ++l) {
      const FFNStats fs = lm.ffn(l).stats();
      std::int64_t total = 0;
      for (auto n : fs.tokens_per_expert) total += n;
      for (std::size_t e = 0; e < fs.tokens_per_expert.size(); ++e) {
        const double share = total ? static_cast<double>(fs.tokens_per_expert[e]) / total : 0.0;
        t_.csv += fmt::format("{},{},{},{},{:.5f}\n", name_, log.step, l, e, share);
        t_.wide += fmt::format(",{:.5f}", share);
        t_.peak = std::max(t_.peak, share);
        logged.push_back(share);
      }
    }
    t_.wide += "\n";
  }
  nlohmann::json gathered() const override { return t_.to_json(); }

 private:
  std::int64_t steps_, every_;
  std::string name_;
  Tally t_;
};

}  // namespace

std::unique_ptr<RunProbe> load_trace_probe(const Study& /*st*/, const RunJob& job) {
  return std::make_unique<LoadTraceProbe>(job);
}

std::int64_t moe_steps(const Study& st) {
  if (!st.has_variant("moe")) return 0;
  // The z-loss ablation trains as many seeds as the training stage's MoE did: at most the cap
  // before training.
  const auto trained =
      static_cast<std::int64_t>(per_seed(st, "moe", &RunRecord::val_bits_per_byte).size());
  return balancing_settings(st).steps * static_cast<std::int64_t>(kSettings.size()) +
         (st.options.full ? st.scale.train.steps * (trained > 0 ? trained : st.scale.design.cap)
                          : 0);
}

void run_moe(Study& st) {
  if (!st.has_variant("moe")) return;
  st.stage("MoE load balancing: none, loss, bias");
  const FFNConfig c = study_ffn("moe", st.scale.model.d_model);
  MoEResult out;
  out.capacity_factor = kCapacity;
  out.balancing_steps = balancing_settings(st).steps;
  out.load_tolerance = kLoadTolerance;
  out.experts = c.moe.num_experts;
  out.top_k = c.moe.top_k;
  out.expert_d_ff = c.expert_d_ff();
  const TrainConfig balancing = balancing_settings(st);
  std::vector<RunJob> jobs;
  for (const Setting& s : kSettings) {
    RunJob job;
    job.model = st.scale.model;
    job.model.ffn = c;
    job.model.ffn.moe.aux_coef = s.aux;
    job.model.ffn.moe.balance_bias = s.bias;
    job.model.ffn.moe.capacity_factor = kCapacity;
    job.label = std::string("moe/") + s.name;
    job.settings = balancing;
    job.probe = Probe::load_trace;
    jobs.push_back(std::move(job));
  }
  const std::vector<RunRecord> runs = train_runs(st, std::move(jobs));
  std::string csv = "setting,step,layer,expert,load_fraction\n";
  for (std::size_t i = 0; i < kSettings.size(); ++i) {
    const Setting& s = kSettings[i];
    const Tally t = Tally::from_json(runs[i].gathered);
    st.write(std::string("moe_load_") + s.name + ".csv", t.wide);
    out.load_peak = std::max(out.load_peak, t.peak);
    csv += t.csv;
    const double n = static_cast<double>(std::max<std::int64_t>(1, t.tail));
    out.settings.push_back({s.name, s.what, runs[i].val_bits_per_byte, t.cv / n, t.max_mean / n,
                            t.dropped / n, t.entropy / n, runs[i].median_tokens_per_second,
                            t.load});
  }
  st.write("moe_load.csv", csv);

  out.specialisation = st.expert_classes;

  // The z-loss ablation (--full): the training stage's MoE LM, every seed, without the router
  // z-loss.
  out.z_coef = c.moe.z_coef;
  const std::vector<double> with_z = per_seed(st, "moe", &RunRecord::val_bits_per_byte);
  if (st.options.full && !with_z.empty() && c.moe.z_coef > 0) {
    LMConfig m = st.scale.model;
    m.ffn = c;
    m.ffn.moe.z_coef = 0.0f;
    TrainConfig settings = st.scale.train;
    settings.eval_every = 0;
    std::vector<RunJob> jobs;
    for (int seed = 1; seed <= static_cast<int>(with_z.size()); ++seed) {
      RunJob job;
      job.model = m;
      job.seed = static_cast<std::uint64_t>(seed);
      job.label = "moe, no z-loss";
      job.settings = settings;
      jobs.push_back(std::move(job));
    }
    std::vector<double> without_z;
    for (const RunRecord& r : train_runs(st, std::move(jobs)))
      without_z.push_back(r.val_bits_per_byte);
    out.with_z_bits_per_byte = with_z;
    out.without_z_outcome = paired_outcome("moe, no z-loss", without_z, with_z, st.options.margin);
  }
  st.results.moe = std::move(out);
}

json moe_json(const Results& res) {
  return json_if(res.moe, [](const MoEResult& m) {
    json out{{"capacity_factor", m.capacity_factor},
             {"balancing_steps", m.balancing_steps},
             {"load_settled_tolerance", m.load_tolerance}};
    if (m.without_z_outcome) {
      const VariantOutcome& o = *m.without_z_outcome;
      out["z_loss_ablation"] = {
          {"z_coef", m.z_coef},
          {"val_bits_per_byte", m.with_z_bits_per_byte},
          {"without_z_loss_val_bits_per_byte", o.val_bits_per_byte},
          {"paired_difference_mean", o.diff_mean},
          {"paired_difference_ci95", interval_json(o.diff_low, o.diff_high)},
          {"verdict", o.verdict == Verdict::better       ? "better without the z-loss"
                      : o.verdict == Verdict::worse      ? "worse without the z-loss"
                      : o.verdict == Verdict::equivalent ? "equivalent within the margin"
                      : o.verdict == Verdict::one_seed   ? verdict_text(Verdict::one_seed)
                                                         : "inconclusive"}};
    }
    for (const ExpertSpecialisation& layer : m.specialisation) {
      json l{{"mutual_information_bits", layer.mutual_information_bits()}};
      for (int c = 0; c < kByteClasses; ++c) {
        json& k = l["classes"][std::string(byte_class_name(c))];
        k["share_of_all"] = layer.base_share(c);
        for (int e = 0; e < layer.experts; ++e) k["share_per_expert"].push_back(layer.share(e, c));
      }
      out["specialisation"].push_back(std::move(l));
    }
    for (const MoESetting& s : m.settings) {
      const auto settled = s.load.settled_step(m.balancing_steps, m.load_tolerance);
      out["settings"][s.name] = {{"description", s.description},
                                 {"val_bits_per_byte", s.val_bits_per_byte},
                                 {"load_cv", s.load_cv},
                                 {"max_over_mean", s.max_over_mean},
                                 {"dropped_fraction", s.dropped_fraction},
                                 {"router_entropy", s.router_entropy},
                                 {"tokens_per_second", s.tokens_per_second},
                                 {"load_settled_step", settled ? json(*settled) : json(nullptr)}};
    }
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
                    thousands(static_cast<std::int64_t>(s.tokens_per_second)), settled_cell(s, m)});
  std::string md = fmt::format(
      "The study's MoE LM ({} experts of width {}, top-{}, softmax router), seed 1, {} steps "
      "(half the study's), capacity factor {} (an expert takes at most ⌈{}·k·T/E⌉ assignments "
      "a batch; the rest pass through the residual only), three ways. Load statistics: means "
      "over layers and the second half of training; entropy: the router's distribution over "
      "the experts for each token, in nats (ln {} = {:.3f} is uniform). An entropy near uniform "
      "does not mean a balanced load: top-k follows the router's small preferences, and when "
      "most tokens share them, most tokens go to the same experts (the load CV and drops say "
      "so).\n\n",
      m.experts, m.expert_d_ff, m.top_k, m.balancing_steps, m.capacity_factor, m.capacity_factor,
      m.experts, std::log(static_cast<double>(m.experts)));
  md += markdown_table({"balancing", "val bits/byte", "load CV", "max / mean", "dropped",
                        "router entropy", "tokens/s", "load settled from"},
                       rows, "lrrrrrrl");
  md += fmt::format(
      "\n**Load settled from**: the first logged step after which every expert's share of the "
      "assignments, in every layer, stays within {} (absolute share) of its mean over the last "
      "10 % of the run (moe_load_<setting>.csv); held only inside that last 10 % is not "
      "settled.\n",
      m.load_tolerance);
  if (m.without_z_outcome || !m.specialisation.empty() || m.z_coef > 0) md += kDetails;
  if (!m.specialisation.empty()) md += specialisation_markdown(m.specialisation);
  if (!m.without_z_outcome && m.z_coef > 0)
    md += fmt::format(
        "\n**Router z-loss.** The study's MoE routers carry ST-MoE's z-loss, "
        "{}·mean(logsumexp(logits)²), which keeps the router's logits small. What it does to "
        "this MoE LM's validation is not measured by this run: `{}` measures it as an "
        "ablation, the same MoE LM without the z-loss on every seed, paired with these runs.\n",
        m.z_coef, full_study_call(st.options));
  if (m.without_z_outcome) {
    const VariantOutcome& o = *m.without_z_outcome;
    auto list = [](const std::vector<double>& x) {
      std::string s;
      for (double v : x) s += (s.empty() ? "" : ", ") + fixed(v, 3);
      return s;
    };
    auto spread = [](std::vector<double> x) {
      return x.empty()
                 ? NAN
                 : *std::max_element(x.begin(), x.end()) - *std::min_element(x.begin(), x.end());
    };
    // The dense reference's spread over the same seeds: what "a seed is late" is measured by.
    std::vector<double> relu = per_seed(st, "relu", &RunRecord::val_bits_per_byte);
    relu.resize(std::min(relu.size(), m.with_z_bits_per_byte.size()));
    md += fmt::format(
        "\n**Router z-loss (an ablation of the recipe).** The study's MoE routers carry ST-MoE's "
        "z-loss, {}·mean(logsumexp(logits)²), which keeps the router's logits small. This run "
        "measures what it does on its own seeds: the same MoE LM (equal total parameters, "
        "dropless) without the z-loss, every seed, against {}'s runs with it, beside ReLU's "
        "spread over the same seeds:\n\n"
        "| router z-loss | bits/byte per seed | mean | spread (max − min) |\n"
        "|---|---|---|---|\n"
        "| {} (the study's) | {} | {} | {} |\n| none | {} | {} | {} |\n"
        "| ReLU, the same seeds | {} | {} | {} |\n\n"
        "Paired difference (without − with): {} bits/byte; {}.\n",
        m.z_coef, sec.ref("training"), m.z_coef, list(m.with_z_bits_per_byte),
        fixed(mean(m.with_z_bits_per_byte), 4), fixed(spread(m.with_z_bits_per_byte), 3),
        list(o.val_bits_per_byte), fixed(o.mean, 4), fixed(spread(o.val_bits_per_byte), 3),
        list(relu), fixed(mean(relu), 4), fixed(spread(relu), 3), difference_cell(o),
        o.verdict == Verdict::worse        ? "in this run the MoE LM is worse without the z-loss"
        : o.verdict == Verdict::better     ? "in this run the MoE LM is better without the z-loss"
        : o.verdict == Verdict::equivalent ? "in this run the two are equivalent within the margin"
        : o.verdict == Verdict::one_seed   ? verdict_text(Verdict::one_seed)
                                           : "in this run these seeds cannot tell them apart");
  }
  return md + "\n";
}

}  // namespace ffnlab::study
