// The flags generated from the config key rows (ffnlab/config_flags.hpp): every row is a flag
// of the commands that take it, with its help, and each value given lands at the row's key.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "cli_fixture.hpp"
#include "ffnlab/config_flags.hpp"
#include "ffnlab/layers/ffn_config.hpp"

using namespace ffnlab;

namespace {

using test::Cli;
using test::Outcome;
using json = nlohmann::json;

std::string first_name(const ConfigFlag& f) {
  return f.name.substr(0, f.name.find(','));
}

// The value at a dotted key of a config's JSON (null: none).
json at_key(const json& j, const std::string& key) {
  const json* at = &j;
  std::size_t from = 0;
  for (auto dot = key.find('.');; dot = key.find('.', from)) {
    const std::string part = key.substr(from, dot - from);
    if (!at->is_object() || !at->contains(part)) return nullptr;
    at = &at->at(part);
    if (dot == std::string::npos) return *at;
    from = dot + 1;
  }
}

}  // namespace

TEST_F(Cli, EveryKeyFlagIsInTheHelpOfItsCommands) {
  const Outcome train = run("train --help"), params = run("params --help"), toy = run("toy --help");
  ASSERT_EQ(train.status, 0);
  std::set<std::string> names;
  auto expect_in = [&](const Outcome& help, const ConfigFlag& f, const char* command) {
    EXPECT_NE(help.out.find(f.name), std::string::npos) << command << ": " << f.name;
    // The help's first words (a row's help may be replaced by the command's own, which keeps
    // them, or have its names filled in).
    const std::string start = f.help.substr(0, std::min<std::size_t>(f.help.size(), 12));
    EXPECT_NE(help.out.find(start), std::string::npos) << command << ": " << f.name;
  };
  for (const auto& rows : {ffn_config_flags(), lm_config_flags(), train_config_flags()})
    for (const ConfigFlag& f : rows) {
      EXPECT_TRUE(names.insert(first_name(f)).second) << "two rows name " << f.name;
      EXPECT_FALSE(f.help.empty()) << f.name;
      EXPECT_EQ(f.help.find("{names"), std::string::npos) << f.name;
      expect_in(train, f, "train");
    }
  for (const ConfigFlag& f : ffn_config_flags()) {
    if (f.name == "--variant") continue;  // params and toy take --variants
    expect_in(params, f, "params");
    expect_in(toy, f, "toy");
  }
}

// Each FFN flag's value reaches the layer's config at its row's key (params --json prints it).
// A new row needs a case here: the test fails for a row that no case gives.
TEST_F(Cli, EveryLayerFlagSetsItsKey) {
  const std::vector<std::string> cases = {
      "--variants moe --d-model 48 --d-ff 96 --no-bias --experts 6 --top-k 3 --shared-experts 1 "
      "--expert-d-ff 32 --aux-coef 0.02 --z-coef 0.001 --capacity 1.5 --no-normalize",
      "--variants moe --constant-experts 1 --copy-experts 1 --zero-experts 1 "
      "--zc-balance-weight 0.5 --gating-residual",
      "--variants moe --routing top_p --top-p 0.6 --entropy-coef 0.0001 --normalize",
      "--variants moe --routing relu --target-sparsity 0.6 --l1-coef-init 1e-6",
      "--variants moe --routing soft --slots 3",
      "--variants gated --branches 3"};
  std::set<std::string> tried;
  for (const std::string& flags : cases) {
    const Outcome r = run("params --json " + flags);
    ASSERT_EQ(r.status, 0) << flags << "\n" << r.err;
    const json config = json::parse(r.out).at("variants").at(0).at("config");
    for (const ConfigFlag& f : ffn_config_flags()) {
      const std::string name = first_name(f);
      const auto at = flags.find(name + " ");
      using V = ConfigFlag::Value;
      const bool both = f.value == V::both;
      std::string negated = "--no-";  // a switch's other sense
      negated += name.substr(2);
      const bool switched = (f.value == V::on || f.value == V::off || both) &&
                            (flags.find(name) != std::string::npos ||
                             (both && flags.find(negated) != std::string::npos));
      if (at == std::string::npos && !switched) continue;
      tried.insert(name);
      const json value = at_key(config, f.key);
      ASSERT_FALSE(value.is_null()) << name << " -> " << f.key << " in " << config.dump();
      if (switched) {
        const bool on = both ? flags.find(name) != std::string::npos : f.value == V::on;
        EXPECT_EQ(value, on) << name << " in " << flags;
        continue;
      }
      std::string text = flags.substr(at + name.size() + 1);
      text = text.substr(0, text.find(' '));
      if (f.value == ConfigFlag::Value::name)
        EXPECT_EQ(value, text) << name;
      else
        EXPECT_FLOAT_EQ(value.get<double>(), std::stod(text)) << name;
    }
  }
  for (const ConfigFlag& f : ffn_config_flags()) {
    if (f.name != "--variant") {
      EXPECT_TRUE(tried.count(first_name(f))) << "no case gives " << f.name;
    }
  }
}

// A routing brings its defaults for the keys not given: ReLU routing drops train's default
// load-balancing loss and the division by the gates' sum; a given --aux-coef is kept (and then
// refused by the layer, which balances with its L1 penalty).
TEST_F(Cli, ARoutingBringsItsDefaultsToTheKeysNotGiven) {
  const Outcome relu = run("params --json --variants moe --routing relu");
  ASSERT_EQ(relu.status, 0) << relu.err;
  const json moe = json::parse(relu.out)["variants"][0]["config"]["moe"];
  EXPECT_EQ(moe["normalize"], false);
  EXPECT_EQ(moe["aux_coef"], 0.0);
  const Outcome given = run("params --json --variants moe --routing relu --aux-coef 0.01");
  EXPECT_EQ(given.status, 1);
  EXPECT_NE(given.err.find("routing 'relu' does not combine with aux_coef"), std::string::npos)
      << given.err;
  // Top-p weights each chosen expert by its probability, as the paper; --normalize renormalises.
  const auto normalize = [&](const std::string& flags) {
    const Outcome r = run("params --json --variants moe " + flags);
    EXPECT_EQ(r.status, 0) << flags << "\n" << r.err;
    return json::parse(r.out)["variants"][0]["config"]["moe"]["normalize"];
  };
  EXPECT_EQ(normalize("--routing top_p"), false);
  EXPECT_EQ(normalize("--routing top_p --normalize"), true);
  EXPECT_EQ(normalize(""), true);
  EXPECT_EQ(normalize("--no-normalize"), false);
  const Outcome topk = run("params --json --variants moe --aux-coef 0.01");
  ASSERT_EQ(topk.status, 0) << topk.err;
  EXPECT_FLOAT_EQ(json::parse(topk.out)["variants"][0]["config"]["moe"]["aux_coef"].get<float>(),
                  0.01f);
}

// On resume the given model flags are laid over the checkpoint's model as JSON: each difference
// is named by its flag, in the flag's own terms (a variant by its name, --no-bias as given).
TEST_F(Cli, ResumeComparesTheModelAsJsonAndNamesEachFlag) {
  {
    std::ofstream corpus(path("corpus.txt"));
    for (int i = 0; i < 400; ++i) corpus << "the quick brown fox " << i << " jumps\n";
  }
  const std::string run_dir = path("r");
  ASSERT_EQ(run("train --data " + path("corpus.txt") +
                " --variant moe --d-model 16 --heads 2 --layers 1 --seq 16 --batch 2 --steps 2 "
                "--sample 0 --threads 1 --out " +
                run_dir)
                .status,
            0);
  const std::string resume = "train --resume " + run_dir + " --steps 3 --sample 0 --threads 1 ";
  // Flags that agree with the checkpoint, the routing's own defaults included, are accepted.
  EXPECT_EQ(
      run(resume + "--variant moe --experts 8 --routing topk --aux-coef 0.01 --out " + path("same"))
          .status,
      0);
  const Outcome r = run(resume + "--variant swiglu --no-bias");
  EXPECT_EQ(r.status, 1);
  for (const char* part : {"--variant gives \"swiglu\", the checkpoint has \"moe\"",
                           "--no-bias gives true, the checkpoint has false"})
    EXPECT_NE(r.err.find(part), std::string::npos) << part << "\n" << r.err;
  // An MoE flag beside a --variant that is not an MoE means nothing, on resume as on a new run.
  const Outcome dense = run(resume + "--variant swiglu --top-k 1");
  EXPECT_EQ(dense.status, 2);
  EXPECT_NE(dense.err.find("--top-k: applies to an MoE layer (variant moe), and --variant swiglu "
                           "has none (a resumed run keeps its model; leave the model flags out)"),
            std::string::npos)
      << dense.err;
  const Outcome routing = run(resume + "--routing relu");
  EXPECT_NE(routing.err.find("--routing gives \"relu\", the checkpoint has \"topk\""),
            std::string::npos)
      << routing.err;
  // The objective's defaults are a new run's: a masked checkpoint with learned positions is
  // continued with --objective masked and a model flag.
  ASSERT_EQ(run("train --data " + path("corpus.txt") +
                " --objective masked --positions learned --d-model 16 --heads 2 --layers 1 "
                "--seq 16 --batch 2 --steps 2 --sample 0 --threads 1 --out " +
                path("masked"))
                .status,
            0);
  const Outcome masked = run("train --resume " + path("masked") +
                             " --objective masked --d-model 16 --steps 3 --sample 0 --threads 1");
  EXPECT_EQ(masked.status, 0) << masked.err;
  const Outcome aux = run(resume + "--aux-coef 0.02");
  EXPECT_NE(aux.err.find("--aux-coef gives 0.02, the checkpoint has 0.01"), std::string::npos)
      << aux.err;
  // A checkpoint of top-p that renormalises (as runs made before top-p's default followed the
  // paper do) resumes with its routing given again: the same routing brings no defaults. A
  // two-sense switch is named in the sense it was given.
  const std::string top_p = path("top_p");
  ASSERT_EQ(run("train --data " + path("corpus.txt") +
                " --variant moe --routing top_p --normalize --d-model 16 --heads 2 --layers 1 "
                "--seq 16 --batch 2 --steps 2 --sample 0 --threads 1 --out " +
                top_p)
                .status,
            0);
  const std::string again = "train --resume " + top_p + " --steps 3 --sample 0 --threads 1 ";
  const Outcome same = run(again + "--routing top_p --out " + path("top_p2"));
  EXPECT_EQ(same.status, 0) << same.err;
  const Outcome off = run(again + "--no-normalize");
  EXPECT_NE(off.err.find("--no-normalize gives false, the checkpoint has true"), std::string::npos)
      << off.err;
}
