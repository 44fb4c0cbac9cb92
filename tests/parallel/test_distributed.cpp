// Data-parallel training over MPI (docs/distributed.md), end to end through `ffnlab train`:
// 1 process and 2 ranks (mpirun -np 2, one thread each) end with the same weights; resuming
// works with another number of ranks; mismatched ranks, a hung rank and a dead rank end the run
// with an error instead of a hang. Skipped, saying so, where mpirun is absent; a build without
// MPI is tested to refuse an mpirun launch.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>
#include <tuple>

#include "../cli/cli_fixture.hpp"
#include "../common/test_util.hpp"
#include "ffnlab/io/safetensors.hpp"

extern char** environ;

#ifndef FFNLAB_STRAY_RANK
#define FFNLAB_STRAY_RANK ""  // built only with MPI; the tests that use it skip without
#endif
#ifndef FFNLAB_WORLD_AFTER_FAILURE
#define FFNLAB_WORLD_AFTER_FAILURE ""  // the same
#endif

namespace ffnlab::test {
namespace {

// OpenMPI refuses root unless told; CI runs as root. Loopback, 2 ranks on any number of cores.
const std::string kMpirun =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
    "mpirun --bind-to none -x OMP_NUM_THREADS=1 ";

bool have_mpirun() {
  return std::system("command -v mpirun > /dev/null 2>&1") == 0;
}

// A small model: 2 blocks, batch 4 of 32 bytes, 20 steps with evaluation at the end.
const std::string kRun =
    "train --d-model 32 --layers 2 --heads 2 --seq 32 --batch 4 --steps 20 --eval-every 0 "
    "--eval-tokens 512 --sample 0 --threads 1 --lr 3e-3 --print-every 20 ";

// Every tensor of a run's checkpoint, by name, from its weights file and (an expert-parallel
// run's) the expert shards beside it.
std::map<std::string, Tensor> checkpoint_tensors(const std::string& dir) {
  std::map<std::string, Tensor> out;
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "checkpoint"))
    if (e.path().extension() == ".safetensors") {
      const SafeTensors st = SafeTensors::load(e.path().string());
      for (const auto& name : st.names()) {
        EXPECT_EQ(out.count(name), 0u) << name << " is in two files";
        out[name] = st.f32(name);
      }
    }
  if (out.empty()) throw std::runtime_error("no weights in " + dir);
  return out;
}

// The largest |a − b| / (1 + |a|) over every tensor of two checkpoints (names must match).
double weights_gap(const std::string& dir_a, const std::string& dir_b) {
  const auto a = checkpoint_tensors(dir_a), b = checkpoint_tensors(dir_b);
  std::vector<std::string> names_a, names_b;
  for (const auto& [name, t] : a) names_a.push_back(name);
  for (const auto& [name, t] : b) names_b.push_back(name);
  EXPECT_EQ(names_a, names_b);
  double gap = 0;
  for (const auto& [name, x] : a) {
    if (!b.count(name)) continue;
    const Tensor& y = b.at(name);
    EXPECT_EQ(x.numel(), y.numel()) << name;
    for (std::int64_t i = 0; i < std::min(x.numel(), y.numel()); ++i)
      gap = std::max(gap, std::abs(static_cast<double>(x.f32()[i]) - y.f32()[i]) /
                              (1.0 + std::abs(static_cast<double>(x.f32()[i]))));
  }
  return gap;
}

class Distributed : public Cli {
 public:
  Outcome run_cli(const std::string& args, const std::string& prefix) { return run(args, prefix); }
  std::string out_dir() const { return path("a"); }

 protected:
  void SetUp() override {
    Cli::SetUp();
#ifndef FFNLAB_MPI_BUILD
    GTEST_SKIP() << "this ffnlab is built without MPI (FFNLAB_MPI=OFF): data-parallel runs are "
                    "not tested here (NoMpi.RefusesAnMpirunLaunch is)";
#endif
    if (!have_mpirun())
      GTEST_SKIP() << "mpirun is not installed (Debian openmpi-bin, scripts/install-deps.sh)";
  }
  // Runs the same arguments in one process and on 2 ranks; both must succeed. `one_args`:
  // the one process's, when they differ.
  void run_both(const std::string& args, const std::string& one_args = "") {
    const Outcome one = run(kRun + (one_args.empty() ? args : one_args) + " --out " + path("one"));
    ASSERT_EQ(one.status, 0) << one.err;
    const Outcome two = run(kRun + args + " --out " + path("two"), kMpirun + "-np 2 ");
    ASSERT_EQ(two.status, 0) << two.err << two.out;
    EXPECT_NE(two.out.find("data parallel: 2 ranks, 2 sequences each"), std::string::npos)
        << two.out;
  }
  // The two runs' step logs, column by column (loss, aux loss, gradient norm, MoE statistics).
  void expect_same_logs(const char* file) {
    const std::string a = read(fs::path(path("one")) / file),
                      b = read(fs::path(path("two")) / file);
    std::istringstream sa(a), sb(b);
    std::string la, lb;
    int rows = 0;
    while (std::getline(sa, la) && std::getline(sb, lb)) {
      if (rows++ == 0) continue;
      std::istringstream ca(la), cb(lb);
      std::string va, vb;
      for (int col = 0; std::getline(ca, va, ',') && std::getline(cb, vb, ','); ++col) {
        if (std::string_view(file) == "train_log.csv" && (col == 5 || col == 6)) continue;  // speed
        EXPECT_NEAR(std::stod(va), std::stod(vb), 1e-4 * (1 + std::abs(std::stod(va))))
            << file << " row " << rows << " column " << col;
      }
    }
    EXPECT_GT(rows, 1) << file;
  }
};

// Tolerance: 2 ranks sum the gradients of their halves of the batch where one process sums them
// over the whole batch; the rounding differs, nothing else. Measured after 20 Adam steps: 1e-6.
constexpr double kTolerance = 1e-4;
constexpr double kMoETolerance = 1e-3;

TEST_F(Distributed, DenseRunMatchesOneProcess) {
  run_both("--variant swiglu --dropout 0.1 --accumulate 2");
  const double gap = weights_gap(path("one"), path("two"));
  EXPECT_LT(gap, kTolerance);
  RecordProperty("weights_gap", std::to_string(gap));
  std::printf("largest relative weight difference: %.3g\n", gap);
  expect_same_logs("train_log.csv");
  expect_same_logs("eval_log.csv");
}

// The MoE's routing statistics, aux and z losses, capacity (position order over the ranks),
// balancing bias, jitter and noisy top-k are the whole batch's.
TEST_F(Distributed, MoERunMatchesOneProcess) {
  {
    std::ofstream(path("moe.json"))
        << R"({"variant": "moe", "d_model": 32, "d_ff": 64, "moe": {"num_experts": 4, "top_k": 2,
         "jitter": 0.05, "noisy_topk": true, "balance_bias": true, "balance_rate": 0.001,
         "capacity_factor": 1.0, "aux_coef": 0.01, "z_coef": 0.001}})";
  }
  run_both("--ffn-config " + path("moe.json") + " --accumulate 2");
  const double gap = weights_gap(path("one"), path("two"));
  // Wider than the dense run's: Adam divides each step by the gradient's running RMS, so a weight
  // whose gradients stay near zero takes a step of up to the learning rate whose size the
  // rounding of those gradients decides. Measured on an AMD EPYC with AVX2: 1.3e-4, all of it in
  // one row of layer 0's expert 2 up_proj (a ReLU unit few tokens open); 1e-6 with AVX-512. A
  // gradient left out of the all-reduce moves weights by the learning rate times the steps.
  EXPECT_LT(gap, kMoETolerance);
  std::printf("largest relative weight difference: %.3g\n", gap);
  expect_same_logs("train_log.csv");
  // The capacity drops something (dropped_fraction, column 9), so that dropping over the ranks
  // is tested.
  std::istringstream log(read(fs::path(path("two")) / "train_log.csv"));
  std::string line, last;
  while (std::getline(log, line)) last = line;
  std::istringstream row(last);
  std::string value;
  for (int col = 0; col <= 9; ++col) std::getline(row, value, ',');
  EXPECT_GT(std::stod(value), 0.0) << last;
}

// Expert parallel: each rank computes 2 of the 4 experts for both ranks' tokens; capacity (the
// rows dropped are decided before the exchange) and dropless.
TEST_F(Distributed, ExpertParallelRunMatchesOneProcess) {
  for (const char* capacity : {"1.0", "0"}) {
    SCOPED_TRACE(std::string("capacity_factor ") + capacity);
    std::ofstream(path("moe.json"))
        << R"({"variant": "moe", "d_model": 32, "d_ff": 64, "moe": {"num_experts": 4, "top_k": 2,
         "noisy_topk": true, "balance_bias": true, "balance_rate": 0.001, "aux_coef": 0.01,
         "capacity_factor": )"
        << capacity << "}}";
    fs::remove_all(path("one"));
    fs::remove_all(path("two"));
    run_both("--ffn-config " + path("moe.json") + " --expert-parallel",
             "--ffn-config " + path("moe.json"));
    const double gap = weights_gap(path("one"), path("two"));
    EXPECT_LT(gap, kTolerance);
    std::printf("largest relative weight difference: %.3g\n", gap);
    expect_same_logs("train_log.csv");
    expect_same_logs("eval_log.csv");
  }
}

TEST_F(Distributed, ExpertParallelNeedsExpertsThatSplit) {
  const Outcome dense = run(kRun + "--expert-parallel --out " + path("a"), kMpirun + "-np 2 ");
  EXPECT_NE(dense.err.find("expert parallelism needs an MoE model"), std::string::npos)
      << dense.err;
  const Outcome odd =
      run(kRun + "--variant moe --experts 3 --top-k 1 --expert-parallel --out " + path("b"),
          kMpirun + "-np 2 ");
  EXPECT_NE(odd.err.find("3 experts cannot be split evenly over 2 ranks"), std::string::npos)
      << odd.err;
  EXPECT_FALSE(fs::exists(path("a")) || fs::exists(path("b"))) << "a refused run left --out";
}

// A checkpoint holds no trace of the number of ranks: 10 steps on 2 ranks, then 10 more in one
// process, end where 20 steps in one process do.
TEST_F(Distributed, ResumesWithAnotherNumberOfRanks) {
  const Outcome one = run(kRun + "--out " + path("one"));
  ASSERT_EQ(one.status, 0) << one.err;
  const std::string half =
      kRun.substr(0, kRun.find("--steps")) + "--steps 10 " + kRun.substr(kRun.find("--eval-every"));
  const Outcome first = run(half + "--out " + path("two"), kMpirun + "-np 2 ");
  ASSERT_EQ(first.status, 0) << first.err;
  const Outcome rest = run("train --resume " + path("two") + " --steps 20 --sample 0 --threads 1");
  ASSERT_EQ(rest.status, 0) << rest.err;
  EXPECT_LT(weights_gap(path("one"), path("two")), kTolerance);
}

// The same with the experts split: the checkpoint holds every expert (each from its holder).
TEST_F(Distributed, ExpertParallelRunResumesInOneProcess) {
  const std::string moe = "--variant moe --experts 4 --top-k 2 ";
  const Outcome one = run(kRun + moe + "--out " + path("one"));
  ASSERT_EQ(one.status, 0) << one.err;
  const std::string half =
      kRun.substr(0, kRun.find("--steps")) + "--steps 10 " + kRun.substr(kRun.find("--eval-every"));
  const Outcome first =
      run(half + moe + "--expert-parallel --out " + path("two"), kMpirun + "-np 2 ");
  ASSERT_EQ(first.status, 0) << first.err;
  const Outcome rest = run("train --resume " + path("two") + " --steps 20 --sample 0 --threads 1");
  ASSERT_EQ(rest.status, 0) << rest.err;
  EXPECT_LT(weights_gap(path("one"), path("two")), kTolerance);
}

// Each rank may be given its own --out (only rank 0 writes the logs): an expert-parallel
// checkpoint still lands whole in rank 0's folder, every part that its checkpoint.json lists,
// and resumes from there.
TEST_F(Distributed, ExpertParallelPartsLandInRankZerosFolder) {
  const std::string args = kRun + "--variant moe --experts 4 --top-k 2 --expert-parallel ";
  const Outcome r = run(args + "--out " + path("b"), kMpirun + "-np 1 " + FFNLAB_BIN + " " + args +
                                                         "--out " + path("a") + " : -np 1 ");
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  EXPECT_FALSE(fs::exists(fs::path(path("b")) / "checkpoint")) << "a part went to rank 1's --out";
  const Outcome rest = run("train --resume " + path("a") + " --steps 22 --sample 0 --threads 1");
  EXPECT_EQ(rest.status, 0) << rest.err;
}

// Expert parallel, no rank holds the whole model to sample from: a causal run says how to sample
// from its checkpoint in one process; a masked model draws no sample, and says nothing of it.
TEST_F(Distributed, OnlyACausalExpertParallelRunSaysHowToSampleLater) {
  std::string args = kRun;
  args.replace(args.find("--sample 0 "), 11, "");
  args.replace(args.find("--steps 20"), 10, "--steps 4");
  args += "--variant moe --experts 4 --top-k 2 --expert-parallel ";
  const Outcome causal = run(args + "--out " + path("a"), kMpirun + "-np 2 ");
  ASSERT_EQ(causal.status, 0) << causal.err;
  EXPECT_NE(causal.out.find("no sample: no rank holds every expert"), std::string::npos)
      << causal.out;
  const Outcome masked = run(args + "--objective masked --out " + path("b"), kMpirun + "-np 2 ");
  ASSERT_EQ(masked.status, 0) << masked.err;
  EXPECT_EQ(masked.out.find("no sample"), std::string::npos) << masked.out;
  EXPECT_EQ(masked.out.find("--sample"), std::string::npos) << masked.out;
}

// Expert groups: 4 ranks with the experts split over groups of 2 (two replicas) or of 4 end
// where one process does; a checkpoint of the 2 × 2 layout resumes on 2 ranks (one group),
// then in one process. Refused: a group that does not divide the ranks, and a group without
// --expert-parallel.
TEST_F(Distributed, ExpertGroupsMatchOneProcessAndResumeOnAnyLayout) {
  const std::string moe = "--variant moe --experts 4 --top-k 2 ";
  const Outcome one = run(kRun + moe + "--out " + path("one"));
  ASSERT_EQ(one.status, 0) << one.err;
  const auto steps = [](const char* n) {
    return kRun.substr(0, kRun.find("--steps")) + "--steps " + n + " " +
           kRun.substr(kRun.find("--eval-every"));
  };
  const Outcome whole = run(kRun + moe + "--expert-parallel --expert-group 4 --out " + path("four"),
                            kMpirun + "-np 4 ");
  ASSERT_EQ(whole.status, 0) << whole.err;
  EXPECT_LT(weights_gap(path("one"), path("four")), kMoETolerance);
  // Its evaluation exchanged rows between the ranks that hold the experts: the same loss.
  const auto validation = [](const std::string& out) {
    const auto at = out.rfind("validation loss ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 16, 8));
  };
  EXPECT_GT(validation(one.out), 0.0) << one.out;
  EXPECT_NEAR(validation(whole.out), validation(one.out), 2e-4) << whole.out;
  // Each rank of the group wrote its own experts: rank 0 the dense part and experts 0, ranks 1-3
  // a shard each, which checkpoint.json lists.
  const auto files_in = [](const std::string& run) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(fs::path(run) / "checkpoint"))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  EXPECT_EQ(files_in(path("four")),
            (std::vector<std::string>{"checkpoint.json", "weights-00000020-experts-1.safetensors",
                                      "weights-00000020-experts-2.safetensors",
                                      "weights-00000020-experts-3.safetensors",
                                      "weights-00000020.safetensors"}));

  const Outcome first =
      run(steps("10") + moe + "--expert-parallel --expert-group 2 --out " + path("two"),
          kMpirun + "-np 4 ");
  ASSERT_EQ(first.status, 0) << first.err;
  EXPECT_NE(first.out.find("expert parallel: 2 experts per rank, in 2 groups of 2 ranks"),
            std::string::npos)
      << first.out;
  const Outcome second =
      run("train --resume " + path("two") + " --steps 15 --sample 0 --threads 1 --expert-parallel",
          kMpirun + "-np 2 ");
  ASSERT_EQ(second.status, 0) << second.err;
  const Outcome rest = run("train --resume " + path("two") + " --steps 20 --sample 0 --threads 1");
  ASSERT_EQ(rest.status, 0) << rest.err;
  EXPECT_LT(weights_gap(path("one"), path("two")), kMoETolerance);
  // One process wrote one file, and removed the shards of the layout before.
  EXPECT_EQ(files_in(path("two")),
            (std::vector<std::string>{"checkpoint.json", "weights-00000020.safetensors"}));

  const Outcome odd =
      run(kRun + moe + "--expert-parallel --expert-group 3 --out " + path("a"), kMpirun + "-np 4 ");
  EXPECT_NE(odd.err.find("an expert group of 3 ranks does not divide the 4 ranks"),
            std::string::npos)
      << odd.err;
  const Outcome alone = run(kRun + moe + "--expert-group 2 --out " + path("b"), kMpirun + "-np 2 ");
  EXPECT_NE(alone.err.find("--expert-group sizes the groups of --expert-parallel"),
            std::string::npos)
      << alone.err;
  EXPECT_FALSE(fs::exists(path("a")) || fs::exists(path("b"))) << "a refused run left --out";
}

// The ranks on one machine share its memory: each checks its model against its part, and a
// model no part holds is refused naming how many share it (here 2 ranks on this machine). The
// model needs half as much again as the whole machine, whatever its size, so that no rank
// allocates it even if the sharing were lost.
TEST_F(Distributed, RanksOnOneMachineCheckTheirShareOfItsMemory) {
  const double machine =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  // 12 MoE layers of 4 experts of d_model 128: about 12·4·257·d_ff parameters, 16 bytes each
  // with gradients and Adam's moments.
  const auto d_ff = static_cast<std::int64_t>(std::ceil(1.5 * machine / (16.0 * 12 * 4 * 257)));
  ASSERT_LE(d_ff, std::int64_t{1} << 24) << "a machine beyond what one --d-ff can exceed";
  const Outcome r =
      run("train --d-model 128 --layers 12 --heads 2 --seq 32 --batch 4 --steps 2 --sample 0 "
          "--threads 1 --variant moe --experts 4 --top-k 2 --d-ff " +
              std::to_string(d_ff) + " --out " + path("a"),
          kMpirun + "-np 2 ");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("available to each of the 2 processes on this machine"), std::string::npos)
      << r.err;
}

// Held experts: a rank allocates only its own. Under a per-process cap of 1.34 GiB (ulimit
// -v), a model of 101.5 M parameters (3 MoE layers of 4 experts of width 65536; 1.5 GiB of
// weights, gradients and Adam state) is refused in one process, naming the memory it needs, and
// trains in an expert group of 4 (0.4 GiB a rank), its checkpoint written in four parts.
TEST_F(Distributed, ExpertGroupsTrainAModelLargerThanOneProcessCanHold) {
  const std::string big =
      "train --d-model 64 --layers 3 --heads 2 --seq 32 --batch 4 --steps 2 --eval-tokens 256 "
      "--sample 0 --threads 1 --variant moe --experts 4 --top-k 2 --d-ff 65536 ";
  const std::string cap = "ulimit -v 1400000 && ";
  const Outcome one = run(big + "--out " + path("one"), cap);
  EXPECT_NE(one.status, 0);
  EXPECT_NE(one.err.find("a model of 101520524 parameters (weights, gradients, Adam state) needs "
                         "1.5 GiB, more than the 1.3 GiB available"),
            std::string::npos)
      << one.err;
  const Outcome four = run(big + "--expert-parallel --expert-group 4 --out " + path("four"),
                           cap + kMpirun + "-np 4 ");
  ASSERT_EQ(four.status, 0) << four.err;
  EXPECT_TRUE(
      fs::exists(fs::path(path("four")) / "checkpoint" / "weights-00000002-experts-3.safetensors"));
  // Resumed on the same layout, from the four parts (each rank reads its own experts).
  const Outcome more =
      run("train --resume " + path("four") + " --steps 3 --sample 0 --threads 1 --expert-parallel",
          cap + kMpirun + "-np 4 ");
  ASSERT_EQ(more.status, 0) << more.err;
}

TEST_F(Distributed, RanksWithOtherSettingsAreRefusedAtStartUp) {
  const std::string bin = FFNLAB_BIN;
  const Outcome r = run(kRun + "--seed 1 --out " + path("a") + " : -np 1 " + bin + " " + kRun +
                            "--seed 2 --out " + path("b"),
                        kMpirun + "-np 1 ");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("rank 1 was started with another configuration than rank 0: "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("train.seed = 2 here, 1 on rank 0"), std::string::npos) << r.err;
}

// Settings that only change how the ranks exchange (the bucket size, expert parallelism) must
// agree too: they crashed the ranks (mismatched collectives) before the start-up check named
// them. Every flag but the rank-local ones is compared, and a refused run leaves no --out.
TEST_F(Distributed, RanksWithOtherExchangeSettingsAreRefusedBeforeAnyOutput) {
  const std::string bin = FFNLAB_BIN;
  const std::string moe = "--variant moe --experts 2 --top-k 1 ";
  for (const auto& [a, b, what] :
       {std::tuple{"--bucket-mb 4", "--bucket-mb 0.01", "settings.--bucket-mb"},
        std::tuple{"", "--expert-parallel", "parallel.expert_parallel = true here, false"},
        std::tuple{"--expert-parallel", "", "settings.--expert-parallel"}}) {
    SCOPED_TRACE(std::string(a) + " vs " + b);
    const Outcome r = run(kRun + moe + a + " --out " + path("a") + " : -np 1 " + bin + " " + kRun +
                              moe + b + " --out " + path("a"),
                          kMpirun + "-np 1 ");
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find("rank 1 was started with another configuration than rank 0: "),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("Segmentation"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(path("a"))) << "a refused run left its output folder";
  }
}

// A flag whose value is not UTF-8 (a folder's name) is compared over the ranks as JSON keeps it,
// not refused by the JSON writer: a run resumed from such a folder continues on 2 ranks.
TEST_F(Distributed, AFolderWhoseNameIsNotUtf8ResumesOverRanks) {
  std::string folder = "'";  // (one + at a time: GCC 12's -Wrestrict misfires on a chain)
  folder += path("r\xff");
  folder += "'";
  const Outcome first = run(kRun + "--out " + folder, kMpirun + "-np 2 ");
  ASSERT_EQ(first.status, 0) << first.err;
  const Outcome resumed =
      run("train --resume " + folder + " --steps 22 --threads 1 --sample 0", kMpirun + "-np 2 ");
  EXPECT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(read(path("r\xff") + "/train_log.csv").find("\n22,"), std::string::npos);
}

// A finished run resumed in rank 0's folder is finished on every rank, whatever folder another
// rank names as its own: rank 0 decides, and no rank trains (or waits for the others) alone.
TEST_F(Distributed, AFinishedRunIsFinishedOnEveryRank) {
  ASSERT_EQ(run(kRun + "--out " + path("a"), kMpirun + "-np 2 ").status, 0);
  const std::string bin = FFNLAB_BIN;
  // (--dist-timeout: a rank left waiting for the others fails in 10 s, saying so)
  const std::string resume =
      "train --resume " + path("a") + " --threads 1 --sample 0 --dist-timeout 10 --out ";
  const Outcome r =
      run(resume + path("a") + " : -np 1 " + bin + " " + resume + path("b"),
          std::regex_replace(kMpirun, std::regex("mpirun "), "timeout 120 mpirun ") + "-np 1 ");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("is finished at step 20 of 20"), std::string::npos) << r.out;
}

TEST_F(Distributed, BatchThatDoesNotSplitIsRefused) {
  std::string args = kRun;
  args.replace(args.find("--batch 4"), 9, "--batch 3");
  const Outcome r = run(args + "--out " + path("a"), kMpirun + "-np 2 ");
  EXPECT_EQ(r.status, 2) << r.err;  // a usage error, before any model is built
  EXPECT_NE(r.err.find("batch = 3 sequences cannot be split evenly over 2 ranks"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(path("a"))) << "a refused run left its output folder";
}

// Rank 0 runs ffnlab train, rank 1 the stray rank in `mode` (tests/parallel/stray_rank.cpp);
// returns the outcome and how long the job took.
std::pair<Outcome, double> run_with_stray_rank(Distributed& t, const std::string& mode,
                                               int timeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const Outcome r =
      t.run_cli(kRun + "--dist-timeout " + std::to_string(timeout) + " --out " + t.out_dir() +
                    " : -np 1 " + std::string(FFNLAB_STRAY_RANK) + " " + mode,
                kMpirun + "-np 1 ");
  return {r, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

// Rank 0's checkpoint write fails (a file-size limit: EFBIG): every rank raises rank 0's error
// as the system's, and the job ends with exit status 3, as one process would. (TCP over the
// loopback between the ranks: under the limit OpenMPI's shared memory would not start.)
TEST_F(Distributed, AFailedCheckpointWriteEndsTheJobWithExitStatus3) {
  const Outcome r = run(kRun + "--out " + path("a") + "'",
                        "OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo " +
                            kMpirun + "-np 2 sh -c 'ulimit -f 16; exec ");
  EXPECT_EQ(r.status, 3) << r.err;
  const std::string line = "write failed (File too large); no checkpoint was written";
  EXPECT_NE(r.err.find(line), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("a") + "/checkpoint/checkpoint.json"));
}

// A rank that never answers: the other gives up after --dist-timeout and ends the job.
TEST_F(Distributed, HungRankEndsTheRunAfterTheTimeout) {
  const auto [r, seconds] = run_with_stray_rank(*this, "silent", 3);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("rank 0 of 2: no answer from the other ranks for 3 s"), std::string::npos)
      << r.err;
  EXPECT_LT(seconds, 60) << "the stray rank sleeps 120 s: the job was not ended";
}

// After an exchange that timed out (MPI may still be running it), the next exchange of the
// world and of a group split from it fail at once, naming the failure, instead of pairing with
// the abandoned one (tests/parallel/world_after_failure.cpp).
TEST_F(Distributed, AnExchangeAfterAFailedOneFailsAtOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  const Outcome r =
      run_command(std::regex_replace(kMpirun, std::regex("mpirun "), "timeout 60 mpirun ") +
                  "-np 2 " + std::string(FFNLAB_WORLD_AFTER_FAILURE));
  const std::string failed = "no answer from the other ranks for 1 s in the first exchange";
  EXPECT_NE(r.out.find("first (after waiting): [dist] rank 0 of 2: " + failed), std::string::npos)
      << r.out << r.err;
  EXPECT_NE(r.out.find("second (at once): [dist] rank 0 of 2: the second exchange cannot start: "
                       "an earlier one failed ([dist] rank 0 of 2: " +
                       failed),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("group (at once): [dist] rank 0 of 2: the group exchange cannot start"),
            std::string::npos)
      << r.out;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60);
}

// A rank that dies: the job ends with an error, not a hang, and no checkpoint is claimed.
TEST_F(Distributed, DeadRankEndsTheRun) {
  const auto [r, seconds] = run_with_stray_rank(*this, "die", 30);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_LT(seconds, 60);
  EXPECT_FALSE(fs::exists(fs::path(out_dir()) / "checkpoint" / "checkpoint.json"));
}

TEST_F(Cli, ExpertParallelNeedsAnMpiRun) {
  expect_usage_error(run(kRun + "--variant moe --expert-parallel --out " + path("a")),
                     "--expert-parallel splits the experts over the ranks of an MPI run");
}

// The settings of the exchanges between ranks mean nothing to one process: refused, not
// ignored, before any output.
TEST_F(Cli, ExchangeSettingsNeedAnMpiRun) {
  expect_usage_error(run(kRun + "--dist-timeout 10 --out " + path("a")),
                     "--dist-timeout sets the exchanges between the ranks of an MPI run");
  expect_usage_error(run(kRun + "--bucket-mb 1 --out " + path("a")),
                     "--bucket-mb sets the exchanges between the ranks of an MPI run");
  expect_usage_error(run("evolve --quick --threads 1 --dist-timeout 3 --out " + path("r")),
                     "--dist-timeout bounds the silence of an MPI run's ranks");
  EXPECT_FALSE(fs::exists(path("a")) || fs::exists(path("r"))) << "a refused run left --out";
}

// Capacity with drop = probability ranks an expert's assignments over the whole batch, which no
// rank holds: refused at start-up, before the output folder is touched (with --force, the old
// run's folder stays).
TEST_F(Distributed, DropByProbabilityIsRefusedBeforeTheFolderIsTouched) {
  std::string args = kRun;
  args.replace(args.find("--steps 20"), 10, "--steps 2");
  ASSERT_EQ(run(args + "--out " + path("a")).status, 0);
  const std::string before = read(fs::path(path("a")) / "train_log.csv");
  std::ofstream(path("moe.json"))
      << R"({"variant":"moe","moe":{"num_experts":4,"top_k":2,"capacity_factor":1.25,)"
      << R"("drop":"probability"}})";
  const Outcome r = run(args + "--ffn-config " + path("moe.json") + " --force --out " + path("a"),
                        kMpirun + "-np 2 ");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("capacity with drop = probability is not supported in data-parallel"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(read(fs::path(path("a")) / "train_log.csv"), before);
}

// Built without MPI, a launch by mpirun is refused: each process would train alone.
TEST_F(Cli, NoMpiRefusesAnMpirunLaunch) {
#ifdef FFNLAB_MPI_BUILD
  GTEST_SKIP() << "this ffnlab is built with MPI (the Distributed tests run it)";
#else
  const Outcome r = run(kRun + "--out " + path("a"), "OMPI_COMM_WORLD_SIZE=2 ");
  expect_error(r, "this ffnlab was built without MPI: each would train alone");
#endif
}

}  // namespace
}  // namespace ffnlab::test

namespace ffnlab::test {

// Ctrl-C or SIGTERM to mpirun: mpirun stops reading the ranks' output at once and ends them with
// SIGTERM, then SIGKILL a second later. The ranks must still stop at a step with its checkpoint
// (they used to block on a full output pipe and die with nothing written), and the run must
// continue from it.
TEST_F(Distributed, InterruptingMpirunKeepsTheStepItStoppedAt) {
  std::ofstream(path("text")) << std::string(4000, 'a') + "Q: Why? A: Because.\n%\n";
  for (const int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig == SIGINT ? "SIGINT" : "SIGTERM");
    const std::string out = path(sig == SIGINT ? "int" : "term");
    const std::string command =
        "exec env " + kMpirun + "-np 2 " + FFNLAB_BIN + " train --data " + path("text") +
        " --d-model 16 --layers 1 --heads 2 --seq 16 --batch 4 --threads 1 --sample 0 "
        "--eval-every 0 --steps 100000 --out " +
        out + " > " + path("mpirun.out") + " 2> " + path("mpirun.err");
    std::vector<std::string> argv_s = {"/bin/sh", "-c", command};
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    ASSERT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, argv.data(), environ), 0);
    const auto t0 = std::chrono::steady_clock::now();
    auto rows = [&] {
      std::ifstream in(out + "/train_log.csv");
      return std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n');
    };
    while (rows() < 50 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_GE(rows(), 50) << read(path("mpirun.err"));
    ::kill(pid, sig);
    int raw = 0;
    ASSERT_TRUE(wait_or_kill(pid, raw, std::chrono::seconds(60)))
        << "mpirun did not end within 60 s of the signal";
    const std::string err = read(path("mpirun.err"));
    ASSERT_TRUE(fs::exists(out + "/checkpoint/checkpoint.json")) << err;
    const auto info = nlohmann::json::parse(read(out + "/checkpoint/checkpoint.json"));
    const std::int64_t step = info["step"];
    EXPECT_GT(step, 0);
    EXPECT_LT(step, 100000);
    EXPECT_EQ(rows(), step + 1) << "every step done is logged, and the checkpoint is the last";
    EXPECT_NE(err.find("checkpoint written to"), std::string::npos) << err;
    const Outcome more =
        run("train --resume " + out + " --steps " + std::to_string(step + 5) + " --threads 1");
    EXPECT_EQ(more.status, 0) << more.err;
  }
}

}  // namespace ffnlab::test

namespace ffnlab::test {
namespace {

// The study over ranks, two sizes and two tasks: rank 0 hands the LM runs out to every rank (a
// work queue) and writes the one report; results.json is the one process's apart from timings
// and the rank count.
TEST_F(Distributed, EvolveOverRanksMatchesOneProcess) {
  const std::string study =
      "evolve --quick --threads 1 --variants relu,swiglu,moe --sizes xs,s --tasks causal,masked ";
  const Outcome one = run(study + "--out " + path("one"));
  ASSERT_EQ(one.status, 0) << one.err;
  std::ifstream in_one(path("one") + "/results.json");
  const nlohmann::json alone = nlohmann::json::parse(in_one);
  EXPECT_EQ(alone.at("ranks"), 1);
  EXPECT_EQ(alone.at("scaling").at("cells").size(), 2u) << "two sizes, each with two tasks";
  for (int n : {2, 3}) {
    const std::string out = path("np" + std::to_string(n));
    const Outcome many = run(study + "--out " + out, kMpirun + "-np " + std::to_string(n) + " ");
    ASSERT_EQ(many.status, 0) << many.err << many.out;
    for (int r = 1; r < n; ++r)
      EXPECT_NE(many.out.find("(rank " + std::to_string(r) + ")"), std::string::npos)
          << "rank " << r << " trains runs\n"
          << many.out;
    std::size_t headers = 0;
    for (std::size_t at = many.out.find("ffnlab evolve: "); at != std::string::npos;
         at = many.out.find("ffnlab evolve: ", at + 1))
      ++headers;
    EXPECT_EQ(headers, 1u) << "one progress display, rank 0's";
    std::ifstream in(out + "/results.json");
    const nlohmann::json together = nlohmann::json::parse(in);
    EXPECT_EQ(together.at("ranks"), n);
    EXPECT_EQ(without_timings(together), without_timings(alone)) << n << " ranks";
    EXPECT_NE(read(out + "/REPORT.md").find(std::to_string(n) + " MPI ranks"), std::string::npos);
  }
}

// The pid of the process of the MPI job with rank `rank` whose command line holds `marker`
// (its environment says its rank), or -1.
pid_t rank_pid(int rank, const std::string& marker) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmd(e.path() / "cmdline"), env(e.path() / "environ");
    const std::string c((std::istreambuf_iterator<char>(cmd)), {});
    const std::string v((std::istreambuf_iterator<char>(env)), {});
    if (c.find(marker) == std::string::npos || c.find("mpirun") != std::string::npos) continue;
    if (v.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(rank) + '\0') !=
        std::string::npos)
      return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

// A rank that stops answering while the study trains (SIGSTOP): rank 0 ends the job after
// --dist-timeout with a message naming the rank and its run, and writes no report.
// A rank that reads other data than rank 0 fails the first run it is given; rank 0 ends the study
// with that rank's error as its own kind (refused input: exit 1), naming the rank and the run,
// and writes no report.
TEST_F(Distributed, EvolveEndsWithARanksFailureAsItsKind) {
  {
    std::ofstream other(path("other.txt"));
    for (int i = 0; i < 3000; ++i) other << "Line " << i << " of a corpus only rank 1 reads.\n";
  }
  const std::string study = " evolve --quick --threads 1 --variants relu,moe ";
  const Outcome r = run(study + "--out " + path("a") + " : -np 1 " + FFNLAB_BIN + study +
                            "--data " + path("other.txt") + " --out " + path("b"),
                        kMpirun + "-np 1 ");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("[evolve] rank 1 failed in the run '"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 reads other data than rank 0"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("a") + "/REPORT.md"));
}

TEST_F(Distributed, EvolveEndsWhenARankHangsNamingItsRun) {
  const std::string out = path("hung");
  const std::string command = kMpirun + "-np 2 " + FFNLAB_BIN +
                              " evolve --quick --threads 1 --variants relu,moe --dist-timeout 3 "
                              "--out " +
                              out + " > " + path("mpi.out") + " 2> " + path("mpi.err");
  const pid_t job = fork();
  if (job == 0) {
    setpgid(0, 0);  // mpirun and its ranks in a group of their own, so that the test can end them
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(job, 0);
  // Once the training has begun, rank 1 stops (as a hung process would).
  const auto t0 = std::chrono::steady_clock::now();
  pid_t worker = -1;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120)) {
    if (read(path("mpi.out")).find("== training") != std::string::npos &&
        (worker = rank_pid(1, out)) > 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(worker, 0) << read(path("mpi.err"));
  ::kill(worker, SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  int raw = 0;
  bool ended = false;
  while (!ended && std::chrono::steady_clock::now() - stopped < std::chrono::seconds(120)) {
    ended = ::waitpid(job, &raw, WNOHANG) == job;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  ::kill(-job, SIGKILL);  // whatever is left of the job (the stopped rank, if the job left it)
  ::kill(worker, SIGKILL);
  if (!ended) ::waitpid(job, &raw, 0);
  ASSERT_TRUE(ended) << "the job did not end within 120 s of the rank's stop";
  EXPECT_LT(seconds, 60);
  EXPECT_FALSE(WIFEXITED(raw) && WEXITSTATUS(raw) == 0);
  const std::string err = read(path("mpi.err"));
  // Stopped while training, or before it took its next run: either way the run is named.
  const bool named =
      err.find("rank 1 has said nothing for 3 s while training the run '") != std::string::npos ||
      err.find("rank 1 did not take the run '") != std::string::npos;
  EXPECT_TRUE(named) << err;
  EXPECT_FALSE(fs::exists(out + "/REPORT.md"));
}

}  // namespace
}  // namespace ffnlab::test
