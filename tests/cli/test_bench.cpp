// ffnlab bench: the tables and the JSON hold every case asked for, with the bytes a decode must
// read computed exactly, and bad flags are usage errors. Speed itself is never asserted here.
#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"

using namespace ffnlab::test;

namespace {
const char* kSmall =
    "bench --quick --variants relu,swiglu,moe --tokens 1,8 "
    "--decode-shape 64,128 --budget 0.002";
}  // namespace

TEST_F(Cli, BenchJsonHoldsEveryCaseAndTheBytesADecodeReads) {
  const auto r = run(std::string(kSmall) + " --dtypes f32,bf16 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["machine"]["read_bandwidth_bytes_per_s"].get<double>(), 1e8);
  EXPECT_GE(j["machine"]["threads"].get<int>(), 1);
  const std::string bf16 = j["machine"]["bf16_products"];
  EXPECT_TRUE(bf16 == "native" || bf16 == "emulated") << bf16;

  ASSERT_EQ(j["layers"].size(), 3u * 2u * 2u);  // variants x dtypes x token counts
  for (const auto& row : j["layers"]) {
    for (const char* k : {"inference_s", "forward_s", "forward_backward_s",
                          "forward_backward_gflops", "bare_forward_backward_gflops"})
      EXPECT_GT(row[k].get<double>(), 0.0) << k << " " << row.dump();
    EXPECT_NEAR(row["forward_backward_of_bare"].get<double>(),
                row["forward_backward_gflops"].get<double>() /
                    row["bare_forward_backward_gflops"].get<double>(),
                1e-9);
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
    EXPECT_GT(row["onednn_f32_seconds"].get<double>(), 0.0);
  }
}

TEST_F(Cli, BenchPrintsTablesAndProgress) {
  const auto r = run(std::string(kSmall) + " --dtypes f32 --no-decode");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("memory read bandwidth"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of bare"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Decode"), std::string::npos) << r.out;
  for (const char* v : {"relu ", "swiglu ", "moe "})
    EXPECT_NE(r.out.find(v), std::string::npos) << v;
  EXPECT_NE(r.err.find("bench 6/6: moe f32 T=8"), std::string::npos) << r.err;
}

TEST_F(Cli, BenchRejectsBadFlags) {
  expect_usage_error(run("bench --tokens 0"), "--tokens");
  expect_usage_error(run("bench --tokens 8,x"), "'x'");
  expect_usage_error(run("bench --dtypes f16"), "--dtypes");
  expect_usage_error(run("bench --decode-shape 0,5"), "--decode-shape");
  expect_usage_error(run("bench --budget 0"), "--budget");
  expect_error(run("bench --variants nope"), "unknown variant");
}
