// Markdown tables and number formatting for reports and for what the commands print.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ffnlab {

// A GitHub-flavoured Markdown table. `align` has one character per column: 'l' or 'r'.
std::string markdown_table(const std::vector<std::string>& header,
                           const std::vector<std::vector<std::string>>& rows,
                           const std::string& align);

// 2099712 -> "2,099,712".
std::string thousands(std::int64_t value);
// Seconds as m:ss or h:mm:ss.
std::string duration(double seconds);
// A length of time in words, for a sentence: "42 s", "19 min 15 s", "1 h 02 min".
std::string elapsed(double seconds);
// `decimals` decimals; "n/a" for a value that is not finite.
std::string fixed(double value, int decimals);
// A fraction as a percentage ("12.5 %"); "n/a" for a value that is not finite.
std::string percent(double fraction, int decimals = 1);
// A count and its noun, plural but for 1: "1 seed", "3 seeds", "2,048 files".
std::string counted(std::int64_t n, std::string_view noun);

}  // namespace ffnlab
