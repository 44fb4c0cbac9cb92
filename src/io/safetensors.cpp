// safetensors reader (strict validation) and writer (atomic).
#include "ffnlab/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "check.hpp"
#include "json_keys.hpp"

namespace ffnlab {

namespace {

// A header larger than this is refused before anything is allocated (the reference
// implementation uses the same bound).
constexpr std::uint64_t kMaxHeader = 100'000'000;

struct DTypeName {
  StDType dtype;
  const char* name;
  std::size_t size;
};
constexpr DTypeName kDTypes[] = {{StDType::f32, "F32", 4},
                                 {StDType::bf16, "BF16", 2},
                                 {StDType::f16, "F16", 2},
                                 {StDType::i32, "I32", 4},
                                 {StDType::i64, "I64", 8}};

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | ((112 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

}  // namespace

const char* st_dtype_name(StDType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}
std::size_t st_dtype_size(StDType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.size;
  return 0;
}

SafeTensors SafeTensors::load(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  check(fd >= 0, "[safetensors] {}: cannot open ({})", path, std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const int stat_errno = errno;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("[safetensors] {}: {}", path, stat_ok ? "not a regular file" : std::strerror(stat_errno));
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail("[safetensors] {}: file of {} bytes is too short for a header", path, size);
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping stays valid without the descriptor
  check(map != MAP_FAILED, "[safetensors] {}: cannot map ({})", path, std::strerror(map_errno));
  std::shared_ptr<const std::byte> owner(
      static_cast<const std::byte*>(map),
      [size](const std::byte* p) { ::munmap(const_cast<std::byte*>(p), size); });
  return from_buffer(std::move(owner), size, path);
}

SafeTensors SafeTensors::parse(std::vector<std::byte> bytes, const std::string& source) {
  auto vec = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  const std::size_t size = vec->size();
  std::shared_ptr<const std::byte> owner(vec, vec->data());  // aliasing: keeps the vector alive
  return from_buffer(std::move(owner), size, source);
}

SafeTensors SafeTensors::from_buffer(std::shared_ptr<const std::byte> owner, std::size_t size,
                                     const std::string& source) {
  SafeTensors st;
  st.source_ = source;
  st.bytes_ = std::move(owner);
  const std::byte* base = st.bytes_.get();
  check(size >= 8, "[safetensors] {}: file of {} bytes is too short for a header", source, size);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(base[i]);
  check(n <= kMaxHeader, "[safetensors] {}: header length {} is absurd (limit {})", source, n,
        kMaxHeader);
  check(n <= size - 8, "[safetensors] {}: header length {} runs past the end of the {}-byte file",
        source, n, size);
  st.data_start_ = 8 + n;
  const std::uint64_t data_size = size - 8 - n;

  const nlohmann::json header = parse_json_text(
      std::string_view(reinterpret_cast<const char*>(base) + 8, static_cast<std::size_t>(n)),
      "safetensors", source);
  check(header.is_object(), "[safetensors] {}: header is not a JSON object", source);

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      check(entry.is_object(), "[safetensors] {}: __metadata__ is not an object", source);
      for (const auto& [k, v] : entry.items()) {
        check(v.is_string(), "[safetensors] {}: metadata '{}' is not a string", source, k);
        st.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    check(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
              entry.contains("data_offsets"),
          "[safetensors] {}: tensor '{}' needs dtype, shape and data_offsets", source, name);
    const auto& jd = entry.at("dtype");
    check(jd.is_string(), "[safetensors] {}: tensor '{}' has a non-string dtype", source, name);
    StTensorInfo info;
    info.name = name;
    const auto dname = jd.get<std::string>();
    const DTypeName* found = nullptr;
    for (const auto& d : kDTypes)
      if (dname == d.name) found = &d;
    check(found != nullptr,
          "[safetensors] {}: tensor '{}' has unsupported dtype '{}' (supported: F32, BF16, F16, "
          "I32, I64)",
          source, name, dname);
    info.dtype = found->dtype;
    const auto& js = entry.at("shape");
    check(js.is_array() && js.size() <= 8, "[safetensors] {}: tensor '{}' has an invalid shape",
          source, name);
    // The element count, guarded against overflow by the data section's size; a shape with a
    // 0 anywhere has no elements whatever its other dimensions.
    bool empty = false;
    for (const auto& d : js) {
      check(d.is_number_unsigned(), "[safetensors] {}: tensor '{}' has a non-integer dimension",
            source, name);
      const auto v = d.get<std::uint64_t>();
      check(v <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
            "[safetensors] {}: tensor '{}' has shape larger than the file", source, name);
      empty |= v == 0;
      info.shape.push_back(static_cast<std::int64_t>(v));
    }
    std::uint64_t numel = empty ? 0 : 1;
    for (const std::int64_t d : info.shape) {
      if (empty) break;
      const auto v = static_cast<std::uint64_t>(d);
      check(numel <= data_size / v, "[safetensors] {}: tensor '{}' has shape larger than the file",
            source, name);
      numel *= v;
    }
    const auto& jo = entry.at("data_offsets");
    check(
        jo.is_array() && jo.size() == 2 && jo[0].is_number_unsigned() && jo[1].is_number_unsigned(),
        "[safetensors] {}: tensor '{}' has invalid data_offsets", source, name);
    info.begin = jo[0].get<std::uint64_t>();
    info.end = jo[1].get<std::uint64_t>();
    check(info.begin <= info.end && info.end <= data_size,
          "[safetensors] {}: tensor '{}' offsets [{}, {}) run past the {}-byte data section",
          source, name, info.begin, info.end, data_size);
    check(info.end - info.begin == numel * found->size,
          "[safetensors] {}: tensor '{}' of shape {} and dtype {} needs {} bytes, offsets give {}",
          source, name, shape_string(info.shape), dname, numel * found->size,
          info.end - info.begin);
    st.tensors_.push_back(std::move(info));
  }

  // The tensors, in offset order, must tile the data section exactly.
  std::vector<const StTensorInfo*> order;
  for (const auto& t : st.tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t pos = 0;
  for (const auto* t : order) {
    check(t->begin >= pos, "[safetensors] {}: tensor '{}' overlaps another tensor", source,
          t->name);
    check(t->begin == pos, "[safetensors] {}: a gap of {} bytes before tensor '{}'", source,
          t->begin - pos, t->name);
    pos = t->end;
  }
  check(pos == data_size, "[safetensors] {}: {} bytes of data after the last tensor", source,
        data_size - pos);

  std::sort(st.tensors_.begin(), st.tensors_.end(),
            [](const auto& a, const auto& b) { return a.begin < b.begin; });
  for (std::size_t i = 0; i < st.tensors_.size(); ++i) st.index_[st.tensors_[i].name] = i;
  return st;
}

const StTensorInfo& SafeTensors::info(const std::string& name) const {
  auto it = index_.find(name);
  check(it != index_.end(), "[safetensors] {}: no tensor named '{}'", source_, name);
  return tensors_[it->second];
}

std::vector<std::string> SafeTensors::names() const {
  std::vector<std::string> out;
  for (const auto& t : tensors_) out.push_back(t.name);
  return out;
}

Tensor SafeTensors::f32(const std::string& name) const {
  const auto& t = info(name);
  check(t.shape.size() <= 4, "[safetensors] {}: tensor '{}' has rank {} (at most 4 supported)",
        source_, name, t.shape.size());
  Tensor out(t.shape.empty() ? Shape{1} : t.shape);
  copy_f32(name, out);
  return out;
}

void SafeTensors::copy_f32(const std::string& name, Tensor& dst) const {
  const auto& t = info(name);
  check(t.dtype == StDType::f32 || t.dtype == StDType::bf16 || t.dtype == StDType::f16,
        "[safetensors] {}: tensor '{}' has dtype {}, expected a float type", source_, name,
        st_dtype_name(t.dtype));
  const std::int64_t n = static_cast<std::int64_t>((t.end - t.begin) / st_dtype_size(t.dtype));
  check(dst.numel() == n, "[safetensors] {}: tensor '{}' has {} elements, destination {}", source_,
        name, n, dst.numel());
  const std::byte* src = bytes_.get() + data_start_ + t.begin;
  float* out = dst.f32();
  if (t.dtype == StDType::f32) {
    if (n) std::memcpy(out, src, static_cast<std::size_t>(n) * 4);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint16_t v;
    std::memcpy(&v, src + 2 * i, 2);
    out[i] = t.dtype == StDType::bf16 ? bf16_to_f32(v) : f16_to_f32(v);
  }
}

std::vector<std::int64_t> SafeTensors::ints(const std::string& name) const {
  const auto& t = info(name);
  check(t.dtype == StDType::i32 || t.dtype == StDType::i64,
        "[safetensors] {}: tensor '{}' has dtype {}, expected I32 or I64", source_, name,
        st_dtype_name(t.dtype));
  const std::size_t size = st_dtype_size(t.dtype);
  const std::size_t n = (t.end - t.begin) / size;
  const std::byte* src = bytes_.get() + data_start_ + t.begin;
  std::vector<std::int64_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (t.dtype == StDType::i32) {
      std::int32_t v;
      std::memcpy(&v, src + 4 * i, 4);
      out[i] = v;
    } else {
      std::memcpy(&out[i], src + 8 * i, 8);
    }
  }
  return out;
}

void SafeTensorsWriter::add(const std::string& name, const Tensor& tensor, StDType as) {
  Entry e{name, as, tensor.shape(), {}};
  const std::int64_t n = tensor.numel();
  if (tensor.dtype() == DType::bf16) {
    e.dtype = StDType::bf16;
    e.bytes.resize(static_cast<std::size_t>(n) * 2);
    if (n > 0) std::memcpy(e.bytes.data(), tensor.bf16(), e.bytes.size());  // (no null pointers)
  } else if (as == StDType::f32) {
    e.bytes.resize(static_cast<std::size_t>(n) * 4);
    if (n > 0) std::memcpy(e.bytes.data(), tensor.f32(), e.bytes.size());
  } else if (as == StDType::bf16) {
    e.bytes.resize(static_cast<std::size_t>(n) * 2);
    const float* src = tensor.f32();
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint16_t v = f32_to_bf16(src[i]);
      std::memcpy(e.bytes.data() + 2 * i, &v, 2);
    }
  } else {
    fail("[safetensors] cannot store tensor '{}' as {}", name, st_dtype_name(as));
  }
  entries_.push_back(std::move(e));
}

void SafeTensorsWriter::add_ints(const std::string& name, const Shape& shape,
                                 const std::vector<std::int64_t>& v, StDType as) {
  check(as == StDType::i32 || as == StDType::i64, "[safetensors] '{}': ints must be I32 or I64",
        name);
  check(static_cast<std::int64_t>(v.size()) == shape_numel(shape),
        "[safetensors] '{}': {} values for shape {}", name, v.size(), shape_string(shape));
  Entry e{name, as, shape, {}};
  e.bytes.resize(v.size() * st_dtype_size(as));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (as == StDType::i32) {
      const auto x = static_cast<std::int32_t>(v[i]);
      std::memcpy(e.bytes.data() + 4 * i, &x, 4);
    } else {
      std::memcpy(e.bytes.data() + 8 * i, &v[i], 8);
    }
  }
  entries_.push_back(std::move(e));
}

void SafeTensorsWriter::add_view(const std::string& name, const Tensor& tensor) {
  Entry e{name, tensor.dtype() == DType::bf16 ? StDType::bf16 : StDType::f32, tensor.shape(), {}};
  e.viewed = tensor;
  e.view_bytes = static_cast<std::size_t>(tensor.nbytes());
  if (e.view_bytes > 0)
    e.view = tensor.dtype() == DType::bf16 ? reinterpret_cast<const std::byte*>(tensor.bf16())
                                           : reinterpret_cast<const std::byte*>(tensor.f32());
  entries_.push_back(std::move(e));
}

std::string SafeTensorsWriter::header() const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::uint64_t pos = 0;
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", st_dtype_name(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {pos, pos + e.size()}}};
    pos += e.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  std::string out(8, '\0');
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

std::vector<std::byte> SafeTensorsWriter::serialize() const {
  const std::string head = header();
  std::size_t total = head.size();
  for (const auto& e : entries_) total += e.size();
  std::vector<std::byte> out(total);
  std::memcpy(out.data(), head.data(), head.size());
  std::byte* data = out.data() + head.size();
  for (const auto& e : entries_) {
    if (e.size() > 0) std::memcpy(data, e.data(), e.size());
    data += e.size();
  }
  return out;
}

void SafeTensorsWriter::write(const std::string& path) const {
  // The header, then each tensor's bytes from where they are: no joined copy of the file.
  const std::string head = header();
  std::vector<FilePiece> pieces{{head.data(), head.size()}};
  for (const auto& e : entries_)
    if (e.size() > 0) pieces.push_back({e.data(), e.size()});
  write_file_atomic(path, pieces);
}

}  // namespace ffnlab
