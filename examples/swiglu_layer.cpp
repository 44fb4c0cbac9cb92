// A SwiGLU FFN (LLaMA's MLP) from your own C++: build it from a config, run a training forward
// and backward, and read its parameters by their Hugging Face names.
#include <cmath>
#include <cstdio>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/layers/feed_forward.hpp"

int main() {
  using namespace ffnlab;
  // d_model 64, d_ff 172 (8/3·64 rounded up to a multiple of 4), no biases: LLaMA's layout.
  const FFNConfig config = variant_config("swiglu", 64, 172, /*bias=*/false);
  auto ffn = make_ffn(config, /*seed=*/1);

  const std::int64_t T = 5;  // tokens: [T, D] rows, batch and sequence flattened
  Tensor x({T, 64}), y, dx;
  float* xs = x.f32();  // checked accessor once, then the raw row-major buffer
  for (std::int64_t i = 0; i < x.numel(); ++i) xs[i] = std::sin(0.1f * static_cast<float>(i));
  ffn->forward(y, x, /*train=*/true);  // keeps what backward needs

  Tensor dy({T, 64});
  dy.fill(1.0f);          // the gradient of sum(y)
  ffn->backward(dx, dy);  // dx overwritten; parameter gradients accumulate

  const Parameter& gate = ffn->parameters().at("gate_proj.weight");
  const float* g = gate.grad.f32();
  double grad_norm = 0;
  for (std::int64_t i = 0; i < gate.grad.numel(); ++i)
    grad_norm += static_cast<double>(g[i]) * g[i];
  std::printf("swiglu: %lld parameters (closed form %lld), y [%lld, %lld], |dL/dW_gate| %.4f\n",
              static_cast<long long>(ffn->parameters().count()),
              static_cast<long long>(count_params(config)), static_cast<long long>(y.dim(0)),
              static_cast<long long>(y.dim(1)), std::sqrt(grad_norm));
  return ffn->parameters().count() == count_params(config) ? 0 : 1;
}
