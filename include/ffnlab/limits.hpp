// The sizes ffnlab accepts, and checked arithmetic for sizes that come from outside (configs,
// flags, files). Every product of sizes that such a value reaches goes through checked_mul, so
// that a huge dimension is refused with a message instead of wrapping to a small buffer.
// docs/hardening.md ("Limits") lists the limits and why they are where they are.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ffnlab {

namespace limits {
// One tensor, and one layer's or model's parameter buffer: 2^40 elements (4 TiB of f32).
inline constexpr std::int64_t kElements = std::int64_t{1} << 40;
// A width: d_model, d_ff, an expert's d_ff, the vocabulary, the context, heads. Real models
// stay below 2^17 (Llama-3-405B: d_ff 53,248; vocabularies up to 256k); 2^24 leaves room.
inline constexpr std::int64_t kWidth = std::int64_t{1} << 24;
// Routed experts of one MoE layer (DeepSeek-V3 has 256), gated branches, layers.
inline constexpr std::int64_t kExperts = std::int64_t{1} << 16;
inline constexpr std::int64_t kBranches = 1024;
inline constexpr std::int64_t kLayers = 4096;
// Tokens of one batch or one forward (batch × seq), and training or evaluation steps.
inline constexpr std::int64_t kTokens = std::int64_t{1} << 32;
inline constexpr std::int64_t kSteps = std::int64_t{1} << 40;
// Counts a double holds exactly (the cost tables' FLOPs and bytes).
inline constexpr std::int64_t kExact = std::int64_t{1} << 53;
}  // namespace limits

// Bytes this process may allocate: its share of the machine's memory (see share_memory_among),
// or the address-space limit (ulimit -v) when that is lower.
double available_memory_bytes();
// The processes that share this machine's memory (an MPI job's ranks on one node, each of which
// allocates its own model): each may allocate 1/n of it. 1 unless set.
void share_memory_among(int processes);

// Refuses work whose `bytes` (what it must allocate at least) exceed available_memory_bytes():
// Error "[scope] <what> needs X GiB, more than the Y GiB available" (with sharers: "to each of
// the n processes on this machine"). Callers check before they
// allocate what a config asks for: zero-filled memory the system promised but cannot give ends
// the process, not with a message.
void check_memory(double bytes, std::string_view scope, std::string_view what);

// Throws Error "[scope] what = a × b overflows" (out of line: keeps the fast path small).
[[noreturn]] void throw_overflow(std::string_view what, std::int64_t a, std::int64_t b, char op);

// a · b and a + b for non-negative sizes; `what` names the quantity in the error.
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t out;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &out)) throw_overflow(what, a, b, '*');
  return out;
}
inline std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t out;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &out)) throw_overflow(what, a, b, '+');
  return out;
}

// A range as help and messages print it: "[1, 2^24]", "(0, 1]", "[0, 1e+30]". An integer
// range prints powers of two from 2^20 as powers.
std::string range_text(double lo, double hi, bool lo_open, bool hi_open, bool integer);

// Throws Error "[scope] name = value must be in [lo, hi]" unless lo <= value <= hi.
void check_range(std::int64_t value, std::int64_t lo, std::int64_t hi, std::string_view scope,
                 std::string_view name);

}  // namespace ffnlab
