// Tensor storage, views and conversions.
#include "ffnlab/tensor.hpp"

#include <cstdlib>
#include <cstring>

#include "check.hpp"
#include "ffnlab/limits.hpp"

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

static std::shared_ptr<std::byte> allocate(std::size_t bytes) {
  // 64-byte alignment: one cache line, one AVX-512 register.
  std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) fail_system("[tensor] out of memory allocating {} bytes", bytes);
  std::memset(p, 0, rounded);
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
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
