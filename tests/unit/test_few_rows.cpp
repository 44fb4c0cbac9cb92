// The few-token kernels (ops/few_rows): against the double reference (linear, then the mix; the
// linear backward) with f32 and bf16 weights, on every instruction set this CPU runs, every
// token count, widths with and without a
// vector remainder; the backward for any thread count; and the
// layers' decode paths: dense and MoE inference at T <= 8 against their training forwards,
// bf16 inference weights against bf16 products, and MoE reading only the chosen experts.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "../common/test_util.hpp"
#include "ffnlab/layers/dense_ffn.hpp"
#include "ffnlab/layers/moe_ffn.hpp"
#include "ffnlab/ops/few_rows.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/matmul.hpp"
#include "ffnlab/ops/ref/activation_ref.hpp"
#include "ffnlab/ops/ref/glu_ref.hpp"
#include "ffnlab/ops/ref/linear_ref.hpp"

using namespace ffnlab;

namespace {

// The values a tensor holds as the kernels read them: rounded to bf16 when `dtype` is bf16.
std::vector<double> as_read(const Tensor& t, DType dtype) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i)
    out[i] = dtype == DType::bf16 ? bf16_to_f32(f32_to_bf16(t.f32()[i])) : t.f32()[i];
  return out;
}

// The widths: a single element, less than one vector, a remainder after whole vectors (of 8,
// 16 and 32), and more than one unrolled block with a remainder.
const std::int64_t kWidths[] = {1, 7, 37, 64, 133};

// Runs `f` on every instruction set this CPU runs (the kernels are chosen at run time), then
// restores the one in use.
template <typename Fn>
void on_every_isa(Fn&& f) {
  const FewRowsIsa before = few_rows_isa();
  for (FewRowsIsa isa : supported_few_rows_isas()) {
    SCOPED_TRACE(enum_name(isa));
    set_few_rows_isa(isa);
    f();
  }
  set_few_rows_isa(before);
}

}  // namespace

TEST(FewRows, LinearMatchesReference) {
  on_every_isa([] {
    std::uint64_t seed = 1;
    for (DType dtype : {DType::f32, DType::bf16})
      for (std::int64_t T = 1; T <= kFewRowsMax; ++T)
        for (std::int64_t I : kWidths)
          for (bool bias : {false, true})
            for (bool accumulate : {false, true}) {
              const std::int64_t O = 5 + I % 11;
              const Tensor x = test::random_tensor({T, I}, seed++);
              const Tensor w32 = test::random_tensor({O, I}, seed++);
              const Tensor b = test::random_tensor({O}, seed++);
              const Tensor y0 = test::random_tensor({T, O}, seed++);
              const Tensor w = w32.to(dtype);
              Tensor y = y0.clone();
              few_rows_linear(y, x, w, bias ? &b : nullptr, accumulate);

              const auto xr = as_read(x, dtype), wr = as_read(w32, dtype);
              const auto br = test::to_vector<double>(b);
              std::vector<double> yr(static_cast<std::size_t>(T * O));
              ref::linear_forward<double>(yr.data(), xr.data(), wr.data(),
                                          bias ? br.data() : nullptr, T, I, O);
              if (accumulate)
                for (std::int64_t i = 0; i < T * O; ++i) yr[i] += y0.f32()[i];
              EXPECT_LT(test::scaled_error(y.f32(), yr.data(), y.numel()), 2e-6)
                  << dtype_name(dtype) << " T=" << T << " I=" << I << " bias=" << bias
                  << " accumulate=" << accumulate;
            }
  });
}

// The run-time choice: the best set this CPU runs is the one in use, portable always runs, and
// a set the CPU lacks is refused.
TEST(FewRows, KernelsAreChosenAtRunTime) {
  const std::vector<FewRowsIsa> isas = supported_few_rows_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), FewRowsIsa::portable);
  EXPECT_EQ(few_rows_isa(), isas.back());
#if defined(__x86_64__)
  __builtin_cpu_init();
  EXPECT_EQ(few_rows_isa_supported(FewRowsIsa::avx512),
            __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2"));
#endif
  for (FewRowsIsa isa :
       {FewRowsIsa::portable, FewRowsIsa::avx2, FewRowsIsa::avx512, FewRowsIsa::avx512_bf16})
    if (!few_rows_isa_supported(isa)) {
      EXPECT_THROW(set_few_rows_isa(isa), Error) << enum_name(isa);
    }
}

TEST(FewRows, MixMatchesReference) {
  on_every_isa([] {
    struct Case {
      int branches;
      Act act;
    };
    const Case cases[] = {{0, {Activation::relu}},      {0, {Activation::gelu}},
                          {0, {Activation::relu2}},     {1, {Activation::silu}},
                          {1, {Activation::identity}},  {1, {Activation::sigmoid}},
                          {3, {Activation::gelu_tanh}}, {2, {Activation::silu, 1.5f}}};
    std::uint64_t seed = 100;
    for (DType dtype : {DType::f32, DType::bf16})
      for (const Case& c : cases)
        for (std::int64_t T = 1; T <= kFewRowsMax; ++T)
          for (std::int64_t D : kWidths)
            for (bool bias : {false, true}) {
              const std::int64_t F = 3 + D % 13;
              const std::int64_t P = c.branches == 0 ? F : 2 * c.branches * F;
              const Tensor x = test::random_tensor({T, D}, seed++);
              const Tensor w32 = test::random_tensor({P, D}, seed++, 1.0f / std::sqrt(D));
              const Tensor b = test::random_tensor({P}, seed++, 0.5f);
              Tensor h({T, F});
              few_rows_mix(h, x, w32.to(dtype), bias ? &b : nullptr, c.act, c.branches);

              const auto xr = as_read(x, dtype), wr = as_read(w32, dtype);
              const auto br = test::to_vector<double>(b);
              std::vector<double> a(static_cast<std::size_t>(T * P)),
                  hr(static_cast<std::size_t>(T * F));
              ref::linear_forward<double>(a.data(), xr.data(), wr.data(),
                                          bias ? br.data() : nullptr, T, D, P);
              if (c.branches == 0)
                for (std::int64_t i = 0; i < T * F; ++i)
                  hr[i] = ref::activation<double>(c.act.kind, a[i], c.act.beta);
              else
                ref::glu_forward<double>(hr.data(), a.data(), T, F, c.branches, c.act);
              EXPECT_LT(test::scaled_error(h.f32(), hr.data(), h.numel()), 3e-6)
                  << dtype_name(dtype) << " " << enum_name(c.act.kind) << " n=" << c.branches
                  << " T=" << T << " D=" << D << " bias=" << bias;
            }
  });
}

// dy with whole zero columns (units no token activated, which the kernel skips) and scattered
// zeros, as ReLU's backward makes them.
Tensor sparse_dy(std::int64_t T, std::int64_t O, std::uint64_t seed) {
  Tensor dy = test::random_tensor({T, O}, seed);
  for (std::int64_t o = 0; o < O; o += 3)
    for (std::int64_t t = 0; t < T; ++t) dy.f32()[t * O + o] = 0.0f;
  for (std::int64_t i = 1; i < T * O; i += 7) dy.f32()[i] = 0.0f;
  return dy;
}

TEST(FewRows, LinearBackwardMatchesReference) {
  std::uint64_t seed = 900;
  // Widths below, at and across the 128-column blocks, with remainders.
  for (std::int64_t T = 1; T <= kFewRowsMax; ++T)
    for (std::int64_t I : {1, 37, 128, 300})
      for (bool bias : {false, true})
        for (bool with_dx : {false, true}) {
          const std::int64_t O = 3 + (I * 7) % 29;
          const Tensor x = test::random_tensor({T, I}, seed++);
          const Tensor w = test::random_tensor({O, I}, seed++);
          const Tensor dy = sparse_dy(T, O, seed++);
          const Tensor dw0 = test::random_tensor({O, I}, seed++);
          const Tensor db0 = test::random_tensor({O}, seed++);
          Tensor dx({T, I}), dw = dw0.clone(), db = db0.clone();
          few_rows_linear_backward(with_dx ? &dx : nullptr, dw, bias ? &db : nullptr, dy, x, w);

          std::vector<double> dxr(static_cast<std::size_t>(T * I));
          auto dwr = test::to_vector<double>(dw0), dbr = test::to_vector<double>(db0);
          const auto x64 = test::to_vector<double>(x), w64 = test::to_vector<double>(w),
                     dy64 = test::to_vector<double>(dy);
          ref::linear_backward<double>(dxr.data(), dwr.data(), dbr.data(), dy64.data(), x64.data(),
                                       w64.data(), T, I, O);
          const std::string what = "T=" + std::to_string(T) + " I=" + std::to_string(I) +
                                   " bias=" + std::to_string(bias);
          if (with_dx) {
            EXPECT_LT(test::scaled_error(dx.f32(), dxr.data(), dx.numel()), 2e-6) << what;
          }
          EXPECT_LT(test::scaled_error(dw.f32(), dwr.data(), dw.numel()), 2e-6) << what;
          if (bias) {
            EXPECT_LT(test::scaled_error(db.f32(), dbr.data(), db.numel()), 2e-6) << what;
          } else {
            EXPECT_EQ(test::scaled_error(db.f32(), db0.f32(), O), 0.0) << what;
          }
        }
}

TEST(FewRows, LinearBackwardOfNoOutputs) {  // an empty sum: dx = 0, dw and db untouched
  const Tensor x = test::random_tensor({3, 5}, 1);
  Tensor w({0, 5}), dw({0, 5}), db({0}), dy({3, 0});
  Tensor dx = test::random_tensor({3, 5}, 2);
  few_rows_linear_backward(&dx, dw, &db, dy, x, w);
  for (std::int64_t i = 0; i < dx.numel(); ++i) EXPECT_EQ(dx.f32()[i], 0.0f) << i;
}

// Large enough to run on every thread: the sums do not depend on how many there are.
TEST(FewRows, LinearBackwardIsTheSameOnAnyThreadCount) {
  const std::int64_t T = 5, I = 700, O = 600;
  const Tensor x = test::random_tensor({T, I}, 1), w = test::random_tensor({O, I}, 2);
  const Tensor dy = sparse_dy(T, O, 3);
  auto run = [&](int threads) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    Tensor dx({T, I}), dw({O, I}), db({O});
    dw.zero();
    db.zero();
    few_rows_linear_backward(&dx, dw, &db, dy, x, w);
    omp_set_num_threads(before);
    return std::vector<Tensor>{dx, dw, db};
  };
  const auto one = run(1), two = run(2), three = run(3);
  for (std::size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(test::scaled_error(two[i].f32(), one[i].f32(), one[i].numel()), 0.0) << i;
    EXPECT_EQ(test::scaled_error(three[i].f32(), one[i].f32(), one[i].numel()), 0.0) << i;
  }
}

TEST(FewRows, RejectsWhatItCannotDo) {
  const Tensor x9 = test::random_tensor({9, 8}, 1), w = test::random_tensor({3, 8}, 2);
  Tensor y({9, 3});
  EXPECT_NE(test::error_of([&] { few_rows_linear(y, x9, w, nullptr); }).find("9 tokens"),
            std::string::npos);
  const Tensor x = test::random_tensor({2, 9}, 3);
  Tensor y2({2, 3});
  EXPECT_NE(test::error_of([&] { few_rows_linear(y2, x, w, nullptr); }).find("does not fit"),
            std::string::npos);
  Tensor h({2, 4});  // a GLU of F = 4 needs 8 rows, w has 3
  const Tensor x8 = test::random_tensor({2, 8}, 4);
  EXPECT_NE(test::error_of([&] { few_rows_mix(h, x8, w, nullptr, Act{}, 1); }).find("expected 8"),
            std::string::npos);
}

// Where the kernels stop: small weights stream up to kFewRowsMax rows on every CPU; a
// large one streams fewer rows where oneDNN's f32 products are 512-bit (bench/bench_few_rows), and
// the rows it does not stream go to oneDNN (a primitive appears). Both paths agree with the
// reference at every row count.
TEST(FewRows, LargeWeightsStreamFewerRowsWhereOneDnnIsWider) {
  const bool wide = matmul_f32_512_bit();
  for (bool backward : {false, true}) {
    EXPECT_EQ(few_rows_f32_max(kFewRowsSmallWeight, backward), kFewRowsMax);
    EXPECT_EQ(few_rows_f32_max(kFewRowsSmallWeight + 1, backward),
              wide ? (backward ? 2 : 1) : kFewRowsMax);
  }
  const std::int64_t I = 512;
  for (std::int64_t T = 1; T <= kFewRowsMax; ++T) {
    SCOPED_TRACE(T);
    // Another weight shape each time, so that a primitive of an earlier T cannot serve this one.
    const std::int64_t O = 640 + T;  // > 320 Ki elements: larger than kFewRowsSmallWeight
    const Tensor w = test::random_tensor({O, I}, 41), b = test::random_tensor({O}, 42);
    const auto wr = test::to_vector<double>(w), br = test::to_vector<double>(b);
    const Tensor x = test::random_tensor({T, I}, 43 + T), dy = test::random_tensor({T, O}, 60 + T);
    Tensor y({T, O}), dx({T, I}), dw({O, I}), db({O});
    dw.zero();
    db.zero();
    const auto before = matmul_primitive_count();
    linear_forward(y, x, w, &b);
    EXPECT_EQ(matmul_primitive_count() == before, T <= few_rows_f32_max(O * I, false));
    linear_backward(&dx, dw, &db, dy, x, w);

    const auto xr = test::to_vector<double>(x), dyr = test::to_vector<double>(dy);
    std::vector<double> yr(static_cast<std::size_t>(T * O)), dxr(static_cast<std::size_t>(T * I));
    std::vector<double> dwr(static_cast<std::size_t>(O * I), 0.0), dbr(static_cast<std::size_t>(O));
    ref::linear_forward<double>(yr.data(), xr.data(), wr.data(), br.data(), T, I, O);
    ref::linear_backward<double>(dxr.data(), dwr.data(), dbr.data(), dyr.data(), xr.data(),
                                 wr.data(), T, I, O);
    EXPECT_LT(test::scaled_error(y.f32(), yr.data(), y.numel()), 2e-6);
    EXPECT_LT(test::scaled_error(dx.f32(), dxr.data(), dx.numel()), 2e-6);
    EXPECT_LT(test::scaled_error(dw.f32(), dwr.data(), dw.numel()), 2e-6);
    EXPECT_LT(test::scaled_error(db.f32(), dbr.data(), db.numel()), 2e-6);
  }
}

// Every dense variant, both layouts, every decode token count: the streamed inference forward
// (the mix fused into the pass over w_in) gives the training forward's output (the products,
// kept, then the mix); both against the reference through the layers' golden tests.
TEST(FewRows, DenseDecodeMatchesTrainingForward) {
  std::uint64_t seed = 300;
  for (const char* v : {"relu", "gelu", "glu", "bilinear", "reglu", "geglu", "swiglu", "gated"})
    for (GLULayout layout : {GLULayout::separate, GLULayout::fused})
      for (bool bias : {false, true}) {
        FFNConfig c = variant_config(v, 40, 72, bias);
        if (c.kind == FFNKind::multi_branch && layout == GLULayout::fused) continue;
        c.layout = layout;
        DenseFFN ffn(c, seed++);
        for (std::int64_t T = 1; T <= kFewRowsMax; ++T) {
          const Tensor x = test::random_tensor({T, c.d_model}, seed++);
          Tensor y_train, y_infer;
          ffn.forward(y_train, x, true);
          ffn.forward(y_infer, x, false);
          EXPECT_LT(test::scaled_error(y_infer.f32(), y_train.f32(), y_train.numel()), 2e-6)
              << v << " T=" << T << " bias=" << bias;
          // The hidden activations are kept for analysis either way.
          EXPECT_EQ(ffn.hidden().dim(0), T);
        }
      }
}

// bf16 inference weights: decode (streamed) and larger T (oneDNN reading the bf16 copy) give
// what the bf16 products give, and differ from f32 by bf16's rounding, not more.
TEST(FewRows, Bf16InferenceWeightsMatchBf16Products) {
  std::uint64_t seed = 500;
  for (const char* v : {"relu", "swiglu", "gated"}) {
    const FFNConfig c = variant_config(v, 48, 64, true);
    DenseFFN ffn(c, seed++);
    for (std::int64_t T : {1, 3, 9}) {
      const Tensor x = test::random_tensor({T, c.d_model}, seed++);
      Tensor y32, y16_products, y16_copy;
      ffn.forward(y32, x, false);
      ffn.set_precision(Precision::bf16);
      ffn.forward(y16_products, x, false);
      ffn.set_precision(Precision::f32);
      ffn.set_inference_weights(DType::bf16);
      ffn.forward(y16_copy, x, false);
      ffn.set_inference_weights(DType::f32);
      const double vs_products =
          test::scaled_error(y16_copy.f32(), y16_products.f32(), y32.numel());
      const double vs_f32 = test::scaled_error(y16_copy.f32(), y32.f32(), y32.numel());
      // Both round x, h and the weights to bf16; they differ in the order of f32 sums only.
      EXPECT_LT(vs_products, 2e-3) << v << " T=" << T;
      // bf16 keeps 8 bits: the error is visible, and bounded.
      EXPECT_GT(vs_f32, 1e-5) << v << " T=" << T << ": the bf16 weights were not used";
      EXPECT_LT(vs_f32, 3e-2) << v << " T=" << T;
    }
  }
}

// A bf16 copy streams up to kFewRowsMax rows, except deep and large up projections in
// fixed-shape rows where oneDNN's bf16 products are native (kFewRowsBf16LargeMax); an MoE's
// blocks keep kFewRowsMax rows. A dense SwiGLU of d_model 2048: its bf16 copy at one more row
// than the limit goes to oneDNN (a primitive appears where bf16 is native) and gives the rows
// streamed one at a time, within bf16's rounding of the sums' order.
TEST(FewRows, DeepBf16CopiesStreamFewerRowsWhereOneDnnHasBf16) {
  const bool native = matmul_bf16_native();
  const std::int64_t deep = dispatch::kFewRowsBf16DeepInputs,
                     large = dispatch::kFewRowsBf16LargeWeight;
  const std::int64_t limited = native ? dispatch::kFewRowsBf16LargeMax : kFewRowsMax;
  EXPECT_EQ(few_rows_bf16_max(deep, large, false), limited);
  EXPECT_EQ(few_rows_bf16_max(deep, large - 1, false), kFewRowsMax);
  EXPECT_EQ(few_rows_bf16_max(deep - 1, large, false), kFewRowsMax);
  EXPECT_EQ(few_rows_bf16_max(deep, large, true), kFewRowsMax);

  const FFNConfig c = variant_config("gated", 2048, 128, false);  // w_in: 1024 x 2048 = 2^21
  DenseFFN ffn(c, 31);
  ffn.set_inference_weights(DType::bf16);
  const std::int64_t T = dispatch::kFewRowsBf16LargeMax + 1;
  const Tensor x = test::random_tensor({T, c.d_model}, 32);
  Tensor y, y_row;
  const auto before = matmul_primitive_count();
  ffn.forward(y, x, false);
  EXPECT_EQ(matmul_primitive_count() > before, native);
  for (std::int64_t t = 0; t < T; ++t) {
    const Tensor row = x.rows(t, t + 1).clone();
    ffn.forward(y_row, row, false);  // one row: streamed
    EXPECT_LT(test::scaled_error(y.rows(t, t + 1).f32(), y_row.f32(), y_row.numel()), 2e-3)
        << "row " << t;
  }
}

TEST(FewRows, TrainingForwardDropsTheBf16Copy) {
  const FFNConfig c = variant_config("swiglu", 16, 24, false);
  DenseFFN ffn(c, 7);
  const Tensor x = test::random_tensor({2, 16}, 8);
  Tensor y_before, y_copy, y_after, y;
  ffn.forward(y_before, x, false);
  ffn.set_inference_weights(DType::bf16);
  EXPECT_EQ(ffn.inference_weights(), DType::bf16);
  ffn.forward(y_copy, x, false);
  ffn.forward(y, x, true);  // training: the weights are about to change
  EXPECT_EQ(ffn.inference_weights(), DType::f32);
  ffn.forward(y_after, x, false);
  EXPECT_GT(test::scaled_error(y_copy.f32(), y_before.f32(), y.numel()), 1e-5);
  EXPECT_EQ(test::scaled_error(y_after.f32(), y_before.f32(), y.numel()), 0.0);
}

// MoE inference: the same output as the training forward, with f32 and bf16 inference weights;
// and the experts no token chose are never read (their weights are NaN here).
TEST(FewRows, MoEDecodeReadsOnlyTheChosenExperts) {
  std::uint64_t seed = 700;
  for (const char* expert : {"relu", "swiglu"})
    for (int shared : {0, 1}) {
      FFNConfig c = variant_config("moe", 24, 32, true);
      const FFNConfig e = variant_config(expert, 24, 32, true);
      c.act = e.act;
      c.moe.expert_kind = e.kind;
      c.moe.num_experts = 8;
      c.moe.top_k = 2;
      c.moe.num_shared = shared;
      MoEFFN moe(c, seed++);
      // Up to 8 tokens every expert block streams; at 16 and 40 blocks of up to 8 rows stream
      // and larger ones go to oneDNN.
      for (std::int64_t T : {1, 2, 3, 4, 8, 16, 40}) {
        SCOPED_TRACE(std::string(expert) + " shared=" + std::to_string(shared) +
                     " T=" + std::to_string(T));
        const Tensor x = test::random_tensor({T, c.d_model}, seed++);
        Tensor y_train, y_infer;
        moe.forward(y_train, x, true);
        moe.forward(y_infer, x, false);
        EXPECT_LT(test::scaled_error(y_infer.f32(), y_train.f32(), y_train.numel()), 2e-6);

        // Poison every expert the tokens did not choose, in a copy of the layer.
        MoEFFN poisoned(c, 0);
        std::copy(moe.parameters().values().f32(),
                  moe.parameters().values().f32() + moe.parameters().count(),
                  poisoned.parameters().values().f32());
        std::vector<bool> chosen(8, false);
        for (std::int64_t a = 0; a < T * 2; ++a) chosen[moe.routing().expert[a]] = true;
        for (int ex = 0; ex < 8; ++ex) {
          if (chosen[ex]) continue;
          for (const auto& p : poisoned.parameters().list())
            if (p.name.rfind("experts." + std::to_string(ex) + ".", 0) == 0) {
              Tensor v = p.value;
              v.fill(std::numeric_limits<float>::quiet_NaN());
            }
        }
        Tensor y_poisoned;
        poisoned.forward(y_poisoned, x, false);
        EXPECT_EQ(test::scaled_error(y_poisoned.f32(), y_infer.f32(), y_infer.numel()), 0.0);

        poisoned.set_inference_weights(DType::bf16);
        Tensor y16;
        poisoned.forward(y16, x, false);
        const double err = test::scaled_error(y16.f32(), y_infer.f32(), y_infer.numel());
        EXPECT_TRUE(std::isfinite(err));
        EXPECT_GT(err, 1e-5);
        EXPECT_LT(err, 3e-2);
      }
    }
}
