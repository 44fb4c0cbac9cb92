// Linear forward/backward on top of the oneDNN matmul wrapper.
#include "ffnlab/ops/linear.hpp"

#include <algorithm>

#include "check.hpp"
#include "ffnlab/ops/activation.hpp"
#include "ffnlab/ops/skinny.hpp"

namespace ffnlab {

namespace {

// f32 products of a few rows stream the weights (ops/skinny) instead of going to oneDNN.
bool skinny(const Tensor& x, const Tensor& w, Precision precision, bool backward) {
  return skinny_fits(x.dim(0), w.numel(), precision, backward) && x.dtype() == DType::f32 &&
         w.dtype() == DType::f32;
}

}  // namespace

void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b,
                    Precision precision, const Act* act, bool varying_rows) {
  check(x.rank() == 2 && w.rank() == 2 && x.dim(1) == w.dim(1),
        "[linear] input {} does not fit weight {} ([out, in])", shape_string(x.shape()),
        shape_string(w.shape()));
  if (skinny(x, w, precision, false)) {
    skinny_linear(y, x, w, b);
    if (act) activation_forward(y.f32(), y.f32(), y.numel(), *act);
    return;
  }
  MatmulOptions opt;
  opt.bias = b;
  opt.act = act;
  opt.precision = precision;
  // A few f32 rows that do not stream: oneDNN's run-time-M primitive measured up to 2.7× faster
  // than a fixed-shape one at 2 to 8 rows (bench/bench_skinny).
  opt.dynamic_m = varying_rows || (precision == Precision::f32 && x.dim(0) <= kSkinnyMaxTokens);
  matmul(y, x, Trans::no, w, Trans::yes, opt);
}

void bias_backward(Tensor& db, const Tensor& dy) {
  const std::int64_t T = dy.dim(0), O = dy.dim(1);
  check(db.numel() == O, "[linear] bias gradient has {} elements, dy has {} columns", db.numel(),
        O);
  const float* g = dy.f32();
  float* out = db.f32();
  // Each thread owns a block of columns and sums its rows in order: no reduction across threads.
  constexpr std::int64_t kBlock = 64;
  const std::int64_t blocks = (O + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (T * O > 65536)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t c0 = blk * kBlock, c1 = std::min(O, c0 + kBlock);
    float acc[kBlock] = {};
    for (std::int64_t t = 0; t < T; ++t) {
      const float* row = g + t * O;
#pragma omp simd
      for (std::int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
    }
    for (std::int64_t c = c0; c < c1; ++c) out[c] += acc[c - c0];
  }
}

void linear_backward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, Precision precision, bool varying_rows) {
  check(dy.rank() == 2 && dy.dim(0) == x.dim(0) && dy.dim(1) == w.dim(0),
        "[linear] dy {} does not fit x {} and weight {}", shape_string(dy.shape()),
        shape_string(x.shape()), shape_string(w.shape()));
  if (skinny(x, w, precision, true) && dw.dtype() == DType::f32) {
    skinny_linear_backward(dx, dw, db, dy, x, w);
    return;
  }
  MatmulOptions opt;
  opt.precision = precision;
  opt.dynamic_m = varying_rows;  // dx: T rows
  if (dx) matmul(*dx, dy, Trans::no, w, Trans::no, opt);
  opt.accumulate = true;
  opt.dynamic_m = false;
  opt.dynamic_k = varying_rows;  // dw: a sum over T
  matmul(dw, dy, Trans::yes, x, Trans::no, opt);
  if (db) bias_backward(*db, dy);
}

}  // namespace ffnlab
