// ffnlab bench: every FFN variant's speed on this machine, as ratios to what the same run
// measures — oneDNN's bare products of the same shapes and the machine's memory read bandwidth
// — so that the numbers hold on a shared machine where absolute times drift.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "commands.hpp"
#include "common.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/machine.hpp"
#include "ffnlab/analysis/speed.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/io/json_text.hpp"
#include "ffnlab/ops/few_rows.hpp"
#include "ffnlab/ops/matmul.hpp"
#include "interrupt.hpp"
#include "launch.hpp"
#include "torch_worker.hpp"

namespace ffnlab::cli {

namespace {

using nlohmann::json;

struct BenchOptions {
  bool quick = false;
  bool json_out = false;
  std::string variants = "all";
  std::string routings = "all";  // routing families of the routing table ("none": no table)
  std::int64_t sequence = 128;   // tokens of one sequence in the routing table
  std::vector<std::string> dtypes = {"f32", "bf16"};
  std::vector<std::int64_t> tokens = {1, 8, 512, 6400};
  std::vector<std::int64_t> shape = {512, 2048};
  std::vector<std::int64_t> decode_shape = {4096, 14336};
  bool decode = true;
  // The few-token kernels' instruction sets the decode table times, side by side (empty: the
  // one in use, the best this CPU runs).
  std::vector<std::string> kernel_sets;
  double budget = 0.3;
  int threads = 0;
  bool torch = true;
  std::string python = "/usr/bin/python3";
  std::string torch_script;    // "" = default_torch_script()
  double torch_timeout = 600;  // seconds PyTorch may take to start or to answer one request
  int rounds = 3;
  std::int64_t bandwidth_mib = 1024;
  // After the layer table: PyTorch's forward+backward at the largest token count timed again
  // in a process of its own, which bench waits on idle, and compared with the table's column.
  bool check_torch = false;
  std::set<std::string> given;  // the flags given on the command line (by their long names)
};

std::vector<Precision> precision_list(const std::vector<std::string>& names) {
  std::vector<Precision> out;
  for (const auto& n : names) {
    try {
      out.push_back(parse_enum<Precision>(n));
    } catch (const Error& e) {
      throw UsageError(std::string("[bench] --dtypes: ") + e.what());
    }
    if (std::find(out.begin(), out.end() - 1, out.back()) != out.end() - 1)
      throw UsageError(fmt::format("[bench] --dtypes: '{}' is listed twice", n));
  }
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

// The request that times the same layer in PyTorch (bench/torch_ffn.py).
json torch_request(const FFNConfig& c, std::int64_t tokens, const char* pass, Precision p,
                   DType weights, double budget) {
  const bool moe = c.kind == FFNKind::moe;
  const FFNConfig dense = moe ? expert_config(c) : c;
  return {{"variant", variant_name(c)},
          {"kind", enum_name(dense.kind)},
          {"act", enum_name(c.act.kind)},
          {"d_model", c.d_model},
          {"d_ff", dense.d_ff},
          {"bias", c.bias},
          {"branches", dense.gated_branches()},
          {"experts", moe ? c.moe.num_experts : 0},
          {"top_k", moe ? c.moe.top_k : 0},
          {"normalize", moe && c.moe.normalize},
          {"router_bias", moe && c.moe.router_bias},
          {"params", count_params(c)},
          {"tokens", tokens},
          {"pass", pass},
          {"dtype", enum_name(p)},
          {"weights", dtype_name(weights)},
          {"budget", budget}};
}

// The median of the rounds' times; -1 when there are none or one was skipped (< 0).
double rounds_median(const std::vector<double>& v) {
  return v.empty() || *std::min_element(v.begin(), v.end()) < 0 ? -1.0 : median(v);
}

// PyTorch's time for a request, or -1 when it skipped (the reason goes to stderr).
double torch_seconds(TorchWorker& torch, const json& request) {
  const TorchReply a = torch.ask(request);
  if (a.kind == TorchReply::Kind::seconds) return a.seconds;
  note("bench: PyTorch skipped " + request.value("variant", std::string()) + ": " + a.skipped);
  return -1;
}

// Between measurements: the first SIGINT or SIGTERM stops bench here (exit 130).
void check_stop() {
  if (InterruptGuard::requested())
    throw Interrupted(InterruptGuard::signal_name() + ": bench stopped");
}

// "2.31x" (PyTorch's time over ffnlab's), or "-" without a PyTorch time.
std::string speedup(double torch_s, double ffnlab_s) {
  return torch_s > 0 ? fmt::format("{:.2f}x", torch_s / ffnlab_s) : "-";
}

// Each round's own ratio, PyTorch's time over ffnlab's in that round (paired: the same stretch
// of a shared machine's drift); empty unless every round has both.
std::vector<double> paired_ratios(const std::vector<double>& torch_s,
                                  const std::vector<double>& ffnlab_s) {
  if (torch_s.size() != ffnlab_s.size() || torch_s.empty() ||
      *std::min_element(torch_s.begin(), torch_s.end()) <= 0)
    return {};
  std::vector<double> out;
  for (std::size_t i = 0; i < torch_s.size(); ++i) out.push_back(torch_s[i] / ffnlab_s[i]);
  return out;
}

// "lowest-highest" of the rounds' ratios, "-" without them.
std::string ratio_range(const std::vector<double>& ratios) {
  if (ratios.empty()) return "-";
  const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
  return fmt::format("{:.2f}-{:.2f}", *lo, *hi);
}

// An MoE of 8 experts, top-2 (MoEConfig's defaults; no balancing loss) with experts of `expert`
// kind at D/F.
FFNConfig moe_of(const std::string& expert, std::int64_t D, std::int64_t F, bool bias) {
  FFNConfig c = variant_config("moe", D, F, bias);
  const FFNConfig e = variant_config(expert, D, F, bias);
  c.act = e.act;
  c.moe.expert_kind = e.kind;
  return c;
}

// Refuses a layer table that cannot fit in memory, before anything is measured: values and
// gradients, the bare products' four matrices, and activations of T tokens (inputs, outputs and
// a generous 8 rows of the widest hidden width).
void check_layer_memory(const std::vector<std::pair<std::string, FFNConfig>>& layers,
                        const std::vector<std::int64_t>& tokens) {
  const std::int64_t T = *std::max_element(tokens.begin(), tokens.end());
  for (const auto& [name, c] : layers) {
    const std::int64_t D = c.d_model;
    const FFNConfig dense = c.kind == FFNKind::moe ? expert_config(c) : c;
    // A token's experts: top-k, top-p's cap, or for ReLU routing at initialisation (before its
    // penalty acts) the experts of positive logit, about half of them.
    const int experts = c.kind != FFNKind::moe               ? 1
                        : c.moe.routing == RoutingKind::relu ? (c.moe.num_experts + 1) / 2
                                                             : c.moe.top_k;
    const double wide = static_cast<double>(std::max(dense.in_width(), D)) * experts;
    check_memory(8.0 * static_cast<double>(count_params(c)) +
                     16.0 * static_cast<double>(count_params(dense)) +
                     4.0 * static_cast<double>(T) * (4.0 * D + 8.0 * wide),
                 "bench", fmt::format("{} at {}/{} with {} tokens", name, D, c.d_ff, T));
  }
}

// The machine's peak FLOP rate per product precision (measure_peak_flops), the layer table's
// "of peak".
struct Peaks {
  double f32 = 0, bf16 = 0;
  double of(Precision p) const { return p == Precision::bf16 ? bf16 : f32; }
};

// The layer's forward+backward rate over the peak: "97%", or "(>pk)" where the layer measured
// faster than the loop that bounds it (that measurement was off, not the layer).
std::string of_peak_text(double gflops, double peak_flops) {
  if (peak_flops <= 0) return "-";
  const double r = gflops * 1e9 / peak_flops;
  return r > 1.0 ? std::string("(>pk)") : fmt::format("{:.0f}%", 100 * r);
}

// After a row whose "of bare" the measurement decided (LayerSpeed::noisy).
constexpr const char* kNoisyMark = "  (noisy: not a finding)";

// PyTorch's bf16 is compared only on a CPU with native bf16 products (avx512_bf16 or AMX):
// elsewhere it has no fast bf16 kernel, and the ratio would measure that, not ffnlab.
constexpr const char* kNoNativeBf16 = "no native bf16 on this CPU";
constexpr const char* kNoTorchBf16 =
    "PyTorch's bf16 is not timed: this CPU has no native bf16 products, where PyTorch has no "
    "fast bf16 kernel and a ratio would measure that (docs/bench.md)";
bool torch_times(bool bf16) {
  return !bf16 || this_machine().bf16;
}

void bench_layers(const BenchOptions& o, const std::vector<std::string>& variants,
                  const std::vector<Precision>& precisions, const std::vector<std::int64_t>& T,
                  TorchWorker& torch, const Peaks& peaks, json& rows) {
  const std::int64_t D = o.shape[0], F = o.shape[1];
  if (!o.json_out) {
    fmt::print(
        "\nLayers at d_model {} and d_ff {} with bias (MoE: 8 experts of that width, top-2). Times "
        "are medians per call over {} alternating rounds; GFLOP/s counts "
        "the matrix products (ffnlab params); 'of bare' is the layer's rate over oneDNN's bare "
        "products of the same shapes at the same precision, 'of peak' over the machine's peak at "
        "that precision (the header's); 'x torch' is PyTorch's time for the same layer over "
        "ffnlab's, timed in the same rounds, and 'rounds' the lowest and highest of each "
        "round's own forward+backward ratio: the spread one ratio carries on this machine.\n\n",
        D, F, o.rounds);
    if (torch.available() && !torch_times(true) &&
        std::find(precisions.begin(), precisions.end(), Precision::bf16) != precisions.end())
      fmt::print("{}\n\n", kNoTorchBf16);
    fmt::print("{:<10} {:>5} {:>5} | {:>10} {:>8} {:>7} | {:>10} {:>8} {:>7} {:>7} {:>7} {:>11}\n",
               "variant", "dtype", "T", "infer ms", "GFLOP/s", "x torch", "fwd+bwd ms", "GFLOP/s",
               "of bare", "of peak", "x torch", "rounds");
  }
  const std::size_t total = variants.size() * precisions.size() * T.size();
  std::size_t done = 0;
  for (const auto& v : variants)
    for (Precision p : precisions)
      for (std::int64_t t : T) {
        check_stop();
        note(fmt::format("bench {}/{}: {} {} T={}", ++done, total, v, enum_name(p), t));
        const FFNConfig c = variant_config(v, D, F, true);
        // Rounds alternate ffnlab and PyTorch, so that drift of a shared machine hits both.
        std::vector<LayerSpeed> ours;
        std::vector<double> torch_inf, torch_fb;
        const double part = o.budget / o.rounds;
        const bool with_torch = torch.available() && torch_times(p == Precision::bf16);
        for (int round = 0; round < o.rounds; ++round) {
          ours.push_back(measure_layer_speed(c, t, part, p));
          if (!with_torch) continue;
          torch_inf.push_back(
              torch_seconds(torch, torch_request(c, t, "inference", p, DType::f32, part)));
          torch_fb.push_back(
              torch_seconds(torch, torch_request(c, t, "forward_backward", p, DType::f32, part)));
        }
        std::vector<double> ours_fb;
        for (const LayerSpeed& r : ours) ours_fb.push_back(r.forward_backward_s);
        const std::vector<double> ratios = paired_ratios(torch_fb, ours_fb);
        // The round with the median forward+backward time stands for ffnlab.
        std::sort(ours.begin(), ours.end(), [](const LayerSpeed& a, const LayerSpeed& b) {
          return a.forward_backward_s < b.forward_backward_s;
        });
        const LayerSpeed s = ours[ours.size() / 2];
        const double ti = rounds_median(torch_inf), tf = rounds_median(torch_fb);
        const double of_bare = s.forward_backward_of_bare;
        json row = {{"variant", v}, {"dtype", enum_name(p)}, {"tokens", t}};
        row.update(json(to_json(s)));
        if (ti > 0) row["torch_inference_s"] = ti;
        if (tf > 0) row["torch_forward_backward_s"] = tf;
        if (!ratios.empty()) row["torch_forward_backward_round_ratios"] = ratios;
        if (torch.available() && !with_torch) row["torch_not_timed"] = kNoNativeBf16;
        if (peaks.of(p) > 0) {  // 0: not measured (AMX)
          const double of_peak = s.forward_backward_gflops * 1e9 / peaks.of(p);
          row["forward_backward_of_peak"] = of_peak;
          // Faster than the loop that bounds it: that measurement, not the layer, was off.
          row["of_peak_impossible"] = of_peak > 1.0;
        }
        rows.push_back(row);
        if (!o.json_out)
          fmt::print(
              "{:<10} {:>5} {:>5} | {:>10} {:>8.1f} {:>7} | {:>10} {:>8.1f} {:>7} {:>7} "
              "{:>7} {:>11}{}\n",
              v, enum_name(p), t, ms(s.inference_s), s.inference_gflops, speedup(ti, s.inference_s),
              ms(s.forward_backward_s), s.forward_backward_gflops, of_bare_text(of_bare),
              of_peak_text(s.forward_backward_gflops, peaks.of(p)),
              speedup(tf, s.forward_backward_s), ratio_range(ratios), s.noisy() ? kNoisyMark : "");
        std::fflush(stdout);
      }
}

// The routing families of --routings ("all", "none" or a list).
std::vector<std::string> routing_list(const std::string& names) {
  if (names == "none") return {};
  if (names == "all") return routing_family_names();
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= names.size()) {
    const std::size_t comma = std::min(names.find(',', at), names.size());
    out.push_back(names.substr(at, comma - at));
    at = comma + 1;
  }
  const auto known = routing_family_names();
  for (auto n = out.begin(); n != out.end(); ++n) {
    if (std::find(known.begin(), known.end(), *n) == known.end())
      throw UsageError(
          fmt::format("[bench] --routings: unknown routing family '{}' (known: {}, all, none)", *n,
                      fmt::join(known, ", ")));
    if (std::find(out.begin(), n, *n) != n)
      throw UsageError(fmt::format("[bench] --routings: '{}' is listed twice", *n));
  }
  return out;
}

// Every routing family on the layer table's MoE (8 experts of d_ff, top-2, with bias), in
// sequences of o.sequence tokens: forward+backward against the bare products of the rows its
// experts ran. Token counts that are not whole sequences are left out (expert choice and Soft
// MoE route whole sequences; the table keeps one set of rows for all families).
void bench_routing(const BenchOptions& o, const std::vector<std::string>& families,
                   const std::vector<Precision>& precisions, const std::vector<std::int64_t>& T,
                   json& rows) {
  const std::int64_t D = o.shape[0], F = o.shape[1], S = o.sequence;
  std::vector<std::int64_t> tokens;
  for (std::int64_t t : T)
    if (t % S == 0) tokens.push_back(t);
  if (tokens.empty()) {
    note(
        fmt::format("bench: no routing table: no token count of --tokens is a multiple of the "
                    "sequence ({})",
                    S));
    return;
  }
  const FFNConfig base = variant_config("moe", D, F, true);
  if (!o.json_out) {
    fmt::print(
        "\nRouting families on the MoE above (8 experts, top-2 compute: top-p 0.4 at most 4, ReLU "
        "routing with a target of 2 (its L1 penalty acts only in training, so at initialisation "
        "it runs more), MoE++ with 2 constant, 1 copy and 1 zero expert (its gating residual "
        "needs a previous layer: not exercised by one layer), expert choice with capacity 1, "
        "Soft MoE with {} slots an expert), sequences of {} tokens, at initialisation. 'experts' "
        "is the FFN experts a token ran in "
        "the timed forwards (it decides the FLOPs); 'of bare' is the layer's rate over oneDNN's "
        "bare products of as many rows, timed in the same rounds. No PyTorch column: PyTorch "
        "has no module for these routings.\n\n",
        routing_family_config(base, "soft", S).moe.slots, S);
    fmt::print("{:<14} {:>5} {:>5} {:>7} | {:>10} {:>8} {:>7} | {:>10} {:>8} {:>7}\n", "family",
               "dtype", "T", "experts", "fwd ms", "GFLOP/s", "of bare", "fwd+bwd ms", "GFLOP/s",
               "of bare");
  }
  const std::size_t total = families.size() * precisions.size() * tokens.size();
  std::size_t done = 0;
  for (const auto& family : families)
    for (Precision p : precisions)
      for (std::int64_t t : tokens) {
        check_stop();
        note(
            fmt::format("bench routing {}/{}: {} {} T={}", ++done, total, family, enum_name(p), t));
        const FFNConfig c = routing_family_config(base, family, S);
        const LayerSpeed s = measure_layer_speed(c, t, o.budget, p, o.rounds, S);
        json row = {{"family", family}, {"dtype", enum_name(p)}, {"tokens", t}, {"sequence", S}};
        row.update(json(to_json(s)));
        rows.push_back(row);
        if (!o.json_out)
          fmt::print(
              "{:<14} {:>5} {:>5} {:>7.2f} | {:>10} {:>8.1f} {:>7} | {:>10} {:>8.1f} "
              "{:>7}{}\n",
              family, enum_name(p), t, s.experts_per_token, ms(s.forward_s), s.forward_gflops,
              of_bare_text(s.forward_of_bare), ms(s.forward_backward_s), s.forward_backward_gflops,
              of_bare_text(s.forward_backward_of_bare), s.noisy() ? kNoisyMark : "");
        std::fflush(stdout);
      }
}

// --kernels: the instruction sets named (Usage error for a name or a set this CPU lacks); the
// one in use when none is named.
std::vector<FewRowsIsa> kernel_list(const std::vector<std::string>& names) {
  std::vector<FewRowsIsa> isas;
  for (const std::string& name : names) {
    FewRowsIsa isa{};
    try {
      isa = parse_enum<FewRowsIsa>(name);
    } catch (const Error& e) {
      throw UsageError(fmt::format("[bench] --kernels: {}", e.what()));
    }
    if (!few_rows_isa_supported(isa))
      throw UsageError(
          fmt::format("[bench] --kernels: this CPU does not run the {} kernels", name));
    if (std::find(isas.begin(), isas.end(), isa) != isas.end())
      throw UsageError(fmt::format("[bench] --kernels: '{}' is listed twice", name));
    isas.push_back(isa);
  }
  if (isas.empty()) isas.push_back(few_rows_isa());
  return isas;
}

// The decode table's layers: a SwiGLU of --decode-shape without bias, and an MoE of 8 such
// experts, top-2.
std::vector<std::pair<std::string, FFNConfig>> decode_layers(const BenchOptions& o) {
  const std::int64_t D = o.decode_shape[0], F = o.decode_shape[1];
  return {{"swiglu", variant_config("swiglu", D, F, false)},
          {"moe", moe_of("swiglu", D, F, false)}};
}

// What the decode table holds while it times a layer: its values and gradients in f32, a bf16
// copy, oneDNN's f32 weights of one expert, and the bandwidth probe's buffer beside them.
double decode_bytes(const FFNConfig& c, std::int64_t bandwidth_bytes) {
  const FFNConfig one = c.kind == FFNKind::moe ? expert_config(c) : c;
  return static_cast<double>(count_params(c)) * (4.0 + 4.0 + 2.0) +
         static_cast<double>(count_params(one)) * 4.0 + static_cast<double>(bandwidth_bytes);
}

// The decode layers this machine cannot hold (beyond 80 % of its memory), each with the reason,
// decided before anything is timed. With --decode-shape given such a layer is refused: the
// table asked for cannot be measured.
std::vector<std::pair<std::string, std::string>> decode_left_out(const BenchOptions& o) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!o.decode) return out;
  const double have = available_memory_bytes();
  for (const auto& [layer, c] : decode_layers(o)) {
    const double need = decode_bytes(c, o.bandwidth_mib << 20);
    if (need <= 0.8 * have) continue;
    const std::string why = fmt::format(
        "the decode table's {} layer at {}/{} needs {:.1f} GiB, more than 80 % of the {:.1f} GiB "
        "available",
        layer, c.d_model, c.d_ff, need / (1 << 30), have / (1 << 30));
    if (o.given.count("--decode-shape") > 0)  // asked for: refused, not left out
      throw Error(fmt::format("[bench] --decode-shape: {} (a smaller shape, or --no-decode)", why));
    out.emplace_back(layer, why);
  }
  return out;
}

void bench_decode(const BenchOptions& o, const std::vector<FewRowsIsa>& isas, TorchWorker& torch,
                  const std::vector<std::pair<std::string, std::string>>& left_out, json& rows) {
  const std::int64_t D = o.decode_shape[0], F = o.decode_shape[1];
  const FewRowsIsa in_use = few_rows_isa();
  if (!o.json_out)
    fmt::print(
        "\nDecode (inference forward) at d_model {}, d_ff {}, no bias: SwiGLU, and an MoE of 8 "
        "such experts, top-2. 'read' is the weights the tokens need (MoE: the router and the "
        "chosen experts); 'of bw' is GB/s over the memory read bandwidth measured in the same "
        "rounds ('(>bw)': above it, so that measurement was off, not a finding); 'kernels' the "
        "few-token kernels' instruction set (--kernels), or oneDNN where weights of this "
        "size do not stream at T tokens on this CPU; 'oneDNN ms' is "
        "its products of the same shapes (T rows) on weights in the same storage (bf16 weights: "
        "bf16 products where this CPU has them, else f32 ones, which read twice the bytes: "
        "marked '*'); 'torch' is PyTorch's "
        "module with its weights in the same dtype, timed in alternating rounds.\n\n",
        D, F);
  if (!o.json_out && torch.available() && !torch_times(true)) fmt::print("{}\n\n", kNoTorchBf16);
  if (!o.json_out)
    fmt::print("{:<8} {:>7} {:>3} {:>11} | {:>9} {:>8} {:>8} {:>6} | {:>10} {:>8} | {:>9} {:>7}\n",
               "layer", "weights", "T", "kernels", "ms", "read GB", "GB/s", "of bw", "oneDNN ms",
               "x oneDNN", "torch ms", "x torch");
  for (const auto& decoded : decode_layers(o)) {
    // (Named, not a structured binding: clang's C++20 lambdas cannot capture those.)
    const std::string& layer = decoded.first;
    const FFNConfig& c = decoded.second;
    if (const auto skip = std::find_if(left_out.begin(), left_out.end(),
                                       [&](const auto& l) { return l.first == layer; });
        skip != left_out.end()) {
      if (!o.json_out) fmt::print("{:<8} left out: {}\n", layer, skip->second);
      continue;
    }
    const FFNConfig one = c.kind == FFNKind::moe ? expert_config(c) : c;  // one expert
    const std::int64_t w_in_elements = one.in_width() * D;
    const double params = static_cast<double>(count_params(c));
    note(fmt::format("bench: building the {} layer at {}/{} ({:.2f} G parameters)", layer, D, F,
                     params / 1e9));
    auto ffn = make_ffn(c, 1);
    for (DType w : {DType::f32, DType::bf16}) {
      ffn->set_inference_weights(w);
      for (std::int64_t t : {std::int64_t{1}, std::int64_t{8}}) {
        if (o.quick && t == 8) continue;
        check_stop();
        note(fmt::format("bench: decode {} {} T={}", layer, dtype_name(w), t));
        std::vector<std::vector<DecodeSpeed>> ours(isas.size());
        std::vector<double> theirs, bandwidths;
        const double part = o.budget / o.rounds;
        for (int round = 0; round < o.rounds; ++round) {
          // The bandwidth in the same rounds: on a shared machine it drifts with the rest.
          bandwidths.push_back(measure_read_bandwidth(o.bandwidth_mib << 20, part));
          for (std::size_t k = 0; k < isas.size(); ++k) {  // each kernel set in every round
            set_few_rows_isa(isas[k]);
            ours[k].push_back(measure_decode_speed(*ffn, t, part));
          }
          set_few_rows_isa(in_use);
          if (torch.available() && torch_times(w == DType::bf16))
            theirs.push_back(
                torch_seconds(torch, torch_request(c, t, "inference", Precision::f32, w, part)));
        }
        const double ts = rounds_median(theirs), bandwidth = rounds_median(bandwidths);
        for (std::size_t k = 0; k < isas.size(); ++k) {
          std::sort(ours[k].begin(), ours[k].end(), [](const DecodeSpeed& a, const DecodeSpeed& b) {
            return a.seconds < b.seconds;
          });
          const DecodeSpeed s = ours[k][ours[k].size() / 2];
          // Weights this large may not stream at t tokens here (few_rows_f32_max; bf16:
          // few_rows_bf16_max, by rows of a fixed shape for a dense layer, of an MoE's blocks).
          const bool streamed =
              w == DType::bf16 ? t <= few_rows_bf16_max(D, w_in_elements,
                                                        /*varying_rows=*/c.kind == FFNKind::moe)
                               : few_rows_fits(t, w_in_elements, Precision::f32);
          const std::string kernels = streamed ? std::string(enum_name(isas[k])) : "oneDNN";
          rows.push_back({{"layer", layer},
                          {"kernels", kernels},
                          {"d_model", D},
                          {"d_ff", F},
                          {"weights", dtype_name(w)},
                          {"tokens", t},
                          {"seconds", s.seconds},
                          {"bytes", s.bytes},
                          {"bytes_per_s", s.bytes_per_s},
                          {"read_bandwidth_bytes_per_s", bandwidth},
                          {"of_bandwidth", s.bytes_per_s / bandwidth},
                          // Above the bandwidth measured beside it: that measurement, not the
                          // layer, is off (a layer cannot read faster than memory delivers).
                          {"of_bandwidth_impossible", s.bytes_per_s > bandwidth},
                          {"onednn_seconds", s.bare_seconds},
                          {"onednn_weights", dtype_name(s.bare_weights)}});
          if (ts > 0) rows.back()["torch_seconds"] = ts;
          if (torch.available() && !torch_times(w == DType::bf16))
            rows.back()["torch_not_timed"] = kNoNativeBf16;
          if (!o.json_out)
            fmt::print(
                "{:<8} {:>7} {:>3} {:>11} | {:>9} {:>8.3f} {:>8.1f} {:>6} | {:>10} {:>7.2f}x | "
                "{:>9} {:>7}\n",
                layer, dtype_name(w), t, kernels, ms(s.seconds), s.bytes / 1e9, s.bytes_per_s / 1e9,
                s.bytes_per_s > bandwidth ? std::string("(>bw)")
                                          : fmt::format("{:.0f}%", 100 * s.bytes_per_s / bandwidth),
                ms(s.bare_seconds) + (s.bare_weights != w ? "*" : ""), s.bare_seconds / s.seconds,
                ts > 0 ? ms(ts) : "-", speedup(ts, s.seconds));
          std::fflush(stdout);
        }
      }
    }
    if (torch.available()) (void)torch.ask({{"free", true}});
  }
}

// bench's PyTorch column against PyTorch timed alone: for each variant and precision at the
// largest token count, a fresh PyTorch process (started now, after ffnlab's own work, with the
// same script, threads and settings) times the layer's forward+backward with the whole budget,
// after one untimed request;
// the two must agree within 10 %. Adds "torch_alone_forward_backward_s" and "torch_agrees" to
// those rows, and says so on stdout when they disagree.
void check_torch_column(const BenchOptions& o, const std::string& script, json& rows) {
  const std::int64_t D = o.shape[0], F = o.shape[1];
  const std::int64_t T = *std::max_element(o.tokens.begin(), o.tokens.end());
  for (json& row : rows) {
    if (row["tokens"] != T || !row.contains("torch_forward_backward_s")) continue;
    check_stop();
    const FFNConfig c = variant_config(row["variant"].get<std::string>(), D, F, true);
    const Precision p = parse_enum<Precision>(row["dtype"].get<std::string>());
    note(fmt::format("bench: PyTorch alone: {} {} T={}", row["variant"].get<std::string>(),
                     enum_name(p), T));
    TorchWorker alone(o.python, script, omp_get_max_threads(), o.torch_timeout);
    // One request untimed first: the table's PyTorch process has run the layer before its
    // rounds too (its allocator holds the buffers; a fresh process's first calls were slower).
    const json request = torch_request(c, T, "forward_backward", p, DType::f32, o.budget);
    if (torch_seconds(alone, request) <= 0) continue;
    const double s = torch_seconds(alone, request);
    if (s <= 0) continue;
    const double in_table = row["torch_forward_backward_s"].get<double>();
    // Within 10 % of the lone process's time, and the percentage printed is that same measure.
    const double off = in_table / s - 1.0;
    const bool agrees = std::abs(off) <= 0.10;
    row["torch_alone_forward_backward_s"] = s;
    row["torch_agrees"] = agrees;
    // Which way they disagree decides what it means: the table's PyTorch slower than alone makes
    // the table's 'x torch' flatter ffnlab; faster, the table's PyTorch was not held back (the
    // lone process is the slow one).
    const std::string verdict =
        agrees    ? fmt::format(" ({:+.0f} %: agree within 10 %)", 100 * off)
        : off > 0 ? fmt::format(
                        ": the table's PyTorch took {:.1f} % longer than PyTorch alone, so the "
                        "table's 'x torch' flatters ffnlab: it is not PyTorch at its best",
                        100 * off)
                  : fmt::format(
                        ": the table's PyTorch took {:.1f} % less time than PyTorch alone, so its "
                        "'x torch' does not flatter ffnlab",
                        -100 * off);
    if (!o.json_out)
      fmt::print("PyTorch alone, {} {} T={}: {} ms forward+backward against the table's {} ms{}\n",
                 row["variant"].get<std::string>(), enum_name(p), T, ms(s), ms(in_table), verdict);
  }
}

// The whole run into `out`; run_bench prints it (with --json).
void bench_into(const BenchOptions& o, json& out) {
  apply_threads(o.threads);
  const auto variants = variant_list(o.variants);
  const auto precisions = precision_list(o.dtypes);
  const auto& tokens = o.tokens;
  const auto routings = routing_list(o.routings);
  const auto kernels = kernel_list(o.kernel_sets);
  // A flag for a part that another flag leaves out means nothing: refused.
  const auto given = [&](const char* flag) { return o.given.count(flag) > 0; };
  for (const char* flag : {"--check-torch", "--python", "--torch-script", "--torch-timeout"})
    if (!o.torch && given(flag))
      throw UsageError(
          fmt::format("[bench] {}: concerns PyTorch, which --no-torch leaves out", flag));
  // A missing script is bad input (exit 1), found before the minutes of timing.
  if (o.torch && !o.torch_script.empty()) regular_file_size(o.torch_script, "bench");
  for (const char* flag : {"--kernels", "--decode-shape"})
    if (!o.decode && given(flag))
      throw UsageError(
          fmt::format("[bench] {}: concerns the decode table, which --no-decode skips", flag));
  if (routings.empty() && given("--sequence"))
    throw UsageError("[bench] --sequence: concerns the routing table, which --routings none skips");
  // A routing table asked for by name must have rows: a token count of whole sequences.
  if (given("--routings") && !routings.empty() &&
      std::none_of(tokens.begin(), tokens.end(), [&](auto t) { return t % o.sequence == 0; }))
    throw UsageError(fmt::format(
        "[bench] --routings: no token count of --tokens is a multiple of --sequence {}, so the "
        "routing table would be empty",
        o.sequence));

  // Every layer the tables build: the variants', and the routing table's MoE of each family.
  std::vector<std::pair<std::string, FFNConfig>> layers;
  for (const std::string& v : variants)
    layers.emplace_back(v, variant_config(v, o.shape[0], o.shape[1], true));
  for (const std::string& family : routings)
    layers.emplace_back(
        family, routing_family_config(variant_config("moe", o.shape[0], o.shape[1], true), family,
                                      o.sequence));
  check_layer_memory(layers, tokens);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (std::find(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(i), tokens[i]) !=
        tokens.begin() + static_cast<std::ptrdiff_t>(i))
      throw UsageError(fmt::format("[bench] --tokens: {} is listed twice", tokens[i]));
  // Far beyond any cache, so this is what memory delivers.
  const std::int64_t bandwidth_bytes = o.bandwidth_mib << 20;
  check_memory(static_cast<double>(bandwidth_bytes), "bench",
               fmt::format("--bandwidth-mib {}: the read bandwidth's buffer", o.bandwidth_mib));
  const auto decode_skipped = decode_left_out(o);
  const double bandwidth = measure_read_bandwidth(bandwidth_bytes, o.quick ? 0.25 : 1.0);
  const bool bf16_native = matmul_bf16_native();
  Peaks peaks;
  const PeakProbe f32_probe = measure_peak_flops(false, o.quick ? 0.05 : 0.3);
  const double probe = f32_probe.flops;
  const double nominal = nominal_peak_flops(omp_get_max_threads());
  // A probe far below what the cores reach at their named clock, or below what its own cores
  // reach at one thread's rate, measured a busy or shared machine: it is said so, and serves as
  // no denominator ("of peak" is then not reported).
  const bool holds = f32_probe.held() && nominal_peak_holds(probe, omp_get_max_threads());
  peaks.f32 = holds ? probe : 0;
  // The bf16 probe serves only when it held too (a busy stretch would inflate bf16's "of peak").
  std::optional<bool> bf16_held;                      // (none: the probe did not run)
  if (bf16_native && holds && !this_machine().amx) {  // AMX: no vector loop bounds its tiles
    const PeakProbe b = measure_peak_flops(true, o.quick ? 0.05 : 0.3);
    bf16_held = b.held();
    peaks.bf16 = *bf16_held ? b.flops : 0;
  } else {
    peaks.bf16 = bf16_native ? 0 : peaks.f32;
  }
  out["machine"] = {{"cpu", this_machine().describe()},
                    {"threads", omp_get_max_threads()},
                    {"read_bandwidth_bytes_per_s", bandwidth},
                    {"peak_f32_flops_per_s", peaks.f32},
                    {"peak_bf16_flops_per_s", peaks.bf16},
                    {"peak_probe_f32_flops_per_s", probe},
                    {"peak_probe_one_thread_f32_flops_per_s", f32_probe.one_thread},
                    {"peak_probe_cores", f32_probe.cores},
                    {"peak_probe_held", f32_probe.held()},
                    {"peak_probe_bf16_held", bf16_held ? json(*bf16_held) : json()},
                    {"nominal_f32_flops_per_s", nominal},
                    {"bf16_products", bf16_native ? "native" : "emulated"},
                    {"cpu_bf16", this_machine().bf16}};
  if (!f32_probe.held() && !o.json_out)
    fmt::print(
        "the peak probe measured {:.0f} GFLOP/s f32 on {} threads, below 75 % of what its {} "
        "cores reach at one thread's rate ({:.0f} GFLOP/s each): the machine gave them less than "
        "their cores for the while (another process, or a host sharing its cores), and 'of "
        "peak' is not reported\n",
        probe / 1e9, omp_get_max_threads(), f32_probe.cores, f32_probe.one_thread / 1e9);
  else if (!holds && !o.json_out)
    fmt::print(
        "the peak probe measured {:.0f} GFLOP/s f32, far below the {:.0f} that {} cores reach at "
        "the {:.0f} MHz /proc/cpuinfo names: the machine is busy, and 'of peak' is not "
        "reported\n",
        probe / 1e9, nominal / 1e9, omp_get_max_threads(), this_machine().mhz);
  out["budget_seconds"] = o.budget;
  if (!o.json_out)
    fmt::print(
        "ffnlab bench on {}: {} threads; memory read bandwidth {:.1f} GB/s (a parallel sum over "
        "{} MiB, median); {} {:.0f} GFLOP/s f32{}, {} (multiply-add loops in registers on "
        "every thread, the best call); bf16 products {}.\n",
        this_machine().describe(), omp_get_max_threads(), bandwidth / 1e9, bandwidth_bytes >> 20,
        holds ? "peak" : "peak probe (not held, above)", probe / 1e9,
        nominal > 0
            ? fmt::format(" ({:.0f} nominal at {:.0f} MHz)", nominal / 1e9, this_machine().mhz)
            : std::string(),
        peaks.bf16 > 0       ? fmt::format("{:.0f} bf16", peaks.bf16 / 1e9)
        : this_machine().amx ? std::string("bf16 not measured (AMX tiles outrun any vector loop)")
        : bf16_held == false
            ? std::string("bf16 not reported (its probe did not hold: a busy machine)")
            : std::string("bf16 not measured"),
        bf16_native ? "native (oneDNN)"
                    : "emulated: oneDNN has no bf16 product for this CPU, so bf16 rounds the "
                      "inputs and multiplies in f32 (same values, f32 speed)");
  const std::string script = o.torch_script.empty() ? default_torch_script() : o.torch_script;
  TorchWorker torch(o.torch ? o.python : "", o.torch ? script : "", omp_get_max_threads(),
                    o.torch_timeout);
  if (o.check_torch && !torch.available())  // before the tables, not after them
    throw Error("[bench] --check-torch: PyTorch did not start: " + torch.why_not());
  for (const auto& [layer, why] : decode_skipped) {
    out["decode_left_out"][layer] = why;
    if (!o.json_out) fmt::print("{}: left out of the decode table\n", why);
  }
  if (torch.available())
    out["torch"] = {{"version", torch.hello().torch},
                    {"threads", torch.hello().threads},
                    {"runtime", torch.hello().runtime}};
  else
    out["torch"] = {{"unavailable", o.torch ? torch.why_not() : "--no-torch"}};
  if (!o.json_out)
    fmt::print("PyTorch: {}\n",
               torch.available()
                   ? fmt::format("{} with {} threads, in alternating rounds; {}",
                                 torch.hello().torch, torch.hello().threads,
                                 torch.hello().runtime.empty() ? "runtime not reported"
                                                               : torch.hello().runtime)
                   : "not measured (" + (o.torch ? torch.why_not() : "--no-torch") + ")");
  // Each table appends its rows as they are measured, so that a stop or a failure keeps them.
  out["layers"] = json::array();
  if (!routings.empty()) out["routing"] = json::array();
  if (o.decode) out["decode"] = json::array();
  bench_layers(o, variants, precisions, tokens, torch, peaks, out["layers"]);
  if (!routings.empty()) bench_routing(o, routings, precisions, tokens, out["routing"]);
  if (o.decode) bench_decode(o, kernels, torch, decode_skipped, out["decode"]);
  if (o.check_torch) {  // (PyTorch may have left during the tables: past its timeout)
    if (!torch.available())
      throw Error("[bench] --check-torch: PyTorch left during the tables: " + torch.why_not());
    torch.stop("done");  // the check's PyTorch runs alone
    check_torch_column(o, script, out["layers"]);
  }
}

// With --json, what was measured reaches standard output whatever ends the run: a stop adds
// "interrupted", a failure after the first measurement "error" (then the exit status says it).
void run_bench(const BenchOptions& o) {
  InterruptGuard interrupts;  // Ctrl-C stops between measurements and ends PyTorch's process
  json out;
  // (A message that quotes bytes that are not UTF-8 - a path - keeps U+FFFD in their place.)
  const auto print = [&] { fmt::print("{}\n", json_text(out, 2)); };
  try {
    bench_into(o, out);
  } catch (const Interrupted& e) {
    if (o.json_out) {
      out["interrupted"] = e.what();
      print();
    }
    throw;
  } catch (const Error& e) {
    if (o.json_out && out.contains("machine")) {
      out["error"] = e.what();
      print();
    }
    throw;
  }
  if (o.json_out) print();
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand(
      "bench",
      "Speed of every FFN variant and MoE on this machine, f32 and bf16: inference and "
      "forward+backward at the tutorial's shape (d_model 512, d_ff 2048; --shape) for several "
      "token counts, as GFLOP/s and as a share of oneDNN's bare products of the same shapes and "
      "of the machine's peak (multiply-add loops, measured at the start); "
      "decode (one and eight tokens) of a 4096/14336 SwiGLU and an 8-expert MoE of it, as GB/s "
      "of weights read and as a share of the memory read bandwidth; every routing family on "
      "the MoE (--routings) against the bare products of the rows its experts ran; and "
      "PyTorch's time for the same layers when the --python interpreter has it, in alternating "
      "rounds. "
      "Everything is measured in the same run. Progress goes to stderr.");
  cmd->add_flag("--quick", o->quick,
                "a short run: T = 1, 8, 512 with a 0.05 s budget, decode at 2048/5632 and T = 1");
  cmd->add_flag("--json", o->json_out, "print the results as JSON instead of tables");
  cmd->add_option("--variants", o->variants,
                  "comma-separated variants (" + join_names(variant_names()) + "), or 'all'")
      ->capture_default_str();
  cmd->add_option("--dtypes", o->dtypes,
                  "comma-separated product precisions: f32, bf16 (bf16 products, f32 weights "
                  "kept; PyTorch's bf16 runs under autocast, and only on a CPU with native bf16)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "comma-separated token counts of the layer table")
      ->delimiter(',')
      ->check(int_in(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--shape", o->shape,
                  "d_model and d_ff of the layer table (the tutorial's shape; the MoE's 8 experts "
                  "are each d_ff wide)")
      ->delimiter(',')
      ->expected(2)
      ->check(int_in(1, 1 << 18))
      ->capture_default_str();
  cmd->add_option("--decode-shape", o->decode_shape, "d_model and d_ff of the decode table")
      ->delimiter(',')
      ->expected(2)
      ->check(int_in(1, 1 << 18))
      ->capture_default_str();
  cmd->add_flag_callback(
      "--no-decode", [o] { o->decode = false; }, "skip the decode table");
  cmd->add_option("--kernels", o->kernel_sets,
                  "comma-separated instruction sets of the few-token kernels the decode table "
                  "times side by side: portable, avx2, avx512, avx512_bf16 (default: the best this "
                  "CPU runs, the one in use)")
      ->delimiter(',');
  cmd->add_option("--routings", o->routings,
                  "comma-separated routing families of the routing table (" +
                      fmt::format("{}", fmt::join(routing_family_names(), ", ")) +
                      "), 'all', or 'none' for no table")
      ->capture_default_str();
  cmd->add_option("--sequence", o->sequence,
                  "tokens of one sequence in the routing table (expert choice and Soft MoE route "
                  "each on its own); token counts that are not multiples of it are left out")
      ->check(int_in(2, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--budget", o->budget,
                  "seconds of timing each timed quantity of a case gets (the layer's inference, "
                  "forward and forward+backward, the bare products, PyTorch's side), split over "
                  "--rounds; each is the median of its calls. A case takes several budgets "
                  "(0.05 with --quick)")
      ->check(real_in(0.001, 60))
      ->capture_default_str();
  cmd->add_flag_callback(
      "--no-torch", [o] { o->torch = false; }, "do not time PyTorch beside ffnlab");
  cmd->add_option("--python", o->python,
                  "the Python interpreter whose PyTorch times PyTorch's side (one that cannot "
                  "start or has no torch: the tables go on without PyTorch, and say why)")
      ->capture_default_str()
      ->check(named_path());
  cmd->add_option("--torch-script", o->torch_script,
                  "the PyTorch side (default: share/ffnlab/torch_ffn.py beside the program, or "
                  "bench/torch_ffn.py in the source tree)")
      ->check(named_path());
  cmd->add_flag("--check-torch", o->check_torch,
                "after the layer table, time PyTorch's forward+backward at the largest token "
                "count again in a process of its own and say whether it agrees with the table's "
                "PyTorch column within 10 %");
  cmd->add_option("--torch-timeout", o->torch_timeout,
                  "seconds PyTorch may take to start or to answer one request; past it, bench "
                  "ends PyTorch's process and goes on without it")
      ->check(real_in(0.1, 1e5))
      ->capture_default_str();
  cmd->add_option("--rounds", o->rounds,
                  "alternating ffnlab/PyTorch rounds per case: each side's time is the median "
                  "over them, and 'rounds' the range of the per-round ratios")
      ->check(int_in(1, 100))
      ->capture_default_str();
  cmd->add_option("--bandwidth-mib", o->bandwidth_mib,
                  "MiB of memory summed to measure the read bandwidth (256 with --quick)")
      ->check(int_in(16, 1 << 16))
      ->capture_default_str();
  add_threads_option(*cmd, o->threads);
  cmd->callback([o, cmd] {
    require_one_process("bench");
    BenchOptions run = *o;
    if (run.quick) {
      if (cmd->count("--tokens") == 0) run.tokens = {1, 8, 512};
      if (cmd->count("--decode-shape") == 0) run.decode_shape = {2048, 5632};
      if (cmd->count("--budget") == 0) run.budget = 0.05;
      if (cmd->count("--bandwidth-mib") == 0) run.bandwidth_mib = 256;
    }
    for (const CLI::Option* flag : cmd->get_options())
      if (flag->count() > 0 && !flag->get_lnames().empty())
        run.given.insert("--" + flag->get_lnames().front());
    run_bench(run);
  });
}

}  // namespace ffnlab::cli
