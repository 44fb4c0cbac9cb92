// Soft MoE (Puigcerver et al. 2024): no router Linear and no choice. Per sequence of S tokens,
//   L = norm(X)·(scale·norm(Φ))ᵀ [S, E·p],  D = softmax over tokens, C = softmax over slots,
//   X̄ = Dᵀ·X, expert e runs its p slots' rows of X̄ (all sequences' in one block), y = C·Ȳ.
// Parameters: gate.phi [E·p, D] (LeCun normal, as Soft MoE's code, vmoe), gate.scale [1] (1).
// Every expert runs every sequence's slots, so the experts do not split over ranks.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/moe/expert_stack.hpp"
#include "ffnlab/layers/parameters.hpp"
#include "ffnlab/ops/router.hpp"
#include "ffnlab/parallel/group.hpp"

namespace ffnlab {

class SoftMoE {
 public:
  explicit SoftMoE(const FFNConfig& layer) : layer_(layer) {}

  void declare(ParameterSet& params) const;
  void bind(ParameterSet& params);
  void init(std::mt19937_64& rng);

  // y [T, D] = the experts' part for x [T, D], sequences of `sequence` tokens (0: x is one),
  // through `experts`. r: what the layer's statistics read (every expert takes p slots of every
  // sequence; the dispatch's entropy and top weight), summed over `group` in training.
  void forward(Tensor& y, Routing& r, const Tensor& x, std::int64_t sequence, ExpertStack& experts,
               bool train, Precision precision, ProcessGroup* group);
  // dx [T, D] (overwritten) from dy; x: the training forward's input. Adds Φ's and the scale's
  // gradients, and the experts' (through `experts`).
  void backward(Tensor& dx, const Tensor& dy, const Tensor& x, ExpertStack& experts,
                Precision precision);

 private:
  // M = E·p slots, B sequences of S tokens (T = B·S).
  struct Cache {
    Tensor xn, phin;                    // [T, D] normalised tokens, [M, D] scale·normalised Φ
    std::vector<float> x_inv, phi_inv;  // [T], [M] 1/sqrt(|·|² + ε)
    Tensor dispatch, combine;           // [B, S, M] softmax over tokens, over slots
    Tensor slots_out;                   // [B, M, D] the experts' outputs per sequence and slot
    std::int64_t sequences = 0, sequence = 0;  // B, S
    std::vector<std::int64_t> offsets;         // [E + 1] expert e's rows: e·B·p
    // Backward workspaces.
    Tensor dslots, dlogits, ddispatch, dxn, dphin;  // [B, M, D], [B, S, M] ×2, [T, D], [M, D]
  };

  FFNConfig layer_;
  Tensor phi_, scale_, dphi_, dscale_;  // [M, D] gate.phi, [1] gate.scale, and their gradients
  Cache cache_;
};

}  // namespace ffnlab
