// Stage 6: MoE behaviour. The study's MoE LM trained three times on seed 1 with a capacity
// factor (so that overflow is dropped and counted): no balancing, the load-balancing loss, and
// the aux-loss-free balancing bias. Tokens per expert over training per layer, load CV,
// max/mean, dropped assignments, router entropy, and what each setting costs in validation.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "../common.hpp"
#include "ffnlab/report/markdown.hpp"
#include "study.hpp"

namespace ffnlab::cli::evolve {

namespace {

constexpr double kCapacity = 1.25;

struct Setting {
  const char* name;
  const char* what;
  float aux;
  bool bias;
};

}  // namespace

void run_moe(Study& st) {
  if (std::find(st.variants.begin(), st.variants.end(), "moe") == st.variants.end()) return;
  st.stage("MoE load balancing: none, loss, bias");
  const std::vector<Setting> settings{
      {"none", "no balancing", 0.0f, false},
      {"loss", "load-balancing loss, coefficient 0.01", 0.01f, false},
      {"bias", "aux-loss-free bias (rate 1e-3)", 0.0f, true}};
  json& out = st.results["moe"];
  out["capacity_factor"] = kCapacity;
  const std::int64_t every = std::max<std::int64_t>(1, st.scale.train.steps / 60);
  std::string csv = "setting,step,layer,expert,load_fraction\n";
  const int E = study_ffn("moe", st.scale.model.d_model).moe.num_experts;
  std::vector<std::vector<std::string>> rows;
  for (const Setting& s : settings) {
    LMConfig m = st.scale.model;
    m.ffn = study_ffn("moe", m.d_model);
    m.ffn.moe.aux_coef = s.aux;
    m.ffn.moe.balance_bias = s.bias;
    m.ffn.moe.capacity_factor = kCapacity;
    double cv = 0, max_mean = 0, dropped = 0, entropy = 0;
    std::string wide = "step";  // layer 0, one column per expert: the figure's data
    for (int e = 0; e < E; ++e) wide += fmt::format(",expert_{}", e);
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
    write_text(st.dir + "/moe_load_" + s.name + ".csv", wide);
    const double n = static_cast<double>(std::max<std::int64_t>(1, tail));
    out["settings"][s.name] = {{"description", s.what},
                               {"val_bits_per_byte", r.val_bits_per_byte},
                               {"load_cv", cv / n},
                               {"max_over_mean", max_mean / n},
                               {"dropped_fraction", dropped / n},
                               {"router_entropy", entropy / n},
                               {"tokens_per_second", r.median_tokens_per_second}};
    rows.push_back({s.what, fixed(r.val_bits_per_byte, 4), fixed(cv / n, 3), fixed(max_mean / n, 2),
                    percent(dropped / n, 2), fixed(entropy / n, 3),
                    thousands(static_cast<std::int64_t>(r.median_tokens_per_second))});
  }
  write_text(st.dir + "/moe_load.csv", csv);
  const FFNConfig c = study_ffn("moe", st.scale.model.d_model);
  st.report += "## 6. MoE behaviour\n\n";
  st.report += fmt::format(
      "The study's MoE LM ({} experts of width {}, top-{}, softmax router) trained on seed 1 "
      "with capacity factor {} (an expert takes at most ⌈{}·k·T/E⌉ assignments per batch; the "
      "rest are dropped and their tokens pass through the residual only), three ways. Load "
      "statistics are means over layers and over the second half of training; entropy is the "
      "router's softmax entropy in nats (ln {} = {:.3f} is uniform). moe_expert_load.png shows "
      "each expert's share of the assignments over training.\n\n",
      c.moe.num_experts, c.expert_d_ff(), c.moe.top_k, kCapacity, kCapacity, c.moe.num_experts,
      std::log(static_cast<double>(c.moe.num_experts)));
  st.report += markdown_table({"balancing", "val bits/byte", "load CV", "max / mean", "dropped",
                               "router entropy", "tokens/s"},
                              rows, "lrrrrrr");
  st.report += "\n";
}

}  // namespace ffnlab::cli::evolve
