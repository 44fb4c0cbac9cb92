// Layer speed against the bare products of the same shapes.
#include "ffnlab/analysis/speed.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "ffnlab/layers/moe/routing_family.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <nlohmann/json.hpp>

#include "check.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/analysis/stats.hpp"
#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/layers/parameters.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/matmul.hpp"

namespace ffnlab {

namespace {

// A bare product's operand: N(0, 1) values, in bf16 for a bf16 product (converted here, once:
// a training layer's products read bf16 operands it converted once, not f32 ones converted on
// every call).
Tensor product_input(Shape shape, std::uint64_t seed, Precision precision) {
  const Tensor t = random_normal(std::move(shape), seed);
  return precision == Precision::bf16 ? t.to(DType::bf16) : t;
}

}  // namespace

double median_seconds(const std::function<void()>& f, double budget, bool warm_up) {
  using clock = std::chrono::steady_clock;
  if (warm_up) f();
  std::vector<double> times;
  const auto start = clock::now();
  while (times.size() < 3 ||
         (std::chrono::duration<double>(clock::now() - start).count() < budget &&
          times.size() < 1000)) {
    const auto t0 = clock::now();
    f();
    times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  return median(std::move(times));
}

std::string of_bare_text(double ratio) {
  if (ratio > kMaxOfBare) return "(>bare)";
  return ratio > 1.0 ? std::string("~100%") : fmt::format("{:.0f}%", 100 * ratio);
}

bool LayerSpeed::noisy() const {
  return forward_of_bare > kMaxOfBare || forward_backward_of_bare > kMaxOfBare ||
         forward_of_bare_spread > kMaxSpread || forward_backward_of_bare_spread > kMaxSpread;
}

nlohmann::ordered_json to_json(const LayerSpeed& s) {
  return {{"inference_s", s.inference_s},
          {"inference_gflops", s.inference_gflops},
          {"forward_s", s.forward_s},
          {"forward_gflops", s.forward_gflops},
          {"forward_backward_s", s.forward_backward_s},
          {"forward_backward_gflops", s.forward_backward_gflops},
          {"bare_forward_gflops", s.bare_forward_gflops},
          {"bare_forward_backward_gflops", s.bare_forward_backward_gflops},
          {"experts_per_token", s.experts_per_token},
          {"rounds", s.rounds},
          {"forward_of_bare", s.forward_of_bare},
          {"forward_backward_of_bare", s.forward_backward_of_bare},
          {"forward_of_bare_spread", s.forward_of_bare_spread},
          {"forward_backward_of_bare_spread", s.forward_backward_of_bare_spread},
          {"noisy", s.noisy()}};
}

LayerSpeed measure_layer_speed(const FFNConfig& config, std::int64_t tokens, double budget,
                               Precision precision, int rounds, std::int64_t sequence) {
  check(tokens > 0 && budget > 0 && rounds > 0 && sequence >= 0,
        "[speed] tokens = {}, budget = {} and rounds = {} must be positive (sequence = {} not "
        "negative)",
        tokens, budget, rounds, sequence);
  const std::int64_t T = tokens, D = config.d_model, S = sequence > 0 ? sequence : T;
  auto ffn = make_ffn(config, 1);
  ffn->set_precision(precision);
  ffn->context().sequence = sequence;
  // Byte ids, a fixed pseudo-random sequence (hash routing chooses by them; others ignore them).
  std::vector<std::int32_t> ids(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) ids[t] = static_cast<std::int32_t>((t * 131 + 7) % 256);
  ffn->context().token_ids = ids.data();
  ffn->context().first_layer = true;  // timed as a lone layer (MoE++: without G·W_gᵀ)
  const Tensor x = random_normal({T, D}, 2), dy = random_normal({T, D}, 3);
  Tensor y, dx;

  // MoE: the experts a token runs, measured on the input every timed forward sees; the closed
  // form's count (costs.hpp) gives way to it in the FLOPs.
  const bool moe = config.kind == FFNKind::moe;
  const FFNConfig dense = moe ? expert_config(config) : config;
  double K = 0, K_closed = 0;
  if (moe) {
    ffn->forward(y, x, /*train=*/true);
    // The rows the experts ran: kept assignments (a capacity drops some), or Soft MoE's slots.
    std::int64_t rows = 0;
    for (auto n : ffn->stats().tokens_per_expert) rows += n;
    K = static_cast<double>(rows) / static_cast<double>(T);
    K_closed = experts_per_token(config, S);
  }
  // The bare products: rows R = T (dense) or K·T (MoE: K experts' worth of rows).
  const std::int64_t R =
      moe ? std::max<std::int64_t>(1, std::llround(K * static_cast<double>(T))) : T;
  const std::int64_t P = dense.in_width(), F = dense.d_ff;
  // The bare products read their operands as a product at this precision does at best: bf16
  // products read bf16 tensors (converted here, once), not f32 ones converted on every call.
  auto operand = [&](Shape shape, std::uint64_t seed) {
    return product_input(std::move(shape), seed, precision);
  };
  const Tensor xr = operand({R, D}, 4), dyr = operand({R, D}, 5), a = operand({R, P}, 6),
               h = operand({R, F}, 7), w_in = operand({P, D}, 8), w_out = operand({D, F}, 9);
  Tensor a_out({R, P}), h_out({R, F}), out({R, D}), dw_in({P, D}), dw_out({D, F});
  MatmulOptions plain;
  plain.precision = precision;
  MatmulOptions acc = plain;
  acc.accumulate = true;
  // A dense layer at many rows reads its weights packed (packs_weights): so do its bare
  // products, packed here once (the layer packs on every step, inside its time). An MoE's
  // expert blocks vary in rows and read them plain.
  const bool pack = !moe && packs_weights(R, precision);
  PackedWeights in_fwd, out_fwd, out_dx, in_dx;
  if (pack) {
    in_fwd.pack(w_in, Trans::yes, R, plain);
    out_fwd.pack(w_out, Trans::yes, R, plain);
    out_dx.pack(w_out, Trans::no, R, plain);
    in_dx.pack(w_in, Trans::no, R, plain);
  }
  const auto weight_product = [&](Tensor& c, const Tensor& a, const Tensor& w, Trans tw,
                                  const PackedWeights& packed) {
    if (pack)
      matmul(c, a, packed, plain);
    else
      matmul(c, a, Trans::no, w, tw, plain);
  };

  const FFNCost cost = ffn_cost(config, S);
  const FFNCost one = ffn_cost(dense, 1);  // one expert (MoE)
  const double flops_f =
      (cost.forward.matmul + (K - K_closed) * one.forward.matmul) * static_cast<double>(T);
  const double flops_b =
      (cost.backward.matmul + (K - K_closed) * one.backward.matmul) * static_cast<double>(T);
  // The bare products do the layer's matrix FLOPs less the router's (MoE), which are small.
  const FFNCost bare = ffn_cost(dense, R);
  const double bare_f = bare.forward.matmul * static_cast<double>(R);
  const double bare_b = bare.backward.matmul * static_cast<double>(R);

  const double each = budget / rounds;
  std::vector<double> inf, fwd, fwdbwd, mm_fwd, mm_bwd, of_f, of_fb;
  for (int r = 0; r < rounds; ++r) {
    const bool cold = r == 0;
    inf.push_back(median_seconds([&] { ffn->forward(y, x, false); }, each, cold));
    fwd.push_back(median_seconds([&] { ffn->forward(y, x, true); }, each, cold));
    fwdbwd.push_back(median_seconds(
        [&] {
          ffn->forward(y, x, true);
          ffn->backward(dx, dy);
        },
        each, cold));
    mm_fwd.push_back(median_seconds(
        [&] {
          weight_product(a_out, xr, w_in, Trans::yes, in_fwd);
          weight_product(out, h, w_out, Trans::yes, out_fwd);
        },
        each, cold));
    mm_bwd.push_back(median_seconds(
        [&] {
          weight_product(h_out, dyr, w_out, Trans::no, out_dx);
          matmul(dw_out, dyr, Trans::yes, h, Trans::no, acc);
          weight_product(out, a, w_in, Trans::no, in_dx);
          matmul(dw_in, a, Trans::yes, xr, Trans::no, acc);
        },
        each, cold));
    // This round's ratios: the layer's rate over the bare products' rate, timed together.
    of_f.push_back((flops_f / fwd.back()) / (bare_f / mm_fwd.back()));
    of_fb.push_back(((flops_f + flops_b) / fwdbwd.back()) /
                    ((bare_f + bare_b) / (mm_fwd.back() + mm_bwd.back())));
  }
  LayerSpeed s;
  s.rounds = rounds;
  s.experts_per_token = K;
  s.inference_s = median(inf);
  s.forward_s = median(fwd);
  s.forward_backward_s = median(fwdbwd);
  s.forward_gflops = flops_f / s.forward_s / 1e9;
  s.inference_gflops = flops_f / s.inference_s / 1e9;
  s.forward_backward_gflops = (flops_f + flops_b) / s.forward_backward_s / 1e9;
  s.bare_forward_gflops = bare_f / median(mm_fwd) / 1e9;
  std::vector<double> mm_fb;
  for (int r = 0; r < rounds; ++r) mm_fb.push_back(mm_fwd[r] + mm_bwd[r]);
  s.bare_forward_backward_gflops = (bare_f + bare_b) / median(mm_fb) / 1e9;
  s.forward_of_bare = median(of_f);
  s.forward_backward_of_bare = median(of_fb);
  s.forward_of_bare_spread = interquartile_spread(of_f);
  s.forward_backward_of_bare_spread = interquartile_spread(of_fb);
  return s;
}

namespace {

// Σ of n floats (n a multiple of 64) with 8 independent vector sums, so that the loop is bound by
// memory, not by the latency of the additions.
float stream_sum(const float* p, std::int64_t n) {
#if defined(__AVX2__)
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < n; i += 64)
    for (int u = 0; u < 8; ++u) acc[u] = _mm256_add_ps(acc[u], _mm256_loadu_ps(p + i + 8 * u));
  for (int u = 1; u < 8; ++u) acc[0] = _mm256_add_ps(acc[0], acc[u]);
  float lanes[8];
  _mm256_storeu_ps(lanes, acc[0]);
  float total = 0.0f;
  for (float l : lanes) total += l;
  return total;
#else
  float lanes[64] = {};
  for (std::int64_t i = 0; i < n; i += 64)
#pragma omp simd
    for (int l = 0; l < 64; ++l) lanes[l] += p[i + l];
  float total = 0.0f;
  for (float l : lanes) total += l;
  return total;
#endif
}

}  // namespace

ModelProducts measure_model_products(const LMConfig& c, std::int64_t sequences, std::int64_t seq,
                                     Precision precision, double budget) {
  check(sequences > 0 && seq > 0 && budget > 0,
        "[speed] sequences = {}, seq = {} and budget = {} must be positive", sequences, seq,
        budget);
  const std::int64_t T = sequences * seq, D = c.d_model, H = c.heads, hd = D / H;
  // One weight product y[rows, out] = x[rows, in]·W[out, in]ᵀ with its backward (dy = g). In
  // bf16, x, W and g are bf16, converted beforehand, as a training layer's products read them
  // (ProductOperands: converted once per layer); the attention products below convert per call,
  // as attention_forward does. The weights of the layers that pack them at this many rows
  // (packs_weights: attention's projections, a dense FFN, a shared expert, the head) are packed
  // here once, as those layers pack them on every step; an MoE's experts and router read them
  // plain, as the layer does.
  struct Product {
    Tensor x, w, g, y, dw, dx;
    double flops;
    PackedWeights forward, backward;
  };
  std::uint64_t seed = 11;
  const auto operand = [&](Shape shape) {
    return product_input(std::move(shape), seed++, precision);
  };
  MatmulOptions plain;
  plain.precision = precision;
  MatmulOptions acc = plain;
  acc.accumulate = true;
  const auto product = [&](std::int64_t rows, std::int64_t in, std::int64_t out,
                           bool packable = false) {
    rows = std::max<std::int64_t>(1, rows);
    Product m{operand({rows, in}),
              operand({out, in}),
              operand({rows, out}),
              Tensor({rows, out}),
              Tensor({out, in}),
              Tensor({rows, in}),
              6.0 * static_cast<double>(rows) * static_cast<double>(in) * static_cast<double>(out),
              {},
              {}};
    if (packable && packs_weights(rows, precision)) {
      m.forward.pack(m.w, Trans::yes, rows, plain);
      m.backward.pack(m.w, Trans::no, rows, plain);
    }
    return m;
  };
  std::vector<Product> block;  // one block's products
  block.push_back(product(T, D, 3 * D, true));
  block.push_back(product(T, D, D, true));
  const FFNConfig& f = c.ffn;
  double expert_flops = 0, K = 0;
  if (f.kind == FFNKind::moe) {
    const MoEConfig& m = f.moe;
    const FFNConfig e = expert_config(f);
    K = experts_per_token(f, seq);
    const auto rows = static_cast<std::int64_t>(std::llround(K * static_cast<double>(T)));
    block.push_back(product(rows, D, e.in_width()));
    block.push_back(product(rows, e.d_ff, D));
    expert_flops = block[block.size() - 2].flops + block.back().flops;
    if (routing_family(m.routing).own_path) {  // logits, dispatch and combine against E·p slots
      for (int i = 0; i < 3; ++i) block.push_back(product(T, D, m.num_experts * m.slots));
    } else {
      if (routing_family(m.routing).router_linear)
        block.push_back(product(T, D, m.routed_experts()));
      if (m.noisy_topk) block.push_back(product(T, D, m.routed_experts()));
      if (m.gating_residual) block.push_back(product(T, m.routed_experts(), m.routed_experts()));
    }
    if (f.moe.num_shared > 0) {
      const FFNConfig s = expert_config(f, /*shared=*/true);
      block.push_back(product(T, D, s.in_width(), true));
      block.push_back(product(T, s.d_ff, D, true));
    }
  } else {
    block.push_back(product(T, D, f.in_width(), true));
    block.push_back(product(T, f.d_ff, D, true));
  }
  Product head = product(T, D, c.vocab, true);
  // Attention's score products, batched over sequences × heads.
  const std::int64_t BH = sequences * H;
  const Tensor q = random_normal({BH, seq, hd}, seed++), k = random_normal({BH, seq, hd}, seed++),
               v = random_normal({BH, seq, hd}, seed++),
               dout = random_normal({BH, seq, hd}, seed++);
  Tensor p({BH, seq, seq}), dp({BH, seq, seq}), o({BH, seq, hd}), dq({BH, seq, hd}),
      dk({BH, seq, hd}), dv({BH, seq, hd});
  const double score_flops =
      12.0 * static_cast<double>(T) * static_cast<double>(seq) * static_cast<double>(D);

  const auto run = [&](Product& m) {
    if (m.forward.packed()) {
      matmul(m.y, m.x, m.forward, plain);
      matmul(m.dx, m.g, m.backward, plain);
    } else {
      matmul(m.y, m.x, Trans::no, m.w, Trans::yes, plain);
      matmul(m.dx, m.g, Trans::no, m.w, Trans::no, plain);
    }
    matmul(m.dw, m.g, Trans::yes, m.x, Trans::no, acc);
  };
  const auto run_block = [&] {
    for (Product& m : block) run(m);
    matmul(p, q, Trans::no, k, Trans::yes, plain);
    matmul(o, p, Trans::no, v, Trans::no, plain);
    matmul(dp, dout, Trans::no, v, Trans::yes, plain);
    matmul(dv, p, Trans::yes, dout, Trans::no, plain);
    matmul(dq, dp, Trans::no, k, Trans::no, plain);
    matmul(dk, dp, Trans::yes, q, Trans::no, plain);
  };
  double block_flops = score_flops;
  for (const Product& m : block) block_flops += m.flops;
  const double L = static_cast<double>(c.layers);
  const double t_block = median_seconds(run_block, budget * L / (L + 1));
  const double t_head = median_seconds([&] { run(head); }, budget / (L + 1));
  ModelProducts out{L * block_flops + head.flops, L * t_block + t_head, L * expert_flops, K};
  if (f.kind == FFNKind::moe) {
    const FFNConfig e = expert_config(f);
    out.expert_token_flops =
        L * 6.0 * static_cast<double>(D) * static_cast<double>(e.in_width() + e.d_ff);
    out.tokens = static_cast<double>(T);
  }
  return out;
}

double flop_utilisation(double matrix_gflops, double bare_gflops) {
  if (!(bare_gflops > 0) || !(matrix_gflops > 0)) return std::nan("");
  const double u = matrix_gflops / bare_gflops;
  return u <= 1.0 ? u : std::nan("");
}

double run_matrix_gflops(const ModelProducts& bare, double experts_per_token, double tokens,
                         double tokens_per_second) {
  return bare.flops_at(experts_per_token) / tokens * tokens_per_second / 1e9;
}

double measure_read_bandwidth(std::int64_t bytes, double budget) {
  constexpr std::int64_t kBlock = 1 << 14;  // floats per work item
  const std::int64_t blocks = std::max<std::int64_t>(1, bytes / 4 / kBlock), n = blocks * kBlock;
  std::vector<float> buffer(static_cast<std::size_t>(n));
  float* data = buffer.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) data[i] = 1.0f;  // first touch by the reading threads
  volatile float sink = 0.0f;
  const double seconds = median_seconds(
      [&] {
        float total = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : total)
        for (std::int64_t b = 0; b < blocks; ++b) total += stream_sum(data + b * kBlock, kBlock);
        sink = total;
      },
      budget);
  (void)sink;
  return static_cast<double>(n) * 4.0 / seconds;
}

DecodeSpeed measure_decode_speed(FeedForward& ffn, std::int64_t tokens, double budget) {
  const FFNConfig& c = ffn.config();
  const std::int64_t T = tokens, D = c.d_model;
  check(T > 0 && budget > 0, "[speed] tokens = {} and budget = {} must be positive", T, budget);
  const Tensor x = random_normal({T, D}, 2);
  Tensor y;
  DecodeSpeed s;
  s.seconds = median_seconds([&] { ffn.forward(y, x, false); }, budget);

  // Weight bytes read: matrices in the inference storage, biases and the router in f32.
  const double wsize = static_cast<double>(dtype_size(ffn.inference_weights()));
  const bool moe = c.kind == FFNKind::moe;
  const FFNConfig dense = moe ? expert_config(c) : c;
  const double P = static_cast<double>(dense.in_width()), F = static_cast<double>(dense.d_ff);
  const double matrices = (P * D + D * F) * wsize, biases = c.bias ? (P + D) * 4.0 : 0.0;
  std::int64_t experts_read = 1;
  if (moe) {
    const auto st = ffn.stats();  // experts with rows in the last forward
    experts_read = 0;
    for (auto n : st.tokens_per_expert) experts_read += n > 0;
    s.bytes += static_cast<double>(c.moe.num_experts) * D * 4.0;  // the router
    if (c.moe.num_shared > 0) {
      const FFNConfig sh = expert_config(c, /*shared=*/true);
      s.bytes +=
          (static_cast<double>(sh.in_width()) * D + D * static_cast<double>(sh.d_ff)) * wsize +
          (c.bias ? (static_cast<double>(sh.in_width()) + D) * 4.0 : 0.0);
    }
  }
  s.bytes += static_cast<double>(experts_read) * (matrices + biases);
  s.bytes_per_s = s.bytes / s.seconds;

  // oneDNN's products over weights of the same storage, T rows (for MoE, per expert read): bf16
  // weights in bf16 products where this CPU has them (the operands converted beforehand, the
  // products alone), f32 products on f32 weights otherwise. A bf16 layer against f32 products
  // would be credited for reading half the bytes.
  s.bare_weights =
      ffn.inference_weights() == DType::bf16 && matmul_bf16_native() ? DType::bf16 : DType::f32;
  MatmulOptions o;
  o.precision = s.bare_weights == DType::bf16 ? Precision::bf16 : Precision::f32;
  Tensor w_in({dense.in_width(), D}), w_out({D, dense.d_ff}), a({T, dense.in_width()}),
      h({T, dense.d_ff}), out({T, D});
  Tensor xs = x;
  if (s.bare_weights == DType::bf16)
    w_in = w_in.to(DType::bf16), w_out = w_out.to(DType::bf16), h = h.to(DType::bf16),
    xs = x.to(DType::bf16);
  s.bare_seconds =
      static_cast<double>(experts_read) * median_seconds(
                                              [&] {
                                                matmul(a, xs, Trans::no, w_in, Trans::yes, o);
                                                matmul(out, h, Trans::no, w_out, Trans::yes, o);
                                              },
                                              budget);
  return s;
}

}  // namespace ffnlab
