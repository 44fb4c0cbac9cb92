// Helpers every subcommand may use: errors and exit statuses, flag checks, threads, variant
// lists. A static library of their own (ffnlab_cli_common), which the benchmark programs in
// bench/ link too: they print and exit as ffnlab does, under their own name.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "ffnlab/error.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/report/markdown.hpp"

namespace ffnlab::cli {

// A flag's value was refused after parsing (two flags that conflict, a value out of range that
// only the command can judge): exit status 2, like CLI11's own parse errors (main.cpp). The
// library's own (ffnlab/error.hpp), which the run driver throws for settings that conflict.
using UsageError = ffnlab::UsageError;

// Exit statuses (docs/hardening.md, "Exit status").
inline constexpr int kExitInput = 1;          // a file, config or value was refused
inline constexpr int kExitUsage = 2;          // a flag or argument is wrong
inline constexpr int kExitSystem = 3;         // a read or write failed, out of memory
inline constexpr int kExitInterrupted = 130;  // SIGINT or SIGTERM (train: after a checkpoint)

// Prints an exception as the one line "ffnlab: error: ..." (a message with a newline is cut
// there; "ffnlab" is the program's name, run_program's `program`) and returns its exit status:
// usage 2 ("ffnlab: usage error: ..."), interrupted 130, system 3, other errors 1.
int report_error(const std::exception_ptr& error);

// A program's main: parses argv, and with it runs the work (the callbacks of the app and of its
// subcommands, CLI::App::callback), prints --help, turns every exception into report_error's one
// line and exit status, and checks that what went to standard output was written (a full disk
// or a closed pipe is exit 3). `program` starts every error line.
// Every switch of app and of its subcommands refuses a value ("--json=false" or
// "--untied=false" would count as given, the opposite of its word) unless `switch_values`
// (bench_kernels, whose Google Benchmark switches take one: --benchmark_list_tests=true).
int run_program(const char* program, CLI::App& app, int argc, char** argv,
                bool switch_values = false);

// Flag checks with short messages ("must be an integer in [1, 65536]"); reals must be finite.
CLI::Validator int_in(std::int64_t lo, std::int64_t hi);
CLI::Validator real_in(double lo, double hi, bool hi_open = false, bool lo_open = false);
// A non-negative integer of any size, in decimal (a seed): no sign, no octal or hex prefix.
CLI::Validator any_count();
// A path that names something: an empty one is refused, not read as the flag left out.
CLI::Validator named_path();

// --threads N: sets OpenMP's thread count (0 keeps OMP_NUM_THREADS or the default). At most
// the number of processors: more only adds waiting (1000 threads took 22 s for a 0.03 s job).
void add_threads_option(CLI::App& cmd, int& threads);
void apply_threads(int threads);

// available_memory_bytes() and check_memory() are the library's (ffnlab/limits.hpp).

// "relu,swiglu" -> {"relu", "swiglu"}; "all" -> every named variant (ffnlab::variant_names()).
// Unknown names are a usage error that lists the known ones.
std::vector<std::string> variant_list(const std::string& spec);

// Number formatting (thousands, duration, fixed, percent) is the report layer's
// (ffnlab/report/markdown.hpp).

}  // namespace ffnlab::cli
