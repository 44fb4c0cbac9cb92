// Products for a few tokens (decode, small batches): with T <= kFewRowsMax tokens a product
// is bound by reading the weights, so these kernels read every weight row once for all tokens,
// straight from f32 or bf16 storage, and finish each row's dot products with its bias,
// activation and gated mix in registers; the backward reads each weight row once for dx and
// each gradient row once for dW. Nothing else is touched: no primitive, no packing, no scratch
// allocation. linear_forward/linear_backward use them for f32 products of up to
// kFewRowsMax rows (on CPUs with AVX-512, fewer for large weights: few_rows_f32_max),
// and the layers for their inference forwards and MoE expert blocks of that size; larger T goes
// through oneDNN (ops/matmul). Reference: ref::linear_forward, ref::linear_backward and
// ref::glu_forward; tests: tests/unit/test_few_rows.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "ffnlab/names.hpp"
#include "ffnlab/ops/activation.hpp"
#include "ffnlab/ops/dispatch.hpp"
#include "ffnlab/ops/matmul.hpp"
#include "ffnlab/tensor.hpp"

namespace ffnlab {

using dispatch::kFewRowsMax;  // (ops/dispatch.hpp holds every threshold)

// The instruction sets the dot kernels are built for, every one in any build (x86), and chosen
// at run time: the best this CPU runs. The AVX-512 sets change bf16 weights' kernel (avx512:
// 16 bf16 widened at a time; avx512_bf16: pairs of bf16 into f32 sums by vdpbf16ps); f32
// weights take the AVX2 kernel on every set above portable (few_rows.cpp says why).
enum class FewRowsIsa { portable, avx2, avx512, avx512_bf16, count };
template <>
struct EnumNames<FewRowsIsa> {
  static constexpr auto table = name_table<FewRowsIsa>("few_rows", "kernel set",
                                                       {{FewRowsIsa::portable, "portable"},
                                                        {FewRowsIsa::avx2, "avx2"},
                                                        {FewRowsIsa::avx512, "avx512"},
                                                        {FewRowsIsa::avx512_bf16, "avx512_bf16"}});
};
static_assert(EnumNames<FewRowsIsa>::table.complete());
bool few_rows_isa_supported(FewRowsIsa isa);
std::vector<FewRowsIsa> supported_few_rows_isas();  // portable first, the best last
// The kernels' instruction set now (every thread's); set_few_rows_isa chooses another for tests
// and benchmarks (Error "[few_rows] this CPU does not run the X kernels" where the CPU lacks it).
FewRowsIsa few_rows_isa();
void set_few_rows_isa(FewRowsIsa isa);

// The most rows an f32 product with a weight of `weight_elements` streams through these kernels
// rather than going to oneDNN, on this CPU (the backward: dx, dW and db together): where
// oneDNN's f32 products are 256-bit (AVX2), kFewRowsMax; where they are 512-bit (AVX-512)
// and the weight is larger than kFewRowsSmallWeight elements, dispatch.hpp's kFewRowsWide* rows.
std::int64_t few_rows_f32_max(std::int64_t weight_elements, bool backward);
using dispatch::kFewRowsSmallWeight;

// Whether an f32 product over `rows` rows with a weight of `weight_elements` takes these kernels
// rather than oneDNN's (training products and f32 inference; bf16 products stream only from
// weights packed in bf16).
inline bool few_rows_fits(std::int64_t rows, std::int64_t weight_elements, Precision precision,
                          bool backward = false) {
  return precision == Precision::f32 && rows >= 1 &&
         rows <= few_rows_f32_max(weight_elements, backward);
}

// The most rows an inference forward on a bf16 copy of an up projection of `inputs` inputs
// (d_model) and `weight_elements` elements streams through these kernels: kFewRowsMax, or where
// oneDNN's bf16 products are native, the rows a fixed shape (not `varying_rows`, an MoE's expert
// blocks) and the projection deep and large, dispatch.hpp's kFewRowsBf16LargeMax.
std::int64_t few_rows_bf16_max(std::int64_t inputs, std::int64_t weight_elements,
                               bool varying_rows);

// Whether an inference forward (train false) over `rows` tokens streams its weights: few enough
// rows for its up projection w_in [P, D], and weights in the storage the kernels take (a bf16
// copy of the weights, few_rows_bf16_max; or f32 products, few_rows_fits).
inline bool streams_weights(bool train, std::int64_t rows, bool bf16_copy, const Tensor& w_in,
                            Precision precision, bool varying_rows) {
  return !train && (bf16_copy ? rows >= 1 && rows <= few_rows_bf16_max(w_in.dim(1), w_in.numel(),
                                                                       varying_rows)
                              : few_rows_fits(rows, w_in.numel(), precision));
}

// y [T, O] = x [T, I] · w [O, I]ᵀ + b [O] (b may be null; y += ... with accumulate).
// w is f32 or bf16; with bf16 weights x is rounded to bf16 too, as oneDNN's bf16 products do
// (accumulation is f32 either way). T <= kFewRowsMax.
void few_rows_linear(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b,
                     bool accumulate = false);

// h [T, F] = mix(x [T, D] · w_in [P, D]ᵀ + b_in) of any dense FFN kind, in one pass over w_in:
// branches = 0 is the plain FFN, h = act(·) with P = F; branches = n >= 1 is the gated sum
// Σ_b act(g_b) ⊙ u_b with P = 2nF and rows [g_0 | u_0 | g_1 | ...] (ops/glu.hpp's layout).
// b_in [P] may be null; w_in f32 or bf16 as above.
void few_rows_mix(Tensor& h, const Tensor& x, const Tensor& w_in, const Tensor* b_in, Act act,
                  int branches);

// linear_backward for T <= kFewRowsMax tokens, all f32: dx [T, I] = dy [T, O] · w [O, I]
// (overwritten; skipped when dx is null), dw [O, I] += dyᵀ · x, db [O] += Σ_t dy (when db).
// Every weight row is read once and every gradient row read and written once; a row whose dy is
// zero for every token (a ReLU unit no token activated) is not read at all. The result does not
// depend on the thread count.
void few_rows_linear_backward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x,
                              const Tensor& w);

}  // namespace ffnlab
