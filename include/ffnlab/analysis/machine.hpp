// The machine a measurement ran on, as a report names it: the CPU's model and the vector
// instructions that decide its speed and its numerics (AVX2 or AVX-512, native bf16 or not).
// Every speed ffnlab reports is only true of such a machine.
#pragma once

#include <string>

namespace ffnlab {

struct Machine {
  std::string cpu;     // /proc/cpuinfo's "model name" ("unknown" where there is none)
  std::string isa;     // "AVX-512", "AVX2", or "other"
  bool bf16 = false;   // native bf16 dot products (avx512_bf16 or AMX)
  bool amx = false;    // AMX bf16 tiles (products no vector loop bounds)
  int processors = 0;  // online processors
  // "AMD EPYC (AVX-512 with bf16, 2 processors)"
  std::string describe() const;
};

// Read once per process (Linux: /proc/cpuinfo; elsewhere what the compiler's CPU checks tell).
const Machine& this_machine();

// The machine's peak arithmetic rate in FLOP/s with the current OpenMP threads: every thread runs
// a loop of independent multiply-adds on registers (no memory) in the widest vectors this CPU
// runs — f32 FMAs, or with `bf16` (on a CPU with native bf16) vdpbf16ps, 2 FLOPs per pair as
// products count them — timed together (median over about `budget` seconds). No product can run
// faster; `ffnlab bench` reports layers against it. bf16 without native bf16 returns the f32
// rate (such products are emulated in f32); bf16 on a CPU with AMX returns 0 (not measured:
// oneDNN's tile products outrun any vector loop, so it would bound nothing).
double measure_peak_flops(bool bf16, double budget);

}  // namespace ffnlab
