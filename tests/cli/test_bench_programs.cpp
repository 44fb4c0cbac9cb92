// The benchmark programs (bench/) check their flags as the ffnlab program does
// (bench/bench_cli.hpp, tools/ffnlab/common.hpp): every bad value is one line "bench_x: usage
// error: --flag: ..." and exit 2, work larger than the memory "bench_x: error: [bench_x] ..." and
// exit 1, a failed write exit 3; never an abort, CLI11's exit 105, or a message that is only a
// number. Built only with the benchmarks (FFNLAB_BUILD_BENCH; the asan preset has none).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Program {
  const char* name;
  const char* path;
};
const Program kMoe{"bench_moe", FFNLAB_BENCH_MOE};
const Program kFfn{"bench_ffn", FFNLAB_BENCH_FFN};
const Program kMatmul{"bench_matmul", FFNLAB_BENCH_MATMUL};
const Program kPacked{"bench_packed", FFNLAB_BENCH_PACKED};
const Program kFewRows{"bench_few_rows", FFNLAB_BENCH_FEW_ROWS};
const Program kKernels{"bench_kernels", FFNLAB_BENCH_KERNELS};
const Program kLibraries{"bench_libraries", FFNLAB_BENCH_LIBRARIES};

// Debian's OpenMP build of OpenBLAS (the test set of scripts/install-deps.sh installs it).
const char* kOpenBlas = "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0";

// A number of 170 digits: CLI11's own range checks printed it as the whole message (exit 105).
const std::string kHuge(170, '9');

struct Outcome {
  int status;
  std::string out, err;
  double seconds;
};

class BenchPrograms : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ffnlab_bench_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `program args` under 1 GiB of address space (a size check that failed would allocate)
  // and a deadline; stdout goes to `out` unless it names another place.
  Outcome run(const Program& p, const std::string& args, const std::string& out = "") {
    const std::string o = out.empty() ? (dir_ / "stdout").string() : out;
    const std::string e = (dir_ / "stderr").string();
    const std::string cmd = "ulimit -v 1048576; OMP_NUM_THREADS=1 timeout 20 " +
                            std::string(p.path) + " " + args + " > " + o + " 2> " + e;
    const auto t0 = std::chrono::steady_clock::now();
    const int raw = std::system(cmd.c_str());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, out.empty() ? read(o) : "", read(e), s};
  }
  static std::string read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  fs::path dir_;
};

// One bad invocation: the program, its arguments, the exit status, and words the one line must
// hold (the flag's name, or the scope).
struct Case {
  Program program;
  std::string args;
  int status;
  std::string what;
};

std::vector<Case> cases() {
  const std::string w = "16777217";    // 2^24 + 1: one past the widths' limit
  const std::string t = "4294967297";  // 2^32 + 1: one past the tokens' limit
  return {
      // bench_moe
      {kMoe, "--top-k 9", 2, "--top-k: 9 is more than --experts (8)"},
      {kMoe, "--experts 4 --top-k 5", 2, "--top-k"},
      {kMoe, "--expert bogus", 2, "--expert: 'bogus' is not one of relu"},
      {kMoe, "--expert moe", 2, "--expert"},
      {kMoe, "--expert gated", 2, "--expert"},
      {kMoe, "--d-model " + w, 2, "--d-model: '16777217' is not an integer in [1, 2^24]"},
      {kMoe, "--d-ff " + kHuge, 2, "--d-ff"},
      {kMoe, "--d-ff 0", 2, "--d-ff"},
      {kMoe, "--tokens " + t, 2, "--tokens: '4294967297' is not an integer in [1, 2^32]"},
      {kMoe, "--tokens -5", 2, "--tokens"},
      {kMoe, "--tokens 1e3", 2, "--tokens"},
      {kMoe, "--experts 65537", 2, "--experts"},
      {kMoe, "--experts 0", 2, "--experts"},
      {kMoe, "--top-k 0", 2, "--top-k"},
      {kMoe, "--seconds nan", 2, "--seconds"},
      {kMoe, "--seconds 1e400", 2, "--seconds"},
      {kMoe, "--seconds -1", 2, "--seconds"},
      {kMoe, "--json=maybe", 2, "--json"},
      {kMoe, "--bogus", 2, "--bogus"},
      {kMoe, "--tokens 2147483648", 1, "[bench_moe] this run needs"},
      {kMoe, "--d-model 16777216 --d-ff 16777216", 1, "[bench_moe]"},
      {kMoe, "--experts 65536 --d-ff 16777216", 1, "[bench_moe]"},
      // bench_ffn
      {kFfn, "--variants bogus", 2, "--variants: 'bogus' is not one of relu"},
      {kFfn, "--variants relu,moe", 2, "--variants: 'moe'"},
      {kFfn, "--dtype f16", 2, "--dtype: 'f16' is not one of f32, bf16"},
      {kFfn, "--d-model " + w, 2, "--d-model"},
      {kFfn, "--d-ff " + kHuge, 2, "--d-ff"},
      {kFfn, "--tokens 8," + t, 2, "--tokens"},
      {kFfn, "--tokens 8,0", 2, "--tokens"},
      {kFfn, "--pack-rows -1", 2, "--pack-rows"},
      {kFfn, "--rounds 0", 2, "--rounds"},
      {kFfn, "--seconds inf", 2, "--seconds"},
      {kFfn, "--json --pack-rows 0", 2, "--json: not supported with --pack-rows"},
      {kFfn, "--conv-rows -1", 2, "--conv-rows"},
      {kFfn, "--json --conv-rows 0", 2, "--json: not supported with --pack-rows, --conv-rows"},
      {kFfn, "--pack-rows 0 --conv-rows 0", 2, "excludes"},
      {kFfn, "--huge-pages-mib -1", 2, "--huge-pages-mib"},
      {kFfn, "--json --huge-pages-mib 0", 2, "--json: not supported with"},
      {kFfn, "--huge-pages-mib 0 --pack-rows 0", 2, "excludes"},
      {kFfn, "--tokens 4294967296", 1, "[bench_ffn] the largest layer"},
      {kFfn, "--variants gated --d-model 16777216 --d-ff 16777216", 1, "[bench_ffn]"},
      // bench_matmul
      {kMatmul, "--k 0", 2, "--k"},
      {kMatmul, "--n " + w, 2, "--n"},
      {kMatmul, "--m 1,0", 2, "--m"},
      {kMatmul, "--m " + kHuge, 2, "--m"},
      {kMatmul, "--seconds 0", 2, "--seconds"},
      {kMatmul, "--m 4294967296 --k 16777216", 1, "[bench_matmul] the largest product"},
      // bench_packed
      {kPacked, "--dtype int8", 2, "--dtype"},
      {kPacked, "--tokens 0", 2, "--tokens"},
      {kPacked, "--d-ff " + w, 2, "--d-ff"},
      {kPacked, "--d-model 16777216 --d-ff 16777216", 1, "[bench_packed]"},
      // bench_few_rows
      {kFewRows, "--shapes 512", 2, "--shapes: '512' is not IN x OUT"},
      {kFewRows, "--shapes 512x0", 2, "--shapes"},
      {kFewRows, "--shapes 16777217x8", 2, "--shapes"},
      {kFewRows, "--shapes 512x2048x3", 2, "--shapes"},
      {kFewRows, "--shapes " + kHuge + "x5", 2, "--shapes"},
      {kFewRows, "--tokens 9", 2, "--tokens: '9' is not an integer in [1, 8]"},
      {kFfn, "--json=false", 2, "--json: a switch takes no value"},
      {kFewRows, "--rounds 0", 2, "--rounds"},
      {kFewRows, "--weights f16", 2, "--weights: 'f16' is not one of f32, bf16"},
      {kFewRows, "--shapes 16777216x16777216", 1, "[bench_few_rows]"},
      // bench_kernels: Google Benchmark's flags, checked first
      {kKernels, "--bogus", 2, "--bogus"},
      {kKernels, "--benchmark_min_time=abc", 2, "--benchmark_min_time"},
      {kKernels, "--benchmark_repetitions=0", 2, "--benchmark_repetitions"},
      {kKernels, "--benchmark_repetitions=" + kHuge, 2, "--benchmark_repetitions"},
      {kKernels, "--benchmark_format=xml", 2, "--benchmark_format"},
      {kKernels, "--benchmark_time_unit=yy", 2, "--benchmark_time_unit"},
      {kKernels, "'--benchmark_filter=('", 2, "--benchmark_filter"},
      {kKernels, "'--benchmark_filter=" + std::string(100000, '(') + "'", 2,
       "--benchmark_filter: longer than 1000 characters"},
      {kKernels, "--benchmark_color=maybe", 2, "--benchmark_color"},
      {kKernels, "--benchmark_context=abc", 2, "--benchmark_context"},
      {kKernels, "--benchmark_list_tests=maybe", 2, "--benchmark_list_tests"},
      {kKernels, "--v=abc", 2, "--v"},
      {kKernels, "--benchmark_out=/nonexistent/x", 1, "[io] '/nonexistent/x'"},
      // bench_libraries
      {kLibraries, "--tokens 0", 2, "--tokens"},
      {kLibraries, "--d-ff " + w, 2, "--d-ff"},
      {kLibraries, "--rounds 0", 2, "--rounds"},
      {kLibraries, "--library /nonexistent/libblas.so", 1,
       "[bench_libraries] cannot open /nonexistent/libblas.so"},
      {kLibraries, "--library ''", 1, "[bench_libraries] --library: an empty path"},
      {kLibraries, "--library libc.so.6 --tokens 4 --d-model 8 --d-ff 8", 1,
       "[bench_libraries] libc.so.6 has no cblas_sgemm"},
      {kLibraries, "--tokens 4294967296", 1, "[bench_libraries] the largest product"},
  };
}

// Every case: its exit status, one line on stderr in the CLI's form with the expected words,
// not a number alone, nothing on stdout, within a second or so (20 s allows a loaded machine).
TEST_F(BenchPrograms, BadValuesAreOneLineWithTheCliExitStatus) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(std::string(c.program.name) + " " + c.args.substr(0, 80));
    const Outcome r = run(c.program, c.args);
    EXPECT_EQ(r.status, c.status) << r.err;
    const std::string prefix =
        std::string(c.program.name) + (c.status == 2 ? ": usage error: " : ": error: ");
    EXPECT_EQ(r.err.rfind(prefix, 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(c.what), std::string::npos) << r.err;
    const std::string message = r.err.substr(std::min(prefix.size(), r.err.size()));
    EXPECT_NE(message.find_first_not_of("0123456789\n"), std::string::npos) << r.err;
    EXPECT_LE(r.err.size(), 400u) << r.err;  // the 170 digits are cut to 40
    EXPECT_EQ(r.out, "");
    EXPECT_LT(r.seconds, 20.0);
  }
}

// --help works, exits 0, and shows every flag's range.
TEST_F(BenchPrograms, HelpShowsTheRanges) {
  const std::vector<std::pair<Program, std::vector<std::string>>> expected{
      {kMoe,
       {"--d-model INT:[1, 2^24]", "--tokens INT:[1, 2^32]", "--experts INT:[1, 65536]",
        "--top-k INT:[1, 65536]", "--expert TEXT:relu|", "--seconds FLOAT:[0.001, 3600]"}},
      {kFfn,
       {"--d-ff INT:[1, 2^24]", "--tokens INT:[1, 2^32]", "--variants TEXT:relu|",
        "--dtype TEXT:f32|bf16", "--pack-rows INT:[0, 2^32]", "--conv-rows INT:[0, 2^32]",
        "--rounds INT:[1, 1000]"}},
      {kMatmul, {"--k INT:[1, 2^24]", "--n INT:[1, 2^24]", "--m INT:[1, 2^32]"}},
      {kPacked, {"--d-model INT:[1, 2^24]", "--tokens INT:[1, 2^32]", "--dtype TEXT:f32|bf16"}},
      {kFewRows, {"--shapes TEXT:INxOUT, each in [1, 2^24]", "--tokens INT:[1, 8]"}},
      {kKernels,
       {"--benchmark_min_time FLOAT:[0.001, 3600]", "--benchmark_repetitions INT:[1, 1000]",
        "--benchmark_format TEXT:console|json|csv"}},
      {kLibraries, {"--library TEXT", "--tokens INT:[1, 2^32]", "--rounds INT:[1, 1000]"}},
  };
  for (const auto& [program, words] : expected) {
    SCOPED_TRACE(program.name);
    const Outcome r = run(program, "--help");
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_NE(r.out.find("Exit status:"), std::string::npos) << r.out;
    for (const auto& w : words) EXPECT_NE(r.out.find(w), std::string::npos) << w << "\n" << r.out;
  }
}

// A tiny valid run still works (exit 0, a table), and its output into a full disk is exit 3.
TEST_F(BenchPrograms, TinyRunsWorkAndAFullDiskIsExit3) {
  const std::vector<std::pair<Program, std::string>> tiny{
      {kMoe, "--d-model 8 --d-ff 8 --tokens 16 --experts 2 --top-k 1 --seconds 0.001"},
      {kFfn, "--d-model 8 --d-ff 8 --tokens 4 --variants relu,swiglu --seconds 0.001"},
      {kMatmul, "--k 8 --n 8 --m 4 --seconds 0.001"},
      {kPacked, "--d-model 8 --d-ff 8 --tokens 8 --seconds 0.001"},
      {kFewRows, "--shapes 8x8 --tokens 1,2 --rounds 1 --seconds 0.001"},
      {kKernels, "--benchmark_list_tests"},
      {kLibraries, (fs::exists(kOpenBlas) ? std::string("--library ") + kOpenBlas : std::string()) +
                       " --d-model 8 --d-ff 8 --tokens 4 --rounds 1 --seconds 0.001"},
  };
  // Every table opens with the machine it measured on (Google Benchmark's context carries it in
  // bench_kernels, whose listing of tests is no table).
  const std::regex machine(
      R"(^bench_\w+ on .+ \((AVX-512|AVX2|other)( with bf16)?, \d+ processors?\), 1 thread\.\n)");
  for (const auto& [program, args] : tiny) {
    SCOPED_TRACE(program.name);
    const Outcome ok = run(program, args);
    EXPECT_EQ(ok.status, 0) << ok.err;
    EXPECT_FALSE(ok.out.empty());
    if (std::string(program.name) != kKernels.name) {
      EXPECT_EQ(ok.out.rfind(std::string(program.name) + " on ", 0), 0u) << ok.out;
      EXPECT_TRUE(std::regex_search(ok.out, machine, std::regex_constants::match_continuous))
          << ok.out;
    }
    EXPECT_LT(ok.seconds, 20.0);
    const Outcome full = run(program, args, "/dev/full");
    EXPECT_EQ(full.status, 3) << full.err;
    EXPECT_EQ(full.err.rfind(std::string(program.name) + ": error: [io] ", 0), 0u) << full.err;
    EXPECT_EQ(std::count(full.err.begin(), full.err.end(), '\n'), 1) << full.err;
  }
}

// The rows of a comparison in alternating rounds that match `row`, whose groups are the row's
// name, its speed-up (a ratio of medians) and its rounds' lowest and highest ratio: each checked
// to hold the speed-up between them (a ratio of medians lies between the rounds' ratios, since
// a_i > r·b_i for every round makes median(a) > r·median(b)). Only names in `names`, if given.
int ratio_rows(const std::string& out, const std::regex& row,
               const std::vector<std::string>& names = {}) {
  std::istringstream lines(out);
  int rows = 0;
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, row) ||
        (!names.empty() && std::find(names.begin(), names.end(), m[1].str()) == names.end()))
      continue;
    const double speed_up = std::stod(m[2]), low = std::stod(m[3]), high = std::stod(m[4]);
    EXPECT_LE(low, high) << line;
    // (printed to 3 and 2 decimals: each rounded by up to half its last digit)
    EXPECT_LE(low, speed_up + 0.006) << line;
    EXPECT_LE(speed_up, high + 0.006) << line;
    ++rows;
  }
  return rows;
}

// The rows of a bench_ffn comparison of two values for these variants.
int comparison_rows(const std::string& out, const std::vector<std::string>& variants) {
  return ratio_rows(
      out, std::regex(R"(^(\w+) +\d+ +[\d.]+ +[\d.]+ +([\d.]+)x +([\d.]+)-([\d.]+)$)"), variants);
}

// bench_packed times the plain and packed products in rounds: one row per product with a weight
// and token count, the speed-up (a ratio of medians) within its rounds' range, which catches a
// ratio taken the wrong way round or of the wrong rounds; the weight gradient (no weight to
// pack) its plain rate alone. (That the rounds alternate is the code's, not checked here.)
TEST_F(BenchPrograms, PackedPrintsEachSpeedUpWithinItsRounds) {
  const Outcome r = run(kPacked, "--d-model 16 --d-ff 32 --tokens 8,24 --rounds 3 --seconds 0.001");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("3 alternating rounds"), std::string::npos) << r.out;
  const std::regex row(
      R"(^(up|down|dx): .+ +\d+ +[\d.]+ +[\d.]+ +([\d.]+)x +([\d.]+)-([\d.]+) +[\d.]+% +-$)");
  EXPECT_EQ(ratio_rows(r.out, row), 6) << r.out;
  // The weight gradients: the plain rate, every other column '-'.
  const std::regex dw(R"(^dW: .+ +\d+ +[\d.]+( +-){5}$)");
  std::istringstream lines(r.out);
  int dw_rows = 0;
  for (std::string line; std::getline(lines, line);) dw_rows += std::regex_match(line, dw);
  EXPECT_EQ(dw_rows, 2) << r.out;
}

// bench_few_rows --weights bf16 times the kernels on a bf16 copy against oneDNN's bf16 products
// (where the CPU has them natively; elsewhere it refuses, exit 1): one row per shape and row
// count, its ratio within its rounds' range, and whether the layers stream those rows.
TEST_F(BenchPrograms, FewRowsComparesBf16KernelsWithOneDnn) {
  const Outcome r =
      run(kFewRows, "--weights bf16 --shapes 16x32 --tokens 1,2,8 --rounds 2 --seconds 0.001");
  if (r.status == 1) {
    EXPECT_NE(r.err.find("--weights bf16: this CPU has no native bf16 products"), std::string::npos)
        << r.err;
    GTEST_SKIP() << "no native bf16 products on this CPU";
  }
  ASSERT_EQ(r.status, 0) << r.err;
  const std::regex row(
      R"(^ +(16x32) +\d +\| +[\d.]+ +[\d.]+ +[\d.]+ +([\d.]+)x +[\d.]+x +([\d.]+)-([\d.]+) +\| +(kernel|oneDNN)$)");
  EXPECT_EQ(ratio_rows(r.out, row), 3) << r.out;
}

// bench_matmul times the fixed-shape and run-time-dimension products' steady rates in rounds:
// one row per product and row count, its ratio within its rounds' range.
TEST_F(BenchPrograms, MatmulPrintsEachRatioWithinItsRounds) {
  const Outcome r = run(kMatmul, "--k 16 --n 32 --m 8,24 --rounds 3 --seconds 0.001");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("median of 3 alternating rounds"), std::string::npos) << r.out;
  const std::regex row(
      R"(^(Y|dW)\S* .+ +\d+ +[\d.]+ms +\d+ +[\d.]+ms +\d+ +([\d.]+)x +([\d.]+)-([\d.]+)$)");
  EXPECT_EQ(ratio_rows(r.out, row), 4) << r.out;
}

// bench_ffn --conv-rows times whole layers with the products as a matmul and as a convolution, one
// row per variant and token count, with each setting's time, the speed-up and its rounds' range.
TEST_F(BenchPrograms, FfnComparesTheConvolutionWithTheMatmul) {
  const Outcome r = run(kFfn,
                        "--d-model 16 --d-ff 32 --tokens 8,40 --variants relu,swiglu "
                        "--conv-rows 0,16 --rounds 2 --seconds 0.001");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("products as a 1x1 convolution from each value"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("speed-up, 16"), std::string::npos) << r.out;
  EXPECT_EQ(comparison_rows(r.out, {"relu", "swiglu"}), 4) << r.out;
}

// bench_ffn --huge-pages-mib does the same for the size from which tensors take huge pages, each
// round's layer allocated under each value; it cannot be mixed with the other comparisons.
TEST_F(BenchPrograms, FfnComparesTensorsInHugePagesWithoutThem) {
  const Outcome r = run(kFfn,
                        "--d-model 256 --d-ff 2048 --tokens 8 --variants gelu "
                        "--huge-pages-mib 0,1 --rounds 3 --seconds 0.001");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("tensors in huge pages from (MiB) each value"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("speed-up, 1"), std::string::npos) << r.out;
  EXPECT_EQ(comparison_rows(r.out, {"gelu"}), 1) << r.out;
  const Outcome mixed = run(kFfn, "--huge-pages-mib 0,4 --conv-rows 0,512");
  EXPECT_EQ(mixed.status, 2) << mixed.err;
}

// bench_libraries against OpenBLAS: every product in the table with the matmul's, the
// convolution's and OpenBLAS's rates, and the summary's verdicts.
TEST_F(BenchPrograms, LibrariesComparesOneDnnWithOpenBlas) {
  if (!fs::exists(kOpenBlas)) GTEST_SKIP() << kOpenBlas << " is not installed";
  const Outcome r = run(kLibraries, std::string("--library ") + kOpenBlas +
                                        " --d-model 16 --d-ff 32 --tokens 8,24 --rounds 2 "
                                        "--seconds 0.001");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("oneDNN's matmul against its 1x1 convolution"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("and libopenblas.so.0, 2 alternating rounds"), std::string::npos) << r.out;
  // 2 token counts x 2 weights x 3 products, each a row with the matmul's, the convolution's
  // and OpenBLAS's rates. The convolution serves no weight gradient, and runs at all only where
  // oneDNN picks its AVX2 1x1 kernel, the only one ffnlab runs as a product (ops/matmul.cpp): on
  // a CPU with AVX2 and no AVX-512.
  __builtin_cpu_init();
  const bool avx2_only = __builtin_cpu_supports("avx2") && !__builtin_cpu_supports("avx512f");
  // ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) may cap oneDNN below the CPU's flags.
  const bool capped = std::getenv("ONEDNN_MAX_CPU_ISA") || std::getenv("DNNL_MAX_CPU_ISA");
  std::istringstream lines(r.out);
  int in_rows = 0, out_rows = 0, no_conv = 0, weight_grads = 0;
  for (std::string line; std::getline(lines, line);) {
    if (std::count(line.begin(), line.end(), '|') != 3) continue;
    in_rows += line.rfind("in ", 0) == 0;
    out_rows += line.rfind("out ", 0) == 0;
    const bool dash = line.find("|                -       |") != std::string::npos;
    const bool weight_grad = line.find("weight grad") != std::string::npos;
    no_conv += dash;
    weight_grads += weight_grad;
    if (weight_grad) {
      EXPECT_TRUE(dash) << line;
    }
  }
  EXPECT_EQ(in_rows, 6) << r.out;
  EXPECT_EQ(out_rows, 6) << r.out;
  EXPECT_EQ(weight_grads, 4) << r.out;
  const bool ran = r.out.find("1x1 conv             forward ") != std::string::npos;
  EXPECT_NE(ran, r.out.find("the convolution did not run") != std::string::npos) << r.out;
  EXPECT_EQ(no_conv, ran ? 4 : 12) << r.out;
  if (!capped) {
    EXPECT_EQ(ran, avx2_only) << r.out;
  }
  EXPECT_NE(r.out.find("libopenblas.so.0     forward "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("against oneDNN as ffnlab runs it: forward "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  -> "), std::string::npos) << r.out;
}

}  // namespace
