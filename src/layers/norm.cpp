// The norm layer: parameters around ops/norm.
#include "ffnlab/layers/norm.hpp"

#include "check.hpp"

namespace ffnlab {

Norm::Norm(NormKind kind, std::int64_t d_model, float eps) : kind_(kind), eps_(eps) {
  check(d_model > 0 && eps > 0.f, "[norm] d_model = {} and eps = {} must be positive", d_model,
        eps);
  params_.declare("weight", {d_model});
  if (kind_ == NormKind::layernorm) params_.declare("bias", {d_model});
  params_.allocate();
  bind_parameters();
  w_.fill(1.f);
}

void Norm::bind_parameters() {
  w_ = params_.at("weight").value;
  dw_ = params_.at("weight").grad;
  if (kind_ == NormKind::layernorm) {
    b_ = params_.at("bias").value;
    db_ = params_.at("bias").grad;
  }
}

void Norm::forward(Tensor& y, const Tensor& x) {
  x_ = x;
  norm_forward(kind_, y, mean_, rstd_, x, w_, b_.defined() ? &b_ : nullptr, eps_);
}

void Norm::backward(Tensor& dx, const Tensor& dy) {
  norm_backward(kind_, dx, dw_, db_.defined() ? &db_ : nullptr, dy, x_, mean_, rstd_, w_);
}

}  // namespace ffnlab
