// ffnlab bench: every FFN variant's speed on this machine, as ratios to what the same run
// measures — oneDNN's bare products of the same shapes and the machine's memory read bandwidth
// — so that the numbers hold on a shared machine where absolute times drift.
#include <fmt/format.h>
#include <omp.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "common.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/ops/matmul.hpp"

namespace ffnlab::cli {

namespace {

using nlohmann::json;

struct BenchOptions {
  bool quick = false;
  bool json_out = false;
  std::string variants = "all";
  std::string dtypes = "f32,bf16";
  std::string tokens = "1,8,512,6400";
  std::vector<std::int64_t> decode_shape = {4096, 14336};
  bool decode = true;
  double budget = 0.3;
  int threads = 0;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) out.push_back(part);
  return out;
}

std::vector<std::int64_t> token_list(const std::string& spec) {
  std::vector<std::int64_t> out;
  for (const auto& p : split(spec)) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(p, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != p.size() || v < 1 || v > (1 << 20))
      throw UsageError(fmt::format("--tokens: '{}' is not a token count in [1, 2^20]", p));
    out.push_back(v);
  }
  if (out.empty()) throw UsageError("--tokens: no token count given");
  return out;
}

std::vector<Precision> precision_list(const std::string& spec) {
  std::vector<Precision> out;
  for (const auto& p : split(spec)) {
    try {
      out.push_back(parse_enum<Precision>(p));
    } catch (const Error& e) {
      throw UsageError(std::string("--dtypes: ") + e.what());
    }
  }
  if (out.empty()) throw UsageError("--dtypes: no dtype given");
  return out;
}

// Progress goes to stderr, so that stdout holds only the tables (or the JSON).
void note(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

std::string ms(double seconds) {
  return fmt::format("{:.3f}", seconds * 1e3);
}

// The MoE of the study (8 experts, top-2) with experts of `expert` kind at D/F.
FFNConfig moe_of(const std::string& expert, std::int64_t D, std::int64_t F, bool bias) {
  FFNConfig c = variant_config("moe", D, F, bias);
  const FFNConfig e = variant_config(expert, D, F, bias);
  c.act = e.act;
  c.moe.expert_kind = e.kind;
  return c;
}

json bench_layers(const BenchOptions& o, const std::vector<std::string>& variants,
                  const std::vector<Precision>& precisions, const std::vector<std::int64_t>& T) {
  const std::int64_t D = 512, F = 2048;
  json rows = json::array();
  if (!o.json_out) {
    fmt::print(
        "\nLayers at d_model {} and d_ff {} with bias (the seeds' shape; MoE: 8 experts of that "
        "width, top-2). Times are medians per call; GFLOP/s counts the matrix products (ffnlab "
        "params); 'of bare' is the layer's rate over oneDNN's bare products of the same shapes "
        "at the same precision, timed in the same run.\n\n",
        D, F);
    fmt::print("{:<10} {:>5} {:>5} | {:>10} {:>8} | {:>10} {:>8} | {:>10} {:>8} {:>7}\n",
               "variant", "dtype", "T", "infer ms", "GFLOP/s", "train fwd", "GFLOP/s",
               "fwd+bwd ms", "GFLOP/s", "of bare");
  }
  const std::size_t total = variants.size() * precisions.size() * T.size();
  std::size_t done = 0;
  for (const auto& v : variants)
    for (Precision p : precisions)
      for (std::int64_t t : T) {
        note(fmt::format("bench {}/{}: {} {} T={}", ++done, total, v, enum_name(p), t));
        const FFNConfig c = variant_config(v, D, F, true);
        const LayerSpeed s = measure_layer_speed(c, t, o.budget, p);
        const double of_bare = s.forward_backward_gflops / s.peak_forward_backward_gflops;
        rows.push_back({{"variant", v},
                        {"dtype", enum_name(p)},
                        {"tokens", t},
                        {"inference_s", s.inference_s},
                        {"inference_gflops", s.inference_gflops},
                        {"forward_s", s.forward_s},
                        {"forward_gflops", s.forward_gflops},
                        {"forward_backward_s", s.forward_backward_s},
                        {"forward_backward_gflops", s.forward_backward_gflops},
                        {"bare_forward_gflops", s.peak_forward_gflops},
                        {"bare_forward_backward_gflops", s.peak_forward_backward_gflops},
                        {"forward_backward_of_bare", of_bare}});
        if (!o.json_out)
          fmt::print("{:<10} {:>5} {:>5} | {:>10} {:>8.1f} | {:>10} {:>8.1f} | {:>10} {:>8.1f} "
                     "{:>6.0f}%\n",
                     v, enum_name(p), t, ms(s.inference_s), s.inference_gflops, ms(s.forward_s),
                     s.forward_gflops, ms(s.forward_backward_s), s.forward_backward_gflops,
                     100 * of_bare);
        std::fflush(stdout);
      }
  return rows;
}

json bench_decode(const BenchOptions& o, double bandwidth) {
  const std::int64_t D = o.decode_shape[0], F = o.decode_shape[1];
  json rows = json::array();
  if (!o.json_out)
    fmt::print(
        "\nDecode (inference forward) at d_model {}, d_ff {}, no bias: SwiGLU, and an MoE of 8 "
        "such experts, top-2. 'read' is the weights the tokens need (MoE: the router and the "
        "chosen experts); 'of bw' is GB/s over the read bandwidth measured above; 'oneDNN' is "
        "its f32 products of the same shapes (T rows) on the same weights.\n\n",
        D, F);
  if (!o.json_out)
    fmt::print("{:<8} {:>7} {:>3} | {:>9} {:>8} {:>8} {:>6} | {:>10} {:>8}\n", "layer", "weights",
               "T", "ms", "read GB", "GB/s", "of bw", "oneDNN ms", "speed-up");
  for (const char* layer : {"swiglu", "moe"}) {
    const FFNConfig c =
        std::string(layer) == "moe" ? moe_of("swiglu", D, F, false) : variant_config(layer, D, F, false);
    const FFNCost cost = ffn_cost(c, 1);
    // Values and gradients in f32, a bf16 copy, oneDNN's f32 weights of one expert.
    const double need = cost.params * (4.0 + 4.0 + 2.0) + cost.params / (c.moe.num_experts + 0.0) * 4.0;
    if (need > 0.8 * available_memory_bytes()) {
      note(fmt::format("bench: decode {} skipped: it needs {:.1f} GiB, more than 80% of the "
                       "{:.1f} GiB available",
                       layer, need / (1 << 30), available_memory_bytes() / (1 << 30)));
      continue;
    }
    note(fmt::format("bench: building the {} layer at {}/{} ({:.2f} G parameters)", layer, D, F,
                     cost.params / 1e9));
    auto ffn = make_ffn(c, 1);
    for (DType w : {DType::f32, DType::bf16}) {
      ffn->set_inference_weights(w);
      for (std::int64_t t : {std::int64_t{1}, std::int64_t{8}}) {
        if (o.quick && t == 8) continue;
        note(fmt::format("bench: decode {} {} T={}", layer, dtype_name(w), t));
        const DecodeSpeed s = measure_decode_speed(*ffn, t, o.budget);
        rows.push_back({{"layer", layer},
                        {"d_model", D},
                        {"d_ff", F},
                        {"weights", dtype_name(w)},
                        {"tokens", t},
                        {"seconds", s.seconds},
                        {"bytes", s.bytes},
                        {"bytes_per_s", s.bytes_per_s},
                        {"of_bandwidth", s.bytes_per_s / bandwidth},
                        {"onednn_f32_seconds", s.bare_seconds}});
        if (!o.json_out)
          fmt::print("{:<8} {:>7} {:>3} | {:>9} {:>8.3f} {:>8.1f} {:>5.0f}% | {:>10} {:>7.2f}x\n",
                     layer, dtype_name(w), t, ms(s.seconds), s.bytes / 1e9, s.bytes_per_s / 1e9,
                     100 * s.bytes_per_s / bandwidth, ms(s.bare_seconds),
                     s.bare_seconds / s.seconds);
        std::fflush(stdout);
      }
    }
  }
  return rows;
}

void run_bench(BenchOptions o) {
  apply_threads(o.threads);
  const auto variants = variant_list(o.variants);
  const auto precisions = precision_list(o.dtypes);
  const auto tokens = token_list(o.tokens);
  if (o.decode_shape.size() != 2 || o.decode_shape[0] < 1 || o.decode_shape[1] < 1 ||
      o.decode_shape[0] > (1 << 16) || o.decode_shape[1] > (1 << 18))
    throw UsageError("--decode-shape: takes D,F with D in [1, 2^16] and F in [1, 2^18]");

  // 1 GiB (256 MiB quick): far beyond any cache, so this is what memory delivers.
  const std::int64_t bandwidth_bytes = std::int64_t{1} << (o.quick ? 28 : 30);
  const double bandwidth = measure_read_bandwidth(bandwidth_bytes, o.quick ? 0.25 : 1.0);
  const bool bf16_native = matmul_bf16_native();
  json out;
  out["machine"] = {{"threads", omp_get_max_threads()},
                    {"read_bandwidth_bytes_per_s", bandwidth},
                    {"bf16_products", bf16_native ? "native" : "emulated"}};
  out["budget_seconds"] = o.budget;
  if (!o.json_out)
    fmt::print(
        "ffnlab bench: {} threads; memory read bandwidth {:.1f} GB/s (a parallel sum over {} MiB, "
        "median); bf16 products {}.\n",
        omp_get_max_threads(), bandwidth / 1e9, bandwidth_bytes >> 20,
        bf16_native ? "native (oneDNN)"
                    : "emulated: oneDNN has no bf16 product for this CPU, so bf16 rounds the "
                      "inputs and multiplies in f32 (same values, f32 speed)");
  out["layers"] = bench_layers(o, variants, precisions, tokens);
  if (o.decode) out["decode"] = bench_decode(o, bandwidth);
  if (o.json_out) fmt::print("{}\n", out.dump(2));
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand(
      "bench",
      "Speed of every FFN variant and MoE on this machine, f32 and bf16: inference, training "
      "forward and forward+backward at the seeds' shape (d_model 512, d_ff 2048) for several "
      "token counts, as GFLOP/s and as a share of oneDNN's bare products of the same shapes; "
      "and decode (one and eight tokens) of a 4096/14336 SwiGLU and an 8-expert MoE of it, as "
      "GB/s of weights read and as a share of the memory bandwidth, both measured in the same "
      "run. Progress goes to stderr.");
  cmd->add_flag("--quick", o->quick,
                "a short run: T = 1, 8, 512 with a 0.05 s budget, decode at 2048/5632 and T = 1");
  cmd->add_flag("--json", o->json_out, "print the results as JSON instead of tables");
  cmd->add_option("--variants", o->variants, "comma-separated variants, or 'all'")
      ->capture_default_str();
  cmd->add_option("--dtypes", o->dtypes, "comma-separated product precisions: f32, bf16")
      ->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "comma-separated token counts of the layer table")
      ->capture_default_str();
  cmd->add_option("--decode-shape", o->decode_shape, "d_model and d_ff of the decode table")
      ->delimiter(',')
      ->expected(2)
      ->capture_default_str();
  cmd->add_flag("!--no-decode", o->decode, "skip the decode table");
  cmd->add_option("--budget", o->budget, "seconds of timing per measurement (median of the calls)")
      ->check(real_in(0.001, 60))
      ->capture_default_str();
  add_threads_option(*cmd, o->threads);
  cmd->callback([o, cmd] {
    BenchOptions run = *o;
    if (run.quick) {
      if (cmd->count("--tokens") == 0) run.tokens = "1,8,512";
      if (cmd->count("--decode-shape") == 0) run.decode_shape = {2048, 5632};
      if (cmd->count("--budget") == 0) run.budget = 0.05;
    }
    run_bench(run);
  });
}

}  // namespace ffnlab::cli
