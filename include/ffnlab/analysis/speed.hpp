// Measured speed of an FFN layer, as matrix-product GFLOP/s and as a ratio to the bare oneDNN
// products of the same shapes timed in the same call ("of bare": what the layer loses to its
// elementwise passes and bookkeeping), so that the ratio holds on a shared machine where
// absolute times drift.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/lm_config.hpp"

namespace ffnlab {

// Median seconds per call of f over about `budget` seconds (at least 3 calls), after one
// warm-up call unless f is already warm.
double median_seconds(const std::function<void()>& f, double budget, bool warm_up = true);

// Measured in alternating rounds: each round times the layer and its bare products one after
// the other, so that load on the machine lands on both sides of a round's ratio; the times are
// medians over the rounds, the ratios medians of the rounds' ratios, with their spread.
struct LayerSpeed {
  double forward_s = 0, forward_backward_s = 0;            // median per call, T tokens
  double forward_gflops = 0, forward_backward_gflops = 0;  // matrix FLOPs (costs.hpp) / time
  double inference_s = 0, inference_gflops = 0;            // forward with train = false
  // Bare products of the same shapes: for a dense layer its own products; for MoE the products
  // of one expert over as many rows as the experts ran (experts_per_token·T: the same matrix
  // FLOPs as the routed experts). In bf16 they read bf16 operands, converted beforehand: the
  // products alone, without the conversions a layer does.
  double bare_forward_gflops = 0, bare_forward_backward_gflops = 0;
  // MoE: the FFN experts a token ran in the timed forwards, measured (top-p, ReLU routing, MoE++
  // and the routings that look at the whole sequence decide it per forward); the layer's matrix
  // FLOPs count as many.
  double experts_per_token = 0;
  int rounds = 0;
  // The layer's rate over its bare products' rate: the median of the rounds' ratios, and their
  // spread (interquartile_spread: the interquartile range over the median).
  double forward_of_bare = 0, forward_backward_of_bare = 0;
  double forward_of_bare_spread = 0, forward_backward_of_bare_spread = 0;
  // A ratio above kMaxOfBare, or a spread above kMaxSpread: the measurement, not the layer,
  // decided the number (a busy machine, or bare products that were not the limit they stand
  // for). Never a finding.
  bool noisy() const;
};
inline constexpr double kMaxOfBare = 1.05, kMaxSpread = 0.10;

// A layer's rate over its bare products as a table shows it: "97%"; "~100%" from 100 % to
// kMaxOfBare (a layer cannot beat its own products: the rates are equal within the timing's
// noise); "(>bare)" above, where the bare products were not the limit they stand for in that
// run (a measurement artefact, never a finding; JSON keeps the value and marks the row noisy).
std::string of_bare_text(double ratio);

// Times the training forward (which keeps activations), the inference forward and
// forward+backward of a layer built from `config` on T random tokens, and the bare products at
// the same precision, in one call.
// The one JSON form of a LayerSpeed (`ffnlab bench --json`, the study's results.json): its
// fields by their names, and "noisy".
nlohmann::ordered_json to_json(const LayerSpeed& speed);

// `budget` seconds per measurement in all, split over `rounds` alternating rounds (the first
// one warms every measurement up). `sequence`: the tokens hold sequences of this many (what
// expert choice and Soft MoE route each on its own; 0: one sequence).
LayerSpeed measure_layer_speed(const FFNConfig& config, std::int64_t tokens, double budget,
                               Precision precision = Precision::f32, int rounds = 7,
                               std::int64_t sequence = 0);

// The bare products of one training micro-batch of a Transformer LM of `config`: every weight
// product (attention's fused q/k/v and o projections, the FFN's — for MoE one expert's over
// experts_per_token·T rows, the router's (twice with noisy top-k; Soft MoE: its logits,
// dispatch and combine), MoE++'s gate map and the shared experts' — and the head) forward and
// backward (x·Wᵀ, dy·W, dyᵀ·x), and attention's batched score products (q·kᵀ, p·v and their four
// backward products), on `sequences` sequences of `seq` tokens, timed together. Their FLOPs are
// the model's matrix work for those tokens; `seconds` what the products alone take, so the
// step's time over it is the model's FLOP utilisation against its own shapes.
struct ModelProducts {
  double flops = 0;    // matrix FLOPs of one micro-batch, forward and backward
  double seconds = 0;  // median time of those products alone
  // MoE: the part of `flops` in the experts' products, at experts_per_token (the closed form;
  // an upper bound for the routings that decide it per token), so that a run can count its
  // work at the experts its tokens measured to take.
  double expert_flops = 0, experts_per_token = 0;
  // MoE: the FLOPs one token spends in one expert, over every layer (forward and backward), and
  // the tokens of the micro-batch: the experts' work at any measured experts per token.
  double expert_token_flops = 0, tokens = 0;
  double gflops() const { return seconds > 0 ? flops / seconds / 1e9 : 0; }
  // The matrix FLOPs of one micro-batch whose tokens took `measured` experts each (a dense model,
  // or measured < 0: `flops`). Counts the work done, never a ratio to the closed form (which
  // can be near 0: ReLU routing at a target sparsity near 1).
  double flops_at(double measured) const {
    if (expert_token_flops <= 0 || measured < 0) return flops;
    return flops - expert_flops + expert_token_flops * measured * tokens;
  }
};
// Model FLOP utilisation: the matrix work a step did per second against the bare products'
// rate of the same shapes; NaN where it was not measured (a rate of 0) or cannot be true (above
// 1: a step cannot outrun its own products, so the timing was disturbed). Never printed as a
// number then.
double flop_utilisation(double matrix_gflops, double bare_gflops);
// The numerator: the matrix work a training run's step did per second, in GFLOP/s: `bare`'s
// FLOPs of one micro-batch of `tokens` tokens (the experts' at the `experts_per_token` the run
// measured; < 0, or a dense model: bare's closed form) at `tokens_per_second`. Every front end
// that trains (ffnlab train, ffnlab.train, ffnlab evolve) reports utilisation through this.
double run_matrix_gflops(const ModelProducts& bare, double experts_per_token, double tokens,
                         double tokens_per_second);
// The seconds a training run spends timing them at start-up (ffnlab train, ffnlab.train).
inline constexpr double kBareProductsBudget = 0.25;
ModelProducts measure_model_products(const LMConfig& config, std::int64_t sequences,
                                     std::int64_t seq, Precision precision, double budget);
// The machine's memory read bandwidth in bytes/s: the median time of a parallel sum over
// `bytes` of memory (far larger than the caches), with the current OpenMP threads.
double measure_read_bandwidth(std::int64_t bytes, double budget);

// Inference (decode) of T tokens: the bytes it must read are the weights it uses — every one for
// a dense layer; for MoE the router, the experts the tokens chose and the shared experts — in
// the storage the layer reads (set_inference_weights). A few-row forward reads each once.
struct DecodeSpeed {
  double seconds = 0;               // median per inference forward
  double bytes = 0;                 // weight bytes that must be read
  double bytes_per_s = 0;           // bytes / seconds
  double bare_seconds = 0;          // the same products through oneDNN (M = T rows), on weights in
  DType bare_weights = DType::f32;  // the layer's storage: bf16 where products of it are native
};
DecodeSpeed measure_decode_speed(FeedForward& ffn, std::int64_t tokens, double budget);

}  // namespace ffnlab
