// Helpers every subcommand may use.
#include "common.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <sstream>

#include "ffnlab/layers/ffn_config.hpp"
#include "interrupt.hpp"

namespace ffnlab::cli {

namespace {
int report(const char* kind, const std::string& message, int status) {
  std::string line = message.substr(0, message.find('\n'));
  if (line.size() > 2000) line = line.substr(0, 2000) + "...";
  std::fprintf(stderr, "ffnlab: %s: %s\n", kind, line.c_str());
  return status;
}
}  // namespace

int report_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const CLI::ParseError& e) {
    return report("usage error", e.what(), kExitUsage);
  } catch (const UsageError& e) {
    return report("usage error", e.what(), kExitUsage);
  } catch (const Interrupted& e) {
    return report("interrupted", e.what(), kExitInterrupted);
  } catch (const ffnlab::SystemError& e) {
    return report("error", e.what(), kExitSystem);
  } catch (const ffnlab::Error& e) {
    return report("error", e.what(), kExitInput);
  } catch (const std::bad_alloc&) {
    return report("error", "out of memory", kExitSystem);
  } catch (const std::filesystem::filesystem_error& e) {
    return report("error", e.what(), kExitSystem);
  } catch (const std::exception& e) {
    return report("error", e.what(), kExitSystem);
  } catch (...) {
    return report("error", "unknown exception", kExitSystem);
  }
}

namespace {
// 1099511627776 -> "2^40" (help and messages); other values as they are.
std::string bound(std::int64_t v) {
  const auto u = static_cast<std::uint64_t>(v);
  if (v >= (1 << 20) && std::has_single_bit(u)) return fmt::format("2^{}", std::countr_zero(u));
  return std::to_string(v);
}
}  // namespace

CLI::Validator int_in(std::int64_t lo, std::int64_t hi) {
  const std::string range = fmt::format("[{}, {}]", bound(lo), bound(hi));
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        std::int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || ptr != end || v < lo || v > hi)
          return fmt::format("'{}' is not an integer in {}", text.substr(0, 40), range);
        return {};
      },
      range);
}

CLI::Validator real_in(double lo, double hi, bool hi_open) {
  const std::string range = fmt::format("[{}, {}{}", lo, hi, hi_open ? ")" : "]");
  return CLI::Validator(
      [lo, hi, hi_open, range](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool ok = !text.empty() && end == text.c_str() + text.size() && std::isfinite(v) &&
                        v >= lo && (hi_open ? v < hi : v <= hi);
        if (!ok) return fmt::format("'{}' is not a number in {}", text.substr(0, 40), range);
        return {};
      },
      range);
}

void add_threads_option(CLI::App& cmd, int& threads) {
  cmd.add_option("--threads", threads,
                 "OpenMP threads, at most the processors (default: OMP_NUM_THREADS or all)")
      ->check(int_in(0, omp_get_num_procs()));
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
