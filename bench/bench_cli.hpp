// Command-line options shared by the benchmark programs (CLI11), checked as the ffnlab program
// checks its own: the same validators, one-line errors and exit statuses (tools/ffnlab/common.hpp,
// docs/hardening.md). A bad value is "bench_x: usage error: --flag: ..." (exit 2), refused work
// "bench_x: error: [bench_x] ..." (exit 1), out of memory or a failed write exit 3. Every size is
// bounded by the library's limits (ffnlab/limits.hpp) when the flags are parsed, and the memory
// the tensors need is checked (in doubles: no product of flag values can overflow) before they
// are allocated.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "common.hpp"  // tools/ffnlab: report_error, run_program, int_in, real_in, UsageError
#include "ffnlab/limits.hpp"

namespace ffnlab::bench {

// An integer option (or a comma-separated list of them) in [lo, hi], the range and the default
// shown in --help.
template <typename T>
CLI::Option* int_option(CLI::App& app, const std::string& name, T& value, std::int64_t lo,
                        std::int64_t hi, const std::string& help) {
  return app.add_option(name, value, help)->check(cli::int_in(lo, hi))->capture_default_str();
}

// A width (d_model, d_ff, a product's K or N): [1, 2^24], the library's limit on widths.
template <typename T>
CLI::Option* width_option(CLI::App& app, const std::string& name, T& value,
                          const std::string& help) {
  return int_option(app, name, value, 1, limits::kWidth, help);
}

// Token or row counts, comma-separated: each in [1, 2^32], the library's limit on the tokens of
// one step.
inline CLI::Option* tokens_option(CLI::App& app, const std::string& name,
                                  std::vector<std::int64_t>& value, const std::string& help) {
  return int_option(app, name, value, 1, limits::kTokens, help)->delimiter(',');
}

// Rounds of a measurement: [1, 1000].
inline CLI::Option* rounds_option(CLI::App& app, int& rounds, const std::string& help) {
  return int_option(app, "--rounds", rounds, 1, 1000, help);
}

// --seconds: the time budget of one measurement, in [0.001, 3600].
inline void add_seconds_option(CLI::App& app, double& budget) {
  app.add_option("--seconds", budget, "time budget per measurement, seconds")
      ->check(cli::real_in(0.001, 3600))
      ->capture_default_str();
}

// A value from a fixed list: "'x' is not one of f32, bf16", the list shown in --help.
inline CLI::Validator one_of(std::vector<std::string> names) {
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  std::string shown;
  for (const auto& n : names) shown += (shown.empty() ? "" : "|") + n;
  return CLI::Validator(
      [names, list](std::string& text) -> std::string {
        for (const auto& n : names)
          if (text == n) return {};
        return "'" + text.substr(0, 40) + "' is not one of " + list;
      },
      shown);
}

// What a program's tensors need, summed in doubles (products of flag values up to 2^32 · 2^24 ·
// 2^24 are far from a double's range, and nothing is rounded to a small number), checked against
// the memory this process may use before any of them is allocated: Error "[program] what needs
// X GiB, more than the Y GiB available" (exit 1). A lower bound: the tensors the program
// allocates itself and the layers' weights; what oneDNN and the layers add beyond is not counted.
class Footprint {
 public:
  // A tensor of these dimensions, `bytes` per element.
  void add(std::initializer_list<std::int64_t> dims, double bytes = 4) {
    double n = bytes;
    for (auto d : dims) n *= static_cast<double>(d);
    total_ += n;
  }
  // `count` tensors of these dimensions.
  void add_n(double count, std::initializer_list<std::int64_t> dims, double bytes = 4) {
    Footprint one;
    one.add(dims, bytes);
    total_ += count * one.total_;
  }
  double bytes() const { return total_; }
  void check(std::string_view program, std::string_view what) const {
    check_memory(total_, program, what);
  }

 private:
  double total_ = 0;
};

}  // namespace ffnlab::bench
