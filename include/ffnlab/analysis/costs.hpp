// Closed-form costs of an FFN config: parameters, FLOPs per token and memory.
// The formulas are derived in docs/costs.md; tests/unit/test_costs.cpp checks the parameter count
// against instantiated layers.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>

#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/lm_config.hpp"

namespace ffnlab {

struct FlopCount {
  double matmul = 0;       // 2 per multiply-add of the matrix products
  double elementwise = 0;  // 1 per element per elementwise stage (bias add, activation, product)
  double total() const { return matmul + elementwise; }
};

struct MemoryBytes {
  double weights = 0;
  double grads = 0;
  double adam = 0;         // Adam's two moments, always f32
  double activations = 0;  // saved by a training forward for backward, for `tokens` tokens
  double total() const { return weights + grads + adam + activations; }
};

struct FFNCost {
  std::int64_t params = 0;
  std::int64_t active_params = 0;  // touched by one token (MoE: router + K experts + shared)
  FlopCount forward;               // per token
  FlopCount backward;              // per token (input and weight gradients)
  double saved_floats_per_token = 0;
  MemoryBytes f32;   // everything in f32
  MemoryBytes bf16;  // weights, grads, activations in bf16; Adam moments in f32
};

std::int64_t count_params(const FFNConfig& config);
// MoE: the FFN experts a token runs by the closed form (0 for a dense FFN): top_k (for top-p
// routing and MoE++'s zero-computation experts an upper bound), ReLU routing's target mean,
// expert choice's c·k, Soft MoE's E·slots/S over sequences of S = `sequence` tokens.
double experts_per_token(const FFNConfig& config, std::int64_t sequence);
// Per token, at experts_per_token(config, tokens): `tokens` is the activations' batch, and for
// Soft MoE also its sequence.
FFNCost ffn_cost(const FFNConfig& config, std::int64_t tokens);

// The one JSON form of an FFNCost (`ffnlab params --json`, the study's results.json and
// ffnlab.params() in Python): {"params", "active_params", "flops_per_token": {"forward_matmul",
// "forward_elementwise", "backward_matmul", "backward_elementwise"}, "saved_floats_per_token",
// "memory_bytes": {"f32"|"bf16": {"weights", "grads", "adam", "activations", "total"}}}.
nlohmann::ordered_json to_json(const FFNCost& cost);

// Equal budgets. The width (a multiple of 8, at least 8) that brings the parameters of `config`
// (with `active`: its active parameters) closest to `target`; for MoE it sets the experts'
// width. The one implementation of "d_ff at equal parameters".
FFNConfig match_params(FFNConfig config, std::int64_t target, bool active = false);
// The d_ff a config gets when none is given: 4·D for the plain and multi-branch FFNs and MoE's
// experts; for the GLU kinds, the width at the parameters of the plain FFN of 4·D with the same
// bias setting (about 8/3·D), so that a default GLU costs what a default ReLU FFN costs.
std::int64_t default_d_ff(const FFNConfig& config);

// The load-balancing coefficient a trained MoE gets unless told otherwise (Switch, Mixtral):
// `ffnlab train`'s --aux-coef default, ffnlab.TransformerLM(variant=)'s and the study's.
inline constexpr float kTrainAuxCoef = 0.01f;

// The FFN of an LM built by variant name, as `ffnlab train --variant V [--d-ff F] [--no-bias]`
// and ffnlab.TransformerLM(variant=V, d_ff=F) build it: d_ff 0 is the variant's default width
// (default_d_ff), and an MoE (top-k softmax routing; other routings bring their own defaults)
// carries the load-balancing loss at kTrainAuxCoef. The study's equal-parameter layers are
// study::study_ffn.
FFNConfig train_ffn(std::string_view variant, std::int64_t d_model, std::int64_t d_ff = 0,
                    bool bias = true);

// The tokens a cost is counted for unless told (activation memory): `ffnlab params --tokens`'s
// default and ffnlab.params'.
inline constexpr std::int64_t kCostTokens = 8;

// A whole Transformer (LMConfig), per token of a forward pass over sequences of `seq` tokens:
// where its parameters and its FLOPs are. FLOPs count matrix products (2 per multiply-add) and
// elementwise operations alike. Attention: q/k/v/o projections 8·D² (+ 4·D bias), scores and
// weighted sum 4·S·D (the full S×S product, as computed; a causal model needs half), softmax
// 3·H·S. Norms 5·D (LayerNorm) or 4·D (RMSNorm), residual adds 2·D per block. The LM head
// 2·D·V + 3·V. `with_embeddings` = false counts the blocks only (the tutorial's encoder has none).
struct TransformerCost {
  std::int64_t params = 0;
  std::int64_t ffn_params = 0, attention_params = 0, norm_params = 0;
  std::int64_t embedding_params = 0;  // token and learned position tables, untied head
  double forward_flops = 0;           // per token
  double ffn_forward_flops = 0, attention_forward_flops = 0, head_forward_flops = 0;
};
TransformerCost transformer_cost(const LMConfig& config, std::int64_t seq,
                                 bool with_embeddings = true);
// The parameters of a model whose MoE layers hold `experts` of their experts each (an
// expert-parallel rank's own experts; TransformerLM's `held`): transformer_cost's params
// without the other experts'.
std::int64_t held_params(const LMConfig& config, int experts);
// Its JSON form: the counts, and the FFN's shares of the parameters and of the FLOPs.
nlohmann::ordered_json to_json(const TransformerCost& cost);

}  // namespace ffnlab
