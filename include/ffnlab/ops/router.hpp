// The MoE router after its Linear: scores, (group-limited) top-k selection, combine weights,
// capacity and the permutation into per-expert blocks, the balancing and z losses, and the
// backward of all of it into the logits. docs/moe.md states every formula.
// Reference: layers/ref/moe_ffn_ref.hpp (an independent, sort-based implementation).
#pragma once

#include <cstdint>
#include <vector>

#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab {

// What the router decided for T tokens, and what its backward needs.
struct Routing {
  std::int64_t tokens = 0;
  int experts = 0, k = 0;
  std::vector<float> probs;           // [T, E] softmax(logits): balance loss, z-loss, statistics
  std::vector<float> scores;          // [T, E] softmax or sigmoid of the logits
  std::vector<float> lse;             // [T]    logsumexp(logits)
  std::vector<std::int32_t> expert;   // [T, k] chosen experts, best first
  std::vector<float> raw;             // [T, k] chosen scores before normalisation and scaling
  std::vector<float> weight;          // [T, k] combine weights
  std::vector<std::int64_t> slot;     // [T, k] row in the permuted buffer, -1 when dropped
  std::vector<std::int64_t> offsets;  // [E + 1] expert blocks in the permuted buffer
  std::vector<std::int64_t> token_of_row;  // [kept] token of each permuted row
  std::vector<std::int64_t> load;          // [E] assignments before capacity
  std::vector<std::int64_t> first;         // [E] tokens whose first choice is e
  std::int64_t capacity = 0;               // per expert; 0: dropless
  double balance_loss = 0, z_loss = 0, entropy = 0, top1_prob = 0;

  std::int64_t kept() const { return offsets.empty() ? 0 : offsets.back(); }
  std::int64_t rows_of(int e) const { return offsets[e + 1] - offsets[e]; }
};

// Scores, selection and combine weights from logits [T, E]. `selection_bias` [E] (null: none)
// is added to the scores for the choice only (aux-loss-free balancing). Also computes the
// balance loss, the z-loss, the entropy and the top-1 probability.
void route(Routing& r, const Tensor& logits, const float* selection_bias, const MoEConfig& m);

// Capacity (dropping by m.drop) and the layout of the permuted buffer: each expert's kept
// assignments are contiguous, in token order.
void assign_rows(Routing& r, const MoEConfig& m);

// dlogits [T, E] (overwritten) from dweight [T, k], the loss gradient of the combine weights
// (zero for dropped assignments), plus aux_scale·(aux_coef·∂balance + z_coef·∂z)/∂logits.
void route_backward(Tensor& dlogits, const Routing& r, const float* dweight, const MoEConfig& m,
                    float aux_scale);

}  // namespace ffnlab
