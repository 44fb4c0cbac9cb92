// Kernel benchmarks (Google Benchmark): activation and gated-product passes, over memory
// (6400 x 2048: the tensors exceed the caches) and in cache (2048 x 344: the SwiGLU layer of the
// language model that `ffnlab train` trains by default, where arithmetic decides the speed).
//
// Its flags are Google Benchmark's (1.7: --benchmark_filter=..., --benchmark_min_time=0.3, ...),
// checked here first as the other benchmark programs check theirs (bench_cli.hpp): a bad value
// is one line "bench_kernels: usage error: --flag: ..." and exit 2, where Google Benchmark would
// print two lines and exit 1, or print its usage and exit 0 (--benchmark_format=xml), or ignore
// it (a regular expression that does not compile). The checked values are handed on to Google
// Benchmark as --flag=value.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>
#include <string>
#include <system_error>
#include <vector>

#include "bench_cli.hpp"
#include "bench_util.hpp"
#include "ffnlab/io/safetensors.hpp"
#include "ffnlab/ops/activation.hpp"
#include "ffnlab/ops/glu.hpp"

using namespace ffnlab;

// A checkpoint of a layer at the documented expert limit (2^16 experts): its weights and Adam's
// two moments, four tensors an expert each, are 3 x 4 x 2^16 tensors. Writing its header was
// quadratic in the tensors (a JSON object that looked each name up); docs/hardening.md states
// the time measured here: the header and the file in memory (serialize), without the disk.
static void BM_CheckpointOfTheExpertLimit(benchmark::State& state) {
  const int tensors = static_cast<int>(state.range(0));
  const Tensor t({2, 2});
  SafeTensorsWriter w;
  for (int i = 0; i < tensors; ++i) w.add_view(fmt::format("layers.0.ffn.experts.{}.w", i), t);
  for (auto _ : state) benchmark::DoNotOptimize(w.serialize());
  state.counters["tensors"] = tensors;
}
BENCHMARK(BM_CheckpointOfTheExpertLimit)
    ->Arg(3 * 4 * 65536)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

static void BM_ActivationForward(benchmark::State& state) {
  const auto act = static_cast<Activation>(state.range(0));
  const std::int64_t n = state.range(1) * state.range(2);
  Tensor x = bench::random({n}, 1), y({n});
  for (auto _ : state) activation_forward(y, x, Act{act});
  state.SetBytesProcessed(state.iterations() * n * 8);
  state.SetLabel(enum_name(act));
}
static void BM_ActivationBackward(benchmark::State& state) {
  const auto act = static_cast<Activation>(state.range(0));
  const std::int64_t n = state.range(1) * state.range(2);
  Tensor x = bench::random({n}, 1), dy = bench::random({n}, 2), dx({n});
  for (auto _ : state) activation_backward(dx, dy, x, Act{act});
  state.SetBytesProcessed(state.iterations() * n * 12);
  state.SetLabel(enum_name(act));
}

static void every_activation(benchmark::internal::Benchmark* b) {
  for (const auto& [T, F] : {std::pair{6400, 2048}, std::pair{2048, 344}})
    for (int a = 0; a < static_cast<int>(Activation::count); ++a) b->Args({a, T, F});
}
BENCHMARK(BM_ActivationForward)->Apply(every_activation);
BENCHMARK(BM_ActivationBackward)->Apply(every_activation);

// The gated product act(g) ⊙ u of a GLU layer (one branch), forward and backward apart: the
// activations whose derivative the backward computes with the value (GELU shares one erf and one
// exponential between them).
static void BM_GluForward(benchmark::State& state) {
  const auto act = static_cast<Activation>(state.range(0));
  const std::int64_t T = state.range(1), F = state.range(2);
  Tensor a = bench::random({T, 2 * F}, 1), h({T, F});
  for (auto _ : state) glu_forward(h, a, Act{act});
  // reads a, writes h
  state.SetBytesProcessed(state.iterations() * T * F * 4 * 3);
  state.SetLabel(enum_name(act));
}
static void BM_GluBackward(benchmark::State& state) {
  const auto act = static_cast<Activation>(state.range(0));
  const std::int64_t T = state.range(1), F = state.range(2);
  Tensor a = bench::random({T, 2 * F}, 1), dh = bench::random({T, F}, 2), da({T, 2 * F});
  for (auto _ : state) glu_backward(da, dh, a, Act{act});
  // reads dh and a, writes da
  state.SetBytesProcessed(state.iterations() * T * F * 4 * 5);
  state.SetLabel(enum_name(act));
}

static void glu_activations(benchmark::internal::Benchmark* b) {
  for (const auto& [T, F] : {std::pair{6400, 2048}, std::pair{2048, 344}})
    for (const Activation a : {Activation::relu, Activation::gelu, Activation::silu})
      b->Args({static_cast<int>(a), T, F});
}
BENCHMARK(BM_GluForward)->Apply(glu_activations)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GluBackward)->Apply(glu_activations)->Unit(benchmark::kMicrosecond);

namespace {

// --benchmark_filter: a regular expression as Google Benchmark compiles it (std::regex,
// extended), after an optional '-' (run the benchmarks that do not match); at most 1000
// characters (std::regex compiles nested groups recursively: a deep enough nest ends the
// process on its stack).
CLI::Validator filter_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.size() > 1000) return "longer than 1000 characters";
        try {
          std::regex(text.substr(!text.empty() && text[0] == '-' ? 1 : 0), std::regex::extended);
        } catch (const std::regex_error& e) {
          return "'" + text.substr(0, 40) + "' is not a regular expression (" + e.what() + ")";
        }
        return {};
      },
      "");
}

// --benchmark_context: key=value pairs, comma-separated.
CLI::Validator context_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::size_t from = 0;
        while (from <= text.size()) {
          const std::size_t to = std::min(text.find(',', from), text.size());
          const std::string pair = text.substr(from, to - from);
          const std::size_t eq = pair.find('=');
          if (eq == 0 || eq == std::string::npos)
            return "'" + pair.substr(0, 40) + "' is not key=value";
          from = to + 1;
        }
        return {};
      },
      "KEY=VALUE,...");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Kernel benchmarks (Google Benchmark): the activation and gated-product passes, over "
      "memory (6400 x 2048) and in cache (2048 x 344). The flags are Google Benchmark's, "
      "written --flag=value.\n"
      "Exit status: 0 done, 1 refused (an output file that cannot be written), 2 a bad flag, 3 "
      "out of memory or a failed write."};
  // Value flags: their text, checked, handed on as --name=text.
  struct Value {
    const char* name;
    const char* type;
    std::string text;
    CLI::Validator check;
    const char* help;
  };
  const std::vector<std::string> formats{"console", "json", "csv"};
  std::vector<Value> values{
      {"--benchmark_filter", "REGEX", "", filter_validator(),
       "the benchmarks to run: a regular expression of their names ('-' first: those not "
       "matching; 'all': every one)"},
      {"--benchmark_min_time", "FLOAT", "", cli::real_in(0.001, 3600),
       "seconds per benchmark, at least"},
      {"--benchmark_min_warmup_time", "FLOAT", "", cli::real_in(0, 3600),
       "seconds of warm-up per benchmark"},
      {"--benchmark_repetitions", "INT", "", cli::int_in(1, 1000),
       "runs of each benchmark (above 1: mean, median and deviation)"},
      {"--benchmark_format", "TEXT", "", bench::one_of(formats), "the format of standard output"},
      {"--benchmark_out", "FILE", "",
       CLI::Validator([](std::string&) { return std::string(); }, ""),
       "a file to write the results to as well"},
      {"--benchmark_out_format", "TEXT", "", bench::one_of(formats),
       "the format of --benchmark_out"},
      {"--benchmark_color", "TEXT", "", bench::one_of({"auto", "true", "false"}),
       "colours on the console"},
      {"--benchmark_context", "TEXT", "", context_validator(),
       "key=value pairs added to the output"},
      {"--benchmark_time_unit", "TEXT", "", bench::one_of({"ns", "us", "ms", "s"}),
       "the unit of times"},
      {"--v", "INT", "", cli::int_in(0, 10), "Google Benchmark's verbosity"}};
  for (auto& v : values) app.add_option(v.name, v.text, v.help)->type_name(v.type)->check(v.check);
  // Switches: handed on as --name=true or --name=false.
  struct Switch {
    const char* name;
    bool on = false;
    const char* help;
  };
  std::vector<Switch> switches{
      {"--benchmark_list_tests", false, "list the benchmarks, run none"},
      {"--benchmark_enable_random_interleaving", false, "run the repetitions interleaved"},
      {"--benchmark_report_aggregates_only", false, "report only the aggregates"},
      {"--benchmark_display_aggregates_only", false, "print only the aggregates"},
      {"--benchmark_counters_tabular", false, "counters as columns"}};
  for (auto& s : switches) app.add_flag(s.name, s.on, s.help);

  app.callback([&] {
    std::vector<std::string> args{argv[0]};
    for (const auto& v : values) {
      if (app.count(v.name) == 0) continue;
      args.push_back(std::string(v.name) + "=" + v.text);
      // Google Benchmark ends the process on a file it cannot open (exit 1, its own words):
      // opened here first, it is "[io] 'FILE': reason" (exit 1 for a path that leads nowhere, 3
      // otherwise), as the ffnlab program reports files.
      if (std::strcmp(v.name, "--benchmark_out") == 0) {
        std::FILE* f = std::fopen(v.text.c_str(), "a");
        if (!f)
          throw std::filesystem::filesystem_error("open", v.text,
                                                  std::error_code(errno, std::generic_category()));
        std::fclose(f);
      }
    }
    for (const auto& s : switches)
      if (app.count(s.name) > 0) args.push_back(std::string(s.name) + (s.on ? "=true" : "=false"));
    std::vector<char*> ptrs;
    for (auto& a : args) ptrs.push_back(a.data());
    ptrs.push_back(nullptr);
    int n = static_cast<int>(args.size());
    benchmark::Initialize(&n, ptrs.data());
    if (n > 1) throw cli::UsageError(fmt::format("{}: not taken by Google Benchmark", ptrs[1]));
    // Google Benchmark does not check its writes to --benchmark_out: past a file-size limit the
    // signal ends the process (run_program ignores it) rather than leave a cut-off file.
    std::signal(SIGXFSZ, SIG_DFL);
    // Google Benchmark's context names the clock and caches, not the CPU: ffnlab's description
    // (model, family, AVX2 or AVX-512, bf16) goes with every report, console and JSON alike.
    benchmark::AddCustomContext("ffnlab_machine", this_machine().describe());
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  });
  return cli::run_program("bench_kernels", app, argc, argv, /*switch_values=*/true);
}
