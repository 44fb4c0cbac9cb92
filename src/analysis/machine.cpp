// The machine's CPU and instruction sets, from /proc/cpuinfo (the model name and the flags of the
// first processor) and the compiler's run-time CPU checks.
#include "ffnlab/analysis/machine.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ffnlab {

namespace {

Machine detect() {
  Machine m;
  m.cpu = "unknown";
  std::string flags;
  int siblings = 0, cores = 0;  // logical and physical processors of the first package
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && m.cpu == "unknown" && !value.empty()) m.cpu = value;
    if (key == "cpu family" && m.family == 0) m.family = std::atoi(value.c_str());
    if (key == "model" && m.model == 0) m.model = std::atoi(value.c_str());
    if (key == "flags" && flags.empty()) flags = " " + value + " ";
    if (key == "vendor_id" && value == "AuthenticAMD") m.amd = true;
    if (key == "cpu MHz" && m.mhz == 0) m.mhz = std::atof(value.c_str());
    if (key == "siblings" && siblings == 0) siblings = std::atoi(value.c_str());
    if (key == "cpu cores" && cores == 0) cores = std::atoi(value.c_str());
  }
  auto has = [&](const char* f) {
    return flags.find(std::string(" ") + f + " ") != std::string::npos;
  };
  if (!flags.empty()) {
    m.isa = has("avx512f") ? "AVX-512" : has("avx2") ? "AVX2" : "other";
    m.amx = has("amx_bf16");
    m.bf16 = has("avx512_bf16") || m.amx;
  } else {
    __builtin_cpu_init();
    m.isa = __builtin_cpu_supports("avx512f") ? "AVX-512"
            : __builtin_cpu_supports("avx2")  ? "AVX2"
                                              : "other";
  }
  m.processors = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  m.threads_per_core = cores > 0 && siblings >= cores ? siblings / cores : 1;
  return m;
}

}  // namespace

int Machine::f32_flops_per_cycle() const {
  if (isa == "AVX2") return 32;
  if (isa != "AVX-512") return 0;
  // Family 25 is Zen 3 and Zen 4; in family 26 (Zen 5) the mobile Strix Point (0x20-0x2f) and
  // Krackan Point (0x60-0x6f) keep 256-bit datapaths, the others are full width.
  const bool mobile = (model >= 0x20 && model <= 0x2f) || (model >= 0x60 && model <= 0x6f);
  const bool split = amd && (family < 26 || (family == 26 && mobile));
  return split ? 32 : 64;
}

double nominal_peak_flops(int threads) {
  const Machine& m = this_machine();
  if (m.mhz <= 0 || threads <= 0) return 0;
  const double per_cycle = m.f32_flops_per_cycle();
  // Threads on SMT siblings share a core's FMA pipes: count the cores they can occupy.
  const int cores = std::max(1, m.processors / std::max(1, m.threads_per_core));
  return per_cycle * m.mhz * 1e6 * std::min(threads, cores);
}

bool nominal_peak_holds(double measured, int threads) {
  const double nominal = nominal_peak_flops(threads);
  return nominal <= 0 || measured >= 0.6 * nominal;
}

std::string Machine::describe() const {
  const std::string which =
      family > 0 ? fmt::format(", family {} model {}", family, model) : std::string();
  return fmt::format("{}{} ({}{}, {} processor{})", cpu, which, isa, bf16 ? " with bf16" : "",
                     processors, processors == 1 ? "" : "s");
}

const Machine& this_machine() {
  static const Machine m = detect();
  return m;
}

}  // namespace ffnlab
