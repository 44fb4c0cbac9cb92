// LayerNorm and RMSNorm: fast forward against the double reference; fast backward against
// central differences of the reference.
#include <gtest/gtest.h>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/ops/norm.hpp"
#include "ffnlab/ops/ref/norm_ref.hpp"

using namespace ffnlab;

TEST(Norm, MatchesReferenceAndCentralDifferences) {
  std::uint64_t seed = 1;
  for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm})
    for (bool bias : {true, false})
      for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{5, 24}, {3, 7}, {1, 130}}) {
        const std::int64_t T = rows, D = cols;  // lambdas below capture them (clang 14: no
                                                // capture of structured bindings)
        if (kind == NormKind::rmsnorm && bias) continue;
        const bool ln = kind == NormKind::layernorm;
        const Tensor x = test::random_tensor({T, D}, seed++, 1.5f);
        Tensor w = test::random_tensor({D}, seed++);
        Tensor b = test::random_tensor({D}, seed++);
        const Tensor dy = test::random_tensor({T, D}, seed++);
        Tensor y, mean, rstd, dx, dw({D}), db({D});
        const float eps = 1e-5f;
        norm_forward(kind, y, mean, rstd, x, w, bias ? &b : nullptr, eps);
        norm_backward(kind, dx, dw, bias ? &db : nullptr, dy, x, mean, rstd, w);

        auto x64 = test::to_vector<double>(x), w64 = test::to_vector<double>(w),
             b64 = test::to_vector<double>(b), g64 = test::to_vector<double>(dy);
        std::vector<double> ry(T * D);
        auto loss = [&] {  // L = Σ y ⊙ dy
          ref::norm_forward<double>(ln, ry.data(), x64.data(), w64.data(),
                                    bias ? b64.data() : nullptr, T, D, eps);
          double l = 0;
          for (std::size_t i = 0; i < ry.size(); ++i) l += ry[i] * g64[i];
          return l;
        };
        loss();
        const std::string what = std::string(enum_name(kind)) + (bias ? " bias" : "");
        EXPECT_LT(test::scaled_error(y.f32(), ry.data(), y.numel()), 2e-6) << what;
        const auto adx = test::to_vector<double>(dx), adw = test::to_vector<double>(dw),
                   adb = test::to_vector<double>(db);
        test::expect_gradient(x64, adx, loss, test::sample_indices(x64.size(), 40), 2e-5, 1e-4,
                              (what + " dx").c_str());
        test::expect_gradient(w64, adw, loss, test::sample_indices(w64.size(), 40), 2e-5, 1e-4,
                              (what + " dw").c_str());
        if (bias)
          test::expect_gradient(b64, adb, loss, test::sample_indices(b64.size(), 40), 2e-5, 1e-4,
                                (what + " db").c_str());
      }
}

TEST(Norm, WeightGradientAccumulatesAndNamesParse) {
  const Tensor x = test::random_tensor({4, 8}, 3), dy = test::random_tensor({4, 8}, 4);
  Tensor w = test::random_tensor({8}, 5), y, mean, rstd, dx, dw1({8}), dw2({8});
  norm_forward(NormKind::rmsnorm, y, mean, rstd, x, w, nullptr, 1e-6f);
  norm_backward(NormKind::rmsnorm, dx, dw1, nullptr, dy, x, mean, rstd, w);
  dw2.fill(1.f);
  norm_backward(NormKind::rmsnorm, dx, dw2, nullptr, dy, x, mean, rstd, w);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(dw2.f32()[i], dw1.f32()[i] + 1.f);
  EXPECT_EQ(parse_enum<NormKind>("layernorm"), NormKind::layernorm);
  EXPECT_THROW(parse_enum<NormKind>("batchnorm"), Error);
  EXPECT_THROW(norm_forward(NormKind::layernorm, y, mean, rstd, x, Tensor({7}), nullptr, 1e-5f),
               Error);
}
