// Markdown tables.
#include "ffnlab/report/markdown.hpp"

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

}  // namespace ffnlab
