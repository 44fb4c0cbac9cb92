// ExpertStack: the routed experts of an MoE layer and their products. It takes the rows of the
// experts' tokens grouped by expert (expert e's block is rows [offsets[e], offsets[e+1]), the
// shape of MLX's gather_mm) and returns each row's output at the same place:
//
//   per expert e with n_e > 0 rows:  A_e = X_e·W_in,eᵀ + b_in,e,  H_e = mix(A_e),
//                                    O_e = H_e·W_out,eᵀ + b_out,e
//
// The weights are stacked, W_in [E, P, D] with P = F (plain) or 2F (glu: gate rows, then up
// rows) and W_out [E, D, F], under Hugging Face per-expert names (experts.{e}.gate_proj.weight,
// ...), so checkpoints load without conversion. Each block's kernels are chosen as DenseFFN
// chooses them (layers/ffn_products.hpp): in inference a block of a few rows streams its
// expert's weights once; otherwise one or a few oneDNN products (linear_forward's varying rows,
// never packed weights). Training with native bf16 products converts the rows and each
// computed expert's weights once for the forward's products and the backward's
// (ProductOperands). Expert parallel, the stack sends the rows to the ranks that hold
// their experts and brings the outputs back (ExpertExchange). An expert with no rows costs
// nothing. Reference: layers/ref/moe_ffn_ref.hpp.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ffnlab/layers/expert_exchange.hpp"
#include "ffnlab/layers/ffn_config.hpp"
#include "ffnlab/layers/ffn_products.hpp"
#include "ffnlab/layers/parameters.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/parallel/group.hpp"

namespace ffnlab {

class ExpertStack {
 public:
  // The rows the experts process, in expert order (R of them).
  struct Rows {
    Tensor xp, ap, hp, op;  // [R, D], [R, P], [R, F], [R, D]
    // Expert parallel: xp … op hold the rows this rank's experts process (from every rank);
    // these are this rank's own tokens' rows before dispatch and after combine.
    Tensor xp_local, op_local;  // [R, D]
    // When the products read bf16 copies (ProductOperands): xp [R, D] and hp [R, F] in bf16.
    Tensor xp16, hp16;
  };

  // The experts of the MoE layer `layer` that `held` names (count > 0).
  ExpertStack(const FFNConfig& layer, HeldExperts held);

  // The parameter names of expert e's input projections (gate first), in buffer order, and of
  // its output projection.
  static std::vector<std::string> in_names(const FFNConfig& layer, int e);
  static std::string out_name(const FFNConfig& layer, int e);
  // Declares the held experts' weights: every input weight, every input bias, every output
  // weight, every output bias (each kind adjacent, so that it binds as one stack).
  void declare(ParameterSet& params) const;
  void bind(ParameterSet& params);
  // torch.nn.Linear's initialisation, expert by expert: every expert's values are drawn (in,
  // out, in_bias, out_bias) and the held ones kept, so a rank's experts start as in the whole.
  void init(std::mt19937_64& rng);

  // Where the caller writes the input rows [R, D]: xp, or xp_local when `exchanged`.
  Tensor& input(bool exchanged) { return exchanged ? rows_.xp_local : rows_.xp; }
  // The experts on the input rows, expert e at [offsets[e], offsets[e+1]) for every expert of
  // the layer. `group` (expert parallel; null: none) first sends each row to the rank that holds
  // its expert, and brings the outputs back. Returns the output rows in the input's order.
  const Tensor& forward(const std::vector<std::int64_t>& offsets, ProcessGroup* group, bool train,
                        Precision precision);
  // The output rows of the last forward, in the input's order.
  const Tensor& output() const { return exchanged_ ? rows_.op_local : rows_.op; }
  // The backward of the last training forward from the output rows' gradients dop [R, D]:
  // returns the input rows' gradients (in the input's order; valid until the next backward of
  // any MoE layer) and adds the experts' parameter gradients.
  Tensor& backward(const Tensor& dop, const std::vector<std::int64_t>& offsets,
                   Precision precision);
  // The backward's check that the precision is still the forward's.
  void check_unchanged(Precision now) const { operands_.check_unchanged(now, "[moe]"); }

  // bf16: a copy of the held experts' weights that inference forwards read (f32: none).
  void set_inference_weights(DType dtype);
  bool has_inference_copy() const { return inference_.defined(); }
  // The stacked gradients [held, P, D], [held, D, F] (and the biases'), for the expert-parallel
  // all-reduce that leaves them out.
  std::vector<Tensor> grads() const;
  const Rows& rows() const { return rows_; }
  Rows& rows() { return rows_; }
  // Whether the last forward exchanged its rows with the other ranks.
  bool exchanged() const { return exchanged_; }

 private:
  void blocks_forward(const std::vector<std::int64_t>& offsets, int first_expert, bool train,
                      Precision precision);
  Tensor& blocks_backward(const Tensor& dop, const std::vector<std::int64_t>& offsets,
                          int first_expert, Precision precision);

  FFNConfig layer_;
  FFNConfig expert_;  // the dense FFN one expert is (expert_config)
  HeldExperts held_;  // w_in [held_.count, P, D] holds experts held_.first, ...
  std::int64_t in_width_;
  Tensor w_in_, w_in_bias_, w_out_, w_out_bias_;      // [E, P, D], [E, P], [E, D, F], [E, D]
  Tensor dw_in_, dw_in_bias_, dw_out_, dw_out_bias_;  // their gradients
  InferenceCopy inference_;  // bf16 copies of w_in_ and w_out_ (set_inference_weights)
  // What the products read (ops/linear.hpp); when it makes copies, bf16 weights of the experts a
  // forward computed, [n, P, D] and [n, D, F] for its n experts from first_expert, made by the
  // forward for its products and the backward's (rows_.xp16, rows_.hp16 too).
  ProductOperands operands_;
  Tensor w_in16_, w_out16_;
  Rows rows_;
  ExpertExchange exchange_;  // expert parallel: the all-to-alls of the last training forward
  bool exchanged_ = false;   // whether the last forward used them
  Tensor ep_dop_, ep_dxp_;   // expert parallel backward: rows here, rows back home
};

}  // namespace ffnlab
