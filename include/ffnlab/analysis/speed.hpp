// Measured speed of an FFN layer, as matrix-product GFLOP/s and as a ratio to the bare oneDNN
// products of the same shapes timed in the same call: the machine's practical peak, so that the
// ratio holds on a shared machine where absolute times drift.
#pragma once

#include <cstdint>
#include <functional>

#include "ffnlab/layers/ffn_config.hpp"

namespace ffnlab {

// Median seconds per call of f over about `budget` seconds (at least 3 calls) after one warm-up.
double median_seconds(const std::function<void()>& f, double budget);

struct LayerSpeed {
  double forward_s = 0, forward_backward_s = 0;            // median per call, T tokens
  double forward_gflops = 0, forward_backward_gflops = 0;  // matrix FLOPs (costs.hpp) / time
  // Bare products of the same shapes: for a dense layer its own products; for MoE the products
  // of k experts over all T tokens (the same matrix FLOPs as the routed experts).
  double peak_forward_gflops = 0, peak_forward_backward_gflops = 0;
};

// Times the training forward (which keeps activations) and forward+backward of a layer built
// from `config` on T random tokens, and the bare products, in one call.
LayerSpeed measure_layer_speed(const FFNConfig& config, std::int64_t tokens, double budget);

}  // namespace ffnlab
