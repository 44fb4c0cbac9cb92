// Loading text and cutting it into windows.
#include "ffnlab/train/data.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "check.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/ops/loss.hpp"
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
  // (A run always has a validation part: its evaluations and final validation read it.)
  check(val_fraction > 0.0 && val_fraction < 1.0, "[data] validation fraction {} outside (0, 1)",
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

std::int64_t masked_per_sequence(std::int64_t seq, double fraction) {
  check(fraction > 0.0 && fraction <= 1.0, "[data] mask fraction {} outside (0, 1]", fraction);
  return std::clamp<std::int64_t>(std::llround(fraction * static_cast<double>(seq)), 1, seq);
}

void mask_batch(Batch& b, std::int64_t seq, double fraction, std::uint64_t seed,
                std::uint64_t stream, std::int64_t first_row) {
  const auto n = static_cast<std::int64_t>(b.ids.size());
  check(seq > 0 && n % seq == 0 && b.targets.size() == b.ids.size(),
        "[data] a batch of {} ids is not whole sequences of {}", n, seq);
  const std::int64_t m = masked_per_sequence(seq, fraction);
  std::vector<std::int64_t> order(static_cast<std::size_t>(seq));
  std::fill(b.targets.begin(), b.targets.end(), kIgnoreTarget);
  for (std::int64_t row = 0; row < n / seq; ++row) {
    // The first m of a Fisher–Yates shuffle drawn from the row's own counter-based stream.
    std::uint64_t h = splitmix64(splitmix64(splitmix64(seed ^ 0x6d61736bull) + stream) +
                                 static_cast<std::uint64_t>(first_row + row));
    for (std::int64_t i = 0; i < seq; ++i) order[i] = i;
    for (std::int64_t i = 0; i < m; ++i) {
      h = splitmix64(h);
      const auto j = i + static_cast<std::int64_t>(h % static_cast<std::uint64_t>(seq - i));
      std::swap(order[i], order[j]);
      const std::int64_t at = row * seq + order[i];
      b.targets[at] = b.ids[at];
      b.ids[at] = kMaskToken;
    }
  }
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
