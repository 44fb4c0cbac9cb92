// Tensor storage, views and conversions.
#include "ffnlab/tensor.hpp"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "check.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/ops/dispatch.hpp"

namespace ffnlab {

const char* dtype_name(DType dtype) {
  return dtype == DType::f32 ? "f32" : "bf16";
}
std::size_t dtype_size(DType dtype) {
  return dtype == DType::f32 ? 4 : 2;
}

std::string shape_string(const Shape& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n = checked_mul(n, d, "[tensor] elements of a shape");
  return shape.empty() ? 0 : n;
}

namespace {

#if defined(__SANITIZE_ADDRESS__)
#define FFNLAB_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FFNLAB_ADDRESS_SANITIZER 1
#endif
#endif

#if defined(FFNLAB_ADDRESS_SANITIZER)
// AddressSanitizer checks the bounds of what the allocator hands out, not of mappings of one's
// own: under it every tensor comes from the allocator unless a test asks otherwise.
constexpr std::int64_t kDefaultHugePageMin = 0;
#else
constexpr std::int64_t kDefaultHugePageMin = dispatch::kHugePageMinBytes;
#endif
std::atomic<std::int64_t> huge_page_min{kDefaultHugePageMin};

#if defined(__linux__)
constexpr std::uintptr_t kHugePage = std::uintptr_t{2} << 20;

// A mapping of its own for `bytes`: 2 MiB-aligned and advised for transparent huge pages, so the
// kernel backs each whole aligned 2 MiB of it with one page where it can, the rest with small
// pages (it holds no more memory than its pages' worth of bytes). Fresh mappings read as zeros.
// Null where the system refuses the mapping.
std::shared_ptr<std::byte> map_huge(std::size_t bytes) {
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const std::uintptr_t length = (bytes + page - 1) / page * page;
  const std::uintptr_t span = length + kHugePage;  // room to align the start
  void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(p, aligned - start);
  const std::uintptr_t end = aligned + length;
  if (start + span > end) munmap(reinterpret_cast<void*>(end), start + span - end);
  auto* data = reinterpret_cast<std::byte*>(aligned);
  madvise(data, length, MADV_HUGEPAGE);  // advice: the kernel ignores it where THP is off
  return std::shared_ptr<std::byte>(data, [length](std::byte* q) { munmap(q, length); });
}
#endif

// Zeroed storage for `bytes`: from huge_page_min_bytes() a mapping of its own (map_huge), below
// it (or where the system has no such mappings) the C++ allocator's, 64-byte aligned: one cache
// line, one AVX-512 register.
std::shared_ptr<std::byte> allocate(std::size_t bytes) {
#if defined(__linux__)
  const std::int64_t from = huge_page_min.load(std::memory_order_relaxed);
  if (from > 0 && bytes >= static_cast<std::size_t>(from))
    if (auto mapped = map_huge(bytes)) return mapped;
#endif
  std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) fail_errno(ENOMEM, "[tensor] out of memory allocating {} bytes", bytes);
  std::memset(p, 0, rounded);
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

}  // namespace

std::int64_t huge_page_min_bytes() {
  return huge_page_min.load(std::memory_order_relaxed);
}

void set_huge_page_min_bytes(std::int64_t bytes) {
  huge_page_min.store(bytes < 0 ? 0 : bytes, std::memory_order_relaxed);
}

static void check_shape(const Shape& shape) {
  check(!shape.empty() && shape.size() <= 4, "[tensor] rank {} is not in 1..4", shape.size());
  for (auto d : shape)
    check(d >= 0, "[tensor] negative dimension in shape {}", shape_string(shape));
  std::int64_t n = 1;
  for (auto d : shape) {
    n = checked_mul(n, d, "[tensor] elements of a shape");
    check(n <= limits::kElements, "[tensor] shape {} has more than 2^40 elements",
          shape_string(shape));
  }
}

Tensor::Tensor(Shape shape, DType dtype) : shape_(std::move(shape)), dtype_(dtype) {
  check_shape(shape_);
  capacity_ = numel();
  storage_ = allocate(static_cast<std::size_t>(capacity_) * dtype_size(dtype_));
  data_ = storage_.get();
  owns_all_ = true;
}

Tensor Tensor::from(Shape shape, const std::vector<float>& values) {
  Tensor t(std::move(shape));
  check(static_cast<std::int64_t>(values.size()) == t.numel(), "[tensor] {} values for shape {}",
        values.size(), shape_string(t.shape()));
  // (an empty vector's data() may be null, which memcpy must not be given even for 0 bytes)
  if (!values.empty()) std::memcpy(t.f32(), values.data(), values.size() * 4);
  return t;
}

float* Tensor::f32() {
  check(dtype_ == DType::f32, "[tensor] f32 access to a {} tensor", dtype_name(dtype_));
  return reinterpret_cast<float*>(data_);
}
const float* Tensor::f32() const {
  return const_cast<Tensor*>(this)->f32();
}
std::uint16_t* Tensor::bf16() {
  check(dtype_ == DType::bf16, "[tensor] bf16 access to a {} tensor", dtype_name(dtype_));
  return reinterpret_cast<std::uint16_t*>(data_);
}
const std::uint16_t* Tensor::bf16() const {
  return const_cast<Tensor*>(this)->bf16();
}

Tensor Tensor::borrow(void* data, Shape shape, DType dtype) {
  check_shape(shape);
  Tensor t;
  t.storage_ = std::shared_ptr<std::byte>(static_cast<std::byte*>(data), [](std::byte*) {});
  t.data_ = static_cast<std::byte*>(data);
  t.capacity_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::view(std::int64_t offset, Shape shape) const {
  check_shape(shape);
  check(offset >= 0 && offset + shape_numel(shape) <= capacity_,
        "[tensor] view of {} elements at offset {} exceeds {} available", shape_numel(shape),
        offset, capacity_);
  Tensor t;
  t.storage_ = storage_;
  t.data_ = data_ + offset * static_cast<std::int64_t>(dtype_size(dtype_));
  t.capacity_ = capacity_ - offset;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype_;
  return t;
}

Tensor Tensor::rows(std::int64_t begin, std::int64_t end) const {
  check(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0),
        "[tensor] rows [{}, {}) out of shape {}", begin, end, shape_string(shape_));
  Shape s = shape_;
  s[0] = end - begin;
  std::int64_t row = numel() / std::max<std::int64_t>(dim(0), 1);
  return view(begin * row, s);
}

Tensor Tensor::reshape(Shape shape) const {
  check(shape_numel(shape) == numel(), "[tensor] cannot reshape {} to {}", shape_string(shape_),
        shape_string(shape));
  return view(0, std::move(shape));
}

void Tensor::resize(Shape shape) {
  check_shape(shape);
  if (owns_all_ && shape_numel(shape) <= capacity_ && storage_.use_count() == 1) {
    shape_ = std::move(shape);
    return;
  }
  *this = Tensor(std::move(shape), dtype_);
}

void Tensor::ensure(Shape shape) {
  if (shape != shape_) resize(std::move(shape));
}

void Tensor::ensure(Shape shape, DType dtype) {
  if (dtype != dtype_ || !defined())
    *this = Tensor(std::move(shape), dtype);
  else
    ensure(std::move(shape));
}

Tensor Tensor::clone() const {
  Tensor t(shape_, dtype_);
  if (numel()) std::memcpy(t.data_, data_, nbytes());
  return t;
}

void round_to_bf16(float* dst, const float* src, std::int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(f32_to_bf16(src[i]));
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  Tensor t;
  t.assign_converted(*this, dtype);
  return t;
}

void Tensor::assign_converted(const Tensor& src, DType dtype) {
  check(this != &src && (data_ != src.data_ || src.numel() == 0),
        "[tensor] cannot convert a tensor into itself");
  ensure(src.shape(), dtype);
  const std::int64_t n = src.numel();
  if (dtype == src.dtype()) {
    if (n) std::memcpy(data_, src.data_, nbytes());
  } else if (dtype == DType::bf16) {
    const float* in = src.f32();
    std::uint16_t* out = bf16();
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (std::int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
  } else {
    const std::uint16_t* in = src.bf16();
    float* out = f32();
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (std::int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
  }
}

void Tensor::fill(float value) {
  float* p = f32();
  const std::int64_t n = numel();
  for (std::int64_t i = 0; i < n; ++i) p[i] = value;
}

void Tensor::zero() {
  if (numel()) std::memset(data_, 0, nbytes());
}

}  // namespace ffnlab
