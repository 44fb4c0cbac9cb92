// The ffnlab program as a user runs it: output, exit status, files written, errors.
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "../common/test_util.hpp"
#include "cli_fixture.hpp"
#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/io/safetensors.hpp"
#include "ffnlab/layers/ffn_config.hpp"

using namespace ffnlab;
namespace fs = std::filesystem;

namespace {

using test::Cli;
using test::Outcome;

}  // namespace

TEST_F(Cli, ParamsPrintsTheSeedCounts) {
  const Outcome r = run("params");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* n : {"2,099,712", "3,150,336", "9,454,080", "16,801,800"})
    EXPECT_NE(r.out.find(n), std::string::npos) << n << "\n" << r.out;
}

TEST_F(Cli, ParamsJson) {
  const Outcome r = run("params --json --variants relu,swiglu --d-model 64 --d-ff 172 --no-bias");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.at("variants").size(), 2u);
  EXPECT_EQ(j["variants"][0]["params"], 2 * 64 * 172);
  EXPECT_EQ(j["variants"][1]["params"], 3 * 64 * 172);
  EXPECT_EQ(j["variants"][1]["config"]["activation"], "silu");
}

TEST_F(Cli, ZooListsRealModelsWithSourcesAndCosts) {
  const Outcome r = run("zoo");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* m :
       {"BERT-base", "BERT-large", "GPT-2 124M", "GPT-2 1.5B", "GPT-3 175B", "T5 v1.1", "PaLM 540B",
        "LLaMA-2 7B", "LLaMA-2 70B", "Mistral 7B", "Mixtral 8x7B", "Switch-Base-128",
        "GLaM 64B/64E", "DeepSeek-V3", "Qwen1.5-MoE"})
    EXPECT_NE(r.out.find(m), std::string::npos) << m;
  EXPECT_NE(r.out.find("[15] DeepSeek-V3: deepseek-ai/DeepSeek-V3 config.json"), std::string::npos);
  const Outcome j = run("zoo --json");
  ASSERT_EQ(j.status, 0) << j.err;
  const auto models = nlohmann::json::parse(j.out);
  ASSERT_EQ(models.size(), 15u);
  for (const auto& m : models) {
    EXPECT_FALSE(m.at("source").get<std::string>().empty()) << m.at("model");
    if (m.at("model") == "GLaM 64B/64E") {  // 64 two-matrix experts of 8192 -> 32768, top-2
      EXPECT_EQ(m.at("params_per_layer"), 64LL * 2 * 8192 * 32768 + 8192LL * 64);
      EXPECT_EQ(m.at("active_params_per_layer"), 2LL * 2 * 8192 * 32768 + 8192LL * 64);
    }
    if (m.at("model") == "Switch-Base-128") {  // its config.json: 128 ReLU experts 768 -> 3072
      EXPECT_EQ(m.at("params_per_layer"), 128LL * 2 * 768 * 3072 + 768LL * 128);
      EXPECT_EQ(m.at("active_params_per_layer"), 2LL * 768 * 3072 + 768LL * 128);
      EXPECT_NE(m.at("source").get<std::string>().find("d_ff 3072, dense_act_fn relu"),
                std::string::npos);
    }
    if (m.at("model") == "LLaMA-2 7B") {  // SwiGLU 4096 -> 11008, no bias: 3·4096·11008
      EXPECT_EQ(m.at("params_per_layer"), 3LL * 4096 * 11008);
    }
    if (m.at("model") == "Mixtral 8x7B") {  // 8 experts + router; 2 experts + router active
      EXPECT_EQ(m.at("params_per_layer"), 8LL * 3 * 4096 * 14336 + 4096 * 8);
      EXPECT_EQ(m.at("active_params_per_layer"), 2LL * 3 * 4096 * 14336 + 4096 * 8);
    }
  }
}

TEST_F(Cli, ParamsCostsAConfigFileAgainstReLU) {
  std::ofstream(path("config.json"))
      << R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 172,
             "hidden_act": "silu"})";
  const Outcome r = run("params --json --config " + path("config.json"));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto v = nlohmann::json::parse(r.out).at("variants").at(0);
  EXPECT_EQ(v.at("params"), 3 * 64 * 172);
  EXPECT_DOUBLE_EQ(v.at("params_over_relu").get<double>(), 1.5);  // against 2·64·172
  const Outcome t = run("params --config " + path("config.json"));
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find("swiglu"), std::string::npos) << t.out;
  expect_error(run("params --config " + path("missing.json")), "missing.json");
}

// The commands that run in one process refuse a launch of several (each would print, time or
// write the same thing); the launcher is told by its environment, which a test can set.
TEST_F(Cli, OneProcessCommandsRefuseAnMpiLaunchOfSeveral) {
  const std::string config = path("config.json");  // refused before it is read
  std::ofstream(config) << "{}";
  const std::vector<std::string> commands = {
      "params --variants relu",
      "toy --out " + path("toy.csv"),
      "zoo",
      "bench --quick",
      "run --config " + config + " --input " + config + " --output " + path("y"),
      "evolve --plan --quick"};
  for (const std::string& command : commands)
    for (const std::string launcher : {"OMPI_COMM_WORLD_SIZE=2 ", "PMI_SIZE=3 PMI_RANK=0 "}) {
      const Outcome r = run(command, launcher);
      EXPECT_EQ(r.status, 2) << launcher << command << "\n" << r.err;
      EXPECT_NE(r.err.find("runs in one process, but an MPI launcher started it as one of"),
                std::string::npos)
          << r.err;
    }
  // One process of one is one process, and so is one whose launcher does not say how many it
  // started; srun with PMIx says it through Slurm's task count.
  EXPECT_EQ(run("params --variants relu", "OMPI_COMM_WORLD_SIZE=1 ").status, 0);
  EXPECT_EQ(run("params --variants relu", "PMIX_RANK=0 ").status, 0);
  EXPECT_EQ(run("params --variants relu", "PMIX_RANK=0 SLURM_NTASKS=4 ").status, 2);
}

TEST_F(Cli, HelpAndUsageErrors) {
  EXPECT_EQ(run("--help").status, 0);
  EXPECT_EQ(run("run --help").status, 0);
  EXPECT_NE(run("").status, 0);
  EXPECT_NE(run("params --d-ff 0").status, 0);
  expect_usage_error(run("params --variants relu,selu"), "unknown variant 'selu'");
  // A flag given twice, or without its value, in words rather than CLI11's counts.
  expect_usage_error(run("params --d-model 64 --d-model 128"),
                     "--d-model: given 2 times; give it once");
  expect_usage_error(run("params --d-model"), "--d-model: needs a value (INT");
}

// Every command that builds a layer takes the same FFN flags, with the same checks and the
// variant list from the library's table.
TEST_F(Cli, EveryLayerCommandSharesTheFFNFlags) {
  for (const char* cmd : {"params", "toy", "train"}) {
    const Outcome help = run(std::string(cmd) + " --help");
    ASSERT_EQ(help.status, 0) << cmd;
    for (const char* flag : {"--d-model", "--d-ff", "--no-bias", "--branches", "--experts",
                             "--top-k", "--shared-experts", "--expert-d-ff", "--aux-coef",
                             "--z-coef", "--capacity", "--ffn-config"})
      EXPECT_NE(help.out.find(flag), std::string::npos) << cmd << " lacks " << flag;
    for (const auto& v : ffnlab::variant_names())
      EXPECT_NE(help.out.find(v), std::string::npos) << cmd << " help lacks " << v;
    const Outcome bad = run(std::string(cmd) + " --experts 0");
    EXPECT_EQ(bad.status, 2) << cmd;
    EXPECT_NE(bad.err.find("--experts"), std::string::npos) << cmd << ": " << bad.err;
  }
  // The flags map to the same layer everywhere: params costs what toy and train would build.
  const Outcome r =
      run("params --json --variants moe --d-model 32 --d-ff 64 --experts 4 "
          "--top-k 1 --shared-experts 1 --expert-d-ff 16");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto moe = nlohmann::json::parse(r.out).at("variants").at(0).at("config").at("moe");
  EXPECT_EQ(moe.at("num_experts"), 4);
  EXPECT_EQ(moe.at("top_k"), 1);
  EXPECT_EQ(moe.at("num_shared"), 1);
  EXPECT_EQ(moe.at("expert_d_ff"), 16);
}

TEST_F(Cli, RunReproducesPyTorchWithGradients) {
  // Every golden case, through the program as a user runs it.
  std::vector<std::string> cases;
  for (const auto& e : fs::directory_iterator(FFNLAB_GOLDEN_DIR))
    if (e.is_directory()) cases.push_back(e.path().filename().string());
  ASSERT_GE(cases.size(), 40u);
  // The leftover of a run killed while it wrote y goes with the next run into the same place.
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);
  const std::string leftover = path("y.safetensors.tmp." + std::to_string(gone));
  std::ofstream(leftover) << "half a file";
  for (const std::string& c : cases) {
    std::ifstream meta_in(golden(c, "case.json"));
    const std::string prefix = nlohmann::json::parse(meta_in).at("prefix");
    const Outcome r =
        run("run --config " + golden(c, "config.json") + " --weights " +
            golden(c, "weights.safetensors") + (prefix.empty() ? "" : " --prefix " + prefix) +
            " --input " + golden(c, "x.safetensors") + " --output " + path("y.safetensors") +
            " --grad-output " + golden(c, "dy.safetensors") + " --grads " + path("g.safetensors") +
            " --threads 1");
    ASSERT_EQ(r.status, 0) << c << ": " << r.err;
    EXPECT_FALSE(fs::exists(leftover)) << c;
    const auto expected = SafeTensors::load(golden(c, "expected.safetensors"));
    const auto y = SafeTensors::load(path("y.safetensors"));
    const auto g = SafeTensors::load(path("g.safetensors"));
    auto err = [&](const SafeTensors& f, const std::string& n) {
      const Tensor a = f.f32(n), b = expected.f32(n);
      EXPECT_EQ(a.shape(), b.shape()) << n;
      return test::scaled_error(a.f32(), b.f32(), a.numel());
    };
    EXPECT_LE(err(y, "y"), 1e-4) << c;
    EXPECT_LE(err(g, "dx"), 1e-4) << c;
    int grads = 0;
    const std::set<std::string> routing_floats{"balance_loss", "z_loss",         "entropy",
                                               "l1_loss",      "expert_weights", "logits"};
    const std::set<std::string> routing_ints{"experts", "expert_kept"};
    // A routing writes only the losses it defines: expert choice no balance loss (it refuses
    // aux_coef), hash routing no router entropy (it has no router); top-k all of them.
    if (c.rfind("moe_expert_choice", 0) == 0) {
      EXPECT_FALSE(y.contains("balance_loss")) << c;
    }
    if (c.rfind("moe_hash", 0) == 0) {
      EXPECT_FALSE(y.contains("entropy")) << c;
    }
    if (c.rfind("moe_hf_mixtral", 0) == 0) {
      for (const char* n : {"balance_loss", "z_loss", "entropy", "logits"})
        EXPECT_TRUE(y.contains(n)) << c << " " << n;
    }
    for (const auto& n : expected.names())
      if (routing_floats.count(n)) {
        if (!y.contains(n)) continue;  // (not defined by this routing: checked above)
        EXPECT_LE(err(y, n), 1e-5) << c << " " << n;
      } else if (routing_ints.count(n)) {
        const auto got = y.ints(n);
        const Tensor want = expected.f32(n);
        ASSERT_EQ(static_cast<std::int64_t>(got.size()), want.numel()) << c << " " << n;
        for (std::size_t i = 0; i < got.size(); ++i)
          EXPECT_EQ(got[i], static_cast<std::int64_t>(want.f32()[i])) << c << " " << n << i;
      } else if (n != "y" && n != "dx") {
        EXPECT_LE(err(g, n), 1e-4) << c << " " << n;
        ++grads;
      }
    EXPECT_EQ(static_cast<std::size_t>(grads) + 1, g.names().size());
  }
}

// The tokens' ids beside x: hash routing reads them; a layer whose routing does not is refused
// them, as it is refused a gate_residual.
TEST_F(Cli, RunHandsTokenIdsToTheRoutingThatReadsThem) {
  Tensor x({4, 8});
  x.fill(0.5f);
  SafeTensorsWriter in;
  in.add("x", x);
  in.add_ints("token_ids", {4}, {3, 1, 4, 1});
  in.write(path("x.safetensors"));
  std::ofstream(path("hash.json"))
      << R"({"kind":"moe","d_model":8,"d_ff":8,"moe":{"num_experts":4,"top_k":1,"routing":"hash"}})";
  std::ofstream(path("dense.json")) << R"({"kind":"plain","d_model":8,"d_ff":8})";
  const std::string io = " --input " + path("x.safetensors") + " --output " + path("y");
  const Outcome hash = run("run --config " + path("hash.json") + io);
  EXPECT_EQ(hash.status, 0) << hash.err;
  expect_error(run("run --config " + path("dense.json") + io),
               "holds 'token_ids', but the layer's routing does not read them");
  // Without them, hash routing is refused before the layer is built, naming the tensor to add.
  SafeTensorsWriter bare;
  bare.add("x", x);
  bare.write(path("bare.safetensors"));
  expect_error(run("run --config " + path("hash.json") + " --input " + path("bare.safetensors") +
                   " --output " + path("y")),
               "the layer's routing (hash) chooses experts by the tokens' ids: put them beside x "
               "as 'token_ids'");
}

// MoE++'s gating residual: the previous layer's logits as gate_residual, or --first-layer for a
// model's first MoE layer; the flag is refused where it means nothing, and beside a residual.
TEST_F(Cli, RunTakesAGateResidualOrTheFirstLayerFlag) {
  Tensor x({4, 8}), logits({4, 4});
  x.fill(0.5f);
  logits.fill(0.25f);
  SafeTensorsWriter bare, with;
  bare.add("x", x);
  bare.write(path("bare.safetensors"));
  with.add("x", x);
  with.add("gate_residual", logits);
  with.write(path("with.safetensors"));
  std::ofstream(path("pp.json")) << R"({"kind":"moe","d_model":8,"d_ff":8,)"
                                 << R"("moe":{"num_experts":4,"top_k":1,"gating_residual":true}})";
  std::ofstream(path("dense.json")) << R"({"kind":"plain","d_model":8,"d_ff":8})";
  const auto with_input = [&](const std::string& config, const std::string& input) {
    return "run --config " + path(config) + " --input " + path(input) + " --output " + path("y");
  };
  EXPECT_EQ(run(with_input("pp.json", "with.safetensors")).status, 0);
  const Outcome first = run(with_input("pp.json", "bare.safetensors") + " --first-layer");
  EXPECT_EQ(first.status, 0) << first.err;
  expect_error(run(with_input("pp.json", "bare.safetensors")), "no gate residual");
  expect_usage_error(run(with_input("pp.json", "with.safetensors") + " --first-layer"),
                     "--first-layer: a model's first MoE layer takes no gate_residual");
  expect_usage_error(run(with_input("dense.json", "bare.safetensors") + " --first-layer"),
                     "--first-layer: the layer has no gating_residual (MoE++)");
}

// With --grad-output the forward is a training one and routes as in training (jitter and gate
// noise from --seed); --no-stochastic routes it as at inference, so y is a plain run's y.
TEST_F(Cli, RunWithGradientsRoutesAsInTrainingUnlessToldNotTo) {
  const Tensor x = test::random_tensor({16, 8}, 3), dy = test::random_tensor({16, 8}, 4);
  SafeTensorsWriter in;
  in.add("x", x);
  in.write(path("x.safetensors"));
  SafeTensorsWriter g;
  g.add("dy", dy);
  g.write(path("dy.safetensors"));
  std::ofstream(path("moe.json"))
      << R"({"kind":"moe","d_model":8,"d_ff":8,"moe":{"num_experts":4,"top_k":2,)"
      << R"("jitter":0.3,"noisy_topk":true}})";
  const std::string base = "run --config " + path("moe.json") + " --input " + path("x.safetensors");
  const auto y_of = [&](const std::string& flags, const std::string& name) {
    const Outcome o = run(base + " --output " + path(name) + flags);
    EXPECT_EQ(o.status, 0) << o.err;
    return SafeTensors::load(path(name)).f32("y");
  };
  const std::string grads = " --grad-output " + path("dy.safetensors") + " --grads ";
  const Tensor plain = y_of("", "plain");
  const Tensor trained = y_of(grads + path("g1") + " --prefix m.", "trained");
  const Tensor evaluated = y_of(grads + path("g2") + " --no-stochastic", "evaluated");
  const Tensor again = y_of(grads + path("g3") + " --stochastic", "again");
  // The same weights (any tensors of their shapes: the first run's gradients), another seed.
  const std::string weights = " --weights " + path("g1") + " --prefix m.";
  const Tensor seed0 = y_of(grads + path("g4") + weights, "seed0");
  const Tensor seed1 = y_of(grads + path("g5") + weights + " --seed 1", "seed1");
  EXPECT_GT(test::scaled_error(seed1.f32(), seed0.f32(), plain.numel()), 1e-3);
  EXPECT_GT(test::scaled_error(trained.f32(), plain.f32(), plain.numel()), 1e-3);
  EXPECT_EQ(test::scaled_error(evaluated.f32(), plain.f32(), plain.numel()), 0.0);
  EXPECT_EQ(test::scaled_error(again.f32(), trained.f32(), plain.numel()), 0.0);
  expect_usage_error(run(base + " --output " + path("y") + " --no-stochastic"), "--grad-output");
}

TEST_F(Cli, RunRejectsBadMoEInput) {
  const std::string c = "moe_hf_mixtral_e6_k2";
  const std::string x =
      " --input " + golden(c, "x.safetensors") + " --output " + path("y.safetensors");
  auto config = [&](const std::string& name, const std::string& json) {
    std::ofstream(path(name)) << json;
    return "run --config " + path(name) + x;
  };
  expect_error(
      run(config("k.json", R"({"kind":"moe","d_model":16,"moe":{"num_experts":4,"top_k":5}})")),
      "top_k = 5 exceeds num_experts = 4");
  expect_error(
      run(config(
          "g.json",
          R"({"kind":"moe","d_model":16,"moe":{"num_experts":6,"groups":4,"topk_groups":1}})")),
      "not divisible by n_group = 4");
  expect_error(
      run(config(
          "tg.json",
          R"({"kind":"moe","d_model":16,"moe":{"num_experts":6,"groups":3,"topk_groups":4}})")),
      "topk_group = 4 must be between 1 and n_group = 3");
  expect_error(
      run(config("c.json", R"({"kind":"moe","d_model":16,"moe":{"capacity_factor":-0.5}})")),
      "capacity_factor = -0.5 must be in [0, 1000000]");
  expect_error(run(config("u.json", R"({"kind":"moe","d_model":16,"moe":{"top_kk":2}})")),
               "unknown key 'moe.top_kk'");
  // A Mixtral checkpoint whose experts are wider than its config says.
  std::ifstream in(golden(c, "config.json"));
  auto hf = nlohmann::json::parse(in);
  hf["intermediate_size"] = 20;
  expect_error(run(config("narrow.json", hf.dump()) + " --weights " +
                   golden(c, "weights.safetensors") + " --prefix model.layers.1.block_sparse_moe."),
               "tensor 'model.layers.1.block_sparse_moe.experts.0.w1.weight' has shape [24, 16], "
               "the layer needs [20, 16]");
  hf["intermediate_size"] = 24;
  // The same weights with a tensor the layer has no parameter for (a bias the config leaves
  // out): refused, not loaded without it.
  {
    const auto file = SafeTensors::load(golden(c, "weights.safetensors"));
    SafeTensorsWriter w;
    for (const auto& n : file.names()) w.add(n, file.f32(n));
    w.add("model.layers.1.block_sparse_moe.experts.0.w1.bias", Tensor(Shape{24}));
    w.write(path("biased.safetensors"));
  }
  expect_error(run(config("mixtral.json", hf.dump()) + " --weights " + path("biased.safetensors") +
                   " --prefix model.layers.1.block_sparse_moe."),
               "1 tensor under the prefix 'model.layers.1.block_sparse_moe.' is no parameter of "
               "this layer ('model.layers.1.block_sparse_moe.experts.0.w1.bias')");
  hf["model_type"] = "deepseek_v2";
  expect_error(run(config("v2.json", hf.dump())), "model_type 'deepseek_v2' has no FFN mapping");
  EXPECT_FALSE(fs::exists(path("y.safetensors")));
}

TEST_F(Cli, RunRejectsBadInputWithoutWritingOutput) {
  const std::string c = "swiglu_separate_nobias";
  const std::string base = "run --config " + golden(c, "config.json") + " --input " +
                           golden(c, "x.safetensors") + " --output " + path("y.safetensors");
  // A truncated weights file.
  {
    std::ifstream in(golden(c, "weights.safetensors"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(path("trunc.safetensors"), std::ios::binary)
        << bytes.substr(0, bytes.size() - 10);
  }
  expect_error(run(base + " --weights " + path("trunc.safetensors")), "[safetensors]");
  // Garbage in place of a safetensors file.
  std::ofstream(path("junk.safetensors")) << "this is not a safetensors file at all";
  expect_error(run(base + " --weights " + path("junk.safetensors")), "[safetensors]");
  // A weights file of another layer: missing tensor.
  expect_error(run(base + " --weights " + golden("plain_relu_bias", "weights.safetensors")),
               "missing tensor 'gate_proj.weight'");
  // The same names with other shapes.
  expect_error(
      run("run --config " + golden("swiglu_wide_T33", "config.json") + " --weights " +
          golden(c, "weights.safetensors") + " --input " +
          golden("swiglu_wide_T33", "x.safetensors") + " --output " + path("y.safetensors")),
      "has shape [37, 13], the layer needs [172, 64]");
  // x of the wrong width.
  expect_error(run("run --config " + golden("swiglu_wide_T33", "config.json") + " --input " +
                   golden(c, "x.safetensors") + " --output " + path("y.safetensors")),
               "expected [..., 64]");
  // Configs that make no sense.
  std::ofstream(path("act.json")) << R"({"variant":"relu","activation":"selu","d_model":13})";
  expect_error(run("run --config " + path("act.json") + " --input " + golden(c, "x.safetensors") +
                   " --output " + path("y.safetensors")),
               "unknown activation 'selu'");
  std::ofstream(path("dff.json")) << R"({"variant":"relu","d_model":13,"d_ff":0})";
  expect_error(run("run --config " + path("dff.json") + " --input " + golden(c, "x.safetensors") +
                   " --output " + path("y.safetensors")),
               "d_ff = 0");
  std::ofstream(path("broken.json")) << R"({"variant": )";
  expect_error(run("run --config " + path("broken.json") + " --input " +
                   golden(c, "x.safetensors") + " --output " + path("y.safetensors")),
               "not valid JSON");
  // dy of another shape than x.
  expect_error(
      run(base + " --weights " + golden(c, "weights.safetensors") + " --grad-output " +
          golden("swiglu_separate_T1", "dy.safetensors") + " --grads " + path("g.safetensors")),
      "expected [..., 13]");
  expect_error(
      run(base + " --weights " + golden(c, "weights.safetensors") + " --grad-output " +
          golden("plain_relu_nobias_T1", "dy.safetensors") + " --grads " + path("g.safetensors")),
      "dy has shape [1, 13], x has [7, 13]");
  EXPECT_FALSE(fs::exists(path("y.safetensors")));
  EXPECT_FALSE(fs::exists(path("g.safetensors")));
  // Writing into a folder that does not exist fails before any work and leaves nothing behind.
  expect_error(run("run --config " + golden(c, "config.json") + " --input " +
                   golden(c, "x.safetensors") + " --weights " + golden(c, "weights.safetensors") +
                   " --output " + path("nope/y.safetensors")),
               "nope' does not exist");
}

namespace {
// A small text file for training runs: a few hundred bytes of English.
std::string training_text() {
  std::string s;
  for (int i = 0; i < 30; ++i)
    s += "Q: Why did the chicken cross the road?\nA: To get to the other side.\n%\n";
  return s;
}
const char* kTiny =
    " --d-model 16 --layers 1 --heads 2 --seq 16 --batch 2 --threads 1 --print-every 1";
}  // namespace

// `train --variant V [--d-ff F] [--no-bias]` trains the library's train_ffn: the one definition
// of a variant's model, which ffnlab.TransformerLM(variant=) builds too.
TEST_F(Cli, TrainVariantIsTheLibrarysTrainFfn) {
  std::ofstream(path("text")) << training_text();
  struct Case {
    std::string variant;
    std::int64_t d_ff;
    bool bias;
  };
  std::vector<Case> cases;
  for (const std::string& v : variant_names()) cases.push_back({v, 0, true});
  cases.push_back({"moe", 24, true});
  cases.push_back({"swiglu", 0, false});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.variant + " d_ff " + std::to_string(c.d_ff) + (c.bias ? "" : " no bias"));
    fs::remove_all(path("run"));
    const auto r = run("train --data " + path("text") + kTiny + " --steps 1 --sample 0 --variant " +
                       c.variant + (c.d_ff > 0 ? " --d-ff " + std::to_string(c.d_ff) : "") +
                       (c.bias ? "" : " --no-bias") + " --out " + path("run"));
    ASSERT_EQ(r.status, 0) << r.err;
    const auto model = nlohmann::json::parse(read(path("run/summary.json")))["model"];
    EXPECT_EQ(model["ffn"], config_to_json(train_ffn(c.variant, 16, c.d_ff, c.bias)));
  }
}

TEST_F(Cli, TrainWritesLogsEvaluationsCheckpointAndSample) {
  std::ofstream(path("text")) << training_text();
  const auto r = run("train --data " + path("text") + kTiny +
                     " --steps 6 --eval-every 3 --sample 20 --out " + path("run"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("step 6/6 loss"), std::string::npos) << r.out;  // plain lines: no TTY
  EXPECT_NE(r.out.find("bits/byte"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model FLOP utilisation "), std::string::npos) << r.out;
  const std::string log = read(path("run/train_log.csv"));
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 7) << log;
  EXPECT_EQ(log.rfind("step,loss,aux_loss,grad_norm,lr,tokens_per_s", 0), 0u) << log;
  const std::string evals = read(path("run/eval_log.csv"));
  EXPECT_EQ(std::count(evals.begin(), evals.end(), '\n'), 3) << evals;
  EXPECT_EQ(read(path("run/sample.txt")).size(), 20u);
  const auto summary = nlohmann::json::parse(read(path("run/summary.json")));
  EXPECT_EQ(summary["steps"], 6);
  EXPECT_EQ(summary["evaluations"].size(), 2u);
  // Model FLOP utilisation: the matrix work the steps did against the bare products of the
  // model's shapes, both measured (rates, not asserted).
  const auto& u = summary["utilisation"];
  EXPECT_GT(u["bare_products_gflops_per_second"].get<double>(), 0.0);
  EXPECT_GT(u["matrix_gflops_per_second"].get<double>(), 0.0);
  EXPECT_NEAR(u["model_flop_utilisation"].get<double>(),
              u["matrix_gflops_per_second"].get<double>() /
                  u["bare_products_gflops_per_second"].get<double>(),
              1e-12);
  EXPECT_TRUE(fs::exists(path("run/checkpoint/checkpoint.json")));
  EXPECT_TRUE(fs::exists(path("run/checkpoint/weights-00000006.safetensors")));

  // MoE: the log carries the load statistics and the experts a token took.
  const auto m =
      run("train --data " + path("text") + kTiny +
          " --variant moe --experts 4 --top-k 2 --steps 2 --sample 0 --out " + path("moe"));
  ASSERT_EQ(m.status, 0) << m.err;
  const std::string mlog = read(path("moe/train_log.csv"));
  const auto line = mlog.substr(mlog.find('\n') + 1);
  EXPECT_NE(line.find(",2.0000,0\n"), std::string::npos) << mlog;      // top-2: 2 experts, no L1
  EXPECT_EQ(line.find(",0.00000,2.0000"), std::string::npos) << mlog;  // router entropy > 0
  EXPECT_FALSE(fs::exists(path("moe/layer_log.csv")));                 // only with --diagnostics
  const auto routing = nlohmann::json::parse(read(path("moe/summary.json")))["routing"];
  EXPECT_EQ(routing["experts_per_token"], 2.0);
  ASSERT_EQ(routing["layers"].size(), 1u);                          // kTiny: one layer
  EXPECT_EQ(routing["layers"][0]["tokens_by_experts"].size(), 3u);  // 0, 1, 2 experts
  EXPECT_FALSE(routing.contains("l1_coef"));

  // ReLU routing: any number of experts a token; the L1 coefficient in the log and summary;
  // the load-balancing loss's default (0.01) is left out, a given one refused.
  const auto relu = run("train --data " + path("text") + kTiny +
                        " --variant moe --routing relu --experts 4 --top-k 1 --l1-coef-init 0.01 "
                        "--steps 2 --sample 0 --out " +
                        path("relu"));
  ASSERT_EQ(relu.status, 0) << relu.err;
  const auto relu_routing = nlohmann::json::parse(read(path("relu/summary.json")))["routing"];
  EXPECT_EQ(relu_routing["layers"][0]["tokens_by_experts"].size(), 5u);  // 0 to 4 experts
  const double lambda = relu_routing["l1_coef"];
  EXPECT_TRUE(std::abs(lambda - 0.01 * 1.2 * 1.2) < 1e-6 || std::abs(lambda - 0.01) < 1e-6 ||
              std::abs(lambda - 0.01 / 1.2 / 1.2) < 1e-6)
      << lambda;
  const auto refused =
      run("train --data " + path("text") + kTiny +
          " --variant moe --routing relu --aux-coef 0.01 --steps 2 --out " + path("relu_aux"));
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.err.find("routing 'relu' does not combine with aux_coef"), std::string::npos)
      << refused.err;

  // --diagnostics N: layer_log.csv, one row per layer at step 1 and every N steps.
  const auto d = run("train --data " + path("text") + kTiny +
                     " --variant moe --experts 4 --top-k 2 --steps 4 --diagnostics 2 --sample 0 "
                     "--out " +
                     path("diag"));
  ASSERT_EQ(d.status, 0) << d.err;
  const std::string dlog = read(path("diag/layer_log.csv"));
  EXPECT_EQ(dlog.rfind("step,layer,residual_rms,attention_rms,ffn_rms,attention_entropy", 0), 0u)
      << dlog;
  const auto layers = nlohmann::json::parse(read(path("diag/summary.json")))["model"]["layers"];
  // Steps 1, 2 and 4, one row per layer, and the header.
  EXPECT_EQ(std::count(dlog.begin(), dlog.end(), '\n'), 3 * layers.get<int>() + 1) << dlog;
  EXPECT_NE(dlog.find("\n4,0,"), std::string::npos) << dlog;
  EXPECT_EQ(dlog.find("\n3,"), std::string::npos) << dlog;
  EXPECT_NE(
      run("train --data " + path("text") + kTiny + " --diagnostics -1 --out " + path("x")).status,
      0);
}

// A new run in a folder that holds an earlier run (--force) removes that run's summary, sample
// and checkpoint before it trains: stopped before its own checkpoint, it leaves no mix of the
// two, and a resume finds nothing to continue rather than the earlier run "finished".
TEST_F(Cli, TrainForcedRestartRemovesTheEarlierRunsFiles) {
  std::ofstream(path("text")) << training_text();
  const std::string common = "train --data " + path("text") + kTiny;
  ASSERT_EQ(run(common + " --steps 2 --sample 8 --out " + path("f")).status, 0);
  ASSERT_TRUE(fs::exists(path("f/summary.json")));
  ASSERT_TRUE(fs::exists(path("f/sample.txt")));
  // The new run diverges at its second step, before any checkpoint of its own.
  const auto r =
      run(common + " --force --lr 1e30 --warmup 0 --clip 0 --steps 5 --out " + path("f"));
  expect_error(r, "step 2");
  EXPECT_FALSE(fs::exists(path("f/summary.json")));
  EXPECT_FALSE(fs::exists(path("f/sample.txt")));
  EXPECT_FALSE(fs::exists(path("f/checkpoint")));
  EXPECT_NE(run("train --resume " + path("f")).status, 0);
}

// A log that cannot be written (here: a full device) stops the run with the system's reason,
// exit 3; it does not train on with a log that silently ends.
TEST_F(Cli, TrainStopsWhenItsLogCannotBeWritten) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  std::ofstream(path("text")) << training_text();
  fs::create_directories(path("full"));
  fs::create_symlink("/dev/full", path("full/train_log.csv"));
  // (--force: a folder holding a train_log.csv holds an earlier run to a new one.)
  const auto r =
      run("train --data " + path("text") + kTiny + " --steps 2 --force --out " + path("full"));
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("full/summary.json")));
}

// A run stopped while it sampled (its checkpoint at the last step, no summary.json) is finished by
// a resume in its folder, which leaves the checkpoint as it is: nothing rewritten.
TEST_F(Cli, TrainFinishingAStoppedRunLeavesItsLastCheckpoint) {
  std::ofstream(path("text")) << training_text();
  const std::string common = "train --data " + path("text") + kTiny + " --sample 0";
  ASSERT_EQ(run(common + " --steps 2 --out " + path("s")).status, 0);
  fs::remove(path("s/summary.json"));
  const auto inode = [&](const std::string& file) {
    struct stat st {};
    EXPECT_EQ(::stat(path("s/checkpoint/" + file).c_str(), &st), 0) << file;
    return st.st_ino;
  };
  const auto weights = inode("weights-00000002.safetensors"), info = inode("checkpoint.json");
  const auto r = run(common + " --resume " + path("s"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(path("s/summary.json")));
  EXPECT_EQ(inode("weights-00000002.safetensors"), weights);
  EXPECT_EQ(inode("checkpoint.json"), info);
  // With another setting, forced, the checkpoint is saved again with it: a later resume takes
  // the run's settings as they ended.
  fs::remove(path("s/summary.json"));
  const auto forced = run(common + " --resume " + path("s") + " --lr 0.002 --force");
  ASSERT_EQ(forced.status, 0) << forced.err;
  const auto saved = nlohmann::json::parse(read(path("s/checkpoint/checkpoint.json")));
  EXPECT_NEAR(saved["train"]["lr"].get<double>(), 0.002, 1e-9);
}

// A log that a resume cannot read back is not replaced by its header alone: the resume fails,
// naming it, before any step and before any log is rewritten (a FIFO, which an unchecked read
// would also wait on forever).
TEST_F(Cli, TrainResumeRefusesALogItCannotRead) {
  std::ofstream(path("text")) << training_text();
  const std::string common = "train --data " + path("text") + kTiny + " --sample 0";
  ASSERT_EQ(run(common + " --steps 2 --out " + path("r")).status, 0);
  fs::remove(path("r/eval_log.csv"));
  ASSERT_EQ(::mkfifo(path("r/eval_log.csv").c_str(), 0600), 0);
  const auto inode = [&](const std::string& file) {
    struct stat st {};
    EXPECT_EQ(::stat(path(file).c_str(), &st), 0) << file;
    return st.st_ino;
  };
  const auto train_log = inode("r/train_log.csv");  // (a rewrite, even of the same rows, renames)
  const auto r = run(common + " --steps 3 --resume " + path("r"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find(path("r/eval_log.csv") + ": a FIFO, not a regular file"), std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::is_fifo(path("r/eval_log.csv")));
  EXPECT_EQ(inode("r/train_log.csv"), train_log);
  EXPECT_EQ(nlohmann::json::parse(read(path("r/checkpoint/checkpoint.json")))["step"], 2);
}

// A log row cut off by a run that died writing it (no line end) is dropped on resume, with the
// rows after the checkpoint; every row left is whole.
TEST_F(Cli, TrainResumeDropsARowCutOffMidWrite) {
  std::ofstream(path("text")) << training_text();
  const std::string common = "train --data " + path("text") + kTiny + " --sample 0";
  ASSERT_EQ(run(common + " --steps 3 --out " + path("cut")).status, 0);
  std::string log = read(path("cut/train_log.csv"));
  const std::size_t last_row = log.rfind('\n', log.size() - 2) + 1;
  log.resize(last_row + (log.size() - last_row) / 2);  // step 3's row, half written
  std::ofstream(path("cut/train_log.csv"), std::ios::trunc) << log;
  const auto r = run(common + " --steps 5 --resume " + path("cut"));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string resumed = read(path("cut/train_log.csv"));
  std::istringstream rows(resumed);
  std::string header, row;
  std::getline(rows, header);
  const auto fields = std::count(header.begin(), header.end(), ',');
  std::vector<std::string> steps;
  while (std::getline(rows, row)) {
    EXPECT_EQ(std::count(row.begin(), row.end(), ','), fields) << row;
    steps.push_back(row.substr(0, row.find(',')));
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"1", "2", "4", "5"})) << resumed;
}

TEST_F(Cli, TrainResumeEqualsAnUninterruptedRun) {
  std::ofstream(path("text")) << training_text();
  const std::string common = "train --data " + path("text") + kTiny + " --dropout 0.1 --sample 0";
  ASSERT_EQ(run(common + " --steps 6 --out " + path("full")).status, 0);
  ASSERT_EQ(run(common + " --steps 3 --out " + path("half")).status, 0);
  const auto r = run(common + " --steps 6 --resume " + path("half") + " --out " + path("half"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("from step 3"), std::string::npos) << r.out;
  const std::string a = read(path("full/checkpoint/weights-00000006.safetensors"));
  const std::string b = read(path("half/checkpoint/weights-00000006.safetensors"));
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "resumed weights differ from the uninterrupted run's";
  const std::string log = read(path("half/train_log.csv"));
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 7) << log;  // appended, one header
}

// Past the warm-up, a cosine schedule's rates depend on the run's length: a run extended with
// another --steps is told it will not equal an uninterrupted one (and does not), where a
// constant schedule's extension does, without a note.
TEST_F(Cli, TrainResumeWithMoreStepsSaysWhenTheScheduleMoved) {
  std::ofstream(path("text")) << training_text();
  const std::string common = "train --data " + path("text") + kTiny + " --sample 0 --warmup 1";
  for (const std::string decay : {"cosine", "constant"}) {
    const std::string c = common + " --decay " + decay;
    const std::string full = path("full-" + decay), half = path("half-" + decay);
    ASSERT_EQ(run(c + " --steps 6 --out " + full).status, 0);
    ASSERT_EQ(run(c + " --steps 3 --out " + half).status, 0);
    const auto r = run(c + " --steps 6 --resume " + half);
    ASSERT_EQ(r.status, 0) << r.err;
    const bool same = read(full + "/checkpoint/weights-00000006.safetensors") ==
                      read(half + "/checkpoint/weights-00000006.safetensors");
    const bool noted = r.out.find(
                           "note: the checkpoint's 3 steps followed a 3-step cosine "
                           "schedule, which from step 3 on") != std::string::npos;
    EXPECT_EQ(same, decay == "constant") << decay;
    EXPECT_EQ(noted, decay == "cosine") << decay << ": " << r.out;
  }
}

// --objective masked: a bidirectional model with [MASK] and RoPE, validation in bits per masked
// byte, no sample; resumed without the flag it stays masked (the checkpoint's objective).
TEST_F(Cli, TrainMaskedObjective) {
  std::ofstream(path("text")) << training_text();
  const std::string common = "train --data " + path("text") + kTiny + " --objective masked";
  const auto r = run(common + " --steps 2 --out " + path("m"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("objective: masked bytes, 2 of each sequence's 16"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("bits per masked byte"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(path("m/sample.txt")));
  const auto summary = nlohmann::json::parse(read(path("m/summary.json")));
  EXPECT_EQ(summary["model"]["causal"], false);
  EXPECT_EQ(summary["model"]["vocab"], 257);
  EXPECT_EQ(summary["model"]["positions"], "rope");
  EXPECT_EQ(summary["train"]["objective"], "masked");
  const auto resumed = run("train --resume " + path("m") + " --steps 3 --d-model 16");
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("objective: masked"), std::string::npos) << resumed.out;
  // Expert choice and Soft MoE train with it; a causal run of them is refused, naming it.
  for (const std::string routing : {"expert_choice", "soft --slots 2"}) {
    const std::string moe = " --variant moe --experts 4 --routing " + routing;
    const auto ok = run(common + moe + " --steps 2 --out " + path(routing.substr(0, 4)));
    EXPECT_EQ(ok.status, 0) << routing << ": " << ok.err;
    const auto causal =
        run("train --data " + path("text") + kTiny + moe + " --steps 2 --out " + path("c"));
    EXPECT_NE(causal.status, 0) << routing;
    EXPECT_NE(causal.err.find("--objective masked"), std::string::npos) << causal.err;
  }
  // Refused by the flag check, with the library's range (0, 1].
  const auto bad = run(common + " --mask-fraction 0 --steps 2 --out " + path("m0"));
  expect_usage_error(bad, "--mask-fraction: '0' is not a number in (0, 1]");

  // A --model-config file takes the objective's keys where it leaves them out, as the flags'
  // model and Python's TransformerLM(objective=) do; the keys it sets are kept.
  const std::string file_run = "train --data " + path("text") +
                               " --seq 16 --batch 2 --threads 1 --objective masked --steps 2";
  std::ofstream(path("lm.json")) << R"({"d_model": 16, "layers": 1, "heads": 2})";
  const auto from_file =
      run(file_run + " --model-config " + path("lm.json") + " --out " + path("f"));
  ASSERT_EQ(from_file.status, 0) << from_file.err;
  const auto file_summary = nlohmann::json::parse(read(path("f/summary.json")));
  EXPECT_EQ(file_summary["model"]["causal"], false);
  EXPECT_EQ(file_summary["model"]["vocab"], 257);
  EXPECT_EQ(file_summary["model"]["positions"], "rope");
  // Resumed with the same file and no --objective: the checkpoint's objective reads it the same.
  const auto file_resumed =
      run("train --resume " + path("f") + " --steps 3 --model-config " + path("lm.json"));
  EXPECT_EQ(file_resumed.status, 0) << file_resumed.err;
  std::ofstream(path("lm_learned.json"))
      << R"({"d_model": 16, "layers": 1, "heads": 2, "positions": "learned"})";
  const auto learned =
      run(file_run + " --model-config " + path("lm_learned.json") + " --out " + path("fl"));
  ASSERT_EQ(learned.status, 0) << learned.err;
  EXPECT_EQ(nlohmann::json::parse(read(path("fl/summary.json")))["model"]["positions"], "learned");
  std::ofstream(path("lm_causal.json"))
      << R"({"d_model": 16, "layers": 1, "heads": 2, "causal": true})";
  const auto causal_file =
      run(file_run + " --model-config " + path("lm_causal.json") + " --out " + path("fc"));
  expect_error(causal_file, "trains a bidirectional model, not one with causal true (in " +
                                path("lm_causal.json") + ")");
}

TEST_F(Cli, TrainStopsOnDivergenceAndKeepsTheLastGoodCheckpoint) {
  // A learning rate of 1e30 throws the weights to ~1e28 in the first update; the second forward
  // overflows. The run must stop there with one line naming the step and the kept checkpoint.
  std::ofstream(path("text")) << training_text();
  const auto r = run("train --data " + path("text") + kTiny +
                     " --lr 1e30 --warmup 0 --clip 0 --steps 5 --checkpoint-every 1 --sample 0"
                     " --out " +
                     path("run"));
  expect_error(r, "step 2");
  EXPECT_NE(r.err.find("training stopped before the update"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("last good checkpoint (step 1)"), std::string::npos) << r.err;
  const auto info = nlohmann::json::parse(read(path("run/checkpoint/checkpoint.json")));
  EXPECT_EQ(info["step"], 1);
  const SafeTensors st = SafeTensors::load(path("run/checkpoint/weights-00000001.safetensors"));
  double largest = 0;
  for (const std::string& name : st.names()) {
    if (name.rfind("model.", 0) != 0) continue;
    const Tensor t = st.f32(name);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(t.f32()[i])) << name;
      largest = std::max(largest, static_cast<double>(std::fabs(t.f32()[i])));
    }
  }
  EXPECT_GT(largest, 1e20) << "the kept weights are the diverged step-1 weights";
  EXPECT_FALSE(fs::exists(path("run/checkpoint/weights-00000002.safetensors")));
}

TEST_F(Cli, TrainRejectsBadInput) {
  std::ofstream(path("empty")).flush();
  expect_error(run("train --data " + path("empty") + kTiny + " --steps 1 --out " + path("o1")),
               "is empty");
  std::ofstream(path("short")) << "just a few bytes";
  expect_error(run("train --data " + path("short") + kTiny + " --steps 1 --out " + path("o2")),
               "sequence length 16");
  expect_error(run("train --data " + path("missing") + kTiny + " --steps 1 --out " + path("o3")),
               "does not exist");
  std::ofstream(path("text")) << training_text();
  const std::string common = "train --data " + path("text") + kTiny + " --sample 0";
  expect_error(run(common + " --steps 2 --resume " + path("nothing") + " --out " + path("o4")),
               "no checkpoint");
  ASSERT_EQ(run(common + " --steps 2 --out " + path("run")).status, 0);
  expect_error(run("train --data " + path("text") +
                   " --d-model 32 --layers 1 --heads 2 --seq 16 --batch 2 --sample 0 --steps 4 "
                   "--resume " +
                   path("run") + " --out " + path("o5")),
               "the model flags do not match the checkpoint's model: --d-model gives 32, the "
               "checkpoint has 16");
  // The data moved: a resume that reads the checkpoint's says to give it.
  fs::rename(path("text"), path("moved"));
  expect_error(run("train --steps 3 --sample 0 --resume " + path("run")),
               "does not exist (the data the checkpoint names: give it with --data)");
  fs::rename(path("moved"), path("text"));
  std::ofstream(path("run/checkpoint/checkpoint.json")) << "{\"format\": \"ffnlab-chec";
  expect_error(run(common + " --steps 4 --resume " + path("run") + " --out " + path("o6")),
               "corrupt");
  expect_usage_error(run(common + " --steps 1 --variant nonsense --out " + path("o7")),
                     "--variant: 'nonsense' is not one of relu");
  expect_error(run("train --data " + path("text") +
                   " --d-model 16 --layers 1 --heads 2 --batch 2 --seq 32 --context 16 --steps 1 "
                   "--out " +
                   path("o8")),
               "context");
}

// On a terminal the toy run draws a bar while a variant trains (here about a second each),
// and each variant's row takes the bar's place; into a file the same run writes the rows alone.
TEST_F(Cli, ToyDrawsABarOnATerminalAndRowsInItsPlace) {
  const std::string flags =
      "toy --variants relu,gelu --d-model 512 --d-ff 2048 --batch 64 --seq 32 --iterations 8 "
      "--threads 2 --out " +
      path("toy.csv");
  const auto logged = run(flags);
  ASSERT_EQ(logged.status, 0) << logged.err;
  EXPECT_EQ(logged.out.find('\r'), std::string::npos) << logged.out;
  EXPECT_NE(logged.out.find("\nrelu  "), std::string::npos) << logged.out;

  std::vector<std::string> args = {FFNLAB_BIN};
  std::istringstream words(flags);
  for (std::string word; words >> word;) args.push_back(word);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int terminal = -1;
  const pid_t pid = forkpty(&terminal, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execv(FFNLAB_BIN, argv.data());
    _exit(127);
  }
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = ::read(terminal, buffer, sizeof buffer)) > 0;) out.append(buffer, n);
  close(terminal);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  for (const std::string name : {"relu", "gelu"}) {
    EXPECT_NE(out.find("] " + name + " "), std::string::npos) << name << ": no bar in " << out;
    EXPECT_NE(out.find("\r\033[K" + name + "  "), std::string::npos)
        << name << ": the row is not in the bar's place in " << out;
  }
  EXPECT_NE(out.find("per-iteration loss"), std::string::npos) << out;
}

TEST_F(Cli, ToyRunsEveryVariantAndLogsEachIteration) {
  const auto r = run("toy --d-model 32 --d-ff 64 --iterations 30 --lr 3e-3 --threads 1 --out " +
                     path("toy.csv"));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string csv = read(path("toy.csv"));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 5 * 30) << csv.substr(0, 200);
  std::istringstream in(csv);
  std::string line;
  std::getline(in, line);
  std::map<std::string, std::vector<double>> loss;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string variant, it, l;
    std::getline(f, variant, ',');
    std::getline(f, it, ',');
    std::getline(f, l, ',');
    loss[variant].push_back(std::stod(l));
  }
  for (const auto& [variant, v] : loss) EXPECT_LT(v.back(), 0.5 * v.front()) << variant;
  EXPECT_EQ(loss.size(), 5u);

  // A layer config file is the one layer: run once, under its own name, at its own shape.
  std::ofstream(path("swiglu.json"))
      << R"({"variant":"swiglu","d_model":16,"d_ff":24,"bias":false})";
  const auto file = run("toy --ffn-config " + path("swiglu.json") +
                        " --iterations 3 --threads 1 --out " + path("file.csv"));
  ASSERT_EQ(file.status, 0) << file.err;
  EXPECT_NE(file.out.find("d_model 16, d_ff 24,"), std::string::npos) << file.out;
  const std::string rows = read(path("file.csv"));
  EXPECT_EQ(rows.substr(rows.find('\n') + 1, 9), "swiglu,1,") << rows;
  EXPECT_EQ(std::count(rows.begin(), rows.end(), '\n'), 1 + 3) << rows;
  // Routings that look at whole sequences route each of the batch's sequences: one token is not
  // a sequence, as in `ffnlab run`.
  expect_error(run("toy --variants moe --routing expert_choice --d-model 8 --d-ff 8 --seq 1 "
                   "--iterations 1 --threads 1 --out " +
                   path("ec.csv")),
               "one token at a time");
}
