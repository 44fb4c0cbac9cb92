// Checked size arithmetic: the out-of-line error paths.
#include "ffnlab/limits.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <string>

#include "check.hpp"

namespace ffnlab {

namespace {
// 1099511627776 -> "2^40"; other values as they are.
std::string bound(std::int64_t v) {
  const auto u = static_cast<std::uint64_t>(v);
  if (v >= (1 << 20) && std::has_single_bit(u)) return fmt::format("2^{}", std::countr_zero(u));
  return std::to_string(v);
}
}  // namespace

std::string range_text(double lo, double hi, bool lo_open, bool hi_open, bool integer) {
  if (integer)
    return fmt::format("[{}, {}]", bound(static_cast<std::int64_t>(lo)),
                       bound(static_cast<std::int64_t>(hi)));
  return fmt::format("{}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
}

namespace {
std::atomic<int> sharers{1};  // processes sharing the machine's memory (share_memory_among)
}  // namespace

void share_memory_among(int processes) {
  check(processes >= 1, "[limits] {} processes cannot share the memory", processes);
  sharers = processes;
}

double available_memory_bytes() {
  double bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                 static_cast<double>(sysconf(_SC_PAGESIZE)) / sharers.load();
  struct rlimit limit {};
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    bytes = std::min(bytes, static_cast<double>(limit.rlim_cur));
  return bytes;
}

void check_memory(double bytes, std::string_view scope, std::string_view what) {
  const double have = available_memory_bytes();
  const int n = sharers.load();
  check(bytes <= have, "[{}] {} needs {:.1f} GiB, more than the {:.1f} GiB available{}", scope,
        what, bytes / (1 << 30), have / (1 << 30),
        n > 1 ? fmt::format(" to each of the {} processes on this machine", n) : std::string());
}

void throw_overflow(std::string_view what, std::int64_t a, std::int64_t b, char op) {
  if (a < 0 || b < 0) fail("{}: negative size {} {} {}", what, a, op == '*' ? "×" : "+", b);
  fail("{} = {} {} {} does not fit in 64 bits", what, a, op == '*' ? "×" : "+", b);
}

void check_range(std::int64_t value, std::int64_t lo, std::int64_t hi, std::string_view scope,
                 std::string_view name) {
  check(lo <= value && value <= hi, "[{}] {} = {} must be in {}", scope, name, value,
        range_text(static_cast<double>(lo), static_cast<double>(hi), false, false, true));
}

}  // namespace ffnlab
