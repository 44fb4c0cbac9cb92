// Expert specialisation on byte-level text: which kinds of byte each expert of an MoE layer
// takes. Every routed assignment (token, expert) is counted under the class of the token's byte
// (space, newline, upper-case letter, lower-case letter starting a word or inside one, digit,
// punctuation, other); P(class | expert) against P(class) over all assignments shows what an
// expert prefers, and the mutual information between expert and class sums it up per layer
// (0: the router ignores the byte's class; at most the class entropy).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace ffnlab {

inline constexpr int kByteClasses = 8;

// The class of byte `b` given the byte before it (a letter after a letter is inside a word).
int byte_class(std::uint8_t previous, std::uint8_t b);
std::string_view byte_class_name(int c);

struct ExpertSpecialisation {
  int experts = 0;
  std::vector<std::int64_t> counts;  // [E, kByteClasses] assignments

  // Adds one forward's routing: expert [T, k] (chosen experts, -1 for none) of tokens whose
  // bytes are ids [T] in windows of `seq` (the first byte of a window counts as after a space).
  void add(std::span<const std::int32_t> expert, int k, std::span<const std::int32_t> ids,
           std::int64_t seq);
  std::int64_t assignments() const;
  std::int64_t of_expert(int e) const;
  std::int64_t of_class(int c) const;
  // P(class c | expert e) and P(class c) over all assignments.
  double share(int e, int c) const;
  double base_share(int c) const;
  // I(expert; class) in bits over the assignments.
  double mutual_information_bits() const;
};

}  // namespace ffnlab
