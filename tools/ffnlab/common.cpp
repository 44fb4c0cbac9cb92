// Helpers every subcommand may use.
#include "common.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <regex>
#include <sstream>
#include <system_error>

#include "ffnlab/failure.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/limits.hpp"

namespace ffnlab::cli {

namespace {
// The name every error line starts with (run_program sets it).
const char* g_program = "ffnlab";

// One line: cut at the first newline (ffnlab::Error has none: it escapes them; CLI11's and other
// libraries' messages may), at most 2000 bytes, and every other control byte shown as \xNN
// (ffnlab::one_line, as Error does).
int report(const char* kind, const std::string& message, int status) {
  std::string line = one_line(std::string_view(message).substr(0, message.find('\n')));
  if (line.size() > 2000) line = line.substr(0, 2000) + "...";
  std::fprintf(stderr, "%s: %s: %s\n", g_program, kind, line.c_str());
  std::fflush(stderr);
  return status;
}

// CLI11's count messages in the words of the rest of ffnlab's: "--steps: At Most 1 required but
// received 2" is a flag given twice, "--tokens: 1 required INT:[1, 2^20] missing" a flag
// without its value, and "untied was given a disallowed flag override" a switch given a value.
// Any other message is CLI11's own.
std::string usage_words(const std::string& message) {
  static const std::regex at_most(R"(^(.+): At Most (\d+) required but received (\d+)$)");
  static const std::regex missing(R"(^(.+): (\d+) required (.+) missing$)");
  static const std::regex valued(R"(^([a-z0-9-]+) was given a disallowed flag override$)");
  std::smatch m;
  if (std::regex_match(message, m, valued))
    return fmt::format("--{}: a switch takes no value; give it alone, or leave it out", m[1].str());
  if (std::regex_match(message, m, at_most))
    return m[2] == "1" ? fmt::format("{}: given {} times; give it once", m[1].str(), m[3].str())
                       : fmt::format("{}: takes at most {} values, given {}", m[1].str(),
                                     m[2].str(), m[3].str());
  if (std::regex_match(message, m, missing))
    return m[2] == "1"
               ? fmt::format("{}: needs a value ({})", m[1].str(), m[3].str())
               : fmt::format("{}: needs {} values ({})", m[1].str(), m[2].str(), m[3].str());
  return message;
}
}  // namespace

int report_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const CLI::ParseError& e) {
    return report("usage error", usage_words(e.what()), kExitUsage);
  } catch (const std::exception& e) {  // its kind: ffnlab/failure.hpp
    using K = Failure::Kind;
    const Failure f = Failure::of(e);
    switch (f.kind) {
      case K::usage:
        return report("usage error", f.message, kExitUsage);
      case K::interrupted:
        return report("interrupted", f.message, kExitInterrupted);
      case K::input:
        return report("error", f.message, kExitInput);
      case K::none:
      case K::system:
        break;
    }
    return report("error", f.message, kExitSystem);
  } catch (...) {
    return report("error", "unknown exception", kExitSystem);
  }
}

namespace {
void refuse_switch_values(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) o->disable_flag_override();
  for (CLI::App* sub : app.get_subcommands(std::function<bool(CLI::App*)>{}))
    refuse_switch_values(*sub);
}
}  // namespace

int run_program(const char* program, CLI::App& app, int argc, char** argv, bool switch_values) {
  g_program = program;
  // Past a file-size limit (ulimit -f) the write fails with EFBIG, reported as the system's
  // error with the file named (exit 3; the earlier file kept), instead of SIGXFSZ ending the
  // process mid-write without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  if (!switch_values) refuse_switch_values(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (...) {
    return report_error(std::current_exception());
  }
  // What a command printed must have reached stdout: a full disk or a closed pipe behind it is
  // a failure (exit 3), not a success with the output lost.
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    const int error = errno;  // 0: an earlier write failed, and its error number is gone
    return report_error(std::make_exception_ptr(ffnlab::SystemError(
        std::string("[io] cannot write to standard output") +
        (error ? std::string(": ") + std::strerror(error) : std::string(" (a write failed)")))));
  }
  return 0;
}

namespace {
// "010" or "-07": CLI11 reads these in octal (strtoll's base 0), so a decimal check must refuse
// them rather than pass a number other than the one it checked.
bool octal_looking(std::string_view text) {
  if (!text.empty() && text[0] == '-') text.remove_prefix(1);
  return text.size() > 1 && text[0] == '0';
}
}  // namespace

CLI::Validator int_in(std::int64_t lo, std::int64_t hi) {
  const std::string range =
      range_text(static_cast<double>(lo), static_cast<double>(hi), false, false, true);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        std::int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || ptr != end || v < lo || v > hi || octal_looking(text))
          return fmt::format("'{}' is not an integer in {}", text.substr(0, 40), range);
        return {};
      },
      range);
}

CLI::Validator real_in(double lo, double hi, bool hi_open, bool lo_open) {
  const std::string range = range_text(lo, hi, lo_open, hi_open, false);
  return CLI::Validator(
      [lo, hi, hi_open, lo_open, range](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        // An open bound holds in single precision too, where most settings live: 0.99999999
        // would become 1.0f, past "below 1".
        const double f = std::abs(v) <= std::numeric_limits<float>::max()
                             ? static_cast<double>(static_cast<float>(v))
                             : v;  // (beyond float's range every bound here is exceeded anyway)
        // Nor may a value other than 0 become 0 there (--clip 1e-50 would turn clipping off).
        const bool ok = !text.empty() && end == text.c_str() + text.size() && std::isfinite(v) &&
                        (v == 0 || f != 0) && (lo_open ? v > lo && f > lo : v >= lo) &&
                        (hi_open ? v < hi && f < hi : v <= hi);
        if (!ok) return fmt::format("'{}' is not a number in {}", text.substr(0, 40), range);
        return {};
      },
      range);
}

CLI::Validator any_count() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::uint64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || ptr != end || octal_looking(text))
          return fmt::format("'{}' is not a non-negative decimal integer", text.substr(0, 40));
        return {};
      },
      "");
}

CLI::Validator named_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? "an empty path names no file" : std::string();
      },
      "");
}

void add_threads_option(CLI::App& cmd, int& threads) {
  cmd.add_option("--threads", threads,
                 "OpenMP threads, at most the processors; 0 (the default): OMP_NUM_THREADS if set, "
                 "else all processors")
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
      if (const auto known = variant_names();
          std::find(known.begin(), known.end(), item) == known.end())
        throw UsageError(fmt::format("--variants: unknown variant '{}' (known: all, {})", item,
                                     fmt::join(known, ", ")));
      if (std::find(out.begin(), out.end(), item) != out.end())
        throw UsageError(fmt::format("--variants: '{}' is listed twice", item));
      out.push_back(item);
    }
  if (out.empty())
    throw UsageError(fmt::format("--variants: '{}' names no variant (known: all, {})", spec,
                                 fmt::join(variant_names(), ", ")));
  return out;
}

}  // namespace ffnlab::cli
