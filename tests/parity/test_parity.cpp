// PyTorch parity: every golden case written by make_golden.py, loaded the way `ffnlab run` loads
// it (config file, Hugging Face names, prefix), compared for y, dx and every parameter gradient.
// f32: error <= 1e-4 of the reference's scale (the bound). bf16 products: <= 3e-2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "ffnlab/io/ffn_io.hpp"
#include "ffnlab/layers/feed_forward.hpp"
#include "ffnlab/layers/moe_ffn.hpp"

using namespace ffnlab;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> case_names() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(FFNLAB_GOLDEN_DIR))
    if (e.is_directory()) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

class Parity : public ::testing::TestWithParam<std::string> {};

void check_case(const std::string& name, Precision precision, double tol) {
  const fs::path dir = fs::path(FFNLAB_GOLDEN_DIR) / name;
  std::ifstream meta_in(dir / "case.json");
  const auto meta = nlohmann::json::parse(meta_in);
  const std::string prefix = meta.at("prefix");
  const FFNConfig config = read_ffn_config_file((dir / "config.json").string());
  auto ffn = make_ffn(config, 123);
  ffn->set_precision(precision);
  ffn->context().sequence = meta.value("sequence", std::int64_t{0});
  load_parameters(ffn->parameters(), SafeTensors::load((dir / "weights.safetensors").string()),
                  prefix);
  // [T, D], or [B, S, D] for routings that route each sequence on its own
  const auto rows = [&](const Tensor& t) {
    return t.reshape({t.numel() / config.d_model, config.d_model});
  };
  const auto x_file = SafeTensors::load((dir / "x.safetensors").string());
  const auto dy_file = SafeTensors::load((dir / "dy.safetensors").string());
  const Tensor x = rows(x_file.f32("x"));
  const Tensor dy = rows(dy_file.f32("dy"));
  const auto expected = SafeTensors::load((dir / "expected.safetensors").string());
  // MoE++'s gating residual: the previous layer's logits, and the next layer's gradient of these.
  const bool residual = x_file.contains("gate_residual");
  const Tensor gate_residual = residual ? x_file.f32("gate_residual") : Tensor();
  const Tensor dlogits = residual ? dy_file.f32("dlogits") : Tensor();
  ffn->context().previous_logits = residual ? &gate_residual : nullptr;
  // Hash routing: the tokens' ids.
  std::vector<std::int32_t> ids;
  if (x_file.contains("token_ids"))
    for (const std::int64_t id : x_file.ints("token_ids"))
      ids.push_back(static_cast<std::int32_t>(id));
  ffn->context().token_ids = ids.empty() ? nullptr : ids.data();
  ffn->context().logits_grad = residual ? &dlogits : nullptr;

  Tensor y, dx;
  ffn->forward(y, x, true);
  ffn->backward(dx, dy);
  auto compare = [&](const std::string& what, const Tensor& got) {
    const Tensor want = expected.f32(what);
    ASSERT_EQ(got.numel(), want.numel()) << what;
    const double err = test::scaled_error(got.f32(), want.f32(), got.numel());
    EXPECT_LE(err, tol) << name << " " << enum_name(precision) << ": " << what;
  };
  compare("y", y);
  compare("dx", dx);
  for (const auto& p : ffn->parameters().list()) compare(prefix + p.name, p.grad);
  if (residual) {
    compare("logits", ffn->router_logits());
    compare("dgate_residual", ffn->previous_logits_grad());
  }
  if (meta.value("moe", false)) {
    // The router runs in f32 at every precision: the same choices, weights and losses.
    const auto* moe = dynamic_cast<const MoEFFN*>(ffn.get());
    ASSERT_NE(moe, nullptr);
    const Routing& r = moe->routing();
    const Tensor experts = expected.f32("experts"), kept = expected.f32("expert_kept");
    const Tensor weights = expected.f32("expert_weights");
    ASSERT_EQ(experts.numel(), static_cast<std::int64_t>(r.expert.size()));
    for (std::int64_t a = 0; a < experts.numel(); ++a) {
      EXPECT_EQ(r.expert[a], static_cast<int>(experts.f32()[a])) << name << " assignment " << a;
      EXPECT_EQ(r.slot[a] >= 0, kept.f32()[a] != 0.0f) << name << " assignment " << a;
      EXPECT_NEAR(r.weight[a], weights.f32()[a], 1e-5) << name << " assignment " << a;
    }
    const float balance = expected.f32("balance_loss").f32()[0];
    const float z = expected.f32("z_loss").f32()[0];
    EXPECT_NEAR(r.balance_loss, balance, 1e-5 * std::max(1.0f, balance)) << name;
    EXPECT_NEAR(r.z_loss, z, 1e-5 * std::max(1.0f, z)) << name;
    const float entropy = expected.f32("entropy").f32()[0];
    EXPECT_NEAR(r.entropy, entropy, 1e-5) << name;
    const float l1 = expected.f32("l1_loss").f32()[0];
    EXPECT_NEAR(r.l1_loss, l1, 1e-5 * std::max(1.0f, l1)) << name;
  }
}

TEST_P(Parity, F32) {
  check_case(GetParam(), Precision::f32, 1e-4);
}
TEST_P(Parity, Bf16) {
  check_case(GetParam(), Precision::bf16, 3e-2);
}

INSTANTIATE_TEST_SUITE_P(Golden, Parity, ::testing::ValuesIn(case_names()), [](const auto& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
});

TEST(ParityCases, AllWritten) {
  EXPECT_GE(case_names().size(), 48u);
  int moe = 0;
  for (const auto& n : case_names()) moe += n.rfind("moe_", 0) == 0;
  EXPECT_GE(moe, 12);
}

}  // namespace
