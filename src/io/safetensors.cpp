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
#include <string_view>
#include <unordered_set>

#include <fmt/ranges.h>

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

// The header, read by a SAX parser straight into tensor records: no JSON tree is built, so the
// memory a header takes is that of its records (a few times the text at most), and a header
// that does not fit fails with std::bad_alloc (exit 3) instead of aborting in a tree's
// destructor. Anything outside the format is refused at the first token that leaves it.
struct Header {
  std::vector<StTensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};

class HeaderReader : public nlohmann::json_sax<nlohmann::json> {
 public:
  HeaderReader(std::uint64_t data_size, std::string_view source)
      : data_size_(data_size), source_(source) {}
  Header header;

  bool null() override { return scalar(Kind::other); }
  bool boolean(bool) override { return scalar(Kind::other); }
  bool number_integer(number_integer_t) override { return scalar(Kind::other); }
  bool number_unsigned(number_unsigned_t v) override {
    if (skip_ == 0 && depth_ == 3 && in_ == In::shape) return dimension(v);
    if (skip_ == 0 && depth_ == 3 && in_ == In::offsets) return offset(v);
    return scalar(Kind::other);
  }
  bool number_float(number_float_t, const string_t&) override { return scalar(Kind::other); }
  bool string(string_t& v) override {
    if (skip_ == 0 && depth_ == 2 && in_ == In::metadata) {
      header.metadata[key_] = std::move(v);
      return true;
    }
    if (skip_ == 0 && depth_ == 2 && in_ == In::entry && field_ == Field::dtype) {
      dtype_ = std::move(v);
      has_dtype_ = true;
      return true;
    }
    return scalar(Kind::other);
  }
  bool binary(binary_t&) override { return scalar(Kind::other); }

  bool start_object(std::size_t) override {
    if (skip_ > 0) return ++skip_, true;
    if (depth_ == 0) return ++depth_, true;
    if (depth_ == 1) {
      if (key_ == "__metadata__") {
        in_ = In::metadata;
      } else {
        in_ = In::entry;
        entry_ = {};
        entry_.name = key_;
        dtype_.clear();
        has_dtype_ = has_shape_ = has_offsets_ = false;
      }
      return ++depth_, true;
    }
    return scalar(Kind::object);
  }
  bool end_object() override {
    if (skip_ > 0) return --skip_, true;
    if (depth_ == 2 && in_ == In::entry) finish_entry();
    in_ = In::top;
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    if (skip_ > 0) return ++skip_, true;
    if (depth_ == 2 && in_ == In::entry && field_ == Field::shape) {
      in_ = In::shape;
      has_shape_ = true;
      return ++depth_, true;
    }
    if (depth_ == 2 && in_ == In::entry && field_ == Field::offsets) {
      in_ = In::offsets;
      has_offsets_ = true;
      offsets_ = 0;
      return ++depth_, true;
    }
    return scalar(Kind::array);
  }
  bool end_array() override {
    if (skip_ > 0) return --skip_, true;
    if (in_ == In::offsets && offsets_ != 2) bad_offsets();
    in_ = In::entry;
    --depth_;
    return true;
  }
  bool key(string_t& k) override {
    if (skip_ > 0) return true;
    if (depth_ == 2 && in_ == In::entry) {
      field_ = k == "dtype" ? Field::dtype
               : k == "shape" ? Field::shape
               : k == "data_offsets" ? Field::offsets
                                     : Field::other;
      const bool again = (field_ == Field::dtype && has_dtype_) ||
                         (field_ == Field::shape && has_shape_) ||
                         (field_ == Field::offsets && has_offsets_);
      check(!again, "[safetensors] {}: tensor '{}' has '{}' twice", source_, entry_.name, k);
      return true;
    }
    key_ = std::move(k);
    if (depth_ == 1 && key_ != "__metadata__") {
      check(names_.insert(key_).second, "[safetensors] {}: tensor '{}' appears twice in the header",
            source_, key_);
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& e) override {
    fail("[safetensors] {}: not valid JSON ({})", source_, json_error_text(e));
  }

 private:
  enum class In { top, metadata, entry, shape, offsets };
  enum class Field { dtype, shape, offsets, other };
  enum class Kind { object, array, other };

  // A value where the format has none of its kind: refused, or skipped where the format allows
  // any value (an entry's other keys).
  bool scalar(Kind kind) {
    if (skip_ > 0) return true;
    if (depth_ == 0) fail("[safetensors] {}: header is not a JSON object", source_);
    if (depth_ == 1) {
      check(key_ != "__metadata__", "[safetensors] {}: __metadata__ is not an object", source_);
      fail("[safetensors] {}: tensor '{}' needs dtype, shape and data_offsets", source_, key_);
    }
    if (in_ == In::metadata)
      fail("[safetensors] {}: metadata '{}' is not a string", source_, key_);
    if (in_ == In::shape)
      fail("[safetensors] {}: tensor '{}' has a non-integer dimension", source_, entry_.name);
    if (in_ == In::offsets) bad_offsets();
    switch (field_) {
      case Field::dtype:
        fail("[safetensors] {}: tensor '{}' has a non-string dtype", source_, entry_.name);
      case Field::shape:
        fail("[safetensors] {}: tensor '{}' has an invalid shape", source_, entry_.name);
      case Field::offsets:
        bad_offsets();
      case Field::other:
        break;
    }
    if (kind != Kind::other) skip_ = 1;  // an unknown key's object or array: skipped whole
    return true;
  }
  bool dimension(std::uint64_t v) {
    check(entry_.shape.size() < 8, "[safetensors] {}: tensor '{}' has an invalid shape", source_,
          entry_.name);
    check(v <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
          "[safetensors] {}: tensor '{}' has shape larger than the file", source_, entry_.name);
    entry_.shape.push_back(static_cast<std::int64_t>(v));
    return true;
  }
  bool offset(std::uint64_t v) {
    if (offsets_ >= 2) bad_offsets();
    (offsets_++ == 0 ? entry_.begin : entry_.end) = v;
    return true;
  }
  [[noreturn]] void bad_offsets() {
    fail("[safetensors] {}: tensor '{}' has invalid data_offsets", source_, entry_.name);
  }
  void finish_entry() {
    const std::string& name = entry_.name;
    check(has_dtype_ && has_shape_ && has_offsets_,
          "[safetensors] {}: tensor '{}' needs dtype, shape and data_offsets", source_, name);
    const DTypeName* found = nullptr;
    for (const auto& d : kDTypes)
      if (dtype_ == d.name) found = &d;
    check(found != nullptr,
          "[safetensors] {}: tensor '{}' has unsupported dtype '{}' (supported: F32, BF16, F16, "
          "I32, I64)",
          source_, name, dtype_);
    entry_.dtype = found->dtype;
    // The element count, guarded against overflow by the data section's size; a shape with a
    // 0 anywhere has no elements whatever its other dimensions.
    const bool empty = std::find(entry_.shape.begin(), entry_.shape.end(), 0) != entry_.shape.end();
    std::uint64_t numel = empty ? 0 : 1;
    for (const std::int64_t d : entry_.shape) {
      if (empty) break;
      const auto v = static_cast<std::uint64_t>(d);
      check(numel <= data_size_ / v,
            "[safetensors] {}: tensor '{}' has shape larger than the file", source_, name);
      numel *= v;
    }
    check(entry_.begin <= entry_.end && entry_.end <= data_size_,
          "[safetensors] {}: tensor '{}' offsets [{}, {}) run past the {}-byte data section",
          source_, name, entry_.begin, entry_.end, data_size_);
    check(entry_.end - entry_.begin == numel * found->size,
          "[safetensors] {}: tensor '{}' of shape {} and dtype {} needs {} bytes, offsets give {}",
          source_, name, shape_string(entry_.shape), dtype_, numel * found->size,
          entry_.end - entry_.begin);
    header.tensors.push_back(std::move(entry_));
  }

  std::uint64_t data_size_;
  std::string_view source_;
  int depth_ = 0;  // 1: the top object, 2: an entry or __metadata__, 3: a shape or offsets
  int skip_ = 0;   // > 0: inside a value that is skipped, this deep
  In in_ = In::top;
  Field field_ = Field::other;
  std::string key_, dtype_;
  StTensorInfo entry_;
  bool has_dtype_ = false, has_shape_ = false, has_offsets_ = false;
  int offsets_ = 0;
  std::unordered_set<std::string> names_;
};

Header parse_header(std::string_view text, std::uint64_t data_size, std::string_view source) {
  HeaderReader reader(data_size, source);
  nlohmann::json::sax_parse(text.begin(), text.end(), &reader);
  return std::move(reader.header);
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

  Header header = parse_header(
      std::string_view(reinterpret_cast<const char*>(base) + 8, static_cast<std::size_t>(n)),
      data_size, source);
  st.tensors_ = std::move(header.tensors);
  st.metadata_ = std::move(header.metadata);

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
  // Written as text, one entry after the other: a JSON object type would look each key up
  // (nlohmann's ordered_json does so linearly, which made 600,000 tensors take minutes). The
  // bytes are what ordered_json wrote: no spaces, entries in the order they were added.
  std::string text = "{";
  const auto quoted = [&](const std::string& s) {
    text += nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  };
  if (!metadata_.empty()) {
    text += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata_) {
      if (!first) text += ',';
      first = false;
      quoted(key);
      text += ':';
      quoted(value);
    }
    text += '}';
  }
  std::unordered_set<std::string_view> names;
  names.reserve(entries_.size());
  std::uint64_t pos = 0;
  for (const auto& e : entries_) {
    check(e.name != "__metadata__", "[safetensors] a tensor cannot be named '__metadata__'");
    check(names.insert(e.name).second, "[safetensors] tensor '{}' is added twice", e.name);
    if (text.size() > 1) text += ',';
    quoted(e.name);
    text += fmt::format(R"(:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})",
                        st_dtype_name(e.dtype), fmt::join(e.shape, ","), pos, pos + e.size());
    pos += e.size();
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  // What no reader would take back (this one's limit is the reference implementation's).
  check(text.size() <= kMaxHeader,
        "[safetensors] a header of {} bytes for {} tensors exceeds the {} bytes readers accept",
        text.size(), entries_.size(), kMaxHeader);
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
