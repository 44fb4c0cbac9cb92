// The kernel choices of one dense FFN's forward on a block of rows (see ffn_products.hpp).
#include "ffnlab/layers/ffn_products.hpp"

#include "ffnlab/ops/few_rows.hpp"
#include "ffnlab/ops/glu.hpp"

namespace ffnlab {

void InferenceCopy::set(DType dtype, const Tensor& w_in, const Tensor& w_out) {
  in_ = dtype == DType::bf16 ? w_in.to(DType::bf16) : Tensor();
  out_ = dtype == DType::bf16 ? w_out.to(DType::bf16) : Tensor();
}

InferenceCopy::Read InferenceCopy::read(bool train, const Tensor& w_in, const Tensor& w_out,
                                        Precision layer) const {
  const bool bf16_copy = !train && in_.defined();
  if (bf16_copy) return {in_, out_, true, Precision::bf16};
  return {w_in, w_out, false, layer};
}

bool ffn_block_stream(Tensor& y, Tensor& h, const Tensor& x, const InferenceCopy::Read& w,
                      const Tensor* b_in, const Tensor* b_out, Act act, int branches, bool train,
                      Precision layer, bool varying_rows) {
  if (!streams_weights(train, x.dim(0), w.bf16_copy, w.w_in, layer, varying_rows)) return false;
  few_rows_mix(h, x, w.w_in, b_in, act, branches);
  few_rows_linear(y, h, w.w_out, b_out);
  return true;
}

void ffn_block_products(Tensor& y, Tensor& h, Tensor& a, const BlockOperands& op, Act act,
                        int branches, bool train, Precision precision, bool varying_rows) {
  if (mix_in_epilogue(act, branches, train)) {
    // Inference keeps nothing; training keeps h only when act' is a function of h (ReLU: h > 0).
    linear_forward(h, op.x, op.w_in, op.b_in, precision, &act, varying_rows, op.in_packing);
  } else {
    linear_forward(a, op.x, op.w_in, op.b_in, precision, nullptr, varying_rows, op.in_packing);
    mix_forward(h, a, act, branches);
  }
  const Tensor& h_op = op.h16 != nullptr ? product_operand(*op.h16, h) : h;
  linear_forward(y, h_op, op.w_out, op.b_out, precision, nullptr, varying_rows, op.out_packing);
}

}  // namespace ffnlab
