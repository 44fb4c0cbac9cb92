// Stage 3: measured speed of every variant at the seeds' shape, as matrix-product GFLOP/s and as
// a ratio to the bare oneDNN products of the same shapes timed in the same run; and the speed
// of the activation functions themselves (GELU exact against its two approximations).
#include "ffnlab/analysis/speed.hpp"

#include <fmt/format.h>

#include <random>

#include "ffnlab/ops/activation.hpp"
#include "ffnlab/report/markdown.hpp"
#include "study.hpp"

namespace ffnlab::cli::evolve {

void run_speed(Study& st) {
  st.stage("speed (every variant against the bare matrix products)");
  const std::int64_t T = st.scale.speed_tokens, D = 512, F = 2048;
  json& out = st.results["speed"];
  out["tokens"] = T;
  out["budget_seconds"] = st.scale.speed_budget;
  std::vector<std::vector<std::string>> rows;
  std::string csv =
      "variant,forward_gflops,forward_backward_gflops,peak_forward_gflops,"
      "peak_forward_backward_gflops\n";
  for (const auto& v : variant_names()) {
    st.progress->message(fmt::format("  speed: {}", v));
    const FFNConfig c = variant_config(v, D, F, true);
    const LayerSpeed s = measure_layer_speed(c, T, st.scale.speed_budget);
    out["variants"][v] = {
        {"forward_s", s.forward_s},
        {"forward_backward_s", s.forward_backward_s},
        {"forward_gflops", s.forward_gflops},
        {"forward_backward_gflops", s.forward_backward_gflops},
        {"peak_forward_gflops", s.peak_forward_gflops},
        {"peak_forward_backward_gflops", s.peak_forward_backward_gflops},
        {"forward_of_peak", s.forward_gflops / s.peak_forward_gflops},
        {"forward_backward_of_peak", s.forward_backward_gflops / s.peak_forward_backward_gflops}};
    csv += fmt::format("{},{:.2f},{:.2f},{:.2f},{:.2f}\n", v, s.forward_gflops,
                       s.forward_backward_gflops, s.peak_forward_gflops,
                       s.peak_forward_backward_gflops);
    rows.push_back({v, fixed(s.forward_s * 1e3, 2), fixed(s.forward_gflops, 1),
                    percent(s.forward_gflops / s.peak_forward_gflops, 0),
                    fixed(s.forward_backward_s * 1e3, 2), fixed(s.forward_backward_gflops, 1),
                    percent(s.forward_backward_gflops / s.peak_forward_backward_gflops, 0)});
  }
  write_text(st.dir + "/speed.csv", csv);

  // Activation functions alone, over one large buffer (the forward kernel).
  const std::int64_t n = T * F;
  Tensor x({n}), y({n});
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.f, 2.f);
  float* xs = x.f32();
  for (std::int64_t i = 0; i < n; ++i) xs[i] = normal(rng);
  std::vector<std::vector<std::string>> act_rows;
  for (Activation a : {Activation::relu, Activation::gelu, Activation::gelu_tanh,
                       Activation::gelu_quick, Activation::silu, Activation::sigmoid}) {
    const double s =
        median_seconds([&] { activation_forward(y, x, Act{a}); }, st.scale.speed_budget / 4);
    out["activations"][enum_name(a)] = {
        {"elements", n}, {"seconds", s}, {"giga_elements_per_s", n / s / 1e9}};
    act_rows.push_back({enum_name(a), fixed(n / s / 1e9, 2)});
  }

  std::string& md = st.report;
  md += "## 3. Speed\n\n";
  md += fmt::format(
      "Every variant at the seeds' shape (d_model {}, d_ff {}, bias, f32), {} tokens, median "
      "of repeated calls; the training forward keeps what backward needs. GFLOP/s count matrix "
      "FLOPs only. **of peak** is the layer's rate over the rate of the bare oneDNN products of "
      "the same shapes, timed in the same run on this machine (for MoE: the products of two "
      "experts over all tokens): what the layer loses to its elementwise passes, routing and "
      "bookkeeping. Times vary between runs on a shared machine; ratios hold better.\n\n",
      D, F, T);
  md += markdown_table({"variant", "fwd ms", "fwd GFLOP/s", "fwd of peak", "fwd+bwd ms",
                        "fwd+bwd GFLOP/s", "fwd+bwd of peak"},
                       rows, "lrrrrrr");
  md += fmt::format(
      "\nActivation forward kernels alone over {} values (billions of values per "
      "second):\n\n",
      n);
  md += markdown_table({"activation", "G values/s"}, act_rows, "lr");
  md += "\n";
}

}  // namespace ffnlab::cli::evolve
