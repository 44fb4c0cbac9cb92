// SGD, Adam, AdamW over contiguous runs of the parameter buffer.
#include "ffnlab/train/optimizer.hpp"

#include <array>
#include <cmath>

#include "check.hpp"
#include "ranges.hpp"

namespace ffnlab {

namespace {
constexpr std::int64_t kChunks = 256;  // fixed partition of reductions
}  // namespace

Optimizer::Optimizer(const OptimizerConfig& config, ParameterSet& params,
                     const std::function<bool(const Parameter&)>& decayed)
    : config_(config), params_(params) {
  check(
      config.lr >= 0.f && config.eps > 0.f && config.weight_decay >= 0.f && config.beta1 >= 0.f &&
          config.beta1 < 1.f && config.beta2 >= 0.f && config.beta2 < 1.f &&
          config.momentum >= 0.f && config.momentum < 1.f,
      "[optimizer] lr, eps and weight decay must be >= 0 (eps > 0) and betas, momentum in [0, 1)");
  for (const Parameter& p : params.list()) {
    if (!p.trainable) continue;
    const bool decay = config.weight_decay > 0.f && decayed(p);
    const std::int64_t begin = p.offset, end = p.offset + shape_numel(p.shape);
    if (!runs_.empty() && runs_.back().end == begin && runs_.back().decay == decay)
      runs_.back().end = end;
    else
      runs_.push_back({begin, end, decay});
  }
  m_ = Tensor({params.count()});
  if (config.kind != OptimizerKind::sgd) v_ = Tensor({params.count()});
}

void Optimizer::exclude(const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
  std::vector<Run> kept;
  for (const Run& r : runs_)
    for_each_outside(r.begin, r.end, ranges, [&](std::int64_t b, std::int64_t e) {
      kept.push_back({b, e, r.decay});
    });
  runs_ = std::move(kept);
}

void Optimizer::step(float lr) {
  ++steps_;
  const OptimizerConfig& c = config_;
  float* w = params_.values().f32();
  const float* g = params_.grads().f32();
  float* m = m_.f32();
  float* v = v_.defined() ? v_.f32() : nullptr;
  const float b1 = c.beta1, b2 = c.beta2, eps = c.eps;
  // PyTorch: bias_correction = 1 − β^t; step_size = lr / bc1; denom = √v / √bc2 + eps.
  const double t = static_cast<double>(steps_);
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)));
  const float step_size = static_cast<float>(lr / (1.0 - std::pow(static_cast<double>(b1), t)));
  for (const Run& r : runs_) {
    const float wd = r.decay ? c.weight_decay : 0.f;
    switch (c.kind) {
      case OptimizerKind::sgd: {
        const bool first = steps_ == 1;
#pragma omp parallel for simd schedule(static) if (r.end - r.begin > 65536)
        for (std::int64_t i = r.begin; i < r.end; ++i) {
          float gi = g[i] + wd * w[i];
          if (c.momentum > 0.f) {
            m[i] = first ? gi : c.momentum * m[i] + gi;
            gi = m[i];
          }
          w[i] -= lr * gi;
        }
        break;
      }
      case OptimizerKind::adam:
      case OptimizerKind::adamw: {
        const bool decoupled = c.kind == OptimizerKind::adamw;
        const float shrink =
            decoupled ? static_cast<float>(1.0 - static_cast<double>(lr) * wd) : 1.f;
        const float l2 = decoupled ? 0.f : wd;
#pragma omp parallel for simd schedule(static) if (r.end - r.begin > 65536)
        for (std::int64_t i = r.begin; i < r.end; ++i) {
          const float gi = g[i] + l2 * w[i];
          const float wi = w[i] * shrink;
          m[i] = m[i] * b1 + (1.f - b1) * gi;
          v[i] = v[i] * b2 + (1.f - b2) * gi * gi;
          const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
          w[i] = wi - step_size * (m[i] / denom);
        }
        break;
      }
      case OptimizerKind::count:
        break;
    }
  }
}

double global_norm(const Tensor& buffer) {
  const std::int64_t n = buffer.numel();
  const float* x = buffer.f32();
  std::array<double, kChunks> part{};
  const std::int64_t chunk = (n + kChunks - 1) / kChunks;
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < kChunks; ++c) {
    const std::int64_t b = c * chunk, e = std::min(n, b + chunk);
    double s = 0;
    for (std::int64_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * x[i];
    part[c] = s;
  }
  double total = 0;
  for (double p : part) total += p;
  return std::sqrt(total);
}

void scale_buffer(Tensor& buffer, float factor) {
  const std::int64_t n = buffer.numel();
  float* x = buffer.f32();
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) x[i] *= factor;
}

}  // namespace ffnlab
