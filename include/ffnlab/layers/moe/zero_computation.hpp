// MoE++'s zero-computation experts (Jin et al. 2024), routed by top-k beside the FFN experts:
// per choice of one by token t with weight w, y_t += w·x_t (a copy expert), w·(a·x_t + b·v_i)
// with [a, b] = softmax(W_c,i·x_t) (constant expert i), or nothing (a zero expert). No rows, no
// products. Parameters: constant_experts.{i}.vector [D], constant_experts.{i}.gate.weight [2, D].
#pragma once

#include <random>
#include <vector>

#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/parameters.hpp"
#include "ffnlab/ops/router.hpp"

namespace ffnlab {

class ZeroComputation {
 public:
  explicit ZeroComputation(const FFNConfig& layer) : layer_(layer) {}

  // Every constant expert's vector, then every one's gate (two stacks).
  void declare(ParameterSet& params) const;
  void bind(ParameterSet& params);
  // v_i ~ N(0, 1); W_c,i as torch.nn.Linear.
  void init(std::mt19937_64& rng);

  // y [T, D] += the zero-computation choices' outputs of routing r.
  void forward(Tensor& y, const Tensor& x, const Routing& r);
  // From dy: these choices' combine-weight gradients into dweight [T, K] (entries the routed
  // experts' backward left 0), dx [T, D] +=, and the constant experts' parameter gradients (+=).
  // x and r: the training forward's. Per token in parallel; the parameter gradients over d in
  // parallel, tokens in order (deterministic).
  void backward(Tensor& dx, float* dweight, const Tensor& dy, const Tensor& x, const Routing& r);

 private:
  FFNConfig layer_;
  Tensor vector_, gate_;    // [C, D], [C, 2, D]: v_i, W_c,i
  Tensor dvector_, dgate_;  // their gradients
  // [a, b] of each constant-expert choice ([T, K, 2], 0 elsewhere), for the backward.
  std::vector<float> mix_;
};

}  // namespace ffnlab
