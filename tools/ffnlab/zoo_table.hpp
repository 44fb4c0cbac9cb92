// The real-model table (analysis/zoo.hpp) with ffnlab's costs, as rows and as JSON: printed by
// `ffnlab zoo` and section 7 of `ffnlab evolve`'s report.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ffnlab::cli {

std::vector<std::string> zoo_header();
std::vector<std::vector<std::string>> zoo_rows();  // the source is the last column
nlohmann::ordered_json zoo_json();

}  // namespace ffnlab::cli
