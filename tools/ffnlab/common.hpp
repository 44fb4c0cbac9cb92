// Helpers every subcommand may use: threads, variant lists, number formatting.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace ffnlab::cli {

// --threads N: sets OpenMP's thread count (0 keeps OMP_NUM_THREADS or the default).
void add_threads_option(CLI::App& cmd, int& threads);
void apply_threads(int threads);

// "relu,swiglu" -> {"relu", "swiglu"}; "all" -> every named variant (ffnlab::variant_names()).
// Unknown names are an error that lists the known ones.
std::vector<std::string> variant_list(const std::string& spec);

// 2099712 -> "2,099,712".
std::string thousands(std::int64_t value);

// Seconds as m:ss or h:mm:ss.
std::string duration(double seconds);

}  // namespace ffnlab::cli
