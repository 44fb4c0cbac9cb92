// Stage "sparsity": activation sparsity measured properly. Per layer: the fraction of exactly
// zero and of near-zero hidden activations at initialisation and after training, dead units
// (never non-zero on any census token) and near-dead units (0 or near zero on every census
// token: a smooth gate is never exactly 0), the per-unit activation frequency; and the activation
// functions themselves: curves, derivatives and GELU's two approximations against the exact GELU.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "ffnlab/ops/activation.hpp"
#include "ffnlab/report/markdown.hpp"
#include "stage_functions.hpp"

namespace ffnlab::study {

const std::vector<LayerSparsity>* SparsityResult::find(std::string_view variant) const {
  for (const auto& [v, layers] : variants)
    if (v == variant) return &layers;
  return nullptr;
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
// also records SiLU's minimum on that grid (the corrections cite it).
void activation_curves(const Study& st, SparsityResult& r) {
  const std::vector<Activation> acts{
      Activation::relu, Activation::gelu,    Activation::gelu_tanh, Activation::gelu_quick,
      Activation::silu, Activation::sigmoid, Activation::tanh};
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
  std::string csv = "x";
  for (Activation a : acts) csv += fmt::format(",{0},d_{0}", enum_name(a));
  csv += ",gelu_tanh_error,gelu_quick_error\n";
  const std::size_t silu = 4;  // its index in acts
  for (std::int64_t i = 0; i < n; ++i) {
    const double xi = xs[i];
    if (values[silu].f32()[i] < r.silu_min) r.silu_min = values[silu].f32()[i], r.silu_min_at = xi;
    csv += fmt::format("{:.4f}", xi);
    for (std::size_t k = 0; k < acts.size(); ++k)
      csv += fmt::format(",{:.6g},{:.6g}", values[k].f32()[i], grads[k].f32()[i]);
    csv += fmt::format(",{:.6g},{:.6g}\n", gelu_tanh(xi) - gelu_exact(xi),
                       gelu_sigmoid(xi) - gelu_exact(xi));
  }
  st.write("activation_curves.csv", csv);
}

}  // namespace

void run_sparsity(Study& st) {
  st.stage("activation sparsity and dead units");
  SparsityResult r;
  r.census_tokens = st.scale.census_tokens;
  activation_curves(st, r);

  // GELU's approximations, in exact arithmetic over [-8, 8].
  for (int i = -80000; i <= 80000; ++i) {
    const double x = i * 1e-4;
    const double et = std::fabs(gelu_tanh(x) - gelu_exact(x));
    const double es = std::fabs(gelu_sigmoid(x) - gelu_exact(x));
    if (et > r.gelu_tanh_error) r.gelu_tanh_error = et, r.gelu_tanh_at = x;
    if (es > r.gelu_sigmoid_error) r.gelu_sigmoid_error = es, r.gelu_sigmoid_at = x;
  }

  std::string freq_csv = "variant,layer,unit,frequency\n";
  std::string summary =
      "variant,zero_init,zero_trained,near_zero_init,near_zero_trained,dead_trained,"
      "near_dead_trained\n";
  for (const auto& v : st.options.variants) {
    if (!st.census_init.count(v)) continue;
    const auto& init = st.census_init.at(v);
    const auto& trained = st.census_trained.at(v);
    std::vector<LayerSparsity> layers;
    double zi = 0, zt = 0, ni = 0, nt = 0;
    std::int64_t dead = 0, near_dead = 0, units = 0;
    for (std::size_t l = 0; l < init.size(); ++l) {
      const UnitSparsity &a = init[l], &b = trained[l];
      layers.push_back({static_cast<std::int64_t>(l), a.zero_fraction(), b.zero_fraction(),
                        a.near_zero_fraction(), b.near_zero_fraction(),
                        static_cast<std::int64_t>(b.nonzero.size()), a.dead_units(), b.dead_units(),
                        a.near_dead_units(), b.near_dead_units()});
      zi += a.zero_fraction();
      zt += b.zero_fraction();
      ni += a.near_zero_fraction();
      nt += b.near_zero_fraction();
      dead += b.dead_units();
      near_dead += b.near_dead_units();
      units += static_cast<std::int64_t>(b.nonzero.size());
    }
    // Per-unit frequency after training, every layer (the figure's histogram).
    for (std::size_t l = 0; l < trained.size(); ++l) {
      const auto f = trained[l].frequency();
      for (std::size_t u = 0; u < f.size(); ++u)
        freq_csv += fmt::format("{},{},{},{:.6f}\n", v, l, u, f[u]);
    }
    const double L = static_cast<double>(init.size());
    const double U = static_cast<double>(std::max<std::int64_t>(1, units));
    summary +=
        fmt::format("{},{:.5f},{:.5f},{:.5f},{:.5f},{:.5f},{:.5f}\n", v, zi / L, zt / L, ni / L,
                    nt / L, static_cast<double>(dead) / U, static_cast<double>(near_dead) / U);
    r.variants.emplace_back(v, std::move(layers));
  }
  st.write("unit_frequency.csv", freq_csv);
  st.write("sparsity_summary.csv", summary);
  st.results.sparsity = std::move(r);
}

json sparsity_json(const Results& res) {
  return json_if(res.sparsity, [](const SparsityResult& r) {
    json out;
    out["silu_min"] = {{"value", r.silu_min}, {"at", r.silu_min_at}};
    out["census_tokens"] = r.census_tokens;
    out["near_zero_rule"] =
        fmt::format("|h| < {} x rms(h) of the layer's batch", kNearZeroRelative);
    out["gelu_approximations"] = {{"tanh_max_abs_error", r.gelu_tanh_error},
                                  {"tanh_at", r.gelu_tanh_at},
                                  {"sigmoid_1702_max_abs_error", r.gelu_sigmoid_error},
                                  {"sigmoid_1702_at", r.gelu_sigmoid_at}};
    for (const auto& [v, layers] : r.variants)
      for (const LayerSparsity& l : layers)
        out["variants"][v].push_back({{"layer", l.layer},
                                      {"zero_fraction_init", l.zero_init},
                                      {"zero_fraction_trained", l.zero_trained},
                                      {"near_zero_fraction_init", l.near_zero_init},
                                      {"near_zero_fraction_trained", l.near_zero_trained},
                                      {"units", l.units},
                                      {"dead_units_init", l.dead_init},
                                      {"dead_units_trained", l.dead_trained},
                                      {"near_dead_units_init", l.near_dead_init},
                                      {"near_dead_units_trained", l.near_dead_trained}});
    return out;
  });
}

std::string sparsity_markdown(const Study& st, const Sections& sec) {
  if (!st.results.sparsity) return "";
  const SparsityResult& r = *st.results.sparsity;
  auto of_units = [](std::int64_t n, std::int64_t units) {  // "3 of 512 (0.6 %)"
    return fmt::format("{} of {} ({})", n, units,
                       percent(static_cast<double>(n) / static_cast<double>(units)));
  };
  std::vector<std::vector<std::string>> totals;
  for (const auto& [v, layers] : r.variants) {
    double zero_init = 0, zero_trained = 0;
    std::int64_t dead = 0, near_dead = 0, units = 0;
    for (const LayerSparsity& l : layers) {
      zero_init += l.zero_init / static_cast<double>(layers.size());
      zero_trained += l.zero_trained / static_cast<double>(layers.size());
      dead += l.dead_trained, near_dead += l.near_dead_trained, units += l.units;
    }
    if (!layers.empty())
      totals.push_back({v, percent(zero_init), percent(zero_trained), of_units(dead, units),
                        of_units(near_dead, units)});
  }
  std::string md = fmt::format(
      "The hidden activations h (what enters the down projection) of every layer of seed 1's "
      "model, over the first {} validation tokens (the census tokens), at initialisation and "
      "after training:\n\n"
      "- **zero**: exactly 0; a share is the mean over layers.\n"
      "- **dead unit**: a hidden unit that is 0 on every census token after training (for moe, "
      "on the tokens routed to its expert; an expert no census token reaches is all dead).\n"
      "- **near-dead unit**: 0 or |h| < {}·rms(h) on every census token, the dead included.\n\n"
      "Only ReLU-gated units (relu, reglu, moe's ReLU experts) can be exactly 0; GELU, SiLU and "
      "sigmoid gates have no dead units by definition, and near-dead compares them with ReLU. A "
      "unit that is 0 for half the tokens is not dead.\n\n",
      r.census_tokens, kNearZeroRelative);
  md += markdown_table(
      {"variant", "zero at init", "zero trained", "dead units trained", "near-dead units trained"},
      totals, "lrrrr");
  md += "\nThe units are all layers' together; results.json (\"sparsity\") has each layer's.\n";
  md += kDetails;
  md += fmt::format(
      "GELU's approximations against the exact x·Φ(x) (double precision, x in [−8, 8]): the "
      "tanh form (GPT-2's gelu_new) is off by at most {:.2e} (at x = {:.2f}); the sigmoid form "
      "x·σ(1.702x) (quick_gelu) by at most {:.2e} (at x = {:.2f}). Their speed in ffnlab's "
      "kernels is in the activation table of {} above; activation_comparison.png draws all "
      "three.\n\n",
      r.gelu_tanh_error, r.gelu_tanh_at, r.gelu_sigmoid_error, r.gelu_sigmoid_at, sec.ref("speed"));
  return md;
}

}  // namespace ffnlab::study
