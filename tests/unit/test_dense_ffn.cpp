// DenseFFN (plain, GLU in both layouts, multi-branch): the fast layer against the double
// reference layer, the reference against central differences, inference against training.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/layers/dense_ffn.hpp"
#include "ffnlab/layers/ref/dense_ffn_ref.hpp"
#include "ffnlab/ops/glu.hpp"
#include "ffnlab/ops/linear.hpp"
#include "ffnlab/ops/matmul.hpp"
#include "ffnlab/scratch.hpp"

using namespace ffnlab;

namespace {

std::vector<FFNConfig> configs() {
  std::vector<FFNConfig> out;
  for (const auto& v : {"relu", "gelu", "glu", "bilinear", "reglu", "geglu", "swiglu", "gated"})
    for (bool bias : {true, false})
      for (GLULayout layout : {GLULayout::separate, GLULayout::fused}) {
        FFNConfig c = variant_config(v, 13, 37, bias);
        if (c.kind == FFNKind::multi_branch) {
          if (layout == GLULayout::fused) continue;
          c.branches = 3;
        }
        c.layout = layout;
        out.push_back(c);
      }
  for (int i = 0; i < static_cast<int>(Activation::count); ++i) {
    FFNConfig c = variant_config("relu", 9, 21, true);
    c.act = Act{static_cast<Activation>(i)};
    out.push_back(c);
  }
  FFNConfig swish = variant_config("swiglu", 8, 16, false);
  swish.act.beta = 1.5f;
  out.push_back(swish);
  return out;
}

std::string describe(const FFNConfig& c) {
  return variant_name(c) + (c.bias ? " bias " : " nobias ") + enum_name(c.layout);
}

// The reference with the layer's parameters, gathered by name (independent of the buffer order).
ref::DenseFFN<double> reference_of(DenseFFN& ffn) {
  const FFNConfig& c = ffn.config();
  ref::DenseFFN<double> r{c, {}, {}, {}, {}, {}, {}};
  auto& ps = ffn.parameters();
  auto append = [&](std::vector<double>& dst, const std::string& name) {
    const Tensor& t = ps.at(name).value;
    dst.insert(dst.end(), t.f32(), t.f32() + t.numel());
  };
  std::vector<std::string> ins;
  if (c.kind == FFNKind::plain)
    ins = {c.layout == GLULayout::fused ? "dense_h_to_4h" : "up_proj"};
  else if (c.kind == FFNKind::glu)
    ins = c.layout == GLULayout::fused ? std::vector<std::string>{"dense_h_to_4h"}
                                       : std::vector<std::string>{"gate_proj", "up_proj"};
  else if (c.kind == FFNKind::multi_branch)
    for (int b = 0; b < c.branches; ++b) {
      ins.push_back("branches." + std::to_string(b) + ".gate_proj");
      ins.push_back("branches." + std::to_string(b) + ".up_proj");
    }
  else  // a new kind: its input names here, written from its Hugging Face layout
    ADD_FAILURE() << "reference_of: no input names for kind " << enum_name(c.kind);
  const std::string out = c.layout == GLULayout::fused ? "dense_4h_to_h" : "down_proj";
  for (const auto& n : ins) append(r.w_in, n + ".weight");
  append(r.w_out, out + ".weight");
  if (c.bias) {
    for (const auto& n : ins) append(r.b_in, n + ".bias");
    append(r.b_out, out + ".bias");
  }
  return r;
}

}  // namespace

TEST(DenseFFN, MatchesReferenceForwardAndBackward) {
  std::uint64_t seed = 1;
  for (const FFNConfig& c : configs()) {
    for (std::int64_t T : {1, 7, 19}) {  // few-row streaming, and oneDNN (T > 8)
      DenseFFN ffn(c, seed++);
      auto r = reference_of(ffn);
      const Tensor x = test::random_tensor({T, c.d_model}, seed++);
      const Tensor dy = test::random_tensor({T, c.d_model}, seed++);
      Tensor y, dx;
      ffn.forward(y, x, true);
      ffn.backward(dx, dy);

      std::vector<double> ry, rdx, rdw_in(r.w_in.size()), rdb_in(r.b_in.size()),
          rdw_out(r.w_out.size()), rdb_out(r.b_out.size());
      const auto x64 = test::to_vector<double>(x);
      r.forward(ry, x64, T);
      r.backward(rdx, rdw_in, rdb_in, rdw_out, rdb_out, test::to_vector<double>(dy), x64, T);

      const std::string what = describe(c) + " T=" + std::to_string(T);
      const double tol = 1e-5;
      EXPECT_LT(test::scaled_error(y.f32(), ry.data(), y.numel()), tol) << what;
      EXPECT_LT(test::scaled_error(dx.f32(), rdx.data(), dx.numel()), tol) << what;
      // Parameter gradients in buffer order: the buffer's W_in span then W_out (see dense_ffn.hpp).
      const std::int64_t P = ffn.in_width(), D = c.d_model, F = c.d_ff;
      const float* g = ffn.parameters().grads().f32();
      EXPECT_LT(test::scaled_error(g, rdw_in.data(), P * D), tol) << what << " dW_in";
      if (c.bias) {
        EXPECT_LT(test::scaled_error(g + P * D, rdb_in.data(), P), tol) << what << " db_in";
        EXPECT_LT(test::scaled_error(g + P * D + P, rdw_out.data(), D * F), tol) << what;
        EXPECT_LT(test::scaled_error(g + P * D + P + D * F, rdb_out.data(), D), tol) << what;
      } else {
        EXPECT_LT(test::scaled_error(g + P * D, rdw_out.data(), D * F), tol) << what << " dW_out";
      }
    }
  }
}

TEST(DenseFFN, ReferenceGradientsMatchCentralDifferences) {
  std::uint64_t seed = 500;
  for (const FFNConfig& base : configs()) {
    FFNConfig c = base;
    c.d_model = 5;
    c.d_ff = 6;
    if (c.kind == FFNKind::multi_branch) c.branches = 2;
    DenseFFN ffn(c, seed++);
    auto r = reference_of(ffn);
    const std::int64_t T = 3;
    auto x = test::to_vector<double>(test::random_tensor({T, c.d_model}, seed++));
    const auto dy = test::to_vector<double>(test::random_tensor({T, c.d_model}, seed++));
    std::vector<double> y, dx, dw_in(r.w_in.size()), db_in(r.b_in.size()), dw_out(r.w_out.size()),
        db_out(r.b_out.size());
    r.forward(y, x, T);
    r.backward(dx, dw_in, db_in, dw_out, db_out, dy, x, T);
    auto loss = [&] {
      std::vector<double> out;
      r.forward(out, x, T);
      double l = 0;
      for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * dy[i];
      return l;
    };
    const std::string what = describe(c);
    const double atol = 1e-7, rtol = 1e-6;
    test::expect_gradient(x, dx, loss, test::sample_indices(x.size(), 15), atol, rtol,
                          (what + " dx").c_str());
    test::expect_gradient(r.w_in, dw_in, loss, test::sample_indices(r.w_in.size(), 25), atol, rtol,
                          (what + " dW_in").c_str());
    test::expect_gradient(r.w_out, dw_out, loss, test::sample_indices(r.w_out.size(), 15), atol,
                          rtol, (what + " dW_out").c_str());
    if (c.bias) {
      test::expect_gradient(r.b_in, db_in, loss, test::sample_indices(r.b_in.size(), 10), atol,
                            rtol, (what + " db_in").c_str());
      test::expect_gradient(r.b_out, db_out, loss, test::sample_indices(r.b_out.size(), 5), atol,
                            rtol, (what + " db_out").c_str());
    }
  }
}

TEST(DenseFFN, InferenceMatchesTrainingForward) {
  std::uint64_t seed = 900;
  for (const FFNConfig& c : configs()) {
    DenseFFN ffn(c, seed++);
    const Tensor x = test::random_tensor({11, c.d_model}, seed++);
    Tensor y_train, y_infer;
    ffn.forward(y_train, x, true);
    ffn.forward(y_infer, x, false);
    EXPECT_LT(test::scaled_error(y_infer.f32(), y_train.f32(), y_train.numel()), 1e-5)
        << describe(c);
  }
}

TEST(DenseFFN, GradientsAccumulateAcrossBackwardCalls) {
  DenseFFN ffn(variant_config("swiglu", 8, 12, true), 3);
  const Tensor x = test::random_tensor({4, 8}, 4), dy = test::random_tensor({4, 8}, 5);
  Tensor y, dx;
  ffn.forward(y, x, true);
  ffn.backward(dx, dy);
  const Tensor once = ffn.parameters().grads().clone();
  ffn.forward(y, x, true);
  ffn.backward(dx, dy);
  for (std::int64_t i = 0; i < once.numel(); ++i)
    EXPECT_NEAR(ffn.parameters().grads().f32()[i], 2 * once.f32()[i], 1e-5);
}

TEST(DenseFFN, WorkspacesFollowTheTokenCount) {
  DenseFFN ffn(variant_config("geglu", 8, 12, false), 3);
  for (std::int64_t T : {5, 2, 9, 1}) {
    const Tensor x = test::random_tensor({T, 8}, T), dy = test::random_tensor({T, 8}, T + 50);
    Tensor y, dx;
    ffn.forward(y, x, true);
    ffn.backward(dx, dy);
    EXPECT_EQ(y.shape(), (Shape{T, 8}));
    EXPECT_EQ(dx.shape(), (Shape{T, 8}));
  }
}

TEST(DenseFFN, ZeroFractionIsMeasured) {
  DenseFFN ffn(variant_config("relu", 16, 64, true), 1);
  const Tensor x = test::random_tensor({50, 16}, 2);
  Tensor y;
  ffn.forward(y, x, true);
  const double z = ffn.stats().zero_fraction;
  EXPECT_GT(z, 0.3);  // about half of a ReLU's pre-activations are negative at initialisation
  EXPECT_LT(z, 0.7);
  DenseFFN gelu(variant_config("gelu", 16, 64, true), 1);
  gelu.forward(y, x, true);
  EXPECT_EQ(gelu.stats().zero_fraction, 0.0);
}

TEST(DenseFFN, RejectsBadInput) {
  EXPECT_THROW(DenseFFN(variant_config("relu", 8, 0, true), 1), Error);
  DenseFFN ffn(variant_config("relu", 8, 16, true), 1);
  Tensor y, dx;
  EXPECT_THROW(ffn.backward(dx, Tensor({2, 8})), Error);  // no training forward yet
  EXPECT_THROW(ffn.forward(y, Tensor({2, 7}), true), Error);
  ffn.forward(y, Tensor({2, 8}), true);
  EXPECT_THROW(ffn.backward(dx, Tensor({3, 8})), Error);
}

TEST(DenseFFN, Bf16LayerConvertsEachOperandOnceWithTheSameValues) {
  // A bf16 layer converts x, h, the weights and the gradients once for all the products that read
  // them; every product converting its own f32 operands computes the same values, bit for bit.
  // Two steps on one layer, the weights changed between them and fewer tokens in the second:
  // the backward reads this step's copies, not the last one's.
  std::uint64_t seed = 1300;
  for (const FFNConfig& c : configs()) {
    DenseFFN ffn(c, seed++);
    ffn.set_precision(Precision::bf16);
    auto& ps = ffn.parameters();
    for (std::int64_t T : {300, 19}) {
      ps.zero_grad();
      const Tensor x = test::random_tensor({T, c.d_model}, seed++);
      const Tensor dy = test::random_tensor({T, c.d_model}, seed++);
      Tensor y, dx;
      ffn.forward(y, x, true);
      ffn.backward(dx, dy);

      // The same layer from ops called on f32 tensors (each product converts its inputs).
      const std::int64_t P = ffn.in_width(), D = c.d_model, F = c.d_ff;
      const int branches = c.gated_branches();
      const Precision bf16 = Precision::bf16;
      const std::string first = DenseFFN::in_names(c)[0], out = DenseFFN::out_name(c);
      const Tensor w_in = ps.value_span(first + ".weight", {P, D});
      const Tensor& w_out = ps.at(out + ".weight").value;
      Tensor b_in, b_out, db_in({P}), db_out({D});
      if (c.bias) {
        b_in = ps.value_span(first + ".bias", {P});
        b_out = ps.at(out + ".bias").value;
      }
      Tensor a({T, P}), h({T, F}), ry({T, D}), dh({T, F}), da({T, P}), rdx({T, D});
      Tensor dw_in({P, D}), dw_out({D, F});
      if (mix_in_epilogue(c.act, branches, true)) {
        linear_forward(h, x, w_in, c.bias ? &b_in : nullptr, bf16, &c.act);
      } else {
        linear_forward(a, x, w_in, c.bias ? &b_in : nullptr, bf16);
        mix_forward(h, a, c.act, branches);
      }
      linear_forward(ry, h, w_out, c.bias ? &b_out : nullptr, bf16);
      linear_backward(&dh, dw_out, c.bias ? &db_out : nullptr, dy, h, w_out, bf16);
      mix_backward(da, dh, a, h, c.act, branches);
      linear_backward(&rdx, dw_in, c.bias ? &db_in : nullptr, da, x, w_in, bf16);

      const std::string what = describe(c) + " T=" + std::to_string(T);
      auto same = [&](const Tensor& got, const Tensor& want, const char* name) {
        ASSERT_EQ(got.numel(), want.numel()) << what << " " << name;
        EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), got.nbytes())) << what << " " << name;
      };
      same(y, ry, "y");
      same(dx, rdx, "dx");
      same(ps.grad_span(first + ".weight", {P, D}), dw_in, "dW_in");
      same(ps.at(out + ".weight").grad, dw_out, "dW_out");
      if (c.bias) {
        same(ps.grad_span(first + ".bias", {P}), db_in, "db_in");
        same(ps.at(out + ".bias").grad, db_out, "db_out");
      }
      // An optimizer step's worth of change before the next step.
      float* v = ps.values().f32();
      for (std::int64_t i = 0; i < ps.values().numel(); ++i) v[i] += 0.01f * std::sin(i + 0.5f);
    }
  }
}

TEST(DenseFFN, PrecisionChangedBeforeTheBackwardIsAnError) {
  DenseFFN ffn(variant_config("swiglu", 8, 12, true), 3);
  const Tensor x = test::random_tensor({20, 8}, 4), dy = test::random_tensor({20, 8}, 5);
  Tensor y, dx;
  ffn.set_precision(Precision::bf16);
  ffn.forward(y, x, true);
  ffn.set_precision(Precision::f32);
  EXPECT_THROW(
      {
        try {
          ffn.backward(dx, dy);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("precision changed from bf16 to f32"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
}

// A layer whose tensors, workspaces included, all take huge-page mappings (from 16 bytes) trains
// to the same bits as one whose tensors come from the allocator: where memory lies changes no
// value. Products as a convolution from 16 rows, so its blocked-weights scratch is mapped too.
TEST(DenseFFN, TensorsInHugePagesTrainToTheSameBits) {
  const auto saved_huge = huge_page_min_bytes();
  const auto saved_conv = matmul_conv_min_rows();
  set_matmul_conv_min_rows(16);
  std::uint64_t seed = 2300;
  for (const FFNConfig& c : configs()) {
    const Tensor x = test::random_tensor({40, c.d_model}, seed++);
    const Tensor dy = test::random_tensor({40, c.d_model}, seed++);
    Tensor y[2], dx[2], grads[2];
    for (int huge = 0; huge < 2; ++huge) {
      set_huge_page_min_bytes(huge ? 16 : 0);
      release_scratch();
      DenseFFN ffn(c, seed);
      ffn.forward(y[huge], x, true);
      ffn.backward(dx[huge], dy);
      grads[huge] = ffn.parameters().grads().clone();
#if defined(__linux__)
      if (huge) {  // the mapped path taken: its starts are 2 MiB-aligned
        for (const Tensor* t : {&ffn.parameters().values(), &y[huge], &scratch(Scratch::ffn_da)}) {
          EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t->f32()) % (std::uintptr_t{2} << 20), 0u)
              << describe(c);
        }
      }
#endif
    }
    set_huge_page_min_bytes(saved_huge);
    release_scratch();
    ++seed;
    for (auto* pair : {y, dx, grads}) {
      ASSERT_EQ(pair[0].numel(), pair[1].numel()) << describe(c);
      EXPECT_EQ(std::memcmp(pair[0].f32(), pair[1].f32(), pair[0].nbytes()), 0) << describe(c);
    }
  }
  set_matmul_conv_min_rows(saved_conv);
}

// From weight_packing_min_rows() rows a training layer reads its weights packed (the forward's
// two products and the backward's two dx products): the same values as the plain products up to
// the order of the sums, in f32 and native bf16, every FFN config; steps with changed weights
// and fewer tokens (below the rows set: not packed) read this step's weights.
TEST(DenseFFN, PackedWeightsTrainLikeThePlainOnes) {
  const auto saved = weight_packing_min_rows();
  std::vector<Precision> precisions{Precision::f32};
  if (converts_operands_once(Precision::bf16)) precisions.push_back(Precision::bf16);
  std::uint64_t seed = 1700;
  for (Precision precision : precisions)
    for (const FFNConfig& c : configs()) {
      DenseFFN plain(c, seed), packed(c, seed);
      ++seed;
      plain.set_precision(precision);
      packed.set_precision(precision);
      for (std::int64_t T : {40, 40, 24, 9}) {
        const Tensor x = test::random_tensor({T, c.d_model}, seed++);
        const Tensor dy = test::random_tensor({T, c.d_model}, seed++);
        Tensor y0, dx0, y1, dx1;
        plain.parameters().zero_grad();
        packed.parameters().zero_grad();
        set_weight_packing_min_rows(0);
        plain.forward(y0, x, true);
        plain.backward(dx0, dy);
        set_weight_packing_min_rows(16);
        const auto before = matmul_packings();
        packed.forward(y1, x, true);
        packed.backward(dx1, dy);
        set_weight_packing_min_rows(saved);
        const std::string what =
            describe(c) + " " + std::string(enum_name(precision)) + " T=" + std::to_string(T);
        EXPECT_EQ(matmul_packings() - before, T >= 16 ? 4 : 0) << what;
        auto near = [&](const Tensor& got, const Tensor& want, const char* name) {
          ASSERT_EQ(got.numel(), want.numel()) << what << " " << name;
          double scale = 0;
          for (std::int64_t i = 0; i < want.numel(); ++i)
            scale = std::max(scale, double(std::abs(want.f32()[i])));
          for (std::int64_t i = 0; i < want.numel(); ++i)
            ASSERT_NEAR(got.f32()[i], want.f32()[i], 1e-5 * scale) << what << " " << name;
        };
        near(y1, y0, "y");
        near(dx1, dx0, "dx");
        near(packed.parameters().grads(), plain.parameters().grads(), "grads");
        for (DenseFFN* ffn : {&plain, &packed}) {  // an optimizer step's worth of change
          float* v = ffn->parameters().values().f32();
          for (std::int64_t i = 0; i < ffn->parameters().values().numel(); ++i)
            v[i] += 0.01f * std::sin(i + 0.5f);
        }
      }
    }
}
