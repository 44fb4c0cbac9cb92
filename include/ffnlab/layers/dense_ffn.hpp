// DenseFFN: the plain FFN, the GLU family (both layouts) and the multi-branch gated FFN.
//
// All three are  y = W_out · mix(W_in·x + b_in) + b_out  with
//   plain:         W_in = up_proj [F, D],               mix(a) = act(a)
//   glu:           W_in = [gate_proj; up_proj] [2F, D], mix(a) = act(g) ⊙ u          (ops/glu)
//   multi_branch:  W_in = [G_0; V_0; G_1; ...] [2nF, D], mix(a) = Σ_b act(g_b) ⊙ u_b
// The projections that form W_in are declared next to each other in the parameter buffer, so
// W_in is one view and the input side is one matrix product whatever the layout.
#pragma once

#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/layers/ffn_products.hpp"
#include "ffnlab/ops/linear.hpp"

namespace ffnlab {

class DenseFFN final : public FeedForward {
 public:
  DenseFFN(const FFNConfig& config, std::uint64_t seed);

  const FFNConfig& config() const override { return config_; }
  void forward(Tensor& y, const Tensor& x, bool train) override;
  void backward(Tensor& dx, const Tensor& dy) override;
  ParameterSet& parameters() override { return params_; }
  FFNStats stats() const override;
  void set_inference_weights(DType dtype) override;

  std::int64_t in_width() const { return in_width_; }  // P
  const Tensor& hidden() const override { return h_; }
  // The names of the input projections in buffer order, and of the output projection.
  static std::vector<std::string> in_names(const FFNConfig& config);
  static std::string out_name(const FFNConfig& config);

 private:
  void bind_parameters() override;
  void finish_forward(const Tensor& x, bool train);  // what backward reads, once forward is done

  FFNConfig config_;
  std::int64_t in_width_;  // P = F, 2F or 2nF
  int branches_;           // 0 for plain
  ParameterSet params_;
  Tensor w_in_, b_in_;    // [P, D], [P]   (b_in_ undefined without bias)
  Tensor w_out_, b_out_;  // [D, F], [D]
  Tensor dw_in_, db_in_, dw_out_, db_out_;
  InferenceCopy inference_;  // bf16 copies of w_in_ and w_out_ (set_inference_weights)

  // Saved by a training forward, reused as workspaces (resized only when T grows).
  Tensor x_;  // [T, D] the caller's input (a view)
  Tensor a_;  // [T, P] pre-activation
  Tensor h_;  // [T, F] mixed hidden activation
  // What the products read (ops/linear.hpp); when it keeps copies, bf16 x [T, D], h [T, F],
  // w_in [P, D] and w_out [D, F] made by the forward for its products and the backward's.
  ProductOperands operands_;
  Tensor x16_, h16_;
  ProductWeight w_in_operand_, w_out_operand_;
  bool saved_ = false;
};

}  // namespace ffnlab
