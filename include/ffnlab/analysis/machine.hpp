// The machine a measurement ran on, as a report names it: the CPU's model and the vector
// instructions that decide its speed and its numerics (AVX2 or AVX-512, native bf16 or not).
// Every speed ffnlab reports is only true of such a machine.
#pragma once

#include <string>

namespace ffnlab {

struct Machine {
  std::string cpu;     // /proc/cpuinfo's "model name" ("unknown" where there is none)
  int family = 0;      // its "cpu family" and "model" (0: unknown); a hypervisor may show a
  int model = 0;       // bare "AMD EPYC" as the name, and these still tell Zen 3 from Zen 4
  std::string isa;     // "AVX-512", "AVX2", or "other"
  bool bf16 = false;   // native bf16 dot products (avx512_bf16 or AMX)
  bool amx = false;    // AMX bf16 tiles (products no vector loop bounds)
  int processors = 0;  // online processors
  bool amd = false;    // AuthenticAMD (Zen 4 runs a 512-bit FMA as two 256-bit halves)
  double mhz = 0;      // /proc/cpuinfo's "cpu MHz" (the base clock under a hypervisor; 0: unknown)
  int threads_per_core = 1;  // SMT: "siblings" over "cpu cores"
  // "AMD EPYC, family 25 model 17 (AVX-512 with bf16, 2 processors)"
  std::string describe() const;
  // f32 FLOPs a core's FMA pipes retire per cycle at its widest vectors: two FMAs of 8 lanes
  // (AVX2), of 16 lanes on Intel's AVX-512 and AMD's full-width family 26, of 8 on Zen 4 and
  // the family-26 mobile models Strix and Krackan Point (0x20-0x2f, 0x60-0x6f), which split a
  // 512-bit FMA in two 256-bit halves. 0: neither AVX2 nor AVX-512.
  int f32_flops_per_cycle() const;
};

// Read once per process (Linux: /proc/cpuinfo; elsewhere what the compiler's CPU checks tell).
const Machine& this_machine();

// The machine's peak arithmetic rate in FLOP/s with the current OpenMP threads: every thread runs
// a loop of independent multiply-adds on registers (no memory) in the widest vectors this CPU
// runs — f32 FMAs, or with `bf16` (on a CPU with native bf16) vdpbf16ps, 2 FLOPs per pair as
// products count them — timed together, the best of calls of a few milliseconds over about
// `budget` seconds (a peak is a maximum: a busy core or a late thread only lowers a call),
// measured again (up to three times) while it is below 75 % of the cores × one thread's rate.
// No product can run faster; `ffnlab bench` reports layers against it. bf16 without native bf16
// returns the f32 rate (such products are emulated in f32); bf16 on a CPU with AMX returns 0
// (not measured: oneDNN's tile products outrun any vector loop, so it would bound nothing).
struct PeakProbe {
  double flops = 0;       // the best rate of every thread together
  double one_thread = 0;  // the best rate of one thread alone (0 with one thread)
  int cores = 1;          // the cores the threads occupy (SMT siblings share one)
  // Whether every thread together reached 75 % of the cores × one thread's rate. A shared host
  // can give two vCPUs one core's pipes for a while (two threads then reach one thread's
  // rate): such a probe measured the host, not the machine's peak.
  bool held() const { return cores <= 1 || one_thread <= 0 || flops >= 0.75 * cores * one_thread; }
};
PeakProbe measure_peak_flops(bool bf16, double budget);

// The f32 rate `threads` threads reach at the clock /proc/cpuinfo names:
// Machine::f32_flops_per_cycle × clock on the cores they occupy (SMT siblings share one core's
// pipes). 0 where the clock or the instruction set is unknown. A boost clock above the named one
// makes the measured peak higher; a probe far below it (nominal_peak_holds) measured a busy
// machine, not the peak.
double nominal_peak_flops(int threads);
// Whether a measured f32 peak is at least 60 % of the nominal one (true when that is unknown).
bool nominal_peak_holds(double measured, int threads);

}  // namespace ffnlab
