// The FFN configurations of well-known real models, each with the source of its numbers (the
// paper's section or the published config.json), costed by ffnlab (analysis/costs.hpp):
// `ffnlab zoo`, and the section "Real models" of `ffnlab evolve`'s report.
#pragma once

#include <string>
#include <vector>

#include "ffnlab/layers/ffn_config.hpp"

namespace ffnlab {

struct ZooModel {
  std::string name;
  std::string family;  // "dense" or "MoE"
  int layers = 0;      // Transformer blocks with this FFN (MoE models: the MoE blocks)
  FFNConfig ffn;       // one layer's FFN
  std::string source;  // where the numbers come from
  std::string note;    // what the table does not say by itself (empty: nothing)
};

// The table, in order of publication within each family.
const std::vector<ZooModel>& zoo_models();

}  // namespace ffnlab
