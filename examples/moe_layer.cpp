// A Mixtral-style MoE layer from your own C++: 8 SwiGLU experts, top-2 routing, the balancing
// loss; forward, backward, and what the router did.
#include <cstdio>

#include "ffnlab/layers/moe_ffn.hpp"

int main() {
  using namespace ffnlab;
  FFNConfig config = variant_config("moe", 32, 48, /*bias=*/false);
  config.moe.expert_kind = FFNKind::glu;  // SwiGLU experts
  config.act = Act{Activation::silu};
  config.moe.num_experts = 8;
  config.moe.top_k = 2;
  config.moe.aux_coef = 0.01f;  // load-balancing loss, added by backward
  MoEFFN moe(config, /*seed=*/3);

  const std::int64_t T = 64;
  Tensor x({T, 32}), y, dx, dy({T, 32});
  float* xs = x.f32();
  for (std::int64_t i = 0; i < x.numel(); ++i)
    xs[i] = static_cast<float>((i * 37) % 17) / 17.0f - 0.5f;
  dy.fill(0.01f);
  moe.forward(y, x, /*train=*/true);
  moe.backward(dx, dy);

  const FFNStats s = moe.stats();
  std::printf("moe: %lld tokens, top-%d of %d experts; tokens per expert:",
              static_cast<long long>(T), config.moe.top_k, s.num_experts);
  std::int64_t assigned = 0;
  for (auto n : s.tokens_per_expert) {
    std::printf(" %lld", static_cast<long long>(n));
    assigned += n;
  }
  std::printf("; load CV %.3f, balance loss %.4f\n", s.load_cv, s.balance_loss);
  return assigned == T * config.moe.top_k ? 0 : 1;  // dropless: every assignment is kept
}
