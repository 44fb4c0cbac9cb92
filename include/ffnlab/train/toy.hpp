// The tutorial's toy experiment: one FFN layer trained alone on a fixed random batch against
// fixed random targets with MSE and Adam — d_model 512, d_ff 2048, batch 2, seq 4, dropout 0.1,
// lr 1e-3, 100 iterations, seed 42. The tutorial gives no place for the dropout; here it is applied
// to the layer's input (on the output it would put a floor of p·E[target²] ≈ 0.1 under the loss
// of every variant alike, measured; the tutorial's losses fall to 0.005-0.01). It measures how fast
// each variant memorises 8 random vectors, which is all this setup can say (it says nothing about
// language modelling; see `ffnlab train`).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ffnlab/layers/ffn_config.hpp"

namespace ffnlab {

struct ToyConfig {
  std::int64_t batch = 2, seq = 4;
  float dropout = 0.1f;
  float lr = 1e-3f;
  int iterations = 100;
  std::uint64_t seed = 42;
};

struct ToyStep {
  double loss = 0;       // MSE (+ MoE aux losses with their coefficients)
  double grad_norm = 0;  // global norm of all parameter gradients
};

// What run_toy holds in memory: the layer's weights, gradients, Adam's moments and activations
// in f32, and the run's six tensors of the batch (x, target, x after dropout, y, dy, dx).
double toy_memory_bytes(const FFNConfig& ffn, const ToyConfig& config);

// Trains a fresh layer of `config` (initialised from config.seed) and returns every iteration's
// loss and gradient norm (before the update). `stop` is asked before each iteration: true
// throws Interrupted (it may also throw its own). `done` is told after each iteration how many
// have run and that iteration's step (progress).
std::vector<ToyStep> run_toy(const FFNConfig& ffn, const ToyConfig& config,
                             const std::function<bool()>& stop = {},
                             const std::function<void(int, const ToyStep&)>& done = {});

}  // namespace ffnlab
