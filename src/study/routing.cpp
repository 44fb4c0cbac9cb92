// Stage "routing": every routing family against token-choice top-k, at the headline MoE's layout
// (16 experts of a quarter of ReLU's width and one shared expert of a quarter: ReLU's active
// compute) and so at its total parameters. The families come from the routing table
// (routing_family_names): those that decide per token (dynamic top-p, ReLU routing, MoE++'s
// zero-computation experts, hash routing, BASE layers) train on the study's causal LM, paired
// with the moe_axes stage's runs of the headline MoE; all of them, and top-k, train on the masked
// objective (a bidirectional LM), where expert choice and Soft MoE, which look at the whole
// sequence, may run. Each over Scale::routing_seeds paired seeds, judged by the training stage's
// rules against top-k; per family what its layers did over the second half of training (experts
// a token ran, per layer with their distribution; load CV; dropped; router entropy), its
// tokens/s, and the LM's forward FLOPs at the experts a token actually ran.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/report/markdown.hpp"
#include "ffnlab/train/data.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

namespace {

struct Family {
  std::string name;
  bool causal;  // decides per token: also trained on the causal LM
};
// Every routing family of the table (routing_family_names, top-k first: the reference of each
// objective); those that look at the whole sequence train on the masked objective only.
std::vector<Family> families() {
  std::vector<Family> out;
  for (const auto& name : routing_family_names()) {
    const FFNConfig c = routing_family_config(headline_moe_ffn(64), name, 64);
    out.push_back({name, !looks_at_whole_sequence(c.moe.routing)});
  }
  return out;
}

// The family's FFN on the headline MoE's layout, for sequences of S tokens. Each keeps the
// headline's balancing loss and z-loss where the family takes them.
FFNConfig family_ffn(std::string_view name, std::int64_t D, std::int64_t S) {
  return routing_family_config(headline_moe_ffn(D), name, S);
}

std::string family_description(std::string_view name, const FFNConfig& c, std::int64_t S) {
  const MoEConfig& m = c.moe;
  if (name == "topk") return fmt::format("token-choice top-{} (the reference)", m.top_k);
  if (name == "top_p")
    return fmt::format(
        "dynamic top-p: the fewest experts whose probabilities reach {}, at most "
        "{}; dynamic loss {}",
        m.top_p, m.top_k, m.entropy_coef);
  if (name == "relu")
    return fmt::format(
        "ReLU routing: every positive gate, held at {} experts a token on average "
        "by the adaptive L1 penalty",
        m.num_experts * (1.0 - m.sparsity_target()));
  if (name == "moe_pp")
    return fmt::format(
        "MoE++: top-{} over the {} FFN experts and {} constant, {} copy and {} zero "
        "experts, with its gating residuals",
        m.top_k, m.num_experts, m.constant_experts, m.copy_experts, m.zero_experts);
  if (name == "expert_choice")
    return fmt::format("expert choice: each expert takes its best {} tokens of a sequence of {}",
                       m.expert_choice_capacity(S), S);
  if (name == "soft")
    return fmt::format("Soft MoE: {} slots an expert, each a mixture of a sequence's {} tokens",
                       m.slots, S);
  return routing_family(m.routing).describe(m);  // a family without its own sentence here
}

// The LM a family trains in an objective: the study's, bidirectional with [MASK] and RoPE for
// the masked objective (as `ffnlab train --objective masked` builds it).
LMConfig family_model(const Study& st, const FFNConfig& ffn, bool masked) {
  LMConfig m = st.scale.model;
  m.ffn = ffn;
  return task_model(m, masked);
}

TrainConfig family_settings(const Study& st, bool masked) {
  TrainConfig t = st.scale.train;
  t.eval_every = 0;  // no periodic evaluations: the stage reads the final one
  if (masked) t.objective = Objective::masked;
  return t;
}

std::string label_of(bool masked, std::string_view name) {
  return fmt::format("{}/{}", masked ? "masked" : "causal", name);
}

bool trains(const Study& st) {
  return st.has_variant("moe");
}

// Whether the stage trains the masked objective: with --full (its run a seed for every family
// would take seeds from the sequential comparisons of the default run's budget).
bool trains_masked(const Study& st) {
  return st.options.full;
}

// The runs the stage trains itself: seed-major; in a seed the causal families, then (with
// --full) the masked ones with top-k. (Causal top-k is the moe_axes stage's headline MoE.)
std::vector<std::pair<bool, Family>> own_runs(const Study& st) {
  std::vector<std::pair<bool, Family>> out;
  for (bool masked : {false, true}) {
    if (masked && !trains_masked(st)) continue;
    for (const Family& f : families())
      if (masked ? true : (f.causal && f.name != "topk")) out.emplace_back(masked, f);
  }
  return out;
}

// Means over the second half of a run's steps (settled behaviour) of what StepLog holds.
void add_step_means(RoutingBehaviour& b, const RunRecord& run) {
  const std::int64_t half = static_cast<std::int64_t>(run.steps.size()) / 2;
  double n = 0;
  for (const StepLog& s : run.steps) {
    if (s.step <= half) continue;
    b.experts_per_token += s.experts_per_token;
    b.load_cv += s.load_cv;
    b.dropped_fraction += s.dropped_fraction;
    b.router_entropy += s.router_entropy;
    ++n;
  }
  if (n == 0) return;
  b.experts_per_token /= n;
  b.load_cv /= n;
  b.dropped_fraction /= n;
  b.router_entropy /= n;
}

// The mean over seeds of the runs' behaviour (the per-layer parts elementwise).
RoutingBehaviour mean_behaviour(const std::vector<RoutingBehaviour>& runs) {
  RoutingBehaviour m;
  if (runs.empty()) return m;
  const double n = static_cast<double>(runs.size());
  m.experts_distribution.resize(runs.front().experts_distribution.size());
  m.experts_per_token_by_layer.assign(runs.front().experts_per_token_by_layer.size(), 0.0);
  for (const RoutingBehaviour& b : runs) {
    m.experts_per_token += b.experts_per_token / n;
    m.load_cv += b.load_cv / n;
    m.dropped_fraction += b.dropped_fraction / n;
    m.router_entropy += b.router_entropy / n;
    m.zero_computation_fraction += b.zero_computation_fraction / n;
    for (std::size_t l = 0; l < m.experts_per_token_by_layer.size(); ++l)
      m.experts_per_token_by_layer[l] += b.experts_per_token_by_layer[l] / n;
    for (std::size_t l = 0; l < m.experts_distribution.size(); ++l) {
      auto& d = m.experts_distribution[l];
      const auto& src = b.experts_distribution[l];
      if (d.size() < src.size()) d.resize(src.size(), 0.0);
      for (std::size_t k = 0; k < src.size(); ++k) d[k] += src[k] / n;
    }
  }
  return m;
}

std::string verdict_words(const VariantOutcome& o) {
  if (o.verdict == Verdict::inconclusive && o.seeds_to_decide > 0 && o.seeds_to_decide <= 1000)
    return fmt::format("inconclusive (about {} seeds would decide it)", o.seeds_to_decide);
  return verdict_text(o.verdict, "top-k");
}

std::string throughput_cell(const VariantOutcome& o, bool reference) {
  const std::string n = thousands(static_cast<std::int64_t>(o.tokens_per_second));
  if (reference) return n;
  if (o.tokens_per_second_noisy)
    return fmt::format("{} (noisy: ratio spread {})", n, percent(o.tokens_per_second_spread, 0));
  return fmt::format("{} ({:.2f}×)", n, o.tokens_per_second_over_relu);
}

// "3.0 [2–4], 1.2 % none": a layer's mean experts a token, the 5th to 95th percentile of its
// distribution, and the share of tokens that ran no FFN expert.
std::string distribution_cell(double mean, const std::vector<double>& shares) {
  if (shares.empty()) return fmt::format("{:.2f}", mean);
  double total = 0;
  for (double s : shares) total += s;
  if (total <= 0) return fmt::format("{:.2f}", mean);
  std::size_t p5 = 0, p95 = shares.size() - 1;
  double cum = 0;
  bool low = false;
  for (std::size_t k = 0; k < shares.size(); ++k) {
    cum += shares[k] / total;
    if (!low && cum >= 0.05) p5 = k, low = true;
    if (cum >= 0.95) {
      p95 = k;
      break;
    }
  }
  return fmt::format("{:.2f} [{}–{}], {} none", mean, p5, p95, percent(shares[0] / total));
}

}  // namespace

const RoutingRow* RoutingResult::find(std::string_view objective, std::string_view name) const {
  for (const RoutingRow& r : rows)
    if (r.objective == objective && r.name == name) return &r;
  return nullptr;
}

std::string RoutingResult::figure_csv() const {
  // std: over seeds, 0 for one seed (no bar).
  std::string csv = "objective,family,active_forward_flops_per_token,mean,std,experts_per_token\n";
  for (const RoutingRow& r : rows)
    csv += fmt::format("{},{},{:.0f},{:.5f},{:.5f},{:.4f}\n", r.objective, r.name,
                       r.active_forward_flops, r.outcome.mean,
                       std::isfinite(r.outcome.std) ? r.outcome.std : 0.0,
                       r.behaviour.experts_per_token);
  return csv;
}

std::string RoutingResult::distribution_csv() const {
  std::string csv = "objective,family,layer,experts,share_of_tokens\n";
  for (const RoutingRow& r : rows)
    for (std::size_t l = 0; l < r.behaviour.experts_distribution.size(); ++l)
      for (std::size_t k = 0; k < r.behaviour.experts_distribution[l].size(); ++k)
        csv += fmt::format("{},{},{},{},{:.6f}\n", r.objective, r.name, l, k,
                           r.behaviour.experts_distribution[l][k]);
  return csv;
}

std::int64_t routing_steps(const Study& st) {
  if (!trains(st)) return 0;
  return st.scale.train.steps * st.scale.routing_seeds *
         static_cast<std::int64_t>(own_runs(st).size());
}

namespace {

// Per layer, over the second half of the steps: the experts a token ran and their distribution,
// and MoE++'s zero-computation share.
class BehaviourProbe final : public RunProbe {
 public:
  explicit BehaviourProbe(const RunJob& job)
      : half_(job.settings->steps / 2),
        tail_(static_cast<double>(job.settings->steps - half_)),
        layers_(job.model.layers) {
    b_.experts_per_token_by_layer.assign(static_cast<std::size_t>(layers_), 0.0);
    b_.experts_distribution.assign(static_cast<std::size_t>(layers_), {});
  }
  void step(const TransformerLM& lm, const StepLog& log) override {
    if (log.step <= half_) return;
    for (int l = 0; l < layers_; ++l) {
      const FFNStats fs = lm.ffn(l).stats();
      const auto i = static_cast<std::size_t>(l);
      b_.experts_per_token_by_layer[i] += fs.experts_per_token / tail_;
      b_.zero_computation_fraction += fs.zero_computation_fraction / tail_ / layers_;
      auto& d = b_.experts_distribution[i];
      if (d.size() < fs.tokens_by_experts.size()) d.resize(fs.tokens_by_experts.size(), 0.0);
      const double tokens = static_cast<double>(std::max<std::int64_t>(1, fs.tokens));
      for (std::size_t k = 0; k < fs.tokens_by_experts.size(); ++k)
        d[k] += static_cast<double>(fs.tokens_by_experts[k]) / tokens / tail_;
    }
  }
  nlohmann::json gathered() const override { return routing_behaviour_json(b_); }

 private:
  std::int64_t half_;
  double tail_;
  int layers_;
  RoutingBehaviour b_;
};

// What a run's BehaviourProbe gathered.
RoutingBehaviour behaviour_of(const RunRecord& r) {
  RoutingBehaviour b;
  const nlohmann::json& g = r.gathered;
  b.experts_per_token_by_layer = g.at("experts_per_token_by_layer").get<std::vector<double>>();
  b.zero_computation_fraction = g.at("zero_computation_fraction");
  b.experts_distribution = g.at("experts_distribution").get<std::vector<std::vector<double>>>();
  return b;
}

}  // namespace

nlohmann::json routing_behaviour_json(const RoutingBehaviour& b) {
  return {{"experts_per_token_by_layer", b.experts_per_token_by_layer},
          {"zero_computation_fraction", b.zero_computation_fraction},
          {"experts_distribution", b.experts_distribution}};
}

std::unique_ptr<RunProbe> routing_behaviour_probe(const Study& /*st*/, const RunJob& job) {
  return std::make_unique<BehaviourProbe>(job);
}

std::vector<RunJob> routing_jobs(const Study& st) {
  std::vector<RunJob> jobs;
  if (!trains(st)) return jobs;
  const std::int64_t D = st.scale.model.d_model, S = st.scale.train.seq;
  for (int seed = 1; seed <= st.scale.routing_seeds; ++seed)
    for (const auto& [masked, family] : own_runs(st)) {
      RunJob job;
      job.model = family_model(st, family_ffn(family.name, D, S), masked);
      job.settings = family_settings(st, masked);
      job.seed = static_cast<std::uint64_t>(seed);
      job.label = label_of(masked, family.name);
      job.probe = Probe::routing_behaviour;
      jobs.push_back(std::move(job));
    }
  return jobs;
}

void run_routing(Study& st) {
  if (!trains(st) || !st.results.training || st.routing_runs.empty()) return;
  const int seeds = st.scale.routing_seeds;
  st.stage(
      fmt::format("routing families against top-k: {} seed{} each (trained with the "
                  "training stage's runs)",
                  seeds, seeds == 1 ? "" : "s"));
  const std::int64_t D = st.scale.model.d_model, S = st.scale.train.seq;
  const double margin = st.results.training->margin;
  RoutingResult out;
  out.seeds = seeds;
  out.sequence = S;
  out.mask_fraction = family_settings(st, true).mask_fraction;

  // The causal reference: the headline MoE's runs of the moe_axes stage, its first seeds.
  std::vector<const RunRecord*> causal_topk;
  for (const RunRecord& r : st.axes_runs)
    if (r.variant == kHeadlineMoE && static_cast<int>(causal_topk.size()) < seeds)
      causal_topk.push_back(&r);
  out.reference_seeds = static_cast<int>(causal_topk.size());

  const auto runs = own_runs(st);
  for (bool masked : {false, true}) {
    if (masked && !trains_masked(st)) continue;
    // The runs of each family of this objective, seed 1 first, with their behaviour.
    auto runs_of = [&](std::string_view name) {
      std::vector<std::pair<const RunRecord*, RoutingBehaviour>> found;
      if (!masked && name == "topk") {
        const FFNConfig c = headline_moe_ffn(D);
        for (const RunRecord* r : causal_topk) {
          // Dropless top-k: every token runs K experts in every layer.
          RoutingBehaviour b;
          b.experts_per_token_by_layer.assign(static_cast<std::size_t>(st.scale.model.layers),
                                              c.moe.top_k);
          std::vector<double> all_k(static_cast<std::size_t>(c.moe.top_k) + 1, 0.0);
          all_k.back() = 1.0;
          b.experts_distribution.assign(static_cast<std::size_t>(st.scale.model.layers), all_k);
          found.emplace_back(r, std::move(b));
        }
      } else {
        const std::string label = label_of(masked, name);
        for (std::size_t i = 0; i < st.routing_runs.size(); ++i)
          if (st.routing_runs[i].variant == label)
            found.emplace_back(&st.routing_runs[i], behaviour_of(st.routing_runs[i]));
      }
      for (auto& [run, b] : found) add_step_means(b, *run);
      return found;
    };
    const auto reference = runs_of("topk");
    std::vector<double> ref_val, ref_tps;
    for (const auto& [run, b] : reference) {
      ref_val.push_back(run->val_bits_per_byte);
      ref_tps.push_back(run->median_tokens_per_second);
    }
    for (const Family& f : families()) {
      if (!masked && !f.causal) continue;
      const auto found = runs_of(f.name);
      if (found.empty()) continue;
      RoutingRow row;
      row.name = f.name;
      row.objective = masked ? "masked" : "causal";
      row.ffn = family_ffn(f.name, D, S);
      row.description = family_description(f.name, row.ffn, S);
      const LMConfig m = family_model(st, row.ffn, masked);
      const TransformerCost tc = transformer_cost(m, S, true);
      row.params = tc.params;
      row.ffn_params = ffn_cost(row.ffn, S).params;
      row.closed_experts_per_token = experts_per_token(row.ffn, S);
      std::vector<double> val, tps;
      std::vector<RoutingBehaviour> behaviour;
      for (const auto& [run, b] : found) {
        val.push_back(run->val_bits_per_byte);
        tps.push_back(run->median_tokens_per_second);
        behaviour.push_back(b);
      }
      row.behaviour = mean_behaviour(behaviour);
      // The closed form's FLOPs with the experts a token ran in place of the config's: one
      // expert's forward and its weighted sum into the output per expert.
      const double per_expert =
          ffn_cost(expert_config(row.ffn), 1).forward.total() + 2.0 * static_cast<double>(D);
      row.active_forward_flops =
          tc.forward_flops + static_cast<double>(m.layers) *
                                 (row.behaviour.experts_per_token - row.closed_experts_per_token) *
                                 per_expert;
      row.outcome = paired_outcome(row.name, std::move(val), ref_val, margin);
      set_throughput(row.outcome, tps, ref_tps, row.name == "topk");
      if (row.name == "topk") row.outcome.verdict = Verdict::reference;
      out.rows.push_back(std::move(row));
    }
  }
  st.write("routing_families.csv", out.figure_csv());
  st.write("routing_experts_per_token.csv", out.distribution_csv());
  st.results.routing = std::move(out);
}

json routing_json(const Results& res) {
  return json_if(res.routing, [&res](const RoutingResult& r) {
    json out;
    out["config"] = {{"seeds", r.seeds},
                     {"causal_reference_seeds", r.reference_seeds},
                     {"sequence", r.sequence},
                     {"mask_fraction", r.mask_fraction},
                     {"equivalence_margin", res.training ? res.training->margin : 0.0}};
    for (const RoutingRow& row : r.rows) {
      const RoutingBehaviour& b = row.behaviour;
      const VariantOutcome& o = row.outcome;
      json j{{"description", row.description},
             {"ffn", config_to_json(row.ffn)},
             {"params", row.params},
             {"ffn_params", row.ffn_params},
             {"experts_per_token_config", row.closed_experts_per_token},
             {"experts_per_token", b.experts_per_token},
             {"experts_per_token_by_layer", b.experts_per_token_by_layer},
             {"experts_per_token_distribution_by_layer", b.experts_distribution},
             {"load_cv", b.load_cv},
             {"dropped_fraction", b.dropped_fraction},
             {"router_entropy", b.router_entropy},
             {"zero_computation_fraction", b.zero_computation_fraction},
             {"active_forward_flops_per_token", row.active_forward_flops},
             {"val_bits_per_byte", o.val_bits_per_byte},
             {"mean", o.mean},
             {"std", o.std},
             {"median_tokens_per_second", o.tokens_per_second}};
      if (o.verdict != Verdict::reference) {
        j["paired_difference_to_topk_mean"] = o.diff_mean;
        j["paired_difference_to_topk_ci95"] = interval_json(o.diff_low, o.diff_high);
        j["paired_difference_to_topk_ci90"] = interval_json(o.diff_low90, o.diff_high90);
        j["seeds_to_decide"] = o.seeds_to_decide;
        j["tokens_per_second_over_topk"] = o.tokens_per_second_over_relu;
        j["tokens_per_second_spread"] = o.tokens_per_second_spread;
        j["tokens_per_second_noisy"] = o.tokens_per_second_noisy;
      }
      j["verdict"] = verdict_text(o.verdict, "top-k");
      out[row.objective][row.name] = std::move(j);
    }
    return out;
  });
}

std::string routing_markdown(const Study& st, const Sections& sec) {
  if (!st.results.routing) return "";
  const RoutingResult& r = *st.results.routing;
  const FFNConfig head = headline_moe_ffn(st.scale.model.d_model);
  // Each family the run trained on the causal LM with what it does, in its table's order: the
  // registry's summary (routing_family.hpp), MoE++ by its zero-computation experts.
  std::vector<std::string> causal;
  for (const RoutingRow& row : r.rows) {
    if (row.objective != "causal" || row.name == "topk") continue;
    causal.push_back(fmt::format("{} ({})", row.name,
                                 row.ffn.moe.zc_experts() > 0
                                     ? "top-k over the FFN experts and zero-computation experts"
                                     : routing_family(row.ffn.moe.routing).summary));
  }
  std::string md = fmt::format(
      "Each routing family replaces the router of the equal-compute MoE ({}: {} experts of width "
      "{}, one shared, top-{}) and keeps its experts: {}. Each trains the causal LM of {}, "
      "paired with that MoE's runs, and is compared with top-k by fixed intervals (95 %; "
      "equivalence within ±{}). {}",
      sec.ref("moe_axes"), head.moe.num_experts, head.expert_d_ff(), head.moe.top_k,
      fmt::join(causal, "; "), sec.ref("training"),
      st.results.training ? st.results.training->margin : 0.0,
      st.options.full
          ? fmt::format("All {} families and top-k also train on the masked objective "
                        "(bidirectional attention, {} of each sequence's bytes masked, "
                        "validation in bits per masked byte), where expert choice and Soft MoE, "
                        "which look at the whole sequence, may run. ",
                        families().size() - 1, percent(r.mask_fraction, 0))
          : fmt::format("Expert choice and Soft MoE need a bidirectional model: `{}` trains "
                        "them on a masked objective. ",
                        full_study_call(st.options)));
  md += r.seeds == 1
            ? "**Each family trained one seed** in this run (seed 1): values without an interval "
              "or a verdict; `--routing-seeds N` (up to `--seeds`) or `--full` pairs more. "
            : fmt::format(
                  "Each family trained seeds 1 to {} (`--routing-seeds`; the default run "
                  "trains one).\n\n",
                  r.seeds);
  std::string tables, details;
  for (const char* objective : {"causal", "masked"}) {
    const bool masked = std::string_view(objective) == "masked";
    std::vector<std::vector<std::string>> rows, behaviour, layers;
    for (const RoutingRow& row : r.rows) {
      if (row.objective != objective) continue;
      const VariantOutcome& o = row.outcome;
      const bool ref = o.verdict == Verdict::reference;
      rows.push_back({row.name, row.description, thousands(row.params),
                      fmt::format("{:.2f} M", row.active_forward_flops / 1e6),
                      o.val_bits_per_byte.size() > 1
                          ? fmt::format("{} ± {}", fixed(o.mean, 4), fixed(o.std, 4))
                          : fixed(o.mean, 4),
                      ref ? "—" : difference_cell(o), verdict_words(o), throughput_cell(o, ref)});
      const RoutingBehaviour& b = row.behaviour;
      behaviour.push_back(
          {row.name, fmt::format("{:.2f}", row.closed_experts_per_token),
           fmt::format("{:.2f}", b.experts_per_token), fixed(b.load_cv, 3),
           percent(b.dropped_fraction),
           routing_family(row.ffn.moe.routing).router_linear ||
                   routing_family(row.ffn.moe.routing).own_path
               ? fmt::format("{:.3f}", b.router_entropy)
               : std::string("—"),  // (hash routing: no router)
           row.ffn.moe.zc_experts() > 0 ? percent(b.zero_computation_fraction) : "—"});
      std::vector<std::string> cells{row.name};
      for (std::size_t l = 0; l < b.experts_per_token_by_layer.size(); ++l)
        cells.push_back(distribution_cell(
            b.experts_per_token_by_layer[l],
            l < b.experts_distribution.size() ? b.experts_distribution[l] : std::vector<double>{}));
      layers.push_back(std::move(cells));
    }
    if (rows.empty()) continue;
    tables += masked ? "**The masked objective** (bits per masked byte; FLOPs at the experts a "
                       "token ran):\n\n"
                     : "**The causal LM** (bits per byte; FLOPs at the experts a token "
                       "ran):\n\n";
    tables +=
        markdown_table({"family", "what", "LM parameters", "forward FLOPs/token (as run)",
                        masked ? "val bits/masked byte" : "val bits/byte",
                        "paired difference to top-k [95 % CI]", "verdict", "tokens/s (÷ top-k's)"},
                       rows, "llrrrrlr");
    tables += "\n";
    details += masked ? "**What each family's router did, masked objective:**\n\n"
                      : "**What each family's router did, causal LM:**\n\n";
    details += markdown_table({"family", "experts/token (config)", "experts/token (ran)", "load CV",
                               "dropped", "router entropy (nats)", "zero-computation choices"},
                              behaviour, "lrrrrrr");
    std::vector<std::string> head_cells{"family"};
    for (std::size_t l = 0; l < layers.front().size() - 1; ++l)
      head_cells.push_back(fmt::format("layer {}", l));
    details += "\n";
    details += markdown_table(head_cells, layers, "l" + std::string(head_cells.size() - 1, 'r'));
    details += "\n";
  }
  // One seed gives values without verdicts: they go to the appendix with the behaviour.
  if (r.seeds == 1) {
    md += "The values and what each router did are in the appendix.\n";
    md += kDetails;
    md += tables;
  } else {
    md += tables;
    md += kDetails;
  }
  md += details;
  md +=
      "The behaviour is the second half of training, the mean over seeds (layers averaged in the "
      "second table). Experts/token (config) is what the config sets: top-p's cap, MoE++'s k "
      "(an upper bound), ReLU routing's target, expert choice's c·k, Soft MoE's E·slots/S; "
      "(ran) counts the FFN experts a token ran: top-k always its k; top-p "
      "between 1 and its cap; ReLU routing its positive gates; MoE++ fewer than k when a choice "
      "went to a zero-computation expert; expert choice 0 to all of them (a token no expert took "
      "passes through the residual and the shared expert alone: expert choice's form of a "
      "dropped token); Soft MoE no expert of its own (every token is in every slot: E·slots/S "
      "experts' compute a token, and no distribution). Per layer: the mean, the 5th to 95th "
      "percentile of the experts a token ran, and the share that ran none "
      "(routing_experts_per_token.csv has every count). Load CV is the coefficient of variation "
      "of the experts' assignments (0 for expert choice and Soft MoE by construction); the "
      "router entropy is of the softmax over the router's logits (Soft MoE: of its combine "
      "weights; ReLU routing: of the softmax of its logits, though its gates are not that "
      "softmax). Tokens/s is each run's median, the ratio to top-k's run of the same seed.\n\n";
  return md;
}

}  // namespace ffnlab::study
