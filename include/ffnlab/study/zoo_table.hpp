// The real-model table (analysis/zoo.hpp) with ffnlab's costs, as rows and as JSON: printed by
// `ffnlab zoo` and the study's real-model section.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ffnlab::study {

std::vector<std::string> zoo_table_header();
std::vector<std::vector<std::string>> zoo_table_rows();  // the source is the last column
nlohmann::ordered_json zoo_table_json();

}  // namespace ffnlab::study
