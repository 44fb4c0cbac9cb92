// Causal multi-head attention and the batched product under it: fast against the double
// reference, backward against central differences of the reference.
#include <gtest/gtest.h>

#include <cstring>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/layers/attention_layer.hpp"
#include "ffnlab/ops/attention.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/positions.hpp"
#include "ffnlab/ops/ref/attention_ref.hpp"
#include "ffnlab/ops/ref/linear_ref.hpp"

using namespace ffnlab;

TEST(Matmul, BatchedMatchesReferenceInEveryTransposition) {
  const std::int64_t G = 3, M = 5, K = 4, N = 6;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) {
      const Tensor a =
          ta == Trans::no ? test::random_tensor({G, M, K}, 1) : test::random_tensor({G, K, M}, 1);
      const Tensor b =
          tb == Trans::no ? test::random_tensor({G, K, N}, 2) : test::random_tensor({G, N, K}, 2);
      Tensor c({G, M, N});
      matmul(c, a, ta, b, tb);
      for (std::int64_t g = 0; g < G; ++g)
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t n = 0; n < N; ++n) {
            double acc = 0;
            for (std::int64_t k = 0; k < K; ++k) {
              const float av =
                  ta == Trans::no ? a.f32()[(g * M + m) * K + k] : a.f32()[(g * K + k) * M + m];
              const float bv =
                  tb == Trans::no ? b.f32()[(g * K + k) * N + n] : b.f32()[(g * N + n) * K + k];
              acc += static_cast<double>(av) * bv;
            }
            EXPECT_NEAR(c.f32()[(g * M + m) * N + n], acc, 1e-5);
          }
    }
  Tensor bad({2, M, N});
  EXPECT_THROW(matmul(bad, test::random_tensor({G, M, K}, 1), Trans::no,
                      test::random_tensor({G, K, N}, 2), Trans::no),
               Error);
}

TEST(Attention, MatchesReferenceAndCentralDifferences) {
  struct Case {
    std::int64_t B, S, H, dh;
  };
  std::uint64_t seed = 10;
  for (bool causal : {true, false})
    for (const Case& c : {Case{2, 5, 3, 4}, Case{1, 1, 2, 8}, Case{3, 7, 1, 6}}) {
      const std::int64_t D = c.H * c.dh, T = c.B * c.S;
      const Tensor qkv = test::random_tensor({T, 3 * D}, seed++);
      const Tensor dout = test::random_tensor({T, D}, seed++);
      Tensor out, dqkv;
      AttentionCache cache;
      attention_forward(out, cache, qkv, c.S, c.H, causal);
      attention_backward(dqkv, dout, cache, c.S, c.H, causal);

      auto x64 = test::to_vector<double>(qkv);
      const auto g64 = test::to_vector<double>(dout);
      std::vector<double> ry(T * D);
      auto loss = [&] {
        ref::attention_forward<double>(ry.data(), x64.data(), c.B, c.S, c.H, D, causal);
        double l = 0;
        for (std::size_t i = 0; i < ry.size(); ++i) l += ry[i] * g64[i];
        return l;
      };
      loss();
      EXPECT_LT(test::scaled_error(out.f32(), ry.data(), out.numel()), 2e-6) << causal;
      test::expect_gradient(x64, test::to_vector<double>(dqkv), loss,
                            test::sample_indices(x64.size(), 120), 2e-5, 1e-4, "dqkv");
    }
}

TEST(Attention, FutureTokensDoNotChangeThePast) {
  const std::int64_t S = 6, H = 2, D = 8;
  Tensor qkv = test::random_tensor({S, 3 * D}, 3);
  Tensor out1, out2;
  AttentionCache cache;
  attention_forward(out1, cache, qkv, S, H);
  for (std::int64_t c = 0; c < 3 * D; ++c) qkv.f32()[(S - 1) * 3 * D + c] += 5.f;
  attention_forward(out2, cache, qkv, S, H);
  for (std::int64_t i = 0; i < (S - 1) * D; ++i) EXPECT_EQ(out1.f32()[i], out2.f32()[i]);
  EXPECT_NE(out1.f32()[(S - 1) * D], out2.f32()[(S - 1) * D]);
  EXPECT_THROW(attention_forward(out1, cache, qkv, 4, H), Error);
}

TEST(Attention, Bf16LayerConvertsEachOperandOnceWithTheSameValues) {
  // The layer converts x, a, the weights and the gradients once for all the products that read
  // them; the ops converting their own f32 operands in every product compute the same bits.
  for (bool rope : {false, true}) {
    AttentionConfig config;
    config.d_model = 32;
    config.heads = 4;
    config.rope = rope;
    Attention attn(config, 5);
    attn.set_precision(Precision::bf16);
    const std::int64_t S = 24, T = 3 * S, D = config.d_model;
    const Tensor x = test::random_tensor({T, D}, 6), dy = test::random_tensor({T, D}, 7);
    Tensor y, dx;
    attn.forward(y, x, S);
    attn.backward(dx, dy);

    auto& ps = attn.parameters();
    const Tensor w_qkv = ps.value_span("q_proj.weight", {3 * D, D});
    const Tensor b_qkv = ps.value_span("q_proj.bias", {3 * D});
    const Tensor& w_o = ps.at("o_proj.weight").value;
    const Tensor& b_o = ps.at("o_proj.bias").value;
    const Precision bf16 = Precision::bf16;
    AttentionCache cache;
    Tensor qkv({T, 3 * D}), a, ry({T, D}), da({T, D}), dqkv({T, 3 * D}), rdx({T, D});
    Tensor dw_qkv({3 * D, D}), db_qkv({3 * D}), dw_o({D, D}), db_o({D});
    linear_forward(qkv, x, w_qkv, &b_qkv, bf16);
    const std::int64_t hd = D / config.heads;
    if (rope) rope_forward(qkv, S, 2 * D, hd, config.rope_theta);
    attention_forward(a, cache, qkv, S, config.heads, true, bf16);
    linear_forward(ry, a, w_o, &b_o, bf16);
    linear_backward(&da, dw_o, &db_o, dy, a, w_o, bf16);
    attention_backward(dqkv, da, cache, S, config.heads, true, bf16);
    if (rope) rope_backward(dqkv, S, 2 * D, hd, config.rope_theta);
    linear_backward(&rdx, dw_qkv, &db_qkv, dqkv, x, w_qkv, bf16);

    auto same = [&](const Tensor& got, const Tensor& want, const char* name) {
      ASSERT_EQ(got.numel(), want.numel()) << name;
      EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), got.nbytes())) << name << " rope " << rope;
    };
    same(y, ry, "y");
    same(dx, rdx, "dx");
    same(ps.grad_span("q_proj.weight", {3 * D, D}), dw_qkv, "dW_qkv");
    same(ps.grad_span("q_proj.bias", {3 * D}), db_qkv, "db_qkv");
    same(ps.at("o_proj.weight").grad, dw_o, "dW_o");
    same(ps.at("o_proj.bias").grad, db_o, "db_o");
  }
}
