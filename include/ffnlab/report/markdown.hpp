// Markdown tables for reports.
#pragma once

#include <string>
#include <vector>

namespace ffnlab {

// A GitHub-flavoured Markdown table. `align` has one character per column: 'l' or 'r'.
std::string markdown_table(const std::vector<std::string>& header,
                           const std::vector<std::vector<std::string>>& rows,
                           const std::string& align);

}  // namespace ffnlab
