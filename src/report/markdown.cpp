// Markdown tables and number formatting.
#include "ffnlab/report/markdown.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "check.hpp"

namespace ffnlab {

std::string markdown_table(const std::vector<std::string>& header,
                           const std::vector<std::vector<std::string>>& rows,
                           const std::string& align) {
  check(align.size() == header.size(), "[report] {} columns, {} alignments", header.size(),
        align.size());
  std::string out = "|";
  for (const auto& h : header) out += " " + h + " |";
  out += "\n|";
  for (char a : align) out += a == 'r' ? "---:|" : "---|";
  out += "\n";
  for (const auto& row : rows) {
    check(row.size() == header.size(), "[report] a row has {} cells, the header {}", row.size(),
          header.size());
    out += "|";
    for (const auto& cell : row) out += " " + cell + " |";
    out += "\n";
  }
  return out;
}

std::string thousands(std::int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (v < 0 ? "-" : "") + out;
}

std::string duration(double seconds) {
  const auto s = static_cast<std::int64_t>(std::max(0.0, seconds));
  return s >= 3600 ? fmt::format("{}:{:02d}:{:02d}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{}:{:02d}", s / 60, s % 60);
}

std::string elapsed(double seconds) {
  const auto s = static_cast<std::int64_t>(std::max(0.0, seconds));
  if (s >= 3600) return fmt::format("{} h {:02d} min", s / 3600, s / 60 % 60);
  if (s >= 60) return fmt::format("{} min {:02d} s", s / 60, s % 60);
  return fmt::format("{} s", s);
}

std::string fixed(double value, int decimals) {
  if (!std::isfinite(value)) return "n/a";
  return fmt::format("{:.{}f}", value, decimals);
}

std::string percent(double fraction, int decimals) {
  if (!std::isfinite(fraction)) return "n/a";
  return fmt::format("{:.{}f} %", 100.0 * fraction, decimals);
}

std::string counted(std::int64_t n, std::string_view noun) {
  return fmt::format("{} {}{}", thousands(n), noun, n == 1 ? "" : "s");
}

}  // namespace ffnlab
