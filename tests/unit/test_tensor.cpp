// Tensor: shapes, views, resize, bf16 conversion.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

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

TEST(Scratch, ReleaseFreesEverySlotOfTheThread) {
  scratch(Scratch::ffn_dh, {4, 3});
  scratch(Scratch::conv_weights, {8});
  release_scratch();
  EXPECT_FALSE(scratch(Scratch::ffn_dh).defined());
  EXPECT_FALSE(scratch(Scratch::conv_weights).defined());
}

namespace {

// Sets huge_page_min_bytes() for a test and restores it.
struct HugePagesFrom {
  std::int64_t saved = huge_page_min_bytes();
  explicit HugePagesFrom(std::int64_t bytes) { set_huge_page_min_bytes(bytes); }
  ~HugePagesFrom() { set_huge_page_min_bytes(saved); }
};

// The VmFlags line of the mapping holding `p` in /proc/self/smaps ("" if none is found).
std::string vm_flags_at(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t from = 0, to = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> from >> dash >> to && dash == '-') inside = from <= at && at < to;
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

// Whether this system shows mappings' advice: a kernel with transparent huge pages, and smaps
// with VmFlags (some sandboxes have neither).
bool shows_huge_page_advice() {
  static const bool shows = [] {
    if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) return false;
    std::ifstream smaps("/proc/self/smaps");
    for (std::string line; std::getline(smaps, line);)
      if (line.rfind("VmFlags:", 0) == 0) return true;
    return false;
  }();
  return shows;
}

// Whether the allocator itself may advise huge pages (glibc's hugetlb tunable, jemalloc's thp),
// so that a tensor below the threshold may sit in advised memory too.
bool allocator_may_advise() {
  for (const char* name : {"GLIBC_TUNABLES", "MALLOC_CONF", "LD_PRELOAD"}) {
    const char* value = std::getenv(name);
    if (value && (std::strstr(value, "hugetlb") || std::strstr(value, "thp") ||
                  std::strstr(value, "jemalloc")))
      return true;
  }
  return false;
}

}  // namespace

TEST(Tensor, LargeTensorsTakeMappingsAdvisedForHugePages) {
  HugePagesFrom from(std::int64_t{1} << 20);
  const std::int64_t n = (std::int64_t{3} << 20) / 4 + 5;  // 3 MiB and a little: 1 MiB and up
  Tensor t({n});
  const float* data = t.f32();
#if defined(__linux__)
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(data) % (std::uintptr_t{2} << 20), 0u);
  if (shows_huge_page_advice()) {
    EXPECT_NE(vm_flags_at(data).find(" hg"), std::string::npos) << vm_flags_at(data);
  }
#endif
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(data[i], 0.0f) << i;  // zeroed, as any tensor
  t.f32()[n - 1] = 3.0f;  // the whole of it is writable
  Tensor copy = t.clone();
  EXPECT_EQ(copy.f32()[n - 1], 3.0f);
  const bool check_unadvised = shows_huge_page_advice() && !allocator_may_advise();
  Tensor small({8});  // below the threshold: the allocator's memory, not advised
  if (check_unadvised) {
    EXPECT_EQ(vm_flags_at(small.f32()).find(" hg"), std::string::npos);
  }
  set_huge_page_min_bytes(0);  // never
  Tensor plain({n});
  if (check_unadvised) {
    EXPECT_EQ(vm_flags_at(plain.f32()).find(" hg"), std::string::npos);
  }
  EXPECT_EQ(plain.f32()[n - 1], 0.0f);
  set_huge_page_min_bytes(-3);
  EXPECT_EQ(huge_page_min_bytes(), 0);
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
