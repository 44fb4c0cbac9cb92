// Expert specialisation by byte class.
#include "ffnlab/analysis/specialisation.hpp"

#include <cmath>

#include "check.hpp"

namespace ffnlab {

namespace {

bool is_letter(std::uint8_t b) {
  return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z');
}

}  // namespace

int byte_class(std::uint8_t previous, std::uint8_t b) {
  if (b == ' ' || b == '\t') return 0;
  if (b == '\n' || b == '\r') return 1;
  if (b >= 'A' && b <= 'Z') return 2;
  if (b >= 'a' && b <= 'z') return is_letter(previous) ? 4 : 3;
  if (b >= '0' && b <= '9') return 5;
  if (b >= 33 && b <= 126) return 6;
  return 7;
}

std::string_view byte_class_name(int c) {
  static constexpr std::string_view kNames[kByteClasses] = {
      "space", "newline", "upper case", "word start", "in word", "digit", "punctuation", "other"};
  check(c >= 0 && c < kByteClasses, "[specialisation] no byte class {}", c);
  return kNames[c];
}

void ExpertSpecialisation::add(std::span<const std::int32_t> expert, int k,
                               std::span<const std::int32_t> ids, std::int64_t seq) {
  check(experts > 0 && k > 0 && seq > 0, "[specialisation] {} experts, top-{}, windows of {}",
        experts, k, seq);
  check(expert.size() == ids.size() * static_cast<std::size_t>(k),
        "[specialisation] {} choices for {} tokens at top-{}", expert.size(), ids.size(), k);
  if (counts.empty()) counts.assign(static_cast<std::size_t>(experts) * kByteClasses, 0);
  for (std::size_t t = 0; t < ids.size(); ++t) {
    const bool first = t % static_cast<std::size_t>(seq) == 0;
    const auto previous = static_cast<std::uint8_t>(first ? ' ' : ids[t - 1]);
    const int c = byte_class(previous, static_cast<std::uint8_t>(ids[t]));
    for (int j = 0; j < k; ++j) {
      const std::int32_t e = expert[t * static_cast<std::size_t>(k) + j];
      if (e < 0) continue;
      check(e < experts, "[specialisation] expert {} of {}", e, experts);
      ++counts[static_cast<std::size_t>(e) * kByteClasses + c];
    }
  }
}

std::int64_t ExpertSpecialisation::assignments() const {
  std::int64_t n = 0;
  for (auto x : counts) n += x;
  return n;
}

std::int64_t ExpertSpecialisation::of_expert(int e) const {
  std::int64_t n = 0;
  for (int c = 0; c < kByteClasses; ++c)
    n += counts[static_cast<std::size_t>(e) * kByteClasses + c];
  return n;
}

std::int64_t ExpertSpecialisation::of_class(int c) const {
  std::int64_t n = 0;
  for (int e = 0; e < experts; ++e) n += counts[static_cast<std::size_t>(e) * kByteClasses + c];
  return n;
}

double ExpertSpecialisation::share(int e, int c) const {
  const std::int64_t n = of_expert(e);
  return n ? static_cast<double>(counts[static_cast<std::size_t>(e) * kByteClasses + c]) /
                 static_cast<double>(n)
           : 0.0;
}

double ExpertSpecialisation::base_share(int c) const {
  const std::int64_t n = assignments();
  return n ? static_cast<double>(of_class(c)) / static_cast<double>(n) : 0.0;
}

double ExpertSpecialisation::mutual_information_bits() const {
  const double n = static_cast<double>(assignments());
  if (n == 0) return 0.0;
  double mi = 0;
  for (int e = 0; e < experts; ++e) {
    const double pe = static_cast<double>(of_expert(e)) / n;
    for (int c = 0; c < kByteClasses; ++c) {
      const double p =
          static_cast<double>(counts[static_cast<std::size_t>(e) * kByteClasses + c]) / n;
      if (p > 0) mi += p * std::log2(p / (pe * base_share(c)));
    }
  }
  return mi;
}

}  // namespace ffnlab
