// The real-model table with ffnlab's costs.
#include "ffnlab/study/zoo_table.hpp"

#include <fmt/format.h>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/zoo.hpp"
#include "ffnlab/report/markdown.hpp"

namespace ffnlab::study {

namespace {

std::string kind_of(const FFNConfig& c) {
  const FFNConfig& e = c.kind == FFNKind::moe ? expert_config(c) : c;
  return e.kind == FFNKind::glu ? fmt::format("GLU ({})", enum_name(e.act.kind))
                                : fmt::format("plain ({})", enum_name(e.act.kind));
}

std::string experts_of(const FFNConfig& c) {
  if (c.kind != FFNKind::moe) return "—";
  std::string s = fmt::format("{} × top-{}", c.moe.num_experts, c.moe.top_k);
  if (c.moe.num_shared > 0)
    s += fmt::format(" + {} shared ({})", c.moe.num_shared, thousands(c.shared_d_ff()));
  return s;
}

std::string billions(double v) {
  return v >= 1e9 ? fmt::format("{:.2f} G", v / 1e9) : fmt::format("{:.1f} M", v / 1e6);
}

}  // namespace

std::vector<std::string> zoo_table_header() {
  return {"model",          "FFN",           "d_model",        "d_ff",
          "d_ff / d_model", "experts",       "FFN layers",     "params / layer",
          "active / layer", "FLOPs / token", "all FFN params", "source"};
}

std::vector<std::vector<std::string>> zoo_table_rows() {
  std::vector<std::vector<std::string>> rows;
  for (const ZooModel& m : zoo_models()) {
    const FFNConfig& c = m.ffn;
    const FFNCost k = ffn_cost(c, 1);
    const std::int64_t F = c.kind == FFNKind::moe ? c.expert_d_ff() : c.d_ff;
    rows.push_back({m.name, kind_of(c), thousands(c.d_model), thousands(F),
                    fmt::format("{:.2f}", static_cast<double>(F) / c.d_model), experts_of(c),
                    std::to_string(m.layers), billions(static_cast<double>(k.params)),
                    billions(static_cast<double>(k.active_params)), billions(k.forward.total()),
                    billions(static_cast<double>(k.params) * m.layers),
                    m.source + (m.note.empty() ? "" : ". Note: " + m.note)});
  }
  return rows;
}

nlohmann::ordered_json zoo_table_json() {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const ZooModel& m : zoo_models()) {
    const FFNCost k = ffn_cost(m.ffn, 1);
    out.push_back({{"model", m.name},
                   {"family", m.family},
                   {"ffn_layers", m.layers},
                   {"config", nlohmann::ordered_json(config_to_json(m.ffn))},
                   {"params_per_layer", k.params},
                   {"active_params_per_layer", k.active_params},
                   {"forward_flops_per_token_per_layer",
                    {{"matmul", k.forward.matmul}, {"elementwise", k.forward.elementwise}}},
                   {"ffn_params_all_layers", k.params * m.layers},
                   {"source", m.source},
                   {"note", m.note}});
  }
  return out;
}

}  // namespace ffnlab::study
