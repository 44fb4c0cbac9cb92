// The kernel choices of one dense FFN's forward on a block of rows, in one place for DenseFFN
// (one block: the batch) and ExpertStack (one block per expert), so that the two cannot drift:
//
//   which weights  the f32 masters, or in inference the layer's bf16 copies (InferenceCopy);
//   streamed       an inference forward of few rows reads each weight row once with the mix
//                  fused (ops/few_rows.hpp; streams_weights says how few): ffn_block_stream;
//   otherwise      the up product with the activation as its oneDNN epilogue where
//                  mix_in_epilogue allows, else the up product and then the mix; then the down
//                  product: ffn_block_products, on the operands the layer chose (bf16 copies,
//                  packed weights; ops/linear.hpp's ProductOperands).
//
// The backward stays in each layer: its products are the same two linear_backward calls, but
// the layers keep their saved tensors differently.
#pragma once

#include <cstdint>

#include "ffnlab/ops/activation.hpp"
#include "ffnlab/ops/linear.hpp"

namespace ffnlab {

// A layer's bf16 copy of its input and output weights, which inference forwards read
// (FeedForward::set_inference_weights).
class InferenceCopy {
 public:
  // bf16: copies the weights now (a snapshot); f32: drops the copy.
  void set(DType dtype, const Tensor& w_in, const Tensor& w_out);
  bool defined() const { return in_.defined(); }

  // What a forward reads: the copy in inference when there is one (products in bf16), else the
  // master weights at the layer's precision.
  struct Read {
    const Tensor& w_in;
    const Tensor& w_out;
    bool bf16_copy;
    Precision precision;
  };
  Read read(bool train, const Tensor& w_in, const Tensor& w_out, Precision layer) const;

 private:
  Tensor in_, out_;
};

// If an inference forward of x's rows streams the weights (streams_weights, with the layer's
// precision; `varying_rows`: an MoE's expert block), computes h [rows, F] and y [rows, D] that
// way and returns true; else false.
bool ffn_block_stream(Tensor& y, Tensor& h, const Tensor& x, const InferenceCopy::Read& w,
                      const Tensor* b_in, const Tensor* b_out, Act act, int branches, bool train,
                      Precision layer, bool varying_rows);

// The operands of a block's products, as the layer converted or packs them.
struct BlockOperands {
  const Tensor& x;
  const Tensor& w_in;
  const Tensor* b_in;
  PackedWeights* in_packing;  // null: w_in is read as it is
  const Tensor& w_out;
  const Tensor* b_out;
  PackedWeights* out_packing;
  Tensor* h16;  // the bf16 copy of h the down product reads (null: h itself)
};

// h = mix(x·w_inᵀ + b_in) and y = h·w_outᵀ + b_out; a [rows, P] receives the pre-activation
// unless the activation is the up product's epilogue (mix_in_epilogue). varying_rows: as
// linear_forward's (an expert's block).
void ffn_block_products(Tensor& y, Tensor& h, Tensor& a, const BlockOperands& op, Act act,
                        int branches, bool train, Precision precision, bool varying_rows);

}  // namespace ffnlab
