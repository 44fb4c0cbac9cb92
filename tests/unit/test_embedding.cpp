// Token and position embeddings, the sinusoidal table and RoPE against their references;
// gradients against central differences.
#include <gtest/gtest.h>

#include <cmath>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/ops/embedding.hpp"
#include "ffnlab/ops/positions.hpp"
#include "ffnlab/ops/ref/positions_ref.hpp"

using namespace ffnlab;

TEST(Embedding, TokensAndPositionsMatchReferenceAndGradients) {
  const std::int64_t V = 9, D = 6, S = 4, B = 3, T = B * S;
  const Tensor table = test::random_tensor({V, D}, 1), pos = test::random_tensor({S + 2, D}, 2);
  std::vector<std::int32_t> ids(T);
  for (std::int64_t t = 0; t < T; ++t) ids[t] = static_cast<std::int32_t>((t * 5) % 7);  // repeats
  Tensor y;
  embedding_forward(y, ids, table);
  position_add_forward(y, pos, S);
  auto tab64 = test::to_vector<double>(table), pos64 = test::to_vector<double>(pos);
  std::vector<double> ry(T * D);
  ref::embed<double>(ry.data(), ids.data(), tab64.data(), pos64.data(), T, S, D);
  EXPECT_LT(test::scaled_error(y.f32(), ry.data(), y.numel()), 1e-7);

  const Tensor dy = test::random_tensor({T, D}, 3);
  const auto g64 = test::to_vector<double>(dy);
  Tensor dtab({V, D}), dpos({S + 2, D});
  embedding_backward(dtab, dy, ids);
  position_add_backward(dpos, dy, S);
  auto loss = [&] {
    ref::embed<double>(ry.data(), ids.data(), tab64.data(), pos64.data(), T, S, D);
    double l = 0;
    for (std::size_t i = 0; i < ry.size(); ++i) l += ry[i] * g64[i];
    return l;
  };
  test::expect_gradient(tab64, test::to_vector<double>(dtab), loss,
                        test::sample_indices(tab64.size(), 54), 1e-6, 1e-5, "dtable");
  test::expect_gradient(pos64, test::to_vector<double>(dpos), loss,
                        test::sample_indices(pos64.size(), 36), 1e-6, 1e-5, "dpos");

  const std::vector<std::int32_t> bad{0, 9};
  EXPECT_THROW(embedding_forward(y, bad, table), Error);
}

TEST(Embedding, SinusoidalTableMatchesReference) {
  const Tensor t = sinusoidal_table(50, 16);
  for (std::int64_t s = 0; s < 50; ++s)
    for (std::int64_t c = 0; c < 16; ++c)
      EXPECT_NEAR(t.f32()[s * 16 + c], ref::sinusoid<double>(s, c, 16), 1e-6);
}

TEST(Rope, MatchesReferenceAndBackwardIsTheTransposedRotation) {
  const std::int64_t S = 5, B = 2, T = B * S, H = 3, dh = 4, stride = 3 * H * dh;
  const std::int64_t width = 2 * H * dh;  // q and k, not v
  const Tensor x0 = test::random_tensor({T, stride}, 4);
  Tensor x = x0.clone();
  rope_forward(x, S, width, dh, 10000.f);
  auto r = test::to_vector<double>(x0);
  ref::rope<double>(r.data(), T, S, stride, width, dh, 10000.0);
  EXPECT_LT(test::scaled_error(x.f32(), r.data(), x.numel()), 1e-6);
  // v columns untouched
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = width; c < stride; ++c)
      EXPECT_EQ(x.f32()[t * stride + c], x0.f32()[t * stride + c]);

  // backward: gradient of L = Σ rope(x) ⊙ g by central differences of the reference
  const Tensor g = test::random_tensor({T, stride}, 5);
  Tensor dx = g.clone();
  rope_backward(dx, S, width, dh, 10000.f);
  auto x64 = test::to_vector<double>(x0);
  const auto g64 = test::to_vector<double>(g);
  auto loss = [&] {
    std::vector<double> y = x64;
    ref::rope<double>(y.data(), T, S, stride, width, dh, 10000.0);
    double l = 0;
    for (std::size_t i = 0; i < y.size(); ++i) l += y[i] * g64[i];
    return l;
  };
  test::expect_gradient(x64, test::to_vector<double>(dx), loss,
                        test::sample_indices(x64.size(), 80), 1e-6, 1e-5, "rope dx");
  EXPECT_THROW(rope_forward(x, S, width, 3, 10000.f), Error);
}
