// MoE++'s zero-computation experts: parameters, forward and backward (zero_computation.hpp).
#include "ffnlab/layers/moe/zero_computation.hpp"

#include <cmath>
#include <string>

namespace ffnlab {

void ZeroComputation::declare(ParameterSet& params) const {
  const std::int64_t D = layer_.d_model;
  for (int i = 0; i < layer_.moe.constant_experts; ++i)
    params.declare("constant_experts." + std::to_string(i) + ".vector", {D});
  for (int i = 0; i < layer_.moe.constant_experts; ++i)
    params.declare("constant_experts." + std::to_string(i) + ".gate.weight", {2, D});
}

void ZeroComputation::bind(ParameterSet& params) {
  const std::int64_t C = layer_.moe.constant_experts, D = layer_.d_model;
  if (C == 0) return;
  vector_ = params.value_span("constant_experts.0.vector", {C, D});
  dvector_ = params.grad_span("constant_experts.0.vector", {C, D});
  gate_ = params.value_span("constant_experts.0.gate.weight", {C, 2, D});
  dgate_ = params.grad_span("constant_experts.0.gate.weight", {C, 2, D});
}

void ZeroComputation::init(std::mt19937_64& rng) {
  if (layer_.moe.constant_experts == 0) return;
  init_normal(vector_, 1.0f, rng);
  init_uniform(gate_, 1.0f / std::sqrt(static_cast<float>(layer_.d_model)), rng);
}

void ZeroComputation::forward(Tensor& y, const Tensor& x, const Routing& r) {
  const MoEConfig& m = layer_.moe;
  const std::int64_t T = x.dim(0), D = layer_.d_model;
  const int N = m.num_experts, K = r.k, copy_from = m.first_copy_expert();
  const int zero_from = m.first_zero_expert();
  mix_.assign(static_cast<std::size_t>(T * K * 2), 0.0f);
  const float* X = x.f32();
  float* Y = y.f32();
#pragma omp parallel for schedule(static) if (T * D > 65536)
  for (std::int64_t t = 0; t < T; ++t) {
    const float* xt = X + t * D;
    float* yt = Y + t * D;
    for (int j = 0; j < r.count[t]; ++j) {
      const int e = r.expert[t * K + j];
      const float w = r.weight[t * K + j];
      if (e < N || e >= zero_from) continue;  // FFN experts (rows), zero experts (nothing)
      if (e >= copy_from) {
        for (std::int64_t d = 0; d < D; ++d) yt[d] += w * xt[d];
        continue;
      }
      const int i = e - N;
      const float* wc = gate_.f32() + i * 2 * D;
      const float* v = vector_.f32() + i * D;
      double z0 = 0, z1 = 0;
      for (std::int64_t d = 0; d < D; ++d) {
        z0 += static_cast<double>(wc[d]) * xt[d];
        z1 += static_cast<double>(wc[D + d]) * xt[d];
      }
      const float a = static_cast<float>(1.0 / (1.0 + std::exp(z1 - z0)));  // softmax of two
      const float b = 1.0f - a;
      mix_[(t * K + j) * 2] = a;
      mix_[(t * K + j) * 2 + 1] = b;
      for (std::int64_t d = 0; d < D; ++d) yt[d] += w * (a * xt[d] + b * v[d]);
    }
  }
}

// The zero-computation choices' part: their combine weights' gradients, dx (+=), and the
// constant experts' dv_i and dW_c,i.
void ZeroComputation::backward(Tensor& dx, float* dweight, const Tensor& dy, const Tensor& x,
                               const Routing& r) {
  const MoEConfig& m = layer_.moe;
  const std::int64_t T = x.dim(0), D = layer_.d_model;
  const int N = m.num_experts, K = r.k, copy_from = m.first_copy_expert();
  const int zero_from = m.first_zero_expert();
  const float* X = x.f32();
  const float* G = dy.f32();
  float* DX = dx.f32();
  // Per constant-expert choice: ∂/∂v_i's scale w·b, and ∂/∂z of softmax(z = W_c,i·x).
  std::vector<float> dv_scale(static_cast<std::size_t>(T * K), 0.0f);
  std::vector<float> dz(static_cast<std::size_t>(T * K * 2), 0.0f);
#pragma omp parallel for schedule(static) if (T * D > 65536)
  for (std::int64_t t = 0; t < T; ++t) {
    const float* xt = X + t * D;
    const float* gt = G + t * D;
    float* dxt = DX + t * D;
    for (int j = 0; j < r.count[t]; ++j) {
      const int e = r.expert[t * K + j];
      if (e < N || e >= zero_from) continue;
      const float w = r.weight[t * K + j];
      double gx = 0;
      for (std::int64_t d = 0; d < D; ++d) gx += static_cast<double>(gt[d]) * xt[d];
      if (e >= copy_from) {  // y += w·x
        dweight[t * K + j] = static_cast<float>(gx);
        for (std::int64_t d = 0; d < D; ++d) dxt[d] += w * gt[d];
        continue;
      }
      const int i = e - N;
      const float* wc = gate_.f32() + i * 2 * D;
      const float* v = vector_.f32() + i * D;
      const float a = mix_[(t * K + j) * 2], b = mix_[(t * K + j) * 2 + 1];
      double gv = 0;
      for (std::int64_t d = 0; d < D; ++d) gv += static_cast<double>(gt[d]) * v[d];
      dweight[t * K + j] = static_cast<float>(a * gx + b * gv);
      // [a, b] = softmax(z): ∂/∂z_0 = a·(da − (a·da + b·db)) with da = w·⟨g, x⟩, db = w·⟨g, v⟩.
      const double da = w * gx, db = w * gv, mean = a * da + b * db;
      const auto dz0 = static_cast<float>(a * (da - mean)),
                 dz1 = static_cast<float>(b * (db - mean));
      dz[(t * K + j) * 2] = dz0;
      dz[(t * K + j) * 2 + 1] = dz1;
      dv_scale[t * K + j] = w * b;
      for (std::int64_t d = 0; d < D; ++d) dxt[d] += w * a * gt[d] + dz0 * wc[d] + dz1 * wc[D + d];
    }
  }
  // The constant-expert choices (t·K + j), in token order: each d sums them in that order.
  std::vector<std::int64_t> constant;
  for (std::int64_t a = 0; a < T * K; ++a)
    if (a % K < r.count[a / K] && r.expert[a] >= N && r.expert[a] < copy_from)
      constant.push_back(a);
  if (constant.empty()) return;
  float* dV = dvector_.f32();
  float* dW = dgate_.f32();
#pragma omp parallel for schedule(static) if (T * D > 65536)
  for (std::int64_t d = 0; d < D; ++d)
    for (const std::int64_t a : constant) {
      const std::int64_t t = a / K, i = r.expert[a] - N;
      dV[i * D + d] += dv_scale[a] * G[t * D + d];
      dW[i * 2 * D + d] += dz[a * 2] * X[t * D + d];
      dW[i * 2 * D + D + d] += dz[a * 2 + 1] * X[t * D + d];
    }
}

}  // namespace ffnlab
