// Stage "moe": MoE behaviour. The study's MoE LM trained three times on seed 1 with a capacity
// factor (so that overflow is dropped and counted): no balancing, the load-balancing loss, and
// the aux-loss-free balancing bias. Tokens per expert over training per layer, load CV,
// max/mean, dropped assignments, router entropy, and what each setting costs in validation.
#include <fmt/format.h>

#include <cmath>

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

}  // namespace

std::int64_t moe_steps(const Study& st) {
  return st.has_variant("moe") ? st.scale.train.steps * static_cast<std::int64_t>(kSettings.size())
                               : 0;
}

void run_moe(Study& st) {
  if (!st.has_variant("moe")) return;
  st.stage("MoE load balancing: none, loss, bias");
  const FFNConfig c = study_ffn("moe", st.scale.model.d_model);
  MoEResult out;
  out.capacity_factor = kCapacity;
  out.experts = c.moe.num_experts;
  out.top_k = c.moe.top_k;
  out.expert_d_ff = c.expert_d_ff();
  const std::int64_t every = std::max<std::int64_t>(1, st.scale.train.steps / 60);
  std::string csv = "setting,step,layer,expert,load_fraction\n";
  for (const Setting& s : kSettings) {
    LMConfig m = st.scale.model;
    m.ffn = c;
    m.ffn.moe.aux_coef = s.aux;
    m.ffn.moe.balance_bias = s.bias;
    m.ffn.moe.capacity_factor = kCapacity;
    double cv = 0, max_mean = 0, dropped = 0, entropy = 0;
    std::string wide = "step";  // layer 0, one column per expert: the figure's data
    for (int e = 0; e < out.experts; ++e) wide += fmt::format(",expert_{}", e);
    wide += "\n";
    std::int64_t tail = 0;
    RunHooks hooks;
    hooks.on_step = [&](const TransformerLM& lm, const StepLog& log) {
      if (log.step > st.scale.train.steps / 2) {  // the second half: settled behaviour
        cv += log.load_cv;
        max_mean += log.max_over_mean;
        dropped += log.dropped_fraction;
        entropy += log.router_entropy;
        ++tail;
      }
      if (log.step % every != 0 && log.step != 1) return;
      for (int l = 0; l < lm.config().layers; ++l) {
        const FFNStats fs = lm.ffn(l).stats();
        std::int64_t total = 0;
        for (auto n : fs.tokens_per_expert) total += n;
        if (l == 0) wide += std::to_string(log.step);
        for (std::size_t e = 0; e < fs.tokens_per_expert.size(); ++e) {
          const double share = total ? static_cast<double>(fs.tokens_per_expert[e]) / total : 0.0;
          csv += fmt::format("{},{},{},{},{:.5f}\n", s.name, log.step, l, e, share);
          if (l == 0) wide += fmt::format(",{:.5f}", share);
        }
        if (l == 0) wide += "\n";
      }
    };
    const RunRecord r = train_run(st, m, 1, std::string("moe/") + s.name, hooks);
    st.write(std::string("moe_load_") + s.name + ".csv", wide);
    const double n = static_cast<double>(std::max<std::int64_t>(1, tail));
    out.settings.push_back({s.name, s.what, r.val_bits_per_byte, cv / n, max_mean / n, dropped / n,
                            entropy / n, r.median_tokens_per_second});
  }
  st.write("moe_load.csv", csv);
  st.results.moe = std::move(out);
}

json moe_json(const Results& res) {
  return json_if(res.moe, [](const MoEResult& m) {
    json out{{"capacity_factor", m.capacity_factor}};
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

std::string moe_markdown(const Study& st, const Sections&) {
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
      "with capacity factor {} (an expert takes at most ⌈{}·k·T/E⌉ assignments per batch; the "
      "rest are dropped and their tokens pass through the residual only), three ways. Load "
      "statistics are means over layers and over the second half of training; entropy is the "
      "router's softmax entropy in nats (ln {} = {:.3f} is uniform). moe_expert_load.png shows "
      "each expert's share of the assignments over training.\n\n",
      m.experts, m.expert_d_ff, m.top_k, m.capacity_factor, m.capacity_factor, m.experts,
      std::log(static_cast<double>(m.experts)));
  md += markdown_table({"balancing", "val bits/byte", "load CV", "max / mean", "dropped",
                        "router entropy", "tokens/s"},
                       rows, "lrrrrrr");
  return md + "\n";
}

}  // namespace ffnlab::study
