// ffnlab bench: the tables and the JSON hold every case asked for, with the bytes a decode must
// read computed exactly, and bad flags are usage errors. Speed itself is never asserted here.
#include <nlohmann/json.hpp>
#include <set>

#include "cli_fixture.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/ops/few_rows.hpp"

using namespace ffnlab;
using namespace ffnlab::test;

namespace {
const char* kSmall =
    "bench --quick --variants relu,swiglu,moe --tokens 1,8 --shape 64,96 "
    "--budget 0.002 --no-torch --bandwidth-mib 32";
// Its decode table at a small shape (a decode flag beside --no-decode is refused).
const char* kDecode = " --decode-shape 64,128";
}  // namespace

TEST_F(Cli, BenchJsonHoldsEveryCaseAndTheBytesADecodeReads) {
  const auto r = run(std::string(kSmall) + kDecode + " --dtypes f32,bf16 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["machine"]["read_bandwidth_bytes_per_s"].get<double>(), 1e8);
  EXPECT_GE(j["machine"]["threads"].get<int>(), 1);
  const std::string bf16 = j["machine"]["bf16_products"];
  EXPECT_TRUE(bf16 == "native" || bf16 == "emulated") << bf16;
  const double peak_f32 = j["machine"]["peak_f32_flops_per_s"],
               peak_bf16 = j["machine"]["peak_bf16_flops_per_s"],
               probe = j["machine"]["peak_probe_f32_flops_per_s"],
               nominal = j["machine"]["nominal_f32_flops_per_s"];
  EXPECT_GT(probe, 1e8);
  EXPECT_GE(nominal, 0.0);
  // Held: every thread together reached 75 % of the cores at one thread's rate.
  const double one = j["machine"]["peak_probe_one_thread_f32_flops_per_s"];
  const int cores = j["machine"]["peak_probe_cores"];
  const bool held = j["machine"]["peak_probe_held"];
  EXPECT_EQ(held, cores <= 1 || one <= 0 || probe >= 0.75 * cores * one)
      << probe << " " << one << " " << cores;
  // The probe is the peak unless it fell far below the nominal rate or was not held (a busy
  // machine: the suite runs two tests at once), when no peak is reported.
  if ((nominal > 0 && probe < 0.6 * nominal) || !held)
    EXPECT_EQ(peak_f32, 0.0);
  else
    EXPECT_EQ(peak_f32, probe);
  if (bf16 == "emulated") {
    EXPECT_EQ(peak_bf16, peak_f32);  // emulated bf16 multiplies in f32
  } else {
    EXPECT_TRUE(peak_bf16 > 1e8 || peak_bf16 == 0.0) << peak_bf16;  // 0: AMX, or not held
  }

  ASSERT_EQ(j["layers"].size(), 3u * 2u * 2u);  // variants x dtypes x token counts
  for (const auto& row : j["layers"]) {
    for (const char* k : {"inference_s", "forward_s", "forward_backward_s",
                          "forward_backward_gflops", "bare_forward_backward_gflops"})
      EXPECT_GT(row[k].get<double>(), 0.0) << k << " " << row.dump();
    // Ratios are medians of alternating rounds; a ratio that cannot be true, or rounds that
    // disagree, mark the row noisy.
    EXPECT_EQ(row["rounds"].get<int>(), 7) << row.dump();
    const double of_bare = row["forward_backward_of_bare"],
                 spread = row["forward_backward_of_bare_spread"];
    EXPECT_GT(of_bare, 0.0) << row.dump();
    EXPECT_GE(spread, 0.0) << row.dump();
    if (of_bare > 1.05 || spread > 0.10) {
      EXPECT_TRUE(row["noisy"].get<bool>()) << row.dump();
    }
    // Over the machine's peak at the row's precision; above 1 is flagged, never a finding.
    const double peak = row["dtype"] == "bf16" ? peak_bf16 : peak_f32;
    ASSERT_EQ(row.contains("forward_backward_of_peak"), peak > 0) << row.dump();
    if (peak == 0) continue;
    const double of_peak = row["forward_backward_of_peak"];
    EXPECT_NEAR(of_peak, row["forward_backward_gflops"].get<double>() * 1e9 / peak, 1e-9 * of_peak);
    EXPECT_EQ(row["of_peak_impossible"].get<bool>(), of_peak > 1.0) << row.dump();
  }

  // Decode at D 64, F 128, no bias, T = 1 (quick): SwiGLU reads gate, up and down
  // (3·64·128 elements); the MoE its router (8·64 f32) and the two chosen experts.
  ASSERT_EQ(j["decode"].size(), 4u);  // {swiglu, moe} x {f32, bf16}
  const double matrices = 3.0 * 64 * 128;
  for (const auto& row : j["decode"]) {
    const double size = row["weights"] == "bf16" ? 2.0 : 4.0;
    const double want =
        row["layer"] == "moe" ? 8.0 * 64 * 4 + 2 * matrices * size : matrices * size;
    EXPECT_EQ(row["bytes"].get<double>(), want) << row.dump();
    EXPECT_EQ(row["tokens"].get<int>(), 1);
    EXPECT_NEAR(row["bytes_per_s"].get<double>(),
                row["bytes"].get<double>() / row["seconds"].get<double>(),
                1e-6 * row["bytes_per_s"].get<double>());
    // oneDNN's products on weights of the layer's storage: bf16 ones where they are native.
    EXPECT_GT(row["onednn_seconds"].get<double>(), 0.0);
    EXPECT_EQ(row["onednn_weights"], row["weights"] == "bf16" && bf16 == "native" ? "bf16" : "f32")
        << row.dump();
    EXPECT_NEAR(row["of_bandwidth"].get<double>(),
                row["bytes_per_s"].get<double>() / row["read_bandwidth_bytes_per_s"].get<double>(),
                1e-9 * row["of_bandwidth"].get<double>());
    EXPECT_EQ(row["of_bandwidth_impossible"].get<bool>(), row["of_bandwidth"].get<double>() > 1.0);
    EXPECT_EQ(row["kernels"], enum_name(supported_few_rows_isas().back()));  // the best
  }
}

// --kernels times the few-token kernels of each instruction set asked for, side by side.
TEST_F(Cli, BenchDecodeTimesEachKernelSetAskedFor) {
  const auto r =
      run(std::string(kSmall) + kDecode + " --dtypes f32 --routings none --kernels portable," +
          enum_name(supported_few_rows_isas().back()) + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["decode"].size(), 8u);  // {swiglu, moe} x {f32, bf16} x 2 kernel sets
  EXPECT_EQ(j["decode"][0]["kernels"], "portable");
  EXPECT_EQ(j["decode"][1]["kernels"], enum_name(supported_few_rows_isas().back()));
  for (const auto& row : j["decode"]) EXPECT_GT(row["seconds"].get<double>(), 0.0) << row.dump();
  expect_usage_error(run(std::string(kSmall) + kDecode + " --kernels sse9"),
                     "unknown kernel set 'sse9'");
}

TEST_F(Cli, BenchPrintsTablesAndProgress) {
  const auto r = run(std::string(kSmall) + " --dtypes f32 --no-decode");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("memory read bandwidth"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of bare"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of peak"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GFLOP/s f32"), std::string::npos) << r.out;  // the peaks in the header
  EXPECT_EQ(r.out.find("Decode"), std::string::npos) << r.out;
  for (const char* v : {"relu ", "swiglu ", "moe "})
    EXPECT_NE(r.out.find(v), std::string::npos) << v;
  // The rounds' ratios are a column of their own, empty ("-") without PyTorch; a row whose
  // "of bare" the measurement decided carries the mark after it.
  const auto header = r.out.find("x torch      rounds\n");
  EXPECT_NE(header, std::string::npos) << r.out;
  const auto row = r.out.find("\nrelu ", header);
  ASSERT_NE(row, std::string::npos) << r.out;
  std::string line = r.out.substr(row + 1, r.out.find('\n', row + 1) - row - 1);
  const std::string mark = "  (noisy: not a finding)";
  const bool noisy = line.size() > mark.size() && line.ends_with(mark);
  if (noisy) line.resize(line.size() - mark.size());
  EXPECT_EQ(line.substr(line.size() - 2), " -") << line;
  if (line.find("(>bare)") != std::string::npos) {
    EXPECT_TRUE(noisy) << line;
  }
  EXPECT_NE(r.err.find("bench 6/6: moe f32 T=8"), std::string::npos) << r.err;
}

// The routing table: every family on the table's MoE, in sequences of 8 (so only T = 16 of
// --tokens 3,16 is whole sequences); the experts a token ran decide the bare products' rows.
TEST_F(Cli, BenchTimesEveryRoutingFamily) {
  const auto r =
      run("bench --quick --variants relu --dtypes f32 --tokens 3,16 --shape 32,48 --sequence 8 "
          "--no-decode --budget 0.002 --no-torch --bandwidth-mib 32 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const std::size_t F = ffnlab::routing_family_names().size();
  ASSERT_EQ(j["routing"].size(), F) << j["routing"].dump();
  std::set<std::string> families;
  for (const auto& row : j["routing"]) {
    const std::string f = row["family"];
    families.insert(f);
    EXPECT_EQ(row["tokens"].get<int>(), 16) << row.dump();
    EXPECT_EQ(row["sequence"].get<int>(), 8) << row.dump();
    EXPECT_GT(row["forward_backward_s"].get<double>(), 0.0) << row.dump();
    EXPECT_GT(row["bare_forward_backward_gflops"].get<double>(), 0.0) << row.dump();
    const double k = row["experts_per_token"];
    // top-k, expert choice (ceil(2·8/8) = 2 tokens an expert of 8 per sequence) and Soft MoE
    // (8 experts of round(2·8/8) = 2 slots over 8 tokens) and hash routing (2 hashed experts)
    // run exactly 2; the others decide.
    if (f == "topk" || f == "expert_choice" || f == "soft" || f == "hash") {
      EXPECT_DOUBLE_EQ(k, 2.0) << row.dump();
    } else if (f == "top_p") {
      EXPECT_GE(k, 1.0);
      EXPECT_LE(k, 4.0);
    } else if (f == "moe_pp") {
      EXPECT_LE(k, 2.0);
    } else {
      EXPECT_LE(k, 8.0);
    }
  }
  EXPECT_EQ(families.size(), F);
  const auto table =
      run("bench --quick --variants relu --dtypes f32 --tokens 16 --shape 32,48 --sequence 8 "
          "--routings soft,relu --no-decode --budget 0.002 --no-torch --bandwidth-mib 32");
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("Routing families"), std::string::npos) << table.out;
  EXPECT_NE(table.err.find("bench routing 2/2: relu f32 T=16"), std::string::npos) << table.err;
  const auto none = run(std::string(kSmall) + " --dtypes f32 --no-decode --json");
  ASSERT_EQ(none.status, 0) << none.err;
  EXPECT_TRUE(nlohmann::json::parse(none.out)["routing"].empty());  // T = 1, 8: no sequence
  EXPECT_NE(none.err.find("no routing table"), std::string::npos) << none.err;
}

TEST_F(Cli, BenchRejectsBadFlags) {
  expect_usage_error(run("bench --tokens 0"), "--tokens");
  expect_usage_error(run("bench --tokens 8,x"), "'x'");
  expect_usage_error(run("bench --dtypes f16"), "--dtypes");
  expect_usage_error(run("bench --decode-shape 0,5"), "--decode-shape");
  expect_usage_error(run("bench --shape 5,0"), "--shape");
  expect_usage_error(run("bench --budget 0"), "--budget");
  expect_usage_error(run("bench --rounds 0"), "--rounds");
  expect_usage_error(run("bench --routings topk,nope"), "unknown routing family 'nope'");
  expect_usage_error(run("bench --sequence 1"), "--sequence");
  expect_usage_error(run("bench --bandwidth-mib 1"), "--bandwidth-mib");
  expect_usage_error(run("bench --variants nope"), "unknown variant");
  // More than the machine has: refused before anything is allocated.
  expect_error(run("bench --no-torch --no-decode --bandwidth-mib 16 --shape 65536,262144 "
                   "--variants relu --dtypes f32 --tokens 1"),
               "[bench] relu at 65536/262144 with 1 tokens needs");
  expect_error(run("bench --no-torch --no-decode --bandwidth-mib 16 --shape 4096,4096 "
                   "--variants relu --dtypes f32 --tokens 1048576"),
               "needs");
}

// PyTorch (installed by install-deps) times the same layers in alternating rounds, at its best:
// an OPENBLAS_CORETYPE in the environment does not reach it, and jemalloc (install-deps) is its
// allocator.
TEST_F(Cli, BenchTimesPyTorchBesideFfnlab) {
  const auto r =
      run("bench --quick --variants swiglu,gated,moe --dtypes f32,bf16 --tokens 3 --shape 32,48 "
          "--decode-shape 32,64 "
          "--budget 0.01 --rounds 2 --bandwidth-mib 32 --json",
          "OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=262144 ");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["torch"].contains("version")) << j["torch"].dump();
  const std::string runtime = j["torch"].value("runtime", "");
  EXPECT_NE(runtime.find("OPENBLAS_CORETYPE/L2_SIZE unset"), std::string::npos) << runtime;
  EXPECT_EQ(runtime.find("slower"), std::string::npos) << runtime;  // a caching allocator
  EXPECT_NE(runtime.find("OMP_WAIT_POLICY=PASSIVE"), std::string::npos) << runtime;
  ASSERT_EQ(j["layers"].size(), 6u);
  // PyTorch's bf16 only where the CPU has native bf16 products: elsewhere it has no fast kernel.
  const bool cpu_bf16 = j["machine"]["cpu_bf16"];
  const auto timed = [&](const nlohmann::json& row, const char* dtype_key) {
    if (row[dtype_key] == "f32" || cpu_bf16) return true;
    EXPECT_EQ(row.value("torch_not_timed", ""), "no native bf16 on this CPU") << row.dump();
    EXPECT_FALSE(row.contains("torch_inference_s") || row.contains("torch_seconds")) << row.dump();
    return false;
  };
  for (const auto& row : j["layers"]) {
    if (!timed(row, "dtype")) continue;
    EXPECT_FALSE(row.contains("torch_not_timed")) << row.dump();
    EXPECT_GT(row.value("torch_inference_s", 0.0), 0.0) << row.dump();
    EXPECT_GT(row.value("torch_forward_backward_s", 0.0), 0.0) << row.dump();
    // One paired ratio per round, each a positive time over a positive time.
    ASSERT_TRUE(row.contains("torch_forward_backward_round_ratios")) << row.dump();
    ASSERT_EQ(row["torch_forward_backward_round_ratios"].size(), 2u) << row.dump();
    for (double ratio : row["torch_forward_backward_round_ratios"]) EXPECT_GT(ratio, 0.0);
  }
  for (const auto& row : j["decode"])
    if (timed(row, "weights")) {
      EXPECT_GT(row.value("torch_seconds", 0.0), 0.0) << row.dump();
    }
}

TEST_F(Cli, BenchGoesOnWithoutPyTorch) {
  const auto r =
      run("bench --quick --variants relu --dtypes f32 --tokens 1 --no-decode --budget 0.002 "
          "--bandwidth-mib 32 --python /nonexistent/python3");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("PyTorch: not measured ([bench] cannot start /nonexistent/python3: no "
                       "such file"),
            std::string::npos)
      << r.out;
  const auto j = run(std::string(kSmall) + " --dtypes f32 --no-decode --json");
  ASSERT_EQ(j.status, 0) << j.err;
  const auto parsed = nlohmann::json::parse(j.out);
  EXPECT_EQ(parsed["torch"]["unavailable"], "--no-torch");
  EXPECT_FALSE(parsed["layers"][0].contains("torch_forward_backward_s"));
  EXPECT_FALSE(parsed["layers"][0].contains("torch_forward_backward_round_ratios"));
}
