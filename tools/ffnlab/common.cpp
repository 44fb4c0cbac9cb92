// Helpers every subcommand may use.
#include "common.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <sstream>

#include "ffnlab/layers/ffn_config.hpp"

namespace ffnlab::cli {

void add_threads_option(CLI::App& cmd, int& threads) {
  cmd.add_option("--threads", threads, "OpenMP threads (default: OMP_NUM_THREADS or all cores)")
      ->check(CLI::NonNegativeNumber);
}

void apply_threads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}

std::vector<std::string> variant_list(const std::string& spec) {
  if (spec == "all") return variant_names();
  std::vector<std::string> out;
  std::stringstream in(spec);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) {
      variant_config(item, 1, 1, false);  // throws "[ffn] unknown variant 'x' (known: ...)"
      out.push_back(item);
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

}  // namespace ffnlab::cli
