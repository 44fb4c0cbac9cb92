// Byte-level text data: a file, or the regular files directly in a folder (sorted by path; not
// its subfolders, so that another package adding a subfolder — fortunes-de puts German files in
// /usr/share/games/fortunes/de — does not change the corpus; skipping the fortune package's
// binary `.dat` indexes and its `.u8` duplicates), concatenated. The last
// `val_fraction` of the bytes is the validation part. Training batches are random contiguous
// windows whose positions are a function of (seed, step, micro-batch, row) only, so a batch
// never depends on what was drawn before: the data position of a run is its step.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ffnlab {

// Debian's `fortunes` package: 43 English files, 2,576,674 bytes (fortunes 1:1.99.1-7.3).
inline constexpr const char* kDefaultCorpus = "/usr/share/games/fortunes";

// The validation part when none is asked for: `ffnlab train`'s and ffnlab.train's default,
// and the study's only split.
inline constexpr double kDefaultValFraction = 0.1;

struct Corpus {
  std::string source;              // what was loaded
  std::vector<std::string> files;  // in order
  std::vector<std::uint8_t> bytes;
  std::int64_t split = 0;   // bytes [0, split) train, [split, size) validation
  double val_fraction = 0;  // what the split was made from
  std::string fingerprint;  // "fnv1a64:<16 hex digits>" of the bytes: two runs with the
                            // same fingerprint read the same text

  std::span<const std::uint8_t> train() const {
    return {bytes.data(), static_cast<std::size_t>(split)};
  }
  std::span<const std::uint8_t> validation() const {
    return {bytes.data() + split, bytes.size() - static_cast<std::size_t>(split)};
  }
};

// Throws "[data] ..." for a missing path, a folder without text files, or empty data.
Corpus load_corpus(const std::string& path, double val_fraction = kDefaultValFraction);

// B windows of seq + 1 bytes: ids = window[0, seq), targets = window[1, seq + 1).
struct Batch {
  std::vector<std::int32_t> ids, targets;  // [B·S] each
};

// Throws "[data] ..." when the part is shorter than seq + 1 bytes. Rows [first, first + rows)
// of the batch (rows < 0: to its end): a data-parallel rank takes its slice of the windows one
// process would take.
Batch sample_batch(std::span<const std::uint8_t> part, std::int64_t batch, std::int64_t seq,
                   std::uint64_t seed, std::uint64_t step, std::uint64_t micro,
                   std::int64_t first = 0, std::int64_t rows = -1);

// The masked objective (masked byte modelling, as BERT on bytes): id 256, after the bytes, is
// [MASK]; a model trained with it has a vocabulary of 257.
inline constexpr std::int32_t kMaskToken = 256;
// Positions masked per sequence: max(1, round(fraction·seq)), the same in every sequence, so the
// mean over a batch's masked positions is the mean of its sequences' (data parallelism splits a
// batch by sequences).
std::int64_t masked_per_sequence(std::int64_t seq, double fraction);
// Turns a batch of sequential windows (ids = the window's bytes) into a masked one: in each
// sequence, masked_per_sequence positions, chosen uniformly without replacement as a function of
// (seed, stream, first_row + row) alone, get id kMaskToken and their byte as target; every other
// target is kIgnoreTarget (ops/loss.hpp). All chosen positions become [MASK] (no 80/10/10).
void mask_batch(Batch& b, std::int64_t seq, double fraction, std::uint64_t seed,
                std::uint64_t stream, std::int64_t first_row);

// Consecutive non-overlapping windows from the start of the part (evaluation): window w starts
// at w·seq. Returns at most `batch` windows starting with window `first`.
Batch sequential_batch(std::span<const std::uint8_t> part, std::int64_t batch, std::int64_t seq,
                       std::int64_t first);
// How many such windows the part holds.
std::int64_t window_count(std::span<const std::uint8_t> part, std::int64_t seq);

// Shannon entropy of the byte distribution of a part, in bits per byte (a unigram baseline).
double unigram_entropy_bits(std::span<const std::uint8_t> part);

}  // namespace ffnlab
