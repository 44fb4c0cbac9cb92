// safetensors: read and write, strictly validated. Layout: an 8-byte little-endian header length
// N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the data. Offsets are relative to the data and must tile it exactly, in order, with no gap
// or overlap (as the reference implementation requires). Nothing is read out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ffnlab/io/files.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab {

enum class StDType : std::uint8_t { f32, bf16, f16, i32, i64 };
const char* st_dtype_name(StDType dtype);  // "F32", "BF16", ...
std::size_t st_dtype_size(StDType dtype);

struct StTensorInfo {
  std::string name;
  StDType dtype;
  Shape shape;                       // may be empty (a scalar)
  std::uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

class SafeTensors {
 public:
  // Maps a file read-only and validates its header and offsets; tensor data is only touched when
  // a tensor is read, so one layer of a large checkpoint costs that layer's pages, not the file.
  // Throws "[safetensors] PATH: ..." on any defect.
  static SafeTensors load(const std::string& path);
  // Validates bytes already in memory; `source` names them in errors.
  static SafeTensors parse(std::vector<std::byte> bytes, const std::string& source);

  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const StTensorInfo& info(const std::string& name) const;
  std::vector<std::string> names() const;  // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& source() const { return source_; }

  // The tensor as f32 (converted from BF16 or F16); a scalar becomes shape [1].
  Tensor f32(const std::string& name) const;
  // Converts the tensor into `dst`, an f32 tensor of the same element count, without a temporary.
  void copy_f32(const std::string& name, Tensor& dst) const;
  // An integer tensor (I32 or I64) as int64 values.
  std::vector<std::int64_t> ints(const std::string& name) const;

 private:
  // Validates the buffer [base, base + size) that `owner` keeps alive (a vector or a mapping).
  static SafeTensors from_buffer(std::shared_ptr<const std::byte> owner, std::size_t size,
                                 const std::string& source);

  std::string source_;
  std::shared_ptr<const std::byte> bytes_;  // the whole file: owned bytes or a read-only mapping
  std::size_t data_start_ = 0;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

class SafeTensorsWriter {
 public:
  // Stores f32 tensors as F32 (or BF16 with as = StDType::bf16) and bf16 tensors as BF16.
  void add(const std::string& name, const Tensor& tensor, StDType as = StDType::f32);
  // Stores the tensor as it is (F32 or BF16) without copying its values: the writer keeps a
  // reference to its storage, whose values must not change until write() or serialize() (a
  // checkpoint of weights that cannot be copied).
  void add_view(const std::string& name, const Tensor& tensor);
  void add_ints(const std::string& name, const Shape& shape, const std::vector<std::int64_t>& v,
                StDType as = StDType::i64);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Writes to a temporary file beside `path`, then renames it: a failure leaves no partial file.
  void write(const std::string& path) const;
  std::vector<std::byte> serialize() const;

 private:
  struct Entry {
    std::string name;
    StDType dtype;
    Shape shape;
    std::vector<std::byte> bytes;  // a copy, or empty for a view:
    Tensor viewed = Tensor();      // (keeps the view's storage alive)
    const std::byte* view = nullptr;
    std::size_t view_bytes = 0;
    const std::byte* data() const { return view ? view : bytes.data(); }
    std::size_t size() const { return view ? view_bytes : bytes.size(); }
  };
  // The header: 8 bytes of its length, then its JSON padded to 8 bytes.
  std::string header() const;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace ffnlab
