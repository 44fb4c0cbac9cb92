// Norm: a LayerNorm or RMSNorm layer over d_model, with "weight" (and for LayerNorm "bias").
#pragma once

#include "ffnlab/layers/layer.hpp"
#include "ffnlab/ops/norm.hpp"

namespace ffnlab {

class Norm final : public Layer {
 public:
  Norm(NormKind kind, std::int64_t d_model, float eps);

  // y [T, D] = norm(x [T, D]); x is kept by reference for backward.
  void forward(Tensor& y, const Tensor& x);
  // dx [T, D] (overwritten); weight and bias gradients accumulate.
  void backward(Tensor& dx, const Tensor& dy);
  ParameterSet& parameters() override { return params_; }

 private:
  void bind_parameters() override;

  NormKind kind_;
  float eps_;
  ParameterSet params_;
  Tensor w_, b_, dw_, db_;  // [D] each (b_, db_ LayerNorm only)
  Tensor x_, mean_, rstd_;  // saved: input [T, D], per-row mean and 1/std [T]
};

}  // namespace ffnlab
