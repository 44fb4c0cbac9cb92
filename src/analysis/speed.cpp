// Layer speed against the bare products of the same shapes.
#include "ffnlab/analysis/speed.hpp"

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "check.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/layers/parameters.hpp"
#include "ffnlab/ops/matmul.hpp"

namespace ffnlab {

double median_seconds(const std::function<void()>& f, double budget) {
  using clock = std::chrono::steady_clock;
  f();
  std::vector<double> times;
  const auto start = clock::now();
  while (times.size() < 3 ||
         (std::chrono::duration<double>(clock::now() - start).count() < budget &&
          times.size() < 1000)) {
    const auto t0 = clock::now();
    f();
    times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

LayerSpeed measure_layer_speed(const FFNConfig& config, std::int64_t tokens, double budget) {
  check(tokens > 0 && budget > 0, "[speed] tokens = {} and budget = {} must be positive", tokens,
        budget);
  const std::int64_t T = tokens, D = config.d_model;
  auto ffn = make_ffn(config, 1);
  const Tensor x = random_normal({T, D}, 2), dy = random_normal({T, D}, 3);
  Tensor y, dx;
  LayerSpeed s;
  s.forward_s = median_seconds([&] { ffn->forward(y, x, true); }, budget);
  s.forward_backward_s = median_seconds(
      [&] {
        ffn->forward(y, x, true);
        ffn->backward(dx, dy);
      },
      budget);

  // The bare products: rows R = T (dense) or k·T (MoE: k experts' worth of rows).
  const bool moe = config.kind == FFNKind::moe;
  const FFNConfig dense = moe ? expert_config(config) : config;
  const std::int64_t R = moe ? config.moe.top_k * T : T, P = dense.in_width(), F = dense.d_ff;
  const Tensor xr = random_normal({R, D}, 4), dyr = random_normal({R, D}, 5);
  Tensor a({R, P}), h({R, F}), w_in({P, D}), w_out({D, F}), out({R, D}), dw_in({P, D}),
      dw_out({D, F});
  const double mm_fwd = median_seconds(
      [&] {
        matmul(a, xr, Trans::no, w_in, Trans::yes);
        matmul(out, h, Trans::no, w_out, Trans::yes);
      },
      budget);
  MatmulOptions acc;
  acc.accumulate = true;
  const double mm_bwd = median_seconds(
      [&] {
        matmul(h, dyr, Trans::no, w_out, Trans::no);
        matmul(dw_out, dyr, Trans::yes, h, Trans::no, acc);
        matmul(out, a, Trans::no, w_in, Trans::no);
        matmul(dw_in, a, Trans::yes, xr, Trans::no, acc);
      },
      budget);
  const FFNCost cost = ffn_cost(config, T);
  const double flops_f = cost.forward.matmul * static_cast<double>(T);
  const double flops_b = cost.backward.matmul * static_cast<double>(T);
  // The bare products do the layer's matrix FLOPs less the router's (MoE), which are small.
  const FFNCost bare = ffn_cost(dense, R);
  const double bare_f = bare.forward.matmul * static_cast<double>(R);
  const double bare_b = bare.backward.matmul * static_cast<double>(R);
  s.forward_gflops = flops_f / s.forward_s / 1e9;
  s.forward_backward_gflops = (flops_f + flops_b) / s.forward_backward_s / 1e9;
  s.peak_forward_gflops = bare_f / mm_fwd / 1e9;
  s.peak_forward_backward_gflops = (bare_f + bare_b) / (mm_fwd + mm_bwd) / 1e9;
  return s;
}

}  // namespace ffnlab
