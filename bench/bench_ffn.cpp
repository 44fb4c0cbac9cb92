// Layer benchmark: forward and forward+backward of every dense FFN variant, as GFLOP/s and as a
// ratio to oneDNN's bare matrix-product throughput for the same product shapes, measured in the
// same run (what the layer's own products reach alone; absolute times drift on a shared machine).
//
// With --pack-rows a,b,...: the same layers with the weights packed from each row count
// (set_weight_packing_min_rows; 0: never), the settings alternating round by round, so the
// packed layout's gain is measured against the plain one in one run. --conv-rows a,b,... does
// the same for the row count from which products run as oneDNN's 1x1 convolution
// (set_matmul_conv_min_rows; 0: never).
//
//   bench_ffn [--d-model 512] [--d-ff 2048] [--tokens 8,6400] [--seconds 0.5] [--json]
//             [--variants relu,swiglu] [--dtype f32|bf16] [--pack-rows 0,2048]
//             [--conv-rows 0,1024] [--huge-pages-mib 0,4] [--rounds 3]
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_cli.hpp"
#include "bench_util.hpp"
#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/matmul.hpp"
#include "ffnlab/scratch.hpp"

using namespace ffnlab;

namespace {

struct Row {
  std::string variant;
  std::int64_t tokens;
  LayerSpeed speed;
};

// The dense variants (every named variant but moe).
std::vector<std::string> dense_variants() {
  std::vector<std::string> out;
  for (const auto& v : variant_names())
    if (variant_config(v, 1, 1, true).kind != FFNKind::moe) out.push_back(v);
  return out;
}

// Bytes of one layer of `config` at T tokens: weights and gradients, x, dy, y, dx and the
// activations; with `bare`, the outputs and weights of the bare products beside it
// (measure_layer_speed).
bench::Footprint footprint(const FFNConfig& config, std::int64_t T, bool bare) {
  const std::int64_t D = config.d_model, F = config.d_ff, P = config.in_width();
  bench::Footprint f;
  f.add_n(2, {P + F, D});
  f.add_n(4, {T, D});
  f.add({T, P + F});
  if (bare) {
    f.add_n(2, {P + F, D});
    f.add({T, P + F + D});
  }
  return f;
}

// A setting compared across values: the row count from which weights are packed, or from which
// products run as a convolution, or the size (MiB) from which tensors take huge pages.
struct Setting {
  const char* what;  // "the weights packed from", "products as a convolution from"
  std::int64_t (*get)();
  void (*set)(std::int64_t);
  std::vector<std::int64_t> values;
  // Whether it applies only to memory allocated afterwards: then each round gives each value a
  // layer, tensors and workspaces allocated under it.
  bool at_allocation = false;
};

// One layer per variant and token count (per value and round where the setting applies at
// allocation), forward+backward timed once per value and round, the values alternating; the
// median per value.
void compare(std::int64_t D, std::int64_t F, const std::vector<std::int64_t>& token_counts,
             double budget, const std::vector<std::string>& variants, Precision precision,
             const Setting& setting, int rounds) {
  const auto saved = setting.get();
  fmt::print("{}\n", bench::measured_on("bench_ffn"));
  fmt::print(
      "Dense FFN layers, d_model {}, d_ff {}, bias, {} products: forward+backward with {} "
      "each value (0: never), {} alternating rounds, medians; 'speed-up' is the first "
      "setting's time over each other one's, 'rounds' each round's, lowest to highest.\n\n",
      D, F, enum_name(precision), setting.what, rounds);
  fmt::print("{:<10} {:>6}", "variant", "T");
  for (auto r : setting.values) fmt::print(" {:>14}", fmt::format("from {} ms", r));
  for (std::size_t i = 1; i < setting.values.size(); ++i)
    fmt::print(" {:>16} {:>11}", fmt::format("speed-up, {}", setting.values[i]), "rounds");
  fmt::print("\n");
  for (const auto& variant : variants)
    for (std::int64_t T : token_counts) {
      std::unique_ptr<FeedForward> ffn;
      Tensor x, dy, y, dx;
      auto allocate = [&] {  // everything freed first: one layer's memory at a time
        ffn.reset();
        x = dy = y = dx = Tensor();
        release_scratch();  // (the calling thread's: the dense layers use no other)
        ffn = make_ffn(variant_config(variant, D, F, true), 1);
        ffn->set_precision(precision);
        x = bench::random({T, D}, 2), dy = bench::random({T, D}, 3);
      };
      if (!setting.at_allocation) allocate();
      auto step = [&] {
        ffn->forward(y, x, true);
        ffn->backward(dx, dy);
      };
      std::vector<std::vector<double>> ms(setting.values.size());
      for (int round = 0; round < rounds; ++round)
        for (std::size_t i = 0; i < setting.values.size(); ++i) {
          setting.set(setting.values[i]);
          if (setting.at_allocation) allocate();
          step();  // the first step of a setting allocates its buffers
          ms[i].push_back(bench::time_it(step, budget) * 1e3);
        }
      setting.set(saved);
      fmt::print("{:<10} {:>6}", variant, T);
      for (const auto& v : ms) fmt::print(" {:>14.3f}", median(v));
      for (std::size_t i = 1; i < ms.size(); ++i) {
        // Each round's speed-up, lowest to highest: how far one round's ratio moves.
        std::vector<double> ratio;
        for (int round = 0; round < rounds; ++round) ratio.push_back(ms[0][round] / ms[i][round]);
        const auto [low, high] = std::minmax_element(ratio.begin(), ratio.end());
        fmt::print(" {:>15.3f}x {:>11}", median(ms[0]) / median(ms[i]),
                   fmt::format("{:.2f}-{:.2f}", *low, *high));
      }
      fmt::print("\n");
    }
}

void run(std::int64_t D, std::int64_t F, const std::vector<std::int64_t>& token_counts,
         double budget, bool json, const std::vector<std::string>& variants,
         const std::string& dtype) {
  const Precision precision = dtype == "bf16" ? Precision::bf16 : Precision::f32;
  std::vector<Row> rows;
  for (const std::string& variant : variants)
    for (std::int64_t T : token_counts) {
      // The layer and, in the same call, the bare oneDNN products of the same shapes.
      rows.push_back(
          {variant, T,
           measure_layer_speed(variant_config(variant, D, F, true), T, budget, precision)});
    }

  if (json) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& r : rows) {  // LayerSpeed's one JSON form, after the row's names
      nlohmann::ordered_json row{{"variant", r.variant},
                                 {"tokens", r.tokens},
                                 {"dtype", dtype},
                                 {"machine", this_machine().describe()},
                                 {"threads", bench::threads()}};
      row.update(to_json(r.speed));
      out.push_back(row);
    }
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print("{}\n", bench::measured_on("bench_ffn"));
  fmt::print(
      "Dense FFN layers, d_model {}, d_ff {}, bias, {} products (training forward keeps "
      "activations). GFLOP/s count matrix-product FLOPs only; 'of bare' is the layer's "
      "rate over bare oneDNN products of the same shapes, measured in this run ('~100%': equal "
      "within noise; '(>bare)': the timing was disturbed, no number).\n\n",
      D, F, enum_name(precision));
  fmt::print(
      "| variant | tokens | fwd ms | fwd GFLOP/s | fwd of bare | fwd+bwd ms | fwd+bwd "
      "GFLOP/s | fwd+bwd of bare |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& [variant, tokens, s] : rows)
    fmt::print("| {} | {} | {:.3f} | {:.1f} | {} | {:.3f} | {:.1f} | {} |\n", variant, tokens,
               s.forward_s * 1e3, s.forward_gflops, of_bare_text(s.forward_of_bare),
               s.forward_backward_s * 1e3, s.forward_backward_gflops,
               of_bare_text(s.forward_backward_of_bare));
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t D = 512, F = 2048;
  std::vector<std::int64_t> token_counts{8, 6400};
  double budget = 0.5;
  bool json = false;
  CLI::App app{
      "Forward and forward+backward of dense FFN variants against bare oneDNN products of the "
      "same shapes, in one run; with --pack-rows (--conv-rows), forward+backward with the "
      "weights packed (the products run as a 1x1 convolution) from each row count, "
      "alternating.\n"
      "Exit status: 0 done, 1 refused (more memory than there is), 2 a bad flag, 3 out of "
      "memory or a failed write."};
  bench::width_option(app, "--d-model", D, "model width D");
  bench::width_option(app, "--d-ff", F, "hidden width F");
  bench::tokens_option(app, "--tokens", token_counts, "token counts, comma-separated");
  bench::add_seconds_option(app, budget);
  app.add_flag("--json", json, "print JSON instead of a table");
  std::vector<std::string> variants{"relu",  "gelu",  "glu",    "bilinear",
                                    "reglu", "geglu", "swiglu", "gated"};
  app.add_option("--variants", variants, "dense variants, comma-separated")
      ->delimiter(',')
      ->check(bench::one_of(dense_variants()))
      ->capture_default_str();
  std::string dtype = "f32";
  app.add_option("--dtype", dtype, "product precision")
      ->check(bench::one_of({"f32", "bf16"}))
      ->capture_default_str();
  std::vector<std::int64_t> pack_rows;
  bench::int_option(app, "--pack-rows", pack_rows, 0, limits::kTokens,
                    "compare packing the weights from these row counts (0: never), alternating "
                    "round by round; comma-separated")
      ->delimiter(',');
  std::vector<std::int64_t> conv_rows;
  bench::int_option(app, "--conv-rows", conv_rows, 0, limits::kTokens,
                    "compare running products as oneDNN's 1x1 convolution from these row counts "
                    "(0: never), alternating round by round; comma-separated")
      ->delimiter(',')
      ->excludes("--pack-rows");
  std::vector<std::int64_t> huge_mib;
  bench::int_option(app, "--huge-pages-mib", huge_mib, 0, 1 << 20,
                    "compare tensors in huge pages from these sizes in MiB (0: never), each "
                    "round's layer and tensors allocated anew, alternating; comma-separated")
      ->delimiter(',')
      ->excludes("--pack-rows")
      ->excludes("--conv-rows");
  int rounds = 3;
  bench::rounds_option(app, rounds,
                       "alternating rounds (with --pack-rows, --conv-rows or --huge-pages-mib)");
  app.callback([&] {
    const bool comparing = !pack_rows.empty() || !conv_rows.empty() || !huge_mib.empty();
    if (comparing && json)
      throw cli::UsageError(
          "--json: not supported with --pack-rows, --conv-rows or --huge-pages-mib");
    // Before anything is allocated: the largest layer and its tensors (one at a time).
    bench::Footprint largest;
    for (const auto& v : variants)
      for (std::int64_t T : token_counts) {
        const bench::Footprint f = footprint(variant_config(v, D, F, true), T, !comparing);
        if (f.bytes() > largest.bytes()) largest = f;
      }
    largest.check("bench_ffn", "the largest layer with its tensors");
    const Precision precision = dtype == "bf16" ? Precision::bf16 : Precision::f32;
    if (!pack_rows.empty())
      compare(D, F, token_counts, budget, variants, precision,
              {"the weights packed from", weight_packing_min_rows, set_weight_packing_min_rows,
               pack_rows},
              rounds);
    else if (!conv_rows.empty())
      compare(D, F, token_counts, budget, variants, precision,
              {"products as a 1x1 convolution from", matmul_conv_min_rows, set_matmul_conv_min_rows,
               conv_rows},
              rounds);
    else if (!huge_mib.empty())
      compare(D, F, token_counts, budget, variants, precision,
              {"tensors in huge pages from (MiB)", [] { return huge_page_min_bytes() >> 20; },
               [](std::int64_t mib) { set_huge_page_min_bytes(mib << 20); }, huge_mib,
               /*at_allocation=*/true},
              rounds);
    else
      run(D, F, token_counts, budget, json, variants, dtype);
  });
  return cli::run_program("bench_ffn", app, argc, argv);
}
