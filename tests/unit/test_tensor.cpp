// Tensor: shapes, views, resize, bf16 conversion.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ffnlab/error.hpp"
#include "ffnlab/scratch.hpp"
#include "ffnlab/tensor.hpp"

using namespace ffnlab;

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor r = t.rows(1, 3);
  ASSERT_EQ(r.shape(), (Shape{2, 2}));
  r.f32()[0] = 30;
  EXPECT_EQ(t.f32()[2], 30);
  EXPECT_EQ(t.reshape({2, 3}).f32()[2], 30);
  EXPECT_THROW(t.rows(2, 4), Error);
  EXPECT_THROW(t.reshape({4, 2}), Error);
  EXPECT_THROW(t.view(4, {3}), Error);
}

TEST(Tensor, RejectsBadShapes) {
  EXPECT_THROW(Tensor({2, -1}), Error);
  EXPECT_THROW(Tensor({1, 1, 1, 1, 1}), Error);
  EXPECT_THROW(Tensor::from({2}, {1, 2, 3}), Error);
}

TEST(Tensor, ResizeReusesMemoryWhenLargeEnough) {
  Tensor t({4, 8});
  const void* before = t.raw();
  t.resize({2, 8});
  EXPECT_EQ(t.raw(), before);
  EXPECT_EQ(t.shape(), (Shape{2, 8}));
  t.resize({4, 8});
  EXPECT_EQ(t.raw(), before);
  t.resize({5, 8});
  EXPECT_EQ(t.numel(), 40);
}

TEST(Tensor, ResizeOfSharedStorageDoesNotClobberTheView) {
  Tensor t = Tensor::from({2}, {1, 2});
  Tensor kept = t;  // e.g. a layer's saved input
  t.resize({2});
  t.f32()[0] = 7;
  EXPECT_EQ(kept.f32()[0], 1);
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 lies halfway between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3·2^-8 lies halfway too: the even neighbour is 1 + 2^-6.
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  Tensor t = Tensor::from({3}, {0.1f, -2.5f, 1e30f});
  Tensor back = t.to(DType::bf16).to(DType::f32);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(back.f32()[i], t.f32()[i], std::fabs(t.f32()[i]) / 256);
  EXPECT_THROW(t.to(DType::bf16).f32(), Error);
}

TEST(Tensor, EnsureKeepsATensorOfTheRightShape) {
  Tensor buffer = Tensor::from({4}, {1, 2, 3, 4});
  Tensor out = buffer.view(2, {2});  // a caller's output view
  out.ensure({2});
  out.f32()[0] = 9;
  EXPECT_EQ(buffer.f32()[2], 9);  // written in place
  out.ensure({3});                // another shape: fresh memory, the buffer is untouched
  out.f32()[0] = 5;
  EXPECT_EQ(buffer.f32()[2], 9);
  EXPECT_EQ(out.shape(), (Shape{3}));
}

TEST(Scratch, OneTensorPerSlotReshapedOnUse) {
  Tensor& a = scratch(Scratch::ffn_dh, {4, 3});
  EXPECT_EQ(a.shape(), (Shape{4, 3}));
  a.f32()[0] = 7;
  const float* storage = a.f32();
  Tensor& again = scratch(Scratch::ffn_dh, {4, 3});  // the same shape: the same memory
  EXPECT_EQ(&again, &a);
  EXPECT_EQ(again.f32(), storage);
  EXPECT_EQ(again.f32()[0], 7);
  Tensor& other = scratch(Scratch::ffn_da, {4, 3});  // another slot: other memory
  EXPECT_NE(other.f32(), storage);
  EXPECT_EQ(scratch(Scratch::ffn_dh, {2, 5}).shape(), (Shape{2, 5}));
}

TEST(Tensor, BorrowWritesInPlaceAndNeverFreesOrReallocatesTheCallersMemory) {
  std::vector<float> mine(6, 1.0f);
  Tensor t = Tensor::borrow(mine.data(), {2, 3});
  EXPECT_EQ(t.f32(), mine.data());
  t.ensure({2, 3});  // the same shape: still the caller's memory, written in place
  t.f32()[4] = 7.0f;
  EXPECT_EQ(mine[4], 7.0f);
  Tensor rows = t.rows(1, 2);
  EXPECT_EQ(rows.f32(), mine.data() + 3);
  t.ensure({1, 3});  // another shape: new memory of its own, the borrowed memory left alone
  EXPECT_NE(t.f32(), mine.data());
  t.fill(5.0f);
  EXPECT_EQ(mine[0], 1.0f);
  EXPECT_EQ(rows.f32()[1], 7.0f);  // a view still reads the caller's memory
}
