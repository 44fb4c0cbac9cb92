// Loading text and cutting it into windows.
#include "ffnlab/train/data.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "check.hpp"
#include "ffnlab/io/files.hpp"
#include "hash.hpp"

namespace ffnlab {

namespace fs = std::filesystem;

namespace {

bool skipped(const fs::path& p) {
  const auto ext = p.extension().string();
  return ext == ".dat" || ext == ".u8";
}

// Appends one file, keeping the whole corpus within kMaxReadBytes.
void append_file(Corpus& c, const fs::path& p) {
  const std::uint64_t room = kMaxReadBytes - c.bytes.size();
  const auto bytes = read_regular_file(p.string(), "data", room);
  c.bytes.insert(c.bytes.end(), bytes.begin(), bytes.end());
  c.files.push_back(p.string());
}

}  // namespace

Corpus load_corpus(const std::string& path, double val_fraction) {
  check(val_fraction >= 0.0 && val_fraction < 1.0, "[data] validation fraction {} outside [0, 1)",
        val_fraction);
  Corpus c;
  c.source = path;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  check(!ec || ec == std::errc::no_such_file_or_directory, "[data] '{}': {}", path, ec.message());
  check(fs::exists(status), "[data] '{}' does not exist", path);
  if (fs::is_directory(status)) {
    std::vector<fs::path> files;
    fs::directory_iterator it(path, ec);
    check(!ec, "[data] '{}': cannot list the folder ({})", path, ec.message());
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      const fs::path& f = it->path();
      std::error_code entry;
      const bool regular = it->is_regular_file(entry);  // a loop of links: refused by name
      check(!entry, "[data] '{}': {}", f.string(), entry.message());
      if (regular && !skipped(f)) files.push_back(f);
    }
    check(!ec, "[data] '{}': cannot list the folder ({})", path, ec.message());
    std::sort(files.begin(), files.end());
    check(!files.empty(), "[data] '{}' holds no text files", path);
    for (const auto& f : files) append_file(c, f);
  } else {
    append_file(c, path);
  }
  check(!c.bytes.empty(), "[data] '{}' is empty", path);
  c.fingerprint = fmt::format("fnv1a64:{:016x}", fnv1a64(c.bytes.data(), c.bytes.size()));
  c.val_fraction = val_fraction;
  c.split = static_cast<std::int64_t>(
      std::floor(static_cast<double>(c.bytes.size()) * (1.0 - val_fraction)));
  return c;
}

Batch sample_batch(std::span<const std::uint8_t> part, std::int64_t batch, std::int64_t seq,
                   std::uint64_t seed, std::uint64_t step, std::uint64_t micro, std::int64_t first,
                   std::int64_t rows) {
  const std::int64_t n = static_cast<std::int64_t>(part.size());
  check(seq > 0 && batch > 0, "[data] batch {} and sequence length {} must be positive", batch,
        seq);
  check(n >= seq + 1, "[data] sequence length {} needs {} bytes, the training part has {}", seq,
        seq + 1, n);
  if (rows < 0) rows = batch - first;
  check(first >= 0 && rows >= 1 && first + rows <= batch, "[data] rows [{}, {}) of a batch of {}",
        first, first + rows, batch);
  Batch b;
  b.ids.resize(static_cast<std::size_t>(rows * seq));
  b.targets.resize(b.ids.size());
  const std::uint64_t starts = static_cast<std::uint64_t>(n - seq);  // valid starts: [0, n − seq)
  for (std::int64_t i = 0; i < rows; ++i) {
    const auto r = static_cast<std::uint64_t>(first + i);
    const std::uint64_t h =
        splitmix64(splitmix64(splitmix64(seed) + step) + micro * 0x100000001b3ull + r);
    const std::int64_t start = static_cast<std::int64_t>(h % starts);
    for (std::int64_t s = 0; s < seq; ++s) {
      b.ids[i * seq + s] = part[start + s];
      b.targets[i * seq + s] = part[start + s + 1];
    }
  }
  return b;
}

std::int64_t window_count(std::span<const std::uint8_t> part, std::int64_t seq) {
  const std::int64_t n = static_cast<std::int64_t>(part.size());
  return n >= seq + 1 ? (n - 1) / seq : 0;
}

Batch sequential_batch(std::span<const std::uint8_t> part, std::int64_t batch, std::int64_t seq,
                       std::int64_t first) {
  const std::int64_t count = std::min(batch, window_count(part, seq) - first);
  Batch b;
  for (std::int64_t w = first; w < first + count; ++w)
    for (std::int64_t s = 0; s < seq; ++s) {
      b.ids.push_back(part[w * seq + s]);
      b.targets.push_back(part[w * seq + s + 1]);
    }
  return b;
}

double unigram_entropy_bits(std::span<const std::uint8_t> part) {
  std::vector<double> count(256, 0.0);
  for (std::uint8_t b : part) count[b] += 1;
  double h = 0;
  for (double c : count)
    if (c > 0) {
      const double p = c / static_cast<double>(part.size());
      h -= p * std::log2(p);
    }
  return h;
}

}  // namespace ffnlab
