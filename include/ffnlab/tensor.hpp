// Tensor: an owning, row-major, rank <= 4 array of f32 (or bf16 storage for compute).
// Storage is shared, so a view (a row range, a reshape) costs nothing and keeps the memory alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace ffnlab {

enum class DType : std::uint8_t { f32, bf16 };

const char* dtype_name(DType dtype);
std::size_t dtype_size(DType dtype);

// Round-to-nearest-even conversion, as PyTorch and oneDNN do it; NaN stays NaN.
inline std::uint16_t f32_to_bf16(float value) {
  std::uint32_t bits;
  __builtin_memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}
inline float bf16_to_f32(std::uint16_t value) {
  std::uint32_t bits = static_cast<std::uint32_t>(value) << 16;
  float out;
  __builtin_memcpy(&out, &bits, 4);
  return out;
}

// dst[i] = the f32 value of src[i] rounded to bf16 (what a bf16 product multiplies).
void round_to_bf16(float* dst, const float* src, std::int64_t n);

// Tensors of at least huge_page_min_bytes() bytes take a mapping of their own, 2 MiB-aligned and
// advised for transparent huge pages (Linux): the large products walk fewer page-table entries
// (dispatch::kHugePageMinBytes says what that measured). 0: never. set_huge_page_min_bytes
// changes it for benchmarks; it applies to tensors allocated afterwards.
std::int64_t huge_page_min_bytes();
void set_huge_page_min_bytes(std::int64_t bytes);

using Shape = std::vector<std::int64_t>;
std::string shape_string(const Shape& shape);
std::int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  // Zero-initialised tensor of the given shape.
  explicit Tensor(Shape shape, DType dtype = DType::f32);
  static Tensor from(Shape shape, const std::vector<float>& values);
  // A view of memory the caller owns and keeps alive while the tensor or a view of it is used
  // (an array from another library). It is never freed or reallocated through the tensor.
  static Tensor borrow(void* data, Shape shape, DType dtype = DType::f32);

  bool defined() const { return !shape_.empty(); }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t dim(int i) const { return shape_.at(i < 0 ? i + rank() : i); }
  std::int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }

  float* f32();
  const float* f32() const;
  std::uint16_t* bf16();
  const std::uint16_t* bf16() const;
  void* raw() { return data_; }
  const void* raw() const { return data_; }

  // A view of rows [begin, end) of the first dimension.
  Tensor rows(std::int64_t begin, std::int64_t end) const;
  // A view of the same elements with another shape (same element count).
  Tensor reshape(Shape shape) const;
  // A view of `shape` starting `offset` elements into this tensor's memory.
  Tensor view(std::int64_t offset, Shape shape) const;

  // Gives the tensor this shape, reusing its memory when it is large enough and not shared
  // (workspaces); shared memory is never written through. Contents are unspecified afterwards.
  void resize(Shape shape);
  // resize() unless the tensor already has this shape, in which case it is kept as is: an
  // output passed in by a caller (possibly a view of its own buffer) is written in place.
  void ensure(Shape shape);

  Tensor clone() const;
  Tensor to(DType dtype) const;
  // ensure(), and of this dtype: a new zeroed tensor when the dtype differs.
  void ensure(Shape shape, DType dtype);
  // to() into this tensor: it becomes src's values in `dtype` with src's shape, through
  // ensure(shape, dtype): written in place when it already has that shape and dtype (a view
  // included), its memory reused when large enough and not shared. Not for a view of src.
  void assign_converted(const Tensor& src, DType dtype);
  void fill(float value);
  void zero();

 private:
  std::shared_ptr<std::byte> storage_;
  std::byte* data_ = nullptr;
  std::int64_t capacity_ = 0;  // elements available from data_ (for resize)
  bool owns_all_ = false;      // data_ is the start of storage_ (resize may reuse it)
  Shape shape_;
  DType dtype_ = DType::f32;
};

}  // namespace ffnlab
