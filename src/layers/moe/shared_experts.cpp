// Shared experts: parameters, forward and backward (shared_experts.hpp).
#include "ffnlab/layers/moe/shared_experts.hpp"

#include <algorithm>
#include <cmath>

#include "ffnlab/ops/linear.hpp"
#include "ffnlab/scratch.hpp"

namespace ffnlab {

namespace {
float sigmoid(float v) {
  return 1.0f / (1.0f + std::exp(-v));
}
}  // namespace

SharedExperts::SharedExperts(const FFNConfig& layer, std::uint64_t seed)
    : layer_(layer),
      dense_(std::make_unique<DenseFFN>(expert_config(layer, /*shared=*/true),
                                        seed ^ 0x9e3779b97f4a7c15ull)) {}

std::string SharedExperts::prefix(const FFNConfig& layer) {
  return layer.moe.naming == MoENaming::qwen2_moe ? "shared_expert." : "shared_experts.";
}

void SharedExperts::declare(ParameterSet& params) const {
  params.declare_all(dense_->parameters(), prefix(layer_));
  if (layer_.moe.shared_gate) params.declare("shared_expert_gate.weight", {1, layer_.d_model});
}

void SharedExperts::bind(ParameterSet& params) {
  if (layer_.moe.shared_gate) {
    gate_ = params.at("shared_expert_gate.weight").value;
    dgate_ = params.at("shared_expert_gate.weight").grad;
  }
  // The dense FFN's parameters follow the layer's buffer.
  dense_->move_parameters(params.child_values(dense_->parameters(), prefix(layer_)),
                          params.child_grads(dense_->parameters(), prefix(layer_)));
}

void SharedExperts::init(std::mt19937_64& rng) {
  if (layer_.moe.shared_gate)
    init_uniform(gate_, 1.0f / std::sqrt(static_cast<float>(layer_.d_model)), rng);
}

void SharedExperts::forward(Tensor& y, const Tensor& x, bool train, Precision precision) {
  const std::int64_t T = x.dim(0), D = layer_.d_model;
  dense_->set_precision(precision);
  dense_->forward(y_, x, train);
  float* out = y.f32();
  const float* s = y_.f32();
  const float* g = nullptr;
  if (layer_.moe.shared_gate) {
    gate_pre_.ensure({T, 1});
    gate_out_.ensure({T, 1});
    linear_forward(gate_pre_, x, gate_, nullptr);
    const float* pre = gate_pre_.f32();
    float* gate = gate_out_.f32();
    for (std::int64_t t = 0; t < T; ++t) gate[t] = sigmoid(pre[t]);
    g = gate;
  }
#pragma omp parallel for schedule(static) if (T > 64)
  for (std::int64_t t = 0; t < T; ++t) {
    const float scale = g ? g[t] : 1.0f;
    for (std::int64_t d = 0; d < D; ++d) out[t * D + d] += scale * s[t * D + d];
  }
}

void SharedExperts::backward(Tensor& dx, const Tensor& dy, const Tensor& x) {
  const std::int64_t T = x.dim(0), D = layer_.d_model;
  Tensor& dshared = scratch(Scratch::moe_dshared, {T, D});
  const float* g = dy.f32();
  const float* s = y_.f32();
  float* ds = dshared.f32();
  float* out = dx.f32();
  if (layer_.moe.shared_gate) {
    dgate_out_.ensure({T, 1});
    const float* gate = gate_out_.f32();
    float* dgate = dgate_out_.f32();
    for (std::int64_t t = 0; t < T; ++t) {
      float dot = 0.0f;
      for (std::int64_t d = 0; d < D; ++d) {
        dot += g[t * D + d] * s[t * D + d];
        ds[t * D + d] = gate[t] * g[t * D + d];
      }
      dgate[t] = dot * gate[t] * (1.0f - gate[t]);
    }
    Tensor& dx_gate = scratch(Scratch::moe_dx_extra, {T, D});
    linear_backward(&dx_gate, dgate_, nullptr, dgate_out_, x, gate_);
    const float* dxg = dx_gate.f32();
    for (std::int64_t i = 0; i < T * D; ++i) out[i] += dxg[i];
  } else {
    std::copy(g, g + T * D, ds);
  }
  Tensor& dx_shared = scratch(Scratch::moe_dx_shared, {T, D});
  dense_->backward(dx_shared, dshared);
  const float* dxs = dx_shared.f32();
#pragma omp parallel for simd schedule(static) if (T * D > 65536)
  for (std::int64_t i = 0; i < T * D; ++i) out[i] += dxs[i];
}

}  // namespace ffnlab
