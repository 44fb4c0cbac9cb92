// Dropout: the kept fraction, the scaling, backward using forward's mask, determinism per
// (seed, stream), and p = 0 as the identity.
#include <gtest/gtest.h>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/ops/dropout.hpp"

using namespace ffnlab;

TEST(Dropout, KeepsOneMinusPScaledAndBackwardUsesTheSameMask) {
  const Tensor x = test::random_tensor({100, 1000}, 1);
  const float p = 0.3f;
  Tensor y, y2, dx;
  dropout_forward(y, x, p, 42, 7);
  dropout_forward(y2, x, p, 42, 7);
  std::int64_t kept = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(y.f32()[i], y2.f32()[i]);
    if (y.f32()[i] != 0.f) {
      ++kept;
      EXPECT_FLOAT_EQ(y.f32()[i], x.f32()[i] / (1 - p));
    }
  }
  const double frac = static_cast<double>(kept) / static_cast<double>(x.numel());
  EXPECT_NEAR(frac, 1 - p, 0.005);  // 1e5 draws: std 0.0015

  Tensor ones({100, 1000});
  ones.fill(1.f);
  dropout_backward(dx, ones, p, 42, 7);
  for (std::int64_t i = 0; i < x.numel(); ++i)
    EXPECT_EQ(dx.f32()[i] != 0.f, y.f32()[i] != 0.f || x.f32()[i] == 0.f);

  Tensor other;
  dropout_forward(other, x, p, 42, 8);  // another stream draws another mask
  std::int64_t same = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) same += (other.f32()[i] != 0) == (y.f32()[i] != 0);
  EXPECT_LT(same, x.numel() * 0.7);

  Tensor copy;
  dropout_forward(copy, x, 0.f, 42, 7);
  for (std::int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(copy.f32()[i], x.f32()[i]);
  EXPECT_THROW(dropout_forward(copy, x, 1.f, 42, 7), Error);
}
