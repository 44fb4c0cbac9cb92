// Layer benchmark: forward and forward+backward of every dense FFN variant, as GFLOP/s and as a
// ratio to oneDNN's bare matrix-product throughput for the same product shapes, measured in the
// same run (the practical peak of this machine; absolute times drift on a shared machine).
//
//   bench_ffn [--d-model 512] [--d-ff 2048] [--tokens 8,6400] [--seconds 0.5] [--json]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench_cli.hpp"
#include "bench_util.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/layers/dense_ffn.hpp"
#include "ffnlab/ops/matmul.hpp"

using namespace ffnlab;
using bench::random;
using bench::time_it;

namespace {

struct Row {
  std::string variant;
  std::int64_t tokens;
  double fwd_s, fwdbwd_s, fwd_gflops, fwdbwd_gflops, mm_fwd_gflops, mm_fwdbwd_gflops;
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
       {"relu", "gelu", "glu", "bilinear", "reglu", "geglu", "swiglu", "gated"}) {
    FFNConfig c = variant_config(variant, D, F, true);
    DenseFFN ffn(c, 1);
    const std::int64_t P = ffn.in_width();
    for (std::int64_t T : token_counts) {
      const Tensor x = random({T, D}, 2), dy = random({T, D}, 3);
      Tensor y, dx;
      const double fwd = time_it([&] { ffn.forward(y, x, true); }, budget);
      const double fwdbwd = time_it(
          [&] {
            ffn.forward(y, x, true);
            ffn.backward(dx, dy);
          },
          budget);
      // The same six products on bare oneDNN, no elementwise work: the practical peak.
      Tensor a({T, P}), h({T, F}), w_in({P, D}), w_out({D, F}), out({T, D}), dw_in({P, D}),
          dw_out({D, F});
      const double mm_fwd = time_it(
          [&] {
            matmul(a, x, Trans::no, w_in, Trans::yes);
            matmul(out, h, Trans::no, w_out, Trans::yes);
          },
          budget);
      MatmulOptions acc;
      acc.accumulate = true;
      const double mm_bwd = time_it(
          [&] {
            matmul(h, dy, Trans::no, w_out, Trans::no);
            matmul(dw_out, dy, Trans::yes, h, Trans::no, acc);
            matmul(out, a, Trans::no, w_in, Trans::no);
            matmul(dw_in, a, Trans::yes, x, Trans::no, acc);
          },
          budget);
      const FFNCost cost = ffn_cost(c, T);
      const double flops_f = cost.forward.matmul * static_cast<double>(T);
      const double flops_b = cost.backward.matmul * static_cast<double>(T);
      rows.push_back({variant, T, fwd, fwdbwd, flops_f / fwd / 1e9,
                      (flops_f + flops_b) / fwdbwd / 1e9, flops_f / mm_fwd / 1e9,
                      (flops_f + flops_b) / (mm_fwd + mm_bwd) / 1e9});
    }
  }

  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : rows)
      out.push_back({{"variant", r.variant},
                     {"tokens", r.tokens},
                     {"forward_s", r.fwd_s},
                     {"forward_backward_s", r.fwdbwd_s},
                     {"forward_gflops", r.fwd_gflops},
                     {"forward_backward_gflops", r.fwdbwd_gflops},
                     {"matmul_forward_gflops", r.mm_fwd_gflops},
                     {"matmul_forward_backward_gflops", r.mm_fwdbwd_gflops}});
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print(
      "Dense FFN layers, d_model {}, d_ff {}, bias, f32 (training forward keeps "
      "activations). GFLOP/s count matrix-product FLOPs only; 'of peak' is the layer's "
      "rate over bare oneDNN products of the same shapes, measured in this run.\n\n",
      D, F);
  fmt::print(
      "| variant | tokens | fwd ms | fwd GFLOP/s | fwd of peak | fwd+bwd ms | fwd+bwd "
      "GFLOP/s | fwd+bwd of peak |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& r : rows)
    fmt::print("| {} | {} | {:.3f} | {:.1f} | {:.0f} % | {:.3f} | {:.1f} | {:.0f} % |\n", r.variant,
               r.tokens, r.fwd_s * 1e3, r.fwd_gflops, 100 * r.fwd_gflops / r.mm_fwd_gflops,
               r.fwdbwd_s * 1e3, r.fwdbwd_gflops, 100 * r.fwdbwd_gflops / r.mm_fwdbwd_gflops);
  return 0;
}
