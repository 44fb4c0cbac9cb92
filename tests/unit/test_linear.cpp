// Linear op and oneDNN matmul: against the naive reference, at awkward shapes, f32 and bf16;
// the reference's gradients against central differences; the primitive cache.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>
#include <tuple>
#include <vector>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/ops/dispatch.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/ref/activation_ref.hpp"
#include "ffnlab/ops/ref/linear_ref.hpp"

using namespace ffnlab;

namespace {
struct Shape3 {
  std::int64_t T, I, O;
};
const Shape3 kShapes[] = {{1, 13, 37}, {7, 37, 13}, {33, 64, 100}, {5, 1, 3}, {129, 17, 9}};

struct Result {
  std::vector<double> y, dx, dw, db;
};

Result reference(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& dy, bool bias,
                 const Tensor& dw0) {
  const std::int64_t T = x.dim(0), I = x.dim(1), O = w.dim(0);
  const auto x64 = test::to_vector<double>(x), w64 = test::to_vector<double>(w),
             b64 = test::to_vector<double>(b), dy64 = test::to_vector<double>(dy);
  Result r;
  r.y.resize(T * O);
  r.dx.resize(T * I);
  r.dw = test::to_vector<double>(dw0);
  r.db.assign(O, 0.0);
  ref::linear_forward<double>(r.y.data(), x64.data(), w64.data(), bias ? b64.data() : nullptr, T, I,
                              O);
  ref::linear_backward<double>(r.dx.data(), r.dw.data(), bias ? r.db.data() : nullptr, dy64.data(),
                               x64.data(), w64.data(), T, I, O);
  return r;
}
}  // namespace

TEST(Linear, MatchesReferenceInF32AndBf16) {
  std::uint64_t seed = 1;
  for (const auto& s : kShapes)
    for (bool bias : {true, false})
      for (Precision p : {Precision::f32, Precision::bf16}) {
        const Tensor x = test::random_tensor({s.T, s.I}, seed++);
        const Tensor w = test::random_tensor({s.O, s.I}, seed++, 0.3f);
        const Tensor b = test::random_tensor({s.O}, seed++);
        const Tensor dy = test::random_tensor({s.T, s.O}, seed++);
        Tensor dw = test::random_tensor({s.O, s.I}, seed++);  // gradients accumulate onto this
        const Result r = reference(x, w, b, dy, bias, dw);
        Tensor y({s.T, s.O}), dx({s.T, s.I}), db({s.O});
        linear_forward(y, x, w, bias ? &b : nullptr, p);
        linear_backward(&dx, dw, bias ? &db : nullptr, dy, x, w, p);
        // bf16 keeps 8 mantissa bits: inputs are rounded to ~0.4 % each, accumulation is f32.
        const double tol = p == Precision::f32 ? 1e-5 : 2e-2;
        const auto where = ::testing::Message() << "T=" << s.T << " I=" << s.I << " O=" << s.O
                                                << " bias=" << bias << " " << enum_name(p);
        EXPECT_LT(test::scaled_error(y.f32(), r.y.data(), y.numel()), tol) << where;
        EXPECT_LT(test::scaled_error(dx.f32(), r.dx.data(), dx.numel()), tol) << where;
        EXPECT_LT(test::scaled_error(dw.f32(), r.dw.data(), dw.numel()), tol) << where;
        if (bias) {
          EXPECT_LT(test::scaled_error(db.f32(), r.db.data(), db.numel()), 1e-5) << where;
        }
      }
}

// Rows that vary from call to call (an MoE's expert blocks) run as fixed-shape parts and a rest
// of a few rows (streamed, or oneDNN's run-time-M product for a weight too large to stream on
// AVX-512 CPUs, and always in bf16): every split gives the reference's values, forward with a
// fused activation and backward.
TEST(Linear, VaryingRowsMatchTheReferenceAtEverySplit) {
  std::uint64_t seed = 900;
  const Act relu{Activation::relu};
  for (std::int64_t O : {24, 520})  // 520 · 512 > 2^18: not streamed past one row on AVX-512
    for (Precision p : {Precision::f32, Precision::bf16})
      for (std::int64_t T : {9, 15, 16, 17, 40, 147}) {
        const std::int64_t I = 512;
        const Tensor x = test::random_tensor({T, I}, seed++);
        const Tensor w = test::random_tensor({O, I}, seed++, 0.05f);
        const Tensor b = test::random_tensor({O}, seed++);
        const Tensor dy = test::random_tensor({T, O}, seed++);
        Tensor dw = test::random_tensor({O, I}, seed++);
        const Result r = reference(x, w, b, dy, true, dw);
        Tensor y({T, O}), act_y({T, O}), dx({T, I}), db({O});
        linear_forward(y, x, w, &b, p, nullptr, /*varying_rows=*/true);
        linear_forward(act_y, x, w, &b, p, &relu, /*varying_rows=*/true);
        linear_backward(&dx, dw, &db, dy, x, w, p, /*varying_rows=*/true);
        const double tol = p == Precision::f32 ? 1e-5 : 2e-2;
        const auto where = ::testing::Message() << "T=" << T << " O=" << O << " " << enum_name(p);
        EXPECT_LT(test::scaled_error(y.f32(), r.y.data(), y.numel()), tol) << where;
        std::vector<double> act_ref(r.y.size());
        for (std::size_t k = 0; k < r.y.size(); ++k) act_ref[k] = std::max(0.0, r.y[k]);
        EXPECT_LT(test::scaled_error(act_y.f32(), act_ref.data(), act_y.numel()), tol) << where;
        EXPECT_LT(test::scaled_error(dx.f32(), r.dx.data(), dx.numel()), tol) << where;
        EXPECT_LT(test::scaled_error(dw.f32(), r.dw.data(), dw.numel()), tol) << where;
        EXPECT_LT(test::scaled_error(db.f32(), r.db.data(), db.numel()), 1e-5) << where;
      }
}

// A few rows of a weight too large for the run-time-M primitive to pay from 4 rows (more than
// 2^23 elements) take a fixed-shape one there: the values are the reference's either way.
TEST(Linear, FewRowsOfAVeryLargeWeightMatchTheReference) {
  const std::int64_t I = 4096, O = 2049;  // 8.4 M elements
  const Tensor w = test::random_tensor({O, I}, 31, 0.02f), b = test::random_tensor({O}, 32);
  const auto w64 = test::to_vector<double>(w), b64 = test::to_vector<double>(b);
  for (std::int64_t T : {2, 5, 8})
    for (bool varying : {false, true}) {
      const Tensor x = test::random_tensor({T, I}, 40 + T);
      const auto x64 = test::to_vector<double>(x);
      std::vector<double> want(static_cast<std::size_t>(T * O));
      ref::linear_forward<double>(want.data(), x64.data(), w64.data(), b64.data(), T, I, O);
      Tensor y({T, O});
      linear_forward(y, x, w, &b, Precision::f32, nullptr, varying);
      EXPECT_LT(test::scaled_error(y.f32(), want.data(), y.numel()), 1e-5)
          << "T=" << T << " varying=" << varying;
    }
}

// Every block size of a run is one of few fixed shapes: M = 9 ... 3000 adds a bounded number of
// primitives (one per size would be 2992), and a wrongly sized output is refused.
TEST(Linear, VaryingRowsCreateFewPrimitives) {
  const Tensor w = test::random_tensor({8, 4}, 1), x = test::random_tensor({3000, 4}, 2);
  Tensor y;
  const auto before = matmul_primitive_count();
  for (std::int64_t m = 9; m <= 3000; ++m) {
    y.resize({m, 8});
    linear_forward(y, x.rows(0, m), w, nullptr, Precision::f32, nullptr, /*varying_rows=*/true);
  }
  EXPECT_LE(matmul_primitive_count() - before, 100);
  Tensor wrong({41, 8});
  EXPECT_THROW(linear_forward(wrong, x.rows(0, 40), w, nullptr, Precision::f32, nullptr, true),
               Error);
}

TEST(Linear, FusedActivationMatchesSeparateOne) {
  const Tensor x = test::random_tensor({9, 21}, 5);
  const Tensor w = test::random_tensor({31, 21}, 6, 0.3f);
  const Tensor b = test::random_tensor({31}, 7);
  for (int i = 0; i < static_cast<int>(Activation::count); ++i) {
    const Act act{static_cast<Activation>(i)};
    Tensor fused({9, 31}), pre({9, 31});
    linear_forward(fused, x, w, &b, Precision::f32, &act);
    linear_forward(pre, x, w, &b, Precision::f32);
    for (std::int64_t k = 0; k < pre.numel(); ++k) {
      const double r = ref::activation<double>(act.kind, pre.f32()[k]);
      EXPECT_NEAR(fused.f32()[k], r, 1e-5 + 1e-5 * std::fabs(r)) << enum_name(act.kind);
    }
  }
}

TEST(Linear, ReferenceGradientsMatchCentralDifferences) {
  const std::int64_t T = 3, I = 5, O = 4;
  auto x = test::to_vector<double>(test::random_tensor({T, I}, 11));
  auto w = test::to_vector<double>(test::random_tensor({O, I}, 12));
  auto b = test::to_vector<double>(test::random_tensor({O}, 13));
  const auto dy = test::to_vector<double>(test::random_tensor({T, O}, 14));
  std::vector<double> dx(T * I), dw(O * I, 0.0), db(O, 0.0), y(T * O);
  ref::linear_backward<double>(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), T, I,
                               O);
  auto loss = [&] {
    ref::linear_forward<double>(y.data(), x.data(), w.data(), b.data(), T, I, O);
    double l = 0;
    for (std::size_t i = 0; i < y.size(); ++i) l += y[i] * dy[i];
    return l;
  };
  auto all = [](std::size_t n) { return test::sample_indices(n, n); };
  test::expect_gradient(x, dx, loss, all(x.size()), 1e-8, 1e-7, "dx");
  test::expect_gradient(w, dw, loss, all(w.size()), 1e-8, 1e-7, "dw");
  test::expect_gradient(b, db, loss, all(b.size()), 1e-8, 1e-7, "db");
}

TEST(Linear, PrimitivesAreCreatedOncePerShape) {
  const Tensor x = test::random_tensor({16, 10}, 1), w = test::random_tensor({7, 10}, 2);
  Tensor y({16, 7});
  linear_forward(y, x, w, nullptr);
  const auto after_first = matmul_primitive_count();
  for (int i = 0; i < 5; ++i) linear_forward(y, x, w, nullptr);
  EXPECT_EQ(matmul_primitive_count(), after_first);
  Tensor y2({15, 7});
  linear_forward(y2, x.rows(0, 15), w, nullptr);
  EXPECT_EQ(matmul_primitive_count(), after_first + 1);
  // f32 products of up to kFewRowsMax rows with a small weight stream it (ops/few_rows): no
  // primitive, forward or backward.
  Tensor y8({8, 7}), dx({8, 10}), dw({7, 10});
  dw.zero();
  linear_forward(y8, x.rows(0, 8), w, nullptr);
  linear_backward(&dx, dw, nullptr, y8, x.rows(0, 8), w);
  EXPECT_EQ(matmul_primitive_count(), after_first + 1);
}

// Ever new shapes do not grow the cache without bound (the configs fuzzer's memory grew with it).
TEST(Linear, PrimitiveCacheIsBounded) {
  const Tensor w = test::random_tensor({2, 3}, 2);
  const Tensor x = test::random_tensor({1100, 3}, 1);
  Tensor y;
  for (std::int64_t m = 1; m <= 1100; ++m) {
    y.resize({m, 2});
    linear_forward(y, x.rows(0, m), w, nullptr);
    ASSERT_LE(matmul_primitive_count(), 1024);
  }
  // The products stay right across the refill.
  for (std::int64_t i = 0; i < 1100; ++i)
    for (int j = 0; j < 2; ++j) {
      double sum = 0;
      for (int k = 0; k < 3; ++k) sum += double(x.f32()[i * 3 + k]) * w.f32()[j * 3 + k];
      ASSERT_NEAR(y.f32()[i * 2 + j], sum, 1e-5);
    }
}

TEST(Matmul, EmptyInnerDimension) {
  Tensor a({3, 0}), b({0, 4}), c = Tensor::from({3, 4}, std::vector<float>(12, 5.0f));
  MatmulOptions acc;
  acc.accumulate = true;
  matmul(c, a, Trans::no, b, Trans::no, acc);
  EXPECT_EQ(c.f32()[7], 5.0f);  // += an empty sum
  matmul(c, a, Trans::no, b, Trans::no);
  EXPECT_EQ(c.f32()[7], 0.0f);  // = an empty sum
  Tensor bias({4});
  MatmulOptions with_bias;
  with_bias.bias = &bias;
  EXPECT_THROW(matmul(c, a, Trans::no, b, Trans::no, with_bias), Error);
}

TEST(Linear, RejectsShapeMismatch) {
  Tensor x({4, 3}), w({5, 2}), y({4, 5});
  EXPECT_THROW(linear_forward(y, x, w, nullptr), Error);
  Tensor w2({5, 3}), bad_y({4, 4});
  EXPECT_THROW(linear_forward(bad_y, x, w2, nullptr), Error);
  Tensor b({4});
  EXPECT_THROW(linear_forward(y, x, w2, &b), Error);
}

// A weight packed into oneDNN's own layout computes what the plain product computes (up to the
// order of the sums), for both orientations, with bias and activation, accumulating, in f32 and
// (where the CPU has them) native bf16 products; it is read again after the weight changes.
TEST(Matmul, PackedOperandMatchesThePlainProduct) {
  std::vector<Precision> precisions{Precision::f32};
  if (matmul_bf16_native()) precisions.push_back(Precision::bf16);
  const Act relu{Activation::relu};
  std::uint64_t seed = 500;
  for (Precision precision : precisions)
    for (Trans tb : {Trans::no, Trans::yes})
      for (int variant = 0; variant < 3; ++variant) {
        const std::int64_t M = 37, K = 29, N = 41;
        const Tensor a = test::random_tensor({M, K}, seed++);
        Tensor b = tb == Trans::no ? test::random_tensor({K, N}, seed++)
                                   : test::random_tensor({N, K}, seed++);
        const Tensor bias = test::random_tensor({N}, seed++);
        const Tensor start = test::random_tensor({M, N}, seed++);
        MatmulOptions o;
        o.precision = precision;
        if (variant == 1) o.bias = &bias, o.act = &relu;
        if (variant == 2) o.accumulate = true;
        PackedWeights packed;
        for (int round = 0; round < 2; ++round) {
          Tensor want = start.clone(), got = start.clone();
          matmul(want, a, Trans::no, b, tb, o);
          const auto before = matmul_packings();
          packed.pack(b, tb, M, o);
          EXPECT_EQ(matmul_packings(), before + 1);
          matmul(got, a, packed, o);
          double scale = 0;
          for (std::int64_t i = 0; i < want.numel(); ++i)
            scale = std::max(scale, double(std::abs(want.f32()[i])));
          for (std::int64_t i = 0; i < want.numel(); ++i)
            ASSERT_NEAR(got.f32()[i], want.f32()[i], 1e-5 * scale)
                << enum_name(precision) << " tb=" << int(tb) << " variant " << variant << " round "
                << round << " at " << i;
          float* v = b.f32();  // the weight changes: packing again reads the new values
          for (std::int64_t i = 0; i < b.numel(); ++i) v[i] = -0.5f * v[i] + 0.25f;
        }
      }
}

// From matmul_conv_min_rows() rows a product runs as oneDNN's 1x1 convolution: the same product
// as the matmul up to the order of its sums, with every option, both readings of b, rows that
// are no multiple of the kernel's blocks, and bf16 (native, or emulated in f32).
// Restores the convolution's row setting when a test ends, failed assertions included.
struct ConvRowsGuard {
  std::int64_t saved = matmul_conv_min_rows();
  ~ConvRowsGuard() { set_matmul_conv_min_rows(saved); }
};

TEST(Matmul, ConvolutionMatchesTheMatmul) {
  const ConvRowsGuard guard;
  const Act gelu{Activation::gelu};
  std::uint64_t seed = 900;
  struct Shape {
    std::int64_t M, K, N;
  };
  for (Precision precision : {Precision::f32, Precision::bf16})
    for (Shape s : {Shape{64, 32, 48}, Shape{37, 40, 24}, Shape{21, 29, 41}})
      for (Trans tb : {Trans::no, Trans::yes})
        for (int variant = 0; variant < 3; ++variant) {
          const Tensor a = test::random_tensor({s.M, s.K}, seed++);
          const Tensor b = tb == Trans::no ? test::random_tensor({s.K, s.N}, seed++)
                                           : test::random_tensor({s.N, s.K}, seed++);
          const Tensor bias = test::random_tensor({s.N}, seed++);
          const Tensor start = test::random_tensor({s.M, s.N}, seed++);
          MatmulOptions o;
          o.precision = precision;
          if (variant == 1) o.bias = &bias, o.act = &gelu;
          if (variant == 2) o.accumulate = true;
          Tensor want = start.clone(), got = start.clone();
          set_matmul_conv_min_rows(0);
          matmul(want, a, Trans::no, b, tb, o);
          set_matmul_conv_min_rows(16);
          const auto before = matmul_conv_products();
          matmul(got, a, Trans::no, b, tb, o);
          const bool conv = matmul_conv_products() > before;
          // Where it is the default path, every shape whose channels fill the kernel's 8-float
          // blocks runs as a convolution (others may fall back to the matmul).
          if (!matmul_f32_512_bit() && s.K % 8 == 0 && s.N % 8 == 0) {
            EXPECT_TRUE(conv) << s.M << "x" << s.K << "x" << s.N;
          }
          double scale = 0;
          for (std::int64_t i = 0; i < want.numel(); ++i)
            scale = std::max(scale, double(std::abs(want.f32()[i])));
          for (std::int64_t i = 0; i < want.numel(); ++i)
            ASSERT_NEAR(got.f32()[i], want.f32()[i], 1e-5 * scale)
                << enum_name(precision) << " " << s.M << "x" << s.K << "x" << s.N
                << " tb=" << int(tb) << " variant " << variant << " conv " << conv << " at " << i;
        }
}

// From a setting of 1 row, a bf16 product still finds out whether bf16 is native (that probe is
// a 1-row bf16 product itself) and runs; the convolution serves it only where bf16 is emulated.
TEST(Matmul, ConvolutionFromOneRowServesBf16) {
  const ConvRowsGuard guard;
  set_matmul_conv_min_rows(1);
  const Tensor a = test::random_tensor({24, 16}, 11), b = test::random_tensor({32, 16}, 12);
  Tensor got({24, 32}), want({24, 32});
  MatmulOptions o;
  o.precision = Precision::bf16;
  const auto before = matmul_conv_products();
  matmul(got, a, Trans::no, b, Trans::yes, o);
  if (!matmul_f32_512_bit() && !matmul_bf16_native()) {
    EXPECT_EQ(matmul_conv_products(), before + 1);
  }
  set_matmul_conv_min_rows(0);
  matmul(want, a, Trans::no, b, Trans::yes, o);
  for (std::int64_t i = 0; i < want.numel(); ++i)
    ASSERT_NEAR(got.f32()[i], want.f32()[i], 1e-5 * (1 + std::abs(want.f32()[i]))) << i;
}

// The convolution path is the default only where oneDNN's f32 products are not 512-bit, from
// dispatch::kConvMinRows rows; a batched, transposed-a or run-time-M product never takes it.
TEST(Matmul, ConvolutionOnlyWhereItIsTheDefault) {
  EXPECT_EQ(matmul_conv_min_rows(), matmul_f32_512_bit() ? 0 : dispatch::kConvMinRows);
  const ConvRowsGuard guard;
  set_matmul_conv_min_rows(8);
  const Tensor a = test::random_tensor({16, 16}, 1), b = test::random_tensor({16, 16}, 2);
  Tensor c({16, 16});
  const auto before = matmul_conv_products();
  matmul(c, a, Trans::yes, b, Trans::no);  // a weight gradient's reading of a
  MatmulOptions dynamic;
  dynamic.dynamic_m = true;
  matmul(c, a, Trans::no, b, Trans::no, dynamic);
  Tensor a3 = test::random_tensor({2, 16, 16}, 3), b3 = test::random_tensor({2, 16, 16}, 4),
         c3({2, 16, 16});
  matmul(c3, a3, Trans::no, b3, Trans::no);
  set_matmul_conv_min_rows(17);  // fewer rows than the setting
  matmul(c, a, Trans::no, b, Trans::no);
  EXPECT_EQ(matmul_conv_products(), before);
  set_matmul_conv_min_rows(-5);  // any value below 0 means never
  EXPECT_EQ(matmul_conv_min_rows(), 0);
}

// Threads may run convolution products at once (ranks as threads, Python with the GIL released):
// each has its own stream, scratchpad and reordered weights, so three threads, each with other
// shapes (the per-thread weight scratch growing differently), compute bit for bit what each
// computes alone. Both passes run on fresh threads, which plan their products for the same
// OpenMP thread count.
TEST(Matmul, ConvolutionFromSeveralThreadsAtOnce) {
  const ConvRowsGuard guard;
  set_matmul_conv_min_rows(16);
  struct Work {
    std::int64_t M = 0, K = 0, N = 0;
    Trans tb = Trans::no;
    Tensor a, b, bias, alone, together;
  };
  std::vector<Work> work;
  std::uint64_t seed = 70;
  for (auto [M, K, N, tb] : {std::tuple{96, 64, 48, Trans::yes}, std::tuple{40, 32, 128, Trans::no},
                             std::tuple{64, 128, 64, Trans::yes}}) {
    Work w;
    w.M = M, w.K = K, w.N = N, w.tb = tb;
    w.a = test::random_tensor({M, K}, seed++);
    w.b =
        tb == Trans::no ? test::random_tensor({K, N}, seed++) : test::random_tensor({N, K}, seed++);
    w.bias = test::random_tensor({N}, seed++);
    work.push_back(std::move(w));
  }
  const auto product = [](Work& w, Tensor& c) {
    MatmulOptions o;
    o.bias = &w.bias;
    c = Tensor({w.M, w.N});
    matmul(c, w.a, Trans::no, w.b, w.tb, o);
  };
  const auto before = matmul_conv_products();
  for (Work& w : work) std::thread([&] { product(w, w.alone); }).join();
  if (!matmul_f32_512_bit()) {
    EXPECT_EQ(matmul_conv_products(), before + static_cast<std::int64_t>(work.size()));
  }
  constexpr int kRepeats = 20;
  std::vector<int> mismatches(work.size(), 0);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < work.size(); ++t)
    threads.emplace_back([&, t] {
      Work& w = work[t];
      for (int r = 0; r < kRepeats; ++r) {
        product(w, w.together);
        for (std::int64_t i = 0; i < w.alone.numel(); ++i)
          if (w.together.f32()[i] != w.alone.f32()[i]) {
            ++mismatches[t];
            break;
          }
      }
    });
  for (auto& t : threads) t.join();
  for (std::size_t t = 0; t < work.size(); ++t)
    EXPECT_EQ(mismatches[t], 0) << "thread " << t
                                << ": products that differ from its product alone";
}

TEST(Matmul, PackedOperandServesOnlyItsOwnProduct) {
  const Tensor a = test::random_tensor({20, 8}, 1), b = test::random_tensor({6, 8}, 2);
  Tensor c({20, 6});
  PackedWeights packed;
  EXPECT_NE(test::error_of([&] { matmul(c, a, packed); }).find("not packed"), std::string::npos);
  packed.pack(b, Trans::yes, 20, {});
  matmul(c, a, packed);  // its own product
  Tensor c19({19, 6});
  EXPECT_NE(test::error_of([&] { matmul(c19, a.rows(0, 19), packed); }).find("another product"),
            std::string::npos);
  MatmulOptions acc;
  acc.accumulate = true;
  EXPECT_NE(test::error_of([&] { matmul(c, a, packed, acc); }).find("another product"),
            std::string::npos);
  Tensor wide({20, 7});
  EXPECT_NE(test::error_of([&] { matmul(wide, a, packed); }).find("do not chain"),
            std::string::npos);
  MatmulOptions runtime;
  runtime.dynamic_m = true;
  EXPECT_THROW(packed.pack(b, Trans::yes, 20, runtime), Error);
  EXPECT_THROW(packed.pack(b, Trans::yes, 0, {}), Error);
  // linear_forward packs when given a PackedWeights (the caller decided), never varying rows.
  Tensor y({20, 6});
  linear_forward(y, a, b, nullptr, Precision::f32, nullptr, false, &packed);
  EXPECT_NEAR(y.f32()[5], c.f32()[5], 1e-5);
  EXPECT_NE(test::error_of([&] {
              linear_forward(y, a, b, nullptr, Precision::f32, nullptr, true, &packed);
            }).find("fixed rows"),
            std::string::npos);
}

// Layers pack only for training products of weight_packing_min_rows() rows or more.
TEST(Linear, PacksWeightsFromTheRowsSet) {
  const auto saved = weight_packing_min_rows();
  set_weight_packing_min_rows(64);
  EXPECT_FALSE(packs_weights(63, Precision::f32));
  EXPECT_TRUE(packs_weights(64, Precision::f32));
  EXPECT_EQ(packs_weights(64, Precision::bf16), matmul_bf16_native());
  set_weight_packing_min_rows(0);
  EXPECT_FALSE(packs_weights(1 << 20, Precision::f32));
  set_weight_packing_min_rows(saved);
}

// Packing is on by default (from dispatch::kPackingMinRows rows) where oneDNN's f32 products
// are 512-bit, and off elsewhere, where the packed layout measured no faster: unless
// ONEDNN_MAX_CPU_ISA (or its older name DNNL_MAX_CPU_ISA) caps oneDNN, wherever the CPU has
// AVX-512 (avx512_core: f, bw, vl and dq). A negative setting means never, as 0 does.
TEST(Linear, PacksByDefaultOnlyOnAvx512) {
  const bool wide = matmul_f32_512_bit();
#if defined(__x86_64__)
  if (!std::getenv("ONEDNN_MAX_CPU_ISA") && !std::getenv("DNNL_MAX_CPU_ISA")) {
    __builtin_cpu_init();
    EXPECT_EQ(wide, __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"));
  }
#endif
  EXPECT_EQ(weight_packing_min_rows(), wide ? dispatch::kPackingMinRows : 0);
  EXPECT_EQ(packs_weights(1 << 20, Precision::f32), wide);
  const std::int64_t saved = weight_packing_min_rows();
  set_weight_packing_min_rows(-1);
  EXPECT_EQ(weight_packing_min_rows(), 0);
  EXPECT_FALSE(packs_weights(1 << 20, Precision::f32));
  set_weight_packing_min_rows(saved);
}

// A copy shares the packed memory until either packs again, which then packs into memory of its
// own; a packed operand keeps serving its product after the primitive cache is emptied.
TEST(Matmul, PackedOperandCopiesAndCacheRefills) {
  const std::int64_t M = 12, K = 9, N = 7;
  const Tensor a = test::random_tensor({M, K}, 1), b1 = test::random_tensor({N, K}, 2),
               b2 = test::random_tensor({N, K}, 3);
  auto plain = [&](const Tensor& b) {
    Tensor c({M, N});
    matmul(c, a, Trans::no, b, Trans::yes);
    return c;
  };
  auto packed_product = [&](const PackedWeights& p) {
    Tensor c({M, N});
    matmul(c, a, p);
    return c;
  };
  auto expect_near = [](const Tensor& got, const Tensor& want, const char* what) {
    for (std::int64_t i = 0; i < want.numel(); ++i)
      ASSERT_NEAR(got.f32()[i], want.f32()[i], 1e-5) << what << " at " << i;
  };
  PackedWeights original;
  original.pack(b1, Trans::yes, M, {});
  const PackedWeights copy = original;
  original.pack(b2, Trans::yes, M, {});
  expect_near(packed_product(copy), plain(b1), "the copy");
  expect_near(packed_product(original), plain(b2), "the original");
  // More new shapes than the cache holds (1024): it is emptied and refilled meanwhile.
  const Tensor x = test::random_tensor({1100, 3}, 4), w = test::random_tensor({2, 3}, 5);
  Tensor y;
  for (std::int64_t m = 1; m <= 1100; ++m) {
    y.resize({m, 2});
    linear_forward(y, x.rows(0, m), w, nullptr);
  }
  expect_near(packed_product(original), plain(b2), "after the cache refilled");
}
