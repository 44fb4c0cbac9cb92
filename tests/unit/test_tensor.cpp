// Tensor: shapes, views, resize, bf16 conversion.
#include <gtest/gtest.h>

#include "ffnlab/error.hpp"
#include "ffnlab/tensor.hpp"

using namespace ffnlab;

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor r = t.rows(1, 3);
  ASSERT_EQ(r.shape(), (Shape{2, 2}));
  r.f32()[0] = 30;
  EXPECT_EQ(t.f32()[2], 30);
  EXPECT_THROW(t.rows(2, 4), Error);
  EXPECT_THROW(t.reshape({4, 2}), Error);
}
