// Layer benchmark: forward and forward+backward of every dense FFN variant, as GFLOP/s and as a
// ratio to oneDNN's bare matrix-product throughput for the same product shapes, measured in the
// same run (what the layer's own products reach alone; absolute times drift on a shared machine).
//
//   bench_ffn [--d-model 512] [--d-ff 2048] [--tokens 8,6400] [--seconds 0.5] [--json]
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_cli.hpp"
#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/layers/ffn_config.hpp"

using namespace ffnlab;

namespace {

struct Row {
  std::string variant;
  std::int64_t tokens;
  LayerSpeed speed;
};

}  // namespace

int main(int argc, char** argv) {
  std::int64_t D = 512, F = 2048;
  std::vector<std::int64_t> token_counts{8, 6400};
  double budget = 0.5;
  bool json = false;
  CLI::App app{
      "Forward and forward+backward of every dense FFN variant against bare oneDNN "
      "products of the same shapes, in one run."};
  bench::positive_option(app, "--d-model", D, "model width D");
  bench::positive_option(app, "--d-ff", F, "hidden width F");
  bench::positive_option(app, "--tokens", token_counts, "token counts, comma-separated")
      ->delimiter(',');
  bench::add_seconds_option(app, budget);
  app.add_flag("--json", json, "print JSON instead of a table");
  CLI11_PARSE(app, argc, argv);

  std::vector<Row> rows;
  for (const std::string variant :
       {"relu", "gelu", "glu", "bilinear", "reglu", "geglu", "swiglu", "gated"})
    for (std::int64_t T : token_counts) {
      // The layer and, in the same call, the bare oneDNN products of the same shapes.
      rows.push_back(
          {variant, T, measure_layer_speed(variant_config(variant, D, F, true), T, budget)});
    }

  if (json) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& r : rows) {  // LayerSpeed's one JSON form, after the row's names
      nlohmann::ordered_json row{{"variant", r.variant}, {"tokens", r.tokens}};
      row.update(to_json(r.speed));
      out.push_back(row);
    }
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print(
      "Dense FFN layers, d_model {}, d_ff {}, bias, f32 (training forward keeps "
      "activations). GFLOP/s count matrix-product FLOPs only; 'of bare' is the layer's "
      "rate over bare oneDNN products of the same shapes, measured in this run.\n\n",
      D, F);
  fmt::print(
      "| variant | tokens | fwd ms | fwd GFLOP/s | fwd of bare | fwd+bwd ms | fwd+bwd "
      "GFLOP/s | fwd+bwd of bare |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& [variant, tokens, s] : rows)
    fmt::print("| {} | {} | {:.3f} | {:.1f} | {:.0f} % | {:.3f} | {:.1f} | {:.0f} % |\n", variant,
               tokens, s.forward_s * 1e3, s.forward_gflops, 100 * s.forward_of_bare,
               s.forward_backward_s * 1e3, s.forward_backward_gflops,
               100 * s.forward_backward_of_bare);
  return 0;
}
