// Stage 5: activation sparsity measured properly. Per layer: the fraction of exactly-zero and of
// near-zero hidden activations at initialisation and after training, dead units (never non-zero
// on any census token), the per-unit activation frequency; and the activation functions
// themselves: curves, derivatives and GELU's two approximations against the exact GELU.
#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "../common.hpp"
#include "ffnlab/ops/activation.hpp"
#include "ffnlab/report/markdown.hpp"
#include "study.hpp"

namespace ffnlab::cli::evolve {

std::vector<UnitSparsity> census(const Study& st, TransformerLM& lm) {
  const auto val = st.corpus.validation();
  const std::int64_t S = st.scale.train.seq, B = st.scale.train.batch;
  const std::int64_t windows =
      std::min(window_count(val, S), std::max<std::int64_t>(1, st.scale.census_tokens / S));
  std::vector<UnitSparsity> layers(static_cast<std::size_t>(lm.config().layers));
  for (std::int64_t first = 0; first < windows; first += B) {
    const Batch b = sequential_batch(val, std::min(B, windows - first), S, first);
    lm.forward(b.ids, {}, S, false);
    for (int l = 0; l < lm.config().layers; ++l) add_hidden(layers[l], lm.ffn(l).hidden());
  }
  return layers;
}

namespace {

double gelu_exact(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}
double gelu_tanh(double x) {
  return 0.5 * x *
         (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}
double gelu_sigmoid(double x) {
  return x / (1.0 + std::exp(-1.702 * x));
}

// The activation curves and derivatives as ffnlab computes them (f32 kernels), for the figure;
// also records SiLU's minimum on that grid (the corrections section cites it).
void write_activation_curves(Study& st) {
  const std::vector<Activation> acts{Activation::relu,      Activation::gelu,
                                     Activation::gelu_tanh, Activation::gelu_quick,
                                     Activation::silu,      Activation::sigmoid};
  const std::int64_t n = 2001;  // [-5, 5] in steps of 0.005
  Tensor x({n}), ones({n});
  float* xs = x.f32();
  for (std::int64_t i = 0; i < n; ++i) xs[i] = -5.0f + 10.0f * static_cast<float>(i) / (n - 1);
  ones.fill(1.0f);
  std::vector<Tensor> values, grads;
  for (Activation a : acts) {
    Tensor y({n}), dy({n});
    activation_forward(y, x, Act{a});
    activation_backward(dy, ones, x, Act{a});
    values.push_back(y);
    grads.push_back(dy);
  }
  std::vector<const float*> v, g;
  for (std::size_t k = 0; k < acts.size(); ++k) {
    v.push_back(values[k].f32());
    g.push_back(grads[k].f32());
  }
  std::string csv = "x";
  for (Activation a : acts) csv += fmt::format(",{0},d_{0}", enum_name(a));
  csv += ",gelu_tanh_error,gelu_quick_error\n";
  const std::size_t silu = 4;  // its index in acts
  double silu_min = 0, silu_argmin = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double xi = xs[i];
    if (v[silu][i] < silu_min) silu_min = v[silu][i], silu_argmin = xi;
    csv += fmt::format("{:.4f}", xi);
    for (std::size_t k = 0; k < acts.size(); ++k)
      csv += fmt::format(",{:.6g},{:.6g}", v[k][i], g[k][i]);
    csv += fmt::format(",{:.6g},{:.6g}\n", gelu_tanh(xi) - gelu_exact(xi),
                       gelu_sigmoid(xi) - gelu_exact(xi));
  }
  write_text(st.dir + "/activation_curves.csv", csv);
  st.results["sparsity"]["silu_min"] = {{"value", silu_min}, {"at", silu_argmin}};
}

}  // namespace

void run_sparsity(Study& st) {
  st.stage("activation sparsity and dead units");
  write_activation_curves(st);
  json& out = st.results["sparsity"];
  out["census_tokens"] = st.scale.census_tokens;
  out["near_zero_rule"] = fmt::format("|h| < {} x rms(h) of the layer's batch", kNearZeroRelative);

  // GELU's approximations, in exact arithmetic over [-8, 8].
  double err_tanh = 0, err_sigmoid = 0, at_tanh = 0, at_sigmoid = 0;
  for (int i = -80000; i <= 80000; ++i) {
    const double x = i * 1e-4;
    const double et = std::fabs(gelu_tanh(x) - gelu_exact(x));
    const double es = std::fabs(gelu_sigmoid(x) - gelu_exact(x));
    if (et > err_tanh) err_tanh = et, at_tanh = x;
    if (es > err_sigmoid) err_sigmoid = es, at_sigmoid = x;
  }
  out["gelu_approximations"] = {{"tanh_max_abs_error", err_tanh},
                                {"tanh_at", at_tanh},
                                {"sigmoid_1702_max_abs_error", err_sigmoid},
                                {"sigmoid_1702_at", at_sigmoid}};

  std::vector<std::vector<std::string>> rows;
  std::string freq_csv = "variant,unit,frequency\n";
  for (const auto& v : st.variants) {
    if (!st.census_init.count(v)) continue;
    const auto& init = st.census_init.at(v);
    const auto& trained = st.census_trained.at(v);
    const bool moe = v == "moe";
    for (std::size_t l = 0; l < init.size(); ++l) {
      const UnitSparsity &a = init[l], &b = trained[l];
      out["variants"][v].push_back({{"layer", l},
                                    {"zero_fraction_init", a.zero_fraction()},
                                    {"zero_fraction_trained", b.zero_fraction()},
                                    {"near_zero_fraction_init", a.near_zero_fraction()},
                                    {"near_zero_fraction_trained", b.near_zero_fraction()},
                                    {"units", moe ? 0 : b.nonzero.size()},
                                    {"dead_units_init", moe ? 0 : a.dead_units()},
                                    {"dead_units_trained", moe ? 0 : b.dead_units()}});
      rows.push_back({v, std::to_string(l), percent(a.zero_fraction()), percent(b.zero_fraction()),
                      percent(a.near_zero_fraction()), percent(b.near_zero_fraction()),
                      moe ? "n/a (rows mix experts)"
                          : fmt::format("{} of {} ({})", b.dead_units(), b.nonzero.size(),
                                        percent(b.dead_fraction()))});
    }
    // Per-unit frequency after training, last layer (the figure's histogram).
    if (!moe) {
      const auto f = trained.back().frequency();
      for (std::size_t u = 0; u < f.size(); ++u)
        freq_csv += fmt::format("{},{},{:.6f}\n", v, u, f[u]);
    }
  }
  write_text(st.dir + "/unit_frequency.csv", freq_csv);
  std::string summary = "variant,zero_init,zero_trained,near_zero_init,near_zero_trained\n";
  for (const auto& v : st.variants) {
    if (!st.census_init.count(v)) continue;
    double zi = 0, zt = 0, ni = 0, nt = 0;
    const auto& init = st.census_init.at(v);
    const auto& trained = st.census_trained.at(v);
    for (std::size_t l = 0; l < init.size(); ++l) {
      zi += init[l].zero_fraction();
      zt += trained[l].zero_fraction();
      ni += init[l].near_zero_fraction();
      nt += trained[l].near_zero_fraction();
    }
    const double L = static_cast<double>(init.size());
    summary += fmt::format("{},{:.5f},{:.5f},{:.5f},{:.5f}\n", v, zi / L, zt / L, ni / L, nt / L);
  }
  write_text(st.dir + "/sparsity_summary.csv", summary);

  std::string& md = st.report;
  md += "## 5. Activation sparsity\n\n";
  md += fmt::format(
      "The hidden activations h (what enters the down projection) of each layer of seed 1's "
      "model, over the first {} validation tokens, at initialisation and after training. "
      "**zero**: exactly 0. **near zero**: |h| < {}·rms(h) of that layer and batch. **Dead "
      "units**: hidden units that are 0 on every census token after training. These are "
      "different quantities: the seeds' \"about 50 % dead neurons\" for ReLU is the zero "
      "fraction at initialisation; a unit that is zero for half the tokens is not dead. Only "
      "ReLU-gated hidden units (relu, reglu, and the ReLU experts of moe) can be exactly zero; "
      "GELU, SiLU and sigmoid gates are almost never exactly zero.\n\n",
      st.scale.census_tokens, kNearZeroRelative);
  md += markdown_table({"variant", "layer", "zero at init", "zero trained", "near zero at init",
                        "near zero trained", "dead units trained"},
                       rows, "lrrrrrr");
  md += fmt::format(
      "\nGELU's approximations against the exact x·Φ(x) (double precision, x in [−8, 8]): the "
      "tanh form (GPT-2's gelu_new) is off by at most {:.2e} (at x = {:.2f}); the sigmoid form "
      "x·σ(1.702x) (quick_gelu) by at most {:.2e} (at x = {:.2f}). Their speed in ffnlab's "
      "kernels is in section 3's activation table; activation_comparison.png draws all three.\n\n",
      err_tanh, at_tanh, err_sigmoid, at_sigmoid);
}

}  // namespace ffnlab::cli::evolve
