// The one enum-name mechanism (names.hpp) for every enum, and the JSON key tables of the configs:
// every name parses back to its value, errors list what is known, every printed key is read back.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include "../common/test_util.hpp"
#include "ffnlab/config_flags.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/layers/moe/routing_family.hpp"
#include "ffnlab/limits.hpp"
#include "ffnlab/names.hpp"
#include "ffnlab/ops/matmul.hpp"
#include "ffnlab/train/trainer.hpp"

using namespace ffnlab;
using nlohmann::json;

namespace {

using test::error_of;

template <typename E>
void expect_names_round_trip(const char* expected_error_prefix) {
  const auto names = enum_names<E>();
  ASSERT_EQ(names.size(), static_cast<std::size_t>(E::count));
  for (std::size_t i = 0; i < names.size(); ++i) {
    const E value = static_cast<E>(i);
    EXPECT_EQ(names[i], enum_name(value));
    EXPECT_EQ(parse_enum<E>(names[i]), value) << names[i];
  }
  const std::string err = error_of([] { parse_enum<E>("no-such-name"); });
  EXPECT_EQ(err.rfind(expected_error_prefix, 0), 0u) << err;
  EXPECT_NE(err.find("'no-such-name' (known: " + names[0]), std::string::npos) << err;
  for (const auto& n : names) EXPECT_NE(err.find(n), std::string::npos) << err;
}

}  // namespace

TEST(Names, EveryEnumRoundTripsAndListsItsNamesOnError) {
  expect_names_round_trip<Activation>("[activation] unknown activation");
  expect_names_round_trip<FFNKind>("[ffn] unknown kind");
  expect_names_round_trip<GLULayout>("[ffn] unknown layout");
  expect_names_round_trip<MoENaming>("[ffn] unknown MoE naming");
  expect_names_round_trip<ScoreFunc>("[ffn] unknown scoring function");
  expect_names_round_trip<DropPolicy>("[ffn] unknown drop policy");
  expect_names_round_trip<BalanceLoss>("[ffn] unknown balance loss");
  expect_names_round_trip<NormKind>("[norm] unknown norm");
  expect_names_round_trip<PositionKind>("[lm] unknown positions");
  expect_names_round_trip<OptimizerKind>("[optimizer] unknown optimizer");
  expect_names_round_trip<DecayKind>("[schedule] unknown decay");
  expect_names_round_trip<Precision>("[precision] unknown dtype");
}

TEST(Names, AliasesParseToTheirValueAndPrintCanonically) {
  EXPECT_EQ(parse_enum<Activation>("swish"), Activation::silu);
  EXPECT_EQ(parse_enum<Activation>("gelu_pytorch_tanh"), Activation::gelu_tanh);
  EXPECT_STREQ(enum_name(parse_enum<Activation>("quick_gelu")), "gelu_quick");
  EXPECT_EQ(parse_enum<Precision>("bfloat16"), Precision::bf16);
  // The error lists aliases too, since they are accepted.
  EXPECT_NE(error_of([] { parse_enum<Activation>("selu"); }).find("relu_squared"),
            std::string::npos);
}

TEST(Names, IncompleteTablesAreCaughtAtCompileTime) {
  enum class Three : std::uint8_t { a, b, c, count };
  constexpr auto full =
      name_table<Three>("t", "t", {{Three::a, "a"}, {Three::b, "b"}, {Three::c, "c"}});
  constexpr auto missing = name_table<Three>("t", "t", {{Three::a, "a"}, {Three::b, "b"}});
  constexpr auto unordered =
      name_table<Three>("t", "t", {{Three::a, "a"}, {Three::c, "c"}, {Three::b, "b"}});
  static_assert(full.complete());  // what each enum's header asserts
  EXPECT_TRUE(full.complete());
  EXPECT_FALSE(missing.complete());
  EXPECT_FALSE(unordered.complete());
}

// Every key a config prints is one it reads, and reading it gives the same config back.
TEST(ConfigKeys, LMAndTrainConfigsRoundTripThroughEveryKey) {
  LMConfig lm;
  lm.positions = PositionKind::rope;
  lm.norm = NormKind::rmsnorm;
  lm.layers = 3;
  lm.dropout = 0.125f;
  lm.ffn = variant_config("moe", lm.d_model, 64, false);
  lm.ffn.moe.score = ScoreFunc::sigmoid;
  lm.ffn.moe.drop = DropPolicy::probability;
  const json j = lm_config_to_json(lm);
  EXPECT_EQ(j.at("positions"), "rope");
  EXPECT_EQ(j.at("ffn").at("moe").at("score"), "sigmoid");
  EXPECT_EQ(lm_config_to_json(lm_config_from_json(j)), j);

  TrainConfig t;
  t.optimizer.kind = OptimizerKind::sgd;
  t.optimizer.momentum = 0.5f;
  t.decay = DecayKind::constant;
  t.precision = Precision::bf16;
  t.seed = 7;
  const json tj = train_config_to_json(t);
  EXPECT_EQ(tj.at("optimizer"), "sgd");
  EXPECT_EQ(tj.at("momentum"), 0.5f);
  EXPECT_EQ(tj.at("precision"), "bf16");
  const TrainConfig back = train_config_from_json(tj);
  EXPECT_EQ(back.optimizer.kind, OptimizerKind::sgd);
  EXPECT_EQ(back.seed, 7u);
  EXPECT_EQ(train_config_to_json(back), tj);
}

// Every flag row names a key its table reads, with the table's default; its range holds that
// default; a routing's defaults are keys of the "moe" object that a layer of that routing takes.
TEST(ConfigKeys, EveryFlagRowIsAKeyOfItsTable) {
  const auto nested = [](const std::string& key, const json& value) {
    json j = json::object();
    const auto dot = key.find('.');
    if (dot == std::string::npos)
      j[key] = value;
    else
      j[key.substr(0, dot)][key.substr(dot + 1)] = value;
    return j;
  };
  const auto in_range = [](const ConfigFlag& f) {
    if (!f.ranged || !f.default_value.is_number()) return true;
    const double v = f.default_value.get<double>();
    return (f.lo_open ? v > f.lo : v >= f.lo) && (f.hi_open ? v < f.hi : v <= f.hi);
  };
  for (const ConfigFlag& f : ffn_config_flags()) {
    json j = f.default_value.is_null() ? json("relu") : f.default_value;  // --variant: a name
    // (An MoE key is read by an MoE layer, "branches" by the gated FFN; others refuse them.)
    json config = nested(f.key, j);
    if (f.key.starts_with("moe.")) config["variant"] = "moe";
    if (f.key == "branches") config["variant"] = "gated";
    EXPECT_NO_THROW(config_from_json(config)) << f.name;
    EXPECT_TRUE(in_range(f)) << f.name;
    if (!f.routing.empty()) {
      EXPECT_NO_THROW(parse_enum<RoutingKind>(f.routing)) << f.name;
    }
  }
  for (const ConfigFlag& f : lm_config_flags()) {
    EXPECT_NO_THROW(lm_config_from_json(nested(f.key, f.default_value))) << f.name;
    EXPECT_TRUE(in_range(f)) << f.name;
  }
  for (const ConfigFlag& f : train_config_flags()) {
    EXPECT_NO_THROW(train_config_from_json(nested(f.key, f.default_value))) << f.name;
    EXPECT_TRUE(in_range(f)) << f.name;
  }
  for (const auto& name : enum_names<RoutingKind>()) {
    FFNConfig c = variant_config("moe", 32, 64, true);
    c.moe.routing = parse_enum<RoutingKind>(name);
    json j = config_to_json(c);
    j["moe"].update(routing_defaults(c.moe.routing));
    EXPECT_NO_THROW(config_from_json(j)) << name;
  }
}

// A flag's range is its key's: the library refuses a value just outside it, from a config file
// as from Python, in the words the command line uses ("must be in [1, 2^32]"), so no front end
// takes what another refuses.
TEST(ConfigKeys, EveryFlagsRangeHoldsForItsKeyInTheLibrary) {
  const auto outside = [](const ConfigFlag& f) {
    std::vector<json> out;
    if (f.value == ConfigFlag::Value::integer) {
      out.push_back(static_cast<std::int64_t>(f.hi) + 1);
      if (f.lo >= 1) out.push_back(static_cast<std::int64_t>(f.lo) - 1);
    } else {
      out.push_back(f.hi_open ? f.hi : f.hi * 2);
      out.push_back(f.lo_open ? f.lo : f.lo == 0 ? -1.0 : f.lo / 2);
    }
    return out;
  };
  const auto expect_refused = [&](const ConfigFlag& f, const std::string& scope, auto read) {
    if (!f.ranged) return;
    const std::string key = f.key.substr(f.key.find('.') + 1);  // "moe.top_k" -> "top_k"
    const std::string range =
        range_text(f.lo, f.hi, f.lo_open, f.hi_open, f.value == ConfigFlag::Value::integer);
    for (const json& v : outside(f)) {
      const std::string err = error_of([&] { read(v); });
      EXPECT_NE(err.find("[" + scope + "] " + key + " = "), std::string::npos) << f.name << err;
      EXPECT_NE(err.find("must be in " + range), std::string::npos) << f.name << err;
    }
  };
  int rows = 0;
  for (const ConfigFlag& f : ffn_config_flags()) {
    const bool moe = f.key.starts_with("moe.");
    rows += f.ranged;
    expect_refused(f, moe ? "moe" : "ffn", [&](const json& v) {
      json j = {{"variant", moe ? "moe" : f.key == "branches" ? "gated" : "relu"}};
      if (moe && !f.routing.empty()) j["moe"]["routing"] = f.routing;
      if (moe)
        j["moe"][f.key.substr(4)] = v;
      else
        j[f.key] = v;
      config_from_json(j);
    });
  }
  for (const ConfigFlag& f : lm_config_flags()) {
    rows += f.ranged;
    expect_refused(f, "lm", [&](const json& v) { lm_config_from_json({{f.key, v}}); });
  }
  for (const ConfigFlag& f : train_config_flags()) {
    rows += f.ranged;
    expect_refused(f, "train", [&](const json& v) { train_config_from_json({{f.key, v}}); });
  }
  EXPECT_GE(rows, 40);  // the rows with a range: a table that lost them would pass unseen
}

TEST(ConfigKeys, UnknownKeysAndBadValuesNameTheKey) {
  const std::string lm_err = error_of([] { lm_config_from_json(json::parse(R"({"layer": 3})")); });
  EXPECT_NE(lm_err.find("[lm] unknown key 'layer' (known: vocab, d_model, layers"),
            std::string::npos)
      << lm_err;
  const std::string train_err =
      error_of([] { train_config_from_json(json::parse(R"({"steps": "many"})")); });
  EXPECT_NE(train_err.find("[train] key 'steps'"), std::string::npos) << train_err;
  // Values each in range whose products overflow: the run's micro-batches, a step's tokens.
  const std::string micro = error_of([] {
    train_config_from_json({{"steps", std::int64_t{1} << 40}, {"accumulate", 1 << 30}});
  });
  EXPECT_NE(micro.find("[train] steps × accumulate"), std::string::npos) << micro;
  const std::string step_tokens = error_of([] {
    train_config_from_json(
        {{"batch", 1 << 16}, {"seq", 1 << 16}, {"accumulate", std::int64_t{1} << 32}});
  });
  EXPECT_NE(step_tokens.find("[train] batch × seq × accumulate"), std::string::npos) << step_tokens;
  const std::string moe_err =
      error_of([] { config_from_json(json::parse(R"({"kind":"moe","moe":{"drop":"random"}})")); });
  EXPECT_NE(moe_err.find("unknown drop policy 'random' (known: position, probability)"),
            std::string::npos)
      << moe_err;
}

// The ranks of an MPI job on one machine share its memory: each checks what it needs against
// its part, and the refusal says so.
TEST(Limits, ProcessesOnOneMachineEachGetTheirShareOfItsMemory) {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    GTEST_SKIP() << "an address-space limit (ulimit -v) decides the memory here, not the sharing";
  const double whole = available_memory_bytes();
  share_memory_among(2);
  const double half = available_memory_bytes();
  try {
    check_memory(0.75 * whole, "train", "a model");
    ADD_FAILURE() << "three quarters of the machine fit in half of it";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("available to each of the 2 processes on this machine"),
              std::string::npos)
        << e.what();
  }
  share_memory_among(1);
  EXPECT_NO_THROW(check_memory(0.75 * whole, "train", "a model"));
  EXPECT_LE(half, whole / 2 + 1);
  EXPECT_THROW(share_memory_among(0), Error);
}
