// Closed-form costs of an FFN config: parameters, FLOPs per token and memory.
// The formulas are derived in docs/costs.md; tests/unit/test_costs.cpp checks the parameter count
// against instantiated layers.
#pragma once

#include <cstdint>

#include "ffnlab/layers/ffn_config.hpp"

namespace ffnlab {

struct FlopCount {
  double matmul = 0;       // 2 per multiply-add of the matrix products
  double elementwise = 0;  // 1 per element per elementwise stage (bias add, activation, product)
  double total() const { return matmul + elementwise; }
};

struct MemoryBytes {
  double weights = 0;
  double grads = 0;
  double adam = 0;         // Adam's two moments, always f32
  double activations = 0;  // saved by a training forward for backward, for `tokens` tokens
  double total() const { return weights + grads + adam + activations; }
};

struct FFNCost {
  std::int64_t params = 0;
  std::int64_t active_params = 0;  // touched by one token (MoE: router + K experts + shared)
  FlopCount forward;               // per token
  FlopCount backward;              // per token (input and weight gradients)
  double saved_floats_per_token = 0;
  MemoryBytes f32;   // everything in f32
  MemoryBytes bf16;  // weights, grads, activations in bf16; Adam moments in f32
};

std::int64_t count_params(const FFNConfig& config);
FFNCost ffn_cost(const FFNConfig& config, std::int64_t tokens);

}  // namespace ffnlab
