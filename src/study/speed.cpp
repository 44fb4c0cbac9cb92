// Stage "speed": measured speed of each variant of the run at the tutorial's shape, as
// matrix-product GFLOP/s and as a ratio to the bare oneDNN products of the same shapes timed in the
// same run; and the speed of the activation functions themselves (GELU exact against its
// approximations).
#include "ffnlab/analysis/speed.hpp"

#include <fmt/format.h>

#include <random>

#include "ffnlab/ops/activation.hpp"
#include "ffnlab/report/markdown.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

void run_speed(Study& st) {
  st.stage("speed (each variant against the bare matrix products)");
  SpeedResult r;
  r.tokens = st.scale.speed_tokens;
  r.d_model = 512;
  r.d_ff = 2048;
  r.budget_seconds = st.scale.speed_budget;
  std::string csv =
      "variant,forward_gflops,forward_backward_gflops,bare_forward_gflops,"
      "bare_forward_backward_gflops,noisy\n";
  for (const auto& v : st.options.variants) {
    check_stop();  // a stop request ends the stage between variants, not after all of them
    st.message(fmt::format("  speed: {}", v));
    const LayerSpeed s =
        measure_layer_speed(variant_config(v, r.d_model, r.d_ff, true), r.tokens, r.budget_seconds);
    r.variants.emplace_back(v, s);
    csv += fmt::format("{},{:.2f},{:.2f},{:.2f},{:.2f},{:d}\n", v, s.forward_gflops,
                       s.forward_backward_gflops, s.bare_forward_gflops,
                       s.bare_forward_backward_gflops, s.noisy() ? 1 : 0);
  }
  st.write("speed.csv", csv);

  // Activation functions alone, over one large buffer (the forward kernel).
  const std::int64_t n = r.tokens * r.d_ff;
  Tensor x({n}), y({n});
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.f, 2.f);
  float* xs = x.f32();
  for (std::int64_t i = 0; i < n; ++i) xs[i] = normal(rng);
  for (Activation a : {Activation::relu, Activation::gelu, Activation::gelu_tanh,
                       Activation::gelu_quick, Activation::silu, Activation::sigmoid}) {
    const double s =
        median_seconds([&] { activation_forward(y, x, Act{a}); }, r.budget_seconds / 4);
    r.activations.push_back({std::string(enum_name(a)), n, s});
  }
  st.results.speed = std::move(r);
}

json speed_json(const Results& res) {
  return json_if(res.speed, [](const SpeedResult& r) {
    json out{{"tokens", r.tokens}, {"budget_seconds", r.budget_seconds}};
    for (const auto& [v, s] : r.variants) out["variants"][v] = to_json(s);
    for (const auto& a : r.activations)
      out["activations"][a.activation] = {{"elements", a.elements},
                                          {"seconds", a.seconds},
                                          {"giga_elements_per_s", a.elements / a.seconds / 1e9}};
    return out;
  });
}

std::string speed_markdown(const Study& st, const Sections&) {
  if (!st.results.speed) return "";
  const SpeedResult& r = *st.results.speed;
  std::vector<std::vector<std::string>> rows;
  // A ratio is shown only when its rounds agree and it is possible; else the row says why not.
  auto ratio = [](double of_bare, double spread) {
    if (of_bare > kMaxOfBare || spread > kMaxSpread)
      // (spread is relative, the interquartile range over the median: ± half that range, in
      // the ratio's own points)
      return fmt::format("noisy ({} ± {})", percent(of_bare, 0), percent(of_bare * spread / 2, 0));
    // A layer cannot beat its own products: up to kMaxOfBare the rates are equal within the
    // noise of the timing.
    return of_bare > 1.0 ? std::string("≈ 100 %") : percent(of_bare, 0);
  };
  int noisy = 0;
  for (const auto& [v, s] : r.variants) {
    noisy += s.noisy() ? 1 : 0;
    rows.push_back({v, fixed(s.forward_s * 1e3, 2), fixed(s.forward_gflops, 1),
                    ratio(s.forward_of_bare, s.forward_of_bare_spread),
                    fixed(s.forward_backward_s * 1e3, 2), fixed(s.forward_backward_gflops, 1),
                    ratio(s.forward_backward_of_bare, s.forward_backward_of_bare_spread)});
  }
  std::vector<std::vector<std::string>> act_rows;
  for (const auto& a : r.activations)
    act_rows.push_back({a.activation, fixed(a.elements / a.seconds / 1e9, 2)});
  std::string md = fmt::format(
      "Every variant at the tutorial's shape (d_model {}, d_ff {}, bias, f32) over {} tokens; "
      "the training forward keeps what backward needs. GFLOP/s count matrix FLOPs only.\n\n"
      "- **of bare**: the layer's rate over that of the bare oneDNN products of its shapes (for "
      "MoE, two experts' products over all tokens), both timed in {} alternating rounds; the "
      "median of the rounds' ratios. What it misses is lost to elementwise passes, routing and "
      "bookkeeping.\n"
      "- **noisy**: a ratio above {} or whose rounds spread by more than {} (interquartile range "
      "over median; shown as the median ± half that range): the timing decided it, and no "
      "conclusion rests on it{}. **≈ 100 %**: from 100 % to that bound, equal to the bare "
      "products within the timing's noise.\n\n",
      r.d_model, r.d_ff, r.tokens, r.variants.empty() ? 0 : r.variants.front().second.rounds,
      percent(kMaxOfBare, 0), percent(kMaxSpread, 0),
      noisy > 0 ? fmt::format(" ({} of {} rows here)", noisy, r.variants.size()) : "");
  md += markdown_table({"variant", "fwd ms", "fwd GFLOP/s", "fwd of bare", "fwd+bwd ms",
                        "fwd+bwd GFLOP/s", "fwd+bwd of bare"},
                       rows, "lrrrrrr");
  md += kDetails;
  md += fmt::format(
      "Activation forward kernels alone over {} values (billions of values per "
      "second):\n\n",
      r.tokens * r.d_ff);
  md += markdown_table({"activation", "G values/s"}, act_rows, "lr");
  return md + "\n";
}

}  // namespace ffnlab::study
