// Hostile use of the surfaces beyond one layer: evolve's output folder, signals while a child
// process runs, bench's PyTorch child, resuming as printed, and the program's messages and exit
// statuses. Each case runs the real program; the signal cases interrupt it at a stated moment
// (a stand-in child that says when it has started).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_fixture.hpp"
#include "ffnlab/report/staged_dir.hpp"

namespace ffnlab::test {

namespace {

using clock_type = std::chrono::steady_clock;

std::string corpus_text(int lines) {
  std::string s;
  for (int i = 0; i < lines; ++i)
    s += "Q: Why did the chicken cross the road?\nA: To get to the other side.\n%\n";
  return s;
}

// An executable script at path.
void write_script(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
  fs::permissions(path, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
}

bool process_exists(pid_t pid) {
  return pid > 0 && ::kill(pid, 0) == 0;
}

// The pid a stand-in child wrote into `file`, once it has (or -1 after 60 s).
pid_t wait_for_pid_file(const fs::path& file) {
  const auto t0 = clock_type::now();
  while (clock_type::now() - t0 < std::chrono::seconds(60)) {
    std::ifstream in(file);
    long pid = 0;
    if (in >> pid && pid > 0) return static_cast<pid_t>(pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

// The shell's exit status of `command` (stdout and stderr as the command line redirects them).
int shell(const std::string& command) {
  const int raw = std::system(command.c_str());
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

}  // namespace

class HostileSurfaces : public Cli {
 protected:
  void write(const std::string& name, const std::string& text) {
    fs::create_directories(fs::path(path(name)).parent_path());
    std::ofstream(path(name), std::ios::binary) << text;
  }
  // The smallest evolve: it reaches its figures in seconds.
  std::vector<std::string> small_evolve(const std::string& out) {
    return {"evolve", "--quick",   "--variants", "relu",   "--seeds",          "1",     "--steps",
            "2",      "--threads", "1",          "--data", path("corpus.txt"), "--out", out};
  }
};

// --- evolve's output folder: only a report is ever replaced ------------------------------------

TEST_F(HostileSurfaces, EvolveReplacesOnlyAnEarlierReportAndRefusesBeforeAnyWork) {
  write("corpus/a.txt", corpus_text(400));
  write("precious/sub/keep.txt", "mine\n");
  write("precious/notes.txt", "also mine\n");
  write("full/thing.txt", "not a report\n");
  // A run store that keeps a finished run (marked, one record): without --resume or --force
  // the study would discard it.
  write("kept.runs/.ffnlab-runs", "ffnlab evolve's finished runs, one file each\n");
  write("kept.runs/0123abcd.cbor", "a finished run\n");
  const std::string quick = "evolve --quick --threads 1 ";
  struct Refusal {
    std::string args, what;
    bool usage = false;  // a usage error (exit 2), not an error (exit 1)
  };
  const std::vector<Refusal> refusals = {
      {"--data " + path("corpus") + " --out " + path("corpus"), "is the input"},
      {"--data " + path("corpus") + " --out " + path("corpus/inside"), "lies inside the input"},
      {"--data " + path("corpus/a.txt") + " --out " + path("corpus"), "contains the input"},
      {"--data " + path("corpus") + " --out " + path("precious/sub/.."), "not an earlier ffnlab"},
      {"--data " + path("corpus") + " --out " + path("full"), "not an earlier ffnlab report"},
      {"--data " + path("corpus") + " --out .", "current directory"},
      {"--data " + path("corpus") + " --out " + dir_.parent_path().string(), "current directory"},
      {"--data " + path("corpus") + " --out /", "root folder"},
      {"--data " + path("corpus") + " --out /proc", "mount point"},
      {"--data " + path("corpus") + " --out " + path("kept"),
       "keeps 1 finished run of an earlier study: --resume takes", true},
  };
  for (const auto& c : refusals) {
    SCOPED_TRACE(c.args);
    const auto t0 = clock_type::now();
    // cd into the test folder, so that "." is a folder of ours.
    const Outcome r = run(quick + c.args, "cd " + dir_.string() + " && ");
    const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (c.usage)
      expect_usage_error(r, c.what);
    else
      expect_error(r, c.what);
    EXPECT_LT(seconds, 5.0) << "refused only after work";
    EXPECT_EQ(r.out.find("== "), std::string::npos) << "a stage ran: " << r.out;
  }
  // Nothing of the user's was touched, and no staging folder was left.
  EXPECT_EQ(read(path("precious/sub/keep.txt")), "mine\n");
  EXPECT_EQ(read(path("precious/notes.txt")), "also mine\n");
  EXPECT_EQ(read(path("full/thing.txt")), "not a report\n");
  EXPECT_EQ(read(path("kept.runs/0123abcd.cbor")), "a finished run\n");
  EXPECT_EQ(read(path("corpus/a.txt")), corpus_text(400));
  for (const auto& e : fs::recursive_directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".partial-"), std::string::npos) << e.path();
}

TEST_F(HostileSurfaces, OutputsThatNameAnInputAreRefused) {
  write("corpus/a.txt", corpus_text(400));
  // train: logs written into the corpus folder would become part of the corpus.
  expect_usage_error(run("train --data " + path("corpus") + " --out " + path("corpus/run") +
                         " --steps 1 --d-model 16 --layers 1 --heads 2 --seq 16 --batch 2"),
                     "lies inside the --data");
  EXPECT_FALSE(fs::exists(path("corpus/run")));
  // run: an output file that is an input file would replace it.
  const std::string config = golden("glu_separate_bias", "config.json");
  ASSERT_TRUE(fs::exists(config)) << config;
  fs::copy_file(golden("glu_separate_bias", "x.safetensors"), path("x.safetensors"));
  const std::string before = read(path("x.safetensors"));
  expect_usage_error(run("run --config " + config + " --weights " +
                         golden("glu_separate_bias", "weights.safetensors") + " --input " +
                         path("x.safetensors") + " --output " + path("x.safetensors")),
                     "--output '" + path("x.safetensors") + "' is the --input file");
  EXPECT_EQ(read(path("x.safetensors")), before);
}

// --- signals while a child runs -------------------------------------------------------------

// SIGINT or SIGTERM to evolve, or Ctrl-C to its process group, while gnuplot draws: exit 130,
// the old report untouched, the staging folder removed, and gnuplot ended.
TEST_F(HostileSurfaces, EvolveStopsWhenInterruptedWhileGnuplotRuns) {
#ifdef FFNLAB_SANITIZED
  GTEST_SKIP() << "the study's stages take minutes under the sanitizers; the release suite runs it";
#endif
  write("corpus.txt", corpus_text(1500));
  // A gnuplot that says it started and then takes its time.
  write_script(dir_ / "bin/gnuplot", "#!/bin/sh\necho $$ > \"$FAKE_GNUPLOT_PID\"\nexec sleep 60\n");
  const std::string path_env = "PATH=" + (dir_ / "bin").string() + ":" + std::getenv("PATH");
  struct Mode {
    const char* name;
    int sig;
    bool group;
  };
  for (const Mode m : {Mode{"SIGINT", SIGINT, false}, Mode{"SIGTERM", SIGTERM, false},
                       Mode{"Ctrl-C to the group", SIGINT, true}}) {
    SCOPED_TRACE(m.name);
    const fs::path report = dir_ / "report";
    fs::create_directories(report);
    std::ofstream(report / "REPORT.md") << "the old report\n";
    std::ofstream(report / ".ffnlab-report") << kReportMarkerText;
    const fs::path pid_file = dir_ / "gnuplot.pid";
    fs::remove(pid_file);
    // --resume: each mode's study takes the runs the one before kept in report.runs.
    std::vector<std::string> args = small_evolve(report.string());
    args.emplace_back("--resume");
    const Started s =
        start(args, dir_, {path_env, "FAKE_GNUPLOT_PID=" + pid_file.string()}, m.group);
    ASSERT_GT(s.pid, 0);
    const pid_t gnuplot = wait_for_pid_file(pid_file);
    ASSERT_GT(gnuplot, 0) << read(s.err);
    const auto t0 = clock_type::now();
    ::kill(m.group ? -s.pid : s.pid, m.sig);
    const int status = finish(s);
    const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
    const std::string err = read(s.err);
    EXPECT_EQ(status, 130) << err;
    EXPECT_NE(err.find("ffnlab: interrupted: "), std::string::npos) << err;
    EXPECT_LT(seconds, 10.0) << "the interrupt waited for gnuplot";
    EXPECT_EQ(read(report / "REPORT.md"), "the old report\n");
    EXPECT_FALSE(process_exists(gnuplot)) << "gnuplot outlived evolve";
    for (const auto& e : fs::directory_iterator(dir_))
      EXPECT_EQ(e.path().filename().string().find(".partial-"), std::string::npos) << e.path();
  }
}

// --- bench's PyTorch child ----------------------------------------------------------------------

namespace {
const std::string kBench =
    "bench --quick --variants relu --dtypes f32 --tokens 1 --no-decode --budget 0.002 "
    "--bandwidth-mib 32 --rounds 1 --threads 1 ";
}  // namespace

TEST_F(HostileSurfaces, BenchOutlivesABrokenPyTorchSideAndEndsIt) {
  struct Broken {
    const char* name;
    std::string script, what;
    int timeout = 10;  // seconds: room for Python to start on a loaded machine
  };
  const std::string pid_line =
      "import os, sys, time, json\nopen(sys.argv[0] + '.pid', 'w')"
      ".write(str(os.getpid()))\n";
  const std::string hello =
      "print(json.dumps({'ready': True, 'torch': 'fake', 'threads': 1}), flush=True)\n";
  const std::vector<Broken> cases = {
      {"silent", pid_line + "time.sleep(600)\n", "no reply within 1 s", 1},
      {"endless", pid_line + "while True:\n    sys.stdout.write('x' * 65536)\n",
       "a reply line longer than 1048576 bytes"},
      {"mute", pid_line + hello + "sys.stdin.readline()\ntime.sleep(600)\n", "no reply within 3 s",
       3},
      {"typed",
       pid_line + hello +
           "for line in sys.stdin:\n    print(json.dumps({'seconds': "
           "'fast'}), flush=True)\n",
       "'seconds' is not a positive finite number"},
      {"bad hello", pid_line + "print(json.dumps({'ready': 'yes'}), flush=True)\ntime.sleep(600)\n",
       "no boolean 'ready'"},
      {"exits", pid_line + hello + "sys.exit(3)\n", "stopped answering (exit status 3)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path script = dir_ / (std::string("torch_") + c.name[0] + ".py");
    write_script(script, c.script);
    const auto t0 = clock_type::now();
    // 1 GiB of address space (outside sanitizer builds, whose shadow memory needs terabytes of
    // it): an endless reply line must not grow without bound.
#ifdef FFNLAB_SANITIZED
    const std::string limits = "timeout 200 ";
#else
    const std::string limits = "ulimit -v 1048576; timeout 100 ";
#endif
    const Outcome r = run(kBench + "--torch-timeout " + std::to_string(c.timeout) +
                              " --torch-script " + script.string(),
                          limits);
    const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE((r.out + r.err).find(c.what), std::string::npos) << r.out << r.err;
    EXPECT_NE((r.out + r.err).find("[bench] " + script.string()), std::string::npos)
        << "the message names the script: " << r.out << r.err;
    EXPECT_LT(seconds, 60.0);
    const pid_t child = wait_for_pid_file(script.string() + ".pid");
    ASSERT_GT(child, 0) << "the script never started";
    EXPECT_FALSE(process_exists(child)) << "the PyTorch side outlived bench";
  }
  // --check-torch whose PyTorch left during the tables fails at the end: its check cannot run.
  const fs::path mute = dir_ / "torch_mute_check.py";
  write_script(mute, pid_line + hello + "sys.stdin.readline()\ntime.sleep(600)\n");
  const Outcome check = run(
      kBench + "--torch-timeout 3 --check-torch --torch-script " + mute.string(), "timeout 100 ");
  EXPECT_EQ(check.status, 1) << check.err;
  EXPECT_NE(check.err.find("--check-torch: PyTorch left during the tables"), std::string::npos)
      << check.err;
  const pid_t child = wait_for_pid_file(mute.string() + ".pid");
  ASSERT_GT(child, 0);
  EXPECT_FALSE(process_exists(child)) << "the PyTorch side outlived bench";
}

TEST_F(HostileSurfaces, BenchInterruptedWhileWaitingForPyTorchEndsBoth) {
  const fs::path script = dir_ / "torch_slow.py";
  write_script(script,
               "import os, sys, time, json\n"
               "print(json.dumps({'ready': True, 'torch': 'fake', 'threads': 1}), flush=True)\n"
               "sys.stdin.readline()\n"
               "open(sys.argv[0] + '.pid', 'w').write(str(os.getpid()))\n"
               "time.sleep(600)\n");
  std::vector<std::string> args;
  std::stringstream words(kBench + "--torch-script " + script.string());
  for (std::string w; words >> w;) args.push_back(w);
  const Started s = start(args, dir_, {}, false);
  ASSERT_GT(s.pid, 0);
  const pid_t child = wait_for_pid_file(script.string() + ".pid");  // it holds a request
  ASSERT_GT(child, 0) << read(s.err);
  ::kill(s.pid, SIGINT);
  const int status = finish(s);
  EXPECT_EQ(status, 130) << read(s.err);
  EXPECT_FALSE(process_exists(child)) << "the PyTorch side outlived bench";
  // With --json the rows measured so far, and why it stopped, reach standard output: PyTorch
  // answers the first case's two requests (inference, forward+backward), then holds the next.
  const fs::path later = dir_ / "torch_later.py";
  write_script(later,
               "import os, sys, time, json\n"
               "print(json.dumps({'ready': True, 'torch': 'fake', 'threads': 1}), flush=True)\n"
               "for _ in range(2):\n"
               "    sys.stdin.readline()\n"
               "    print(json.dumps({'seconds': 0.001}), flush=True)\n"
               "sys.stdin.readline()\n"
               "open(sys.argv[0] + '.pid', 'w').write(str(os.getpid()))\n"
               "time.sleep(600)\n");
  std::string two_cases = kBench + "--json --torch-script " + later.string();
  two_cases.replace(two_cases.find("--tokens 1 "), 11, "--tokens 1,2 ");
  std::vector<std::string> json_args;
  std::stringstream json_words(two_cases);
  for (std::string w; json_words >> w;) json_args.push_back(w);
  const Started j = start(json_args, dir_, {}, false);
  ASSERT_GT(j.pid, 0);
  ASSERT_GT(wait_for_pid_file(later.string() + ".pid"), 0) << read(j.err);
  ::kill(j.pid, SIGINT);
  EXPECT_EQ(finish(j), 130) << read(j.err);
  const auto partial = nlohmann::json::parse(read(j.out));
  EXPECT_NE(partial.value("interrupted", "").find("SIGINT"), std::string::npos) << partial.dump();
  ASSERT_EQ(partial.at("layers").size(), 1u) << partial.dump();  // the case measured before
  EXPECT_EQ(partial["layers"][0]["tokens"], 1) << partial.dump();
}

TEST_F(HostileSurfaces, BenchRefusesWhatItCannotRun) {
  write("python-not-executable", "#!/bin/sh\n");
  const Outcome r = run(kBench + "--python " + path("python-not-executable"));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("it is not executable"), std::string::npos) << r.out;
  expect_usage_error(run("bench --variants ''"), "names no variant");
  expect_usage_error(run("bench --variants ,"), "names no variant");
  expect_usage_error(run("evolve --quick --variants relu,relu"), "'relu' is listed twice");
}

// --- resuming as printed ------------------------------------------------------------------------

TEST_F(HostileSurfaces, TheContinueCommandPrintedOnInterruptWorksAsPrinted) {
  write("corpus.txt", corpus_text(40));
  const fs::path run_dir = dir_ / "run";
  const Started s = start({"train",
                           "--data",
                           path("corpus.txt"),
                           "--d-model",
                           "16",
                           "--layers",
                           "1",
                           "--heads",
                           "2",
                           "--seq",
                           "16",
                           "--batch",
                           "2",
                           "--threads",
                           "1",
                           "--sample",
                           "0",
                           "--eval-every",
                           "0",
                           "--val-fraction",
                           "0.2",
                           "--steps",
                           "2000",
                           "--out",
                           run_dir.string()},
                          dir_, {}, false);
  ASSERT_GT(s.pid, 0);
  const auto t0 = clock_type::now();
  while (!fs::exists(run_dir / "train_log.csv") ||
         read(run_dir / "train_log.csv").find("\n3,") == std::string::npos) {
    ASSERT_LT(clock_type::now() - t0, std::chrono::seconds(60)) << read(s.err);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(s.pid, SIGINT);
  ASSERT_EQ(finish(s), 130) << read(s.err);
  const std::string err = read(s.err);
  const std::string marker = "continue with: ffnlab ";
  const auto at = err.find(marker);
  ASSERT_NE(at, std::string::npos) << err;
  const std::string printed =
      err.substr(at + marker.size(), err.find('\n', at) - at - marker.size());
  // Run it as printed, from another folder: the data, split and step count are the run's own.
  const Outcome r = run(printed, "cd / && ");
  ASSERT_EQ(r.status, 0) << printed << "\n" << r.err;
  const auto summary = nlohmann::json::parse(read(run_dir / "summary.json"));
  EXPECT_EQ(summary["steps"], 2000);
  EXPECT_EQ(summary["data"]["source"], path("corpus.txt"));
  // Model flags that agree with the checkpoint are accepted; others are refused by name.
  EXPECT_EQ(run("train --resume " + run_dir.string() +
                " --d-model 16 --layers 1 --steps 2001 "
                "--sample 0 --threads 1")
                .status,
            0);
  expect_error(run("train --resume " + run_dir.string() + " --d-model 32 --steps 2002"),
               "--d-model gives 32, the checkpoint has 16");
}

// Model flags given on resume are laid over the checkpoint's model: --d-model 18 alone matches
// a model of 3 heads, though with the default 4 heads it would not be a valid model.
TEST_F(HostileSurfaces, MatchingModelFlagsOnResumeAreJudgedWithTheCheckpointsModel) {
  write("corpus.txt", corpus_text(40));
  ASSERT_EQ(run("train --data " + path("corpus.txt") +
                " --d-model 18 --heads 3 --layers 1 --seq 16 --batch 2 --steps 2 --sample 0 "
                "--threads 1 --out " +
                path("r"))
                .status,
            0);
  const Outcome r =
      run("train --resume " + path("r") + " --d-model 18 --steps 3 --sample 0 --threads 1");
  EXPECT_EQ(r.status, 0) << r.err;
  expect_error(run("train --resume " + path("r") + " --heads 2 --steps 4"),
               "--heads gives 2, the checkpoint has 3");
}

// Data whose name is not UTF-8 trains and checkpoints (JSON keeps the name with U+FFFD in place
// of the byte), and resumes when given again; without it the resume says to give it.
TEST_F(HostileSurfaces, DataWhoseNameIsNotUtf8TrainsAndResumesWhenGiven) {
  write("d\xff.txt", corpus_text(40));
  const std::string data = path("d\xff.txt");
  const std::string flags =
      " --d-model 16 --heads 2 --layers 1 --seq 16 --batch 2 --sample 0 "
      "--threads 1 --eval-every 0";
  const Outcome first =
      run("train --data '" + data + "'" + flags + " --steps 2 --out " + path("r"));
  ASSERT_EQ(first.status, 0) << first.err;
  EXPECT_NE(read(path("r/checkpoint/checkpoint.json")).find("d\xef\xbf\xbd.txt"),
            std::string::npos);
  expect_error(run("train --resume " + path("r") + " --steps 3 --sample 0"),
               "(the data the checkpoint names: give it with --data)");
  const Outcome resumed = run("train --resume " + path("r") + " --data '" + data +
                              "' --steps 3 --sample 0 --threads 1");
  EXPECT_EQ(resumed.status, 0) << resumed.err;
}

// --- messages and exit statuses -----------------------------------------------------------------

TEST_F(HostileSurfaces, OutputThatCannotBeWrittenIsExitStatus3) {
  const std::string bin = FFNLAB_BIN;
  write("corpus.txt", corpus_text(40));
  for (const std::string& args :
       std::vector<std::string>{"params --json", "params", "zoo", "zoo --json",
                                "bench --quick --variants relu --dtypes f32 --tokens 1 "
                                "--no-decode --budget 0.002 --bandwidth-mib 16 --no-torch "
                                "--threads 1",
                                "train --data " + path("corpus.txt") +
                                    " --d-model 16 --layers 1 --heads 2 --seq 16 "
                                    "--batch 2 --steps 2 --threads 1 --out " +
                                    path("t")}) {
    SCOPED_TRACE(args);
    const int status = shell(bin + " " + args + " > /dev/full 2> " + path("err"));
    EXPECT_EQ(status, 3) << read(path("err"));
    // bench notes its progress on stderr first; the error is the last line.
    const std::string err = read(path("err"));
    const auto last = err.rfind('\n', err.size() >= 2 ? err.size() - 2 : 0);
    EXPECT_EQ(err.substr(last == std::string::npos ? 0 : last + 1).rfind("ffnlab: error: [io] ", 0),
              0u)
        << err;
  }
}

TEST_F(HostileSurfaces, MessagesAreOneScopedLineWhateverTheInput) {
  // A NUL in a key is shown, not a cut in the message.
  write("nul.json", "{\"d_mo\\u0000del\": 4, \"kind\": \"plain\"}");
  expect_error(run("params --config " + path("nul.json")), "unknown key 'd_mo\\u0000del'");
  // Numbers beyond a double are named as such.
  write("huge.json", "{\"kind\": \"plain\", \"activation\": \"silu\", \"swish_beta\": 1e400}");
  expect_error(run("params --config " + path("huge.json")), "number overflow parsing '1e400'");
  write("hf.json",
        "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 8, \"intermediate_size\": 16, "
        "\"moe_intermediate_size\": 8, \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, "
        "\"routed_scaling_factor\": 1e300}");
  expect_error(run("params --config " + path("hf.json")), "within the range of a float");
  // A value other than 0 that becomes 0 in float is refused, in ffnlab's files as in the flags.
  write("tiny.json", "{\"kind\": \"plain\", \"activation\": \"silu\", \"swish_beta\": 1e-50}");
  expect_error(run("params --config " + path("tiny.json")),
               "key 'swish_beta' must be 0 or a number that a float (from about 1.4e-45) holds as "
               "other than 0, got 1e-50");
  // Not JSON: ffnlab's words, not the parser's.
  write("nan.json", "{\"kind\": \"plain\", \"d_model\": NaN}");
  const Outcome bad = run("params --config " + path("nan.json"));
  expect_error(bad, "not valid JSON");
  EXPECT_EQ(bad.err.find("json.exception"), std::string::npos) << bad.err;
  // A loop of symbolic links in a corpus folder: named, in the data's scope.
  fs::create_directories(path("loop"));
  write("loop/a.txt", corpus_text(40));
  fs::create_symlink(path("loop/b"), path("loop/c"));
  fs::create_symlink(path("loop/c"), path("loop/b"));
  const Outcome loop = run("train --data " + path("loop") + " --steps 1 --out " + path("o"));
  expect_error(loop, "[data] ");
  EXPECT_NE(loop.err.find("symbolic links"), std::string::npos) << loop.err;
  EXPECT_EQ(loop.err.find("filesystem error"), std::string::npos) << loop.err;
}

}  // namespace ffnlab::test

namespace ffnlab::test {

// --check-torch times PyTorch again in a process of its own after the tables and says whether
// the table's PyTorch column agrees with it within 10 %, and, when not, which way: PyTorch faster
// alone means the table flatters ffnlab. Stand-in PyTorch sides: one that answers the same time in
// every process (agrees), one whose second process answers twice as slow, one twice as fast.
TEST_F(HostileSurfaces, BenchChecksItsPyTorchColumnAgainstPyTorchAlone) {
  const std::string common =
      "import os, sys, json\n"
      "print(json.dumps({'ready': True, 'torch': 'fake', 'threads': 1}), flush=True)\n"
      "n = len(os.listdir(os.environ['FAKE_TORCH_DIR']))\n"
      "open(os.path.join(os.environ['FAKE_TORCH_DIR'], str(os.getpid())), 'w').close()\n";
  const std::string answer =
      "for line in sys.stdin:\n"
      "    r = json.loads(line)\n"
      "    print(json.dumps({'freed': True} if r.get('free') else {'seconds': SECONDS}), "
      "flush=True)\n";
  struct Case {
    const char* name;
    std::string seconds;
    bool agrees;
    const char* says;  // in the text output (the percentage depends on the processes started)
  };
  for (const Case& c :
       {Case{"same", "0.01", true, "(+0 %: agree within 10 %)"},
        Case{"slower alone", "0.01 * (1 + n)", false,
             "% less time than PyTorch alone, so its 'x torch' does not flatter ffnlab"},
        Case{"faster alone", "0.01 / (1 + n)", false,
             "% longer than PyTorch alone, so the table's 'x torch' flatters ffnlab"},
        // Alone 0.907 of the table's time: the table's took 10.3 % longer, past the 10 % the
        // check allows (the verdict and the percentage are one measure).
        Case{"just past", "0.01 * (0.907 if n else 1)", false, "took 10.3 % longer"}}) {
    SCOPED_TRACE(c.name);
    std::string body = answer;
    body.replace(body.find("SECONDS"), 7, c.seconds);
    std::string name = c.name;
    std::replace(name.begin(), name.end(), ' ', '_');
    const fs::path script = dir_ / ("torch_" + name + ".py");
    write_script(script, common + body);
    // Each run counts its own processes: the table's is the first, the check's the second.
    const auto starts = [&](const std::string& tag) {
      const fs::path d = dir_ / ("starts_" + name + tag);
      fs::create_directories(d);
      return "FAKE_TORCH_DIR=" + d.string() + " ";
    };
    const Outcome text =
        run(kBench + "--check-torch --torch-script " + script.string(), starts("t"));
    ASSERT_EQ(text.status, 0) << text.err;
    EXPECT_NE(text.out.find(c.says), std::string::npos) << text.out;
    const Outcome r =
        run(kBench + "--json --check-torch --torch-script " + script.string(), starts("j"));
    ASSERT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    int checked = 0;
    for (const auto& row : j["layers"]) {
      if (!row.contains("torch_agrees")) continue;
      ++checked;
      EXPECT_EQ(row["torch_agrees"].get<bool>(), c.agrees) << row.dump();
      EXPECT_GT(row["torch_alone_forward_backward_s"].get<double>(), 0.0);
    }
    EXPECT_EQ(checked, 1) << r.out;  // relu, f32, at the one token count
  }
  expect_usage_error(run(kBench + "--check-torch --no-torch"),
                     "--check-torch: concerns PyTorch, which --no-torch leaves out");
}

}  // namespace ffnlab::test
