// Command-line options shared by the benchmark programs (CLI11).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace ffnlab::bench {

// A positive number (or list of them), its default shown in --help.
template <typename T>
CLI::Option* positive_option(CLI::App& app, const std::string& name, T& value,
                             const std::string& help) {
  return app.add_option(name, value, help)->check(CLI::PositiveNumber)->capture_default_str();
}

// --seconds: the time budget of one measurement.
inline void add_seconds_option(CLI::App& app, double& budget) {
  positive_option(app, "--seconds", budget, "time budget per measurement");
}

}  // namespace ffnlab::bench
