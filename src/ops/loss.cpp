// Cross-entropy (softmax fused, one pass per row) and MSE. Row sums are reduced in a fixed order
// so that the loss is the same for any thread count.
#include "ffnlab/ops/loss.hpp"

#include <cmath>
#include <vector>

#include "activation_kernels.hpp"
#include "check.hpp"

namespace ffnlab {

double cross_entropy_forward(Tensor& probs, const Tensor& logits,
                             std::span<const std::int32_t> targets) {
  check(logits.rank() == 2 && static_cast<std::int64_t>(targets.size()) == logits.dim(0),
        "[cross_entropy] logits {} for {} targets", shape_string(logits.shape()), targets.size());
  const std::int64_t T = logits.dim(0), V = logits.dim(1);
  check(V >= 1 || T == 0, "[cross_entropy] logits {} have no vocabulary",
        shape_string(logits.shape()));
  for (std::int32_t t : targets)
    check(t == kIgnoreTarget || (t >= 0 && t < V),
          "[cross_entropy] target {} outside the vocabulary [0, {})", t, V);
  probs.ensure({T, V});
  std::vector<double> row_loss(static_cast<std::size_t>(T));
  const float* lp = logits.f32();
  float* pp = probs.f32();
#pragma omp parallel for schedule(static) if (T * V > 32768)
  for (std::int64_t t = 0; t < T; ++t) {
    const float* l = lp + t * V;
    float* p = pp + t * V;
    float mx;
    const float sum = kernels::exp_minus_max(p, l, V, &mx);
    const float inv = 1.f / sum;
#pragma omp simd
    for (std::int64_t v = 0; v < V; ++v) p[v] *= inv;
    if (targets[t] != kIgnoreTarget)
      row_loss[t] = -(static_cast<double>(l[targets[t]]) - mx - std::log(static_cast<double>(sum)));
  }
  double loss = 0;
  for (double r : row_loss) loss += r;
  const std::int64_t n = counted_targets(targets);
  return n > 0 ? loss / static_cast<double>(n) : 0.0;
}

std::int64_t counted_targets(std::span<const std::int32_t> targets) {
  std::int64_t n = 0;
  for (std::int32_t t : targets) n += t != kIgnoreTarget;
  return n;
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& probs,
                            std::span<const std::int32_t> targets, float scale) {
  const std::int64_t T = probs.dim(0), V = probs.dim(1);
  dlogits.ensure({T, V});
  const std::int64_t n = counted_targets(targets);
  const float s = n > 0 ? scale / static_cast<float>(n) : 0.f;
  const float* pp = probs.f32();
  float* dp = dlogits.f32();
#pragma omp parallel for schedule(static) if (T * V > 32768)
  for (std::int64_t t = 0; t < T; ++t) {
    const float st = targets[t] == kIgnoreTarget ? 0.f : s;
#pragma omp simd
    for (std::int64_t v = 0; v < V; ++v) dp[t * V + v] = st * pp[t * V + v];
    if (targets[t] != kIgnoreTarget) dp[t * V + targets[t]] -= s;
  }
}

double mse_forward(const Tensor& y, const Tensor& target) {
  check(y.shape() == target.shape(), "[mse] y {} and target {} differ", shape_string(y.shape()),
        shape_string(target.shape()));
  const float* ys = y.f32();
  const float* ts = target.f32();
  double sum = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const double d = static_cast<double>(ys[i]) - ts[i];
    sum += d * d;
  }
  return y.numel() > 0 ? sum / static_cast<double>(y.numel()) : 0.0;
}

void mse_backward(Tensor& dy, const Tensor& y, const Tensor& target, float scale) {
  dy.ensure(y.shape());
  const float s = 2.f * scale / static_cast<float>(y.numel());
  const float* ys = y.f32();
  const float* ts = target.f32();
  float* dys = dy.f32();
  for (std::int64_t i = 0; i < y.numel(); ++i) dys[i] = s * (ys[i] - ts[i]);
}

}  // namespace ffnlab
