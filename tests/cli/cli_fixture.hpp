// The fixture of the command-line tests: runs the ffnlab program in a fresh folder per test and
// captures its exit status, stdout and stderr.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ffnlab::test {

namespace fs = std::filesystem;

// The study's results.json without what a run measures in time (speeds, tokens/s, FLOP
// utilisation, the stages' seconds, the machine) and without how it was run (threads, ranks):
// what must not depend on where or how the study's runs trained.
inline nlohmann::json without_timings(nlohmann::json j) {
  static const std::set<std::string> timed = {
      "seconds",
      "stage_seconds",
      "machine",
      "threads",
      "ranks",
      "speed",  // the run's
      "tokens_per_second",
      "median_tokens_per_second",
      "tokens_per_second_spread",
      "tokens_per_second_noisy",
      "tokens_per_second_over_relu",
      "tokens_per_second_over_topk",
      "model_flop_utilisation",
      "best_per_second"};  // measured per run, or read from those
  if (j.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!timed.contains(it.key())) out[it.key()] = without_timings(it.value());
    return out;
  }
  if (j.is_array())
    for (auto& x : j) x = without_timings(x);
  return j;
}

// Programs started in the background, for tests that signal them at a stated moment.
// A started program: its pid, and its stdout/stderr files.
struct Started {
  pid_t pid = -1;
  fs::path out, err;
};

// Starts ffnlab with args and extra environment entries ("KEY=value"); in its own process
// group when `own_group` (so that a signal to the group reaches it and its children, as Ctrl-C
// in a terminal does).
inline Started start(const std::vector<std::string>& args, const fs::path& dir,
                     const std::vector<std::string>& env_extra, bool own_group) {
  Started s{-1, dir / "spawn.out", dir / "spawn.err"};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, s.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, s.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (own_group) {
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  }
  std::vector<std::string> argv_s = {FFNLAB_BIN};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  for (const auto& e : env_extra) {
    const std::string key = e.substr(0, e.find('=') + 1);
    std::erase_if(env_s, [&](const std::string& x) { return x.rfind(key, 0) == 0; });
    env_s.push_back(e);
  }
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  if (posix_spawn(&s.pid, FFNLAB_BIN, &actions, &attr, argv.data(), envp.data()) != 0) s.pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  return s;
}

// The exit status of a started program (-signal when a signal ended it), waiting at most 120 s.
inline int finish(const Started& s) {
  const auto t0 = std::chrono::steady_clock::now();
  int raw = 0;
  while (::waitpid(s.pid, &raw, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(120)) {
      ::kill(s.pid, SIGKILL);
      ::waitpid(s.pid, &raw, 0);
      return -1000;  // did not end
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -WTERMSIG(raw);
}

struct Outcome {
  int status;
  std::string out, err;
};

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    // Per process too: two checkouts' suites on one machine must not share a folder.
    dir_ = fs::temp_directory_path() /
           ("ffnlab_cli_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `ffnlab args`; `prefix` goes before it in the shell command (limits, environment).
  Outcome run(const std::string& args, const std::string& prefix = "") {
    return run_command(prefix + std::string(FFNLAB_BIN) + " " + args);
  }
  // Any command line, its output captured as run()'s.
  Outcome run_command(const std::string& command) {
    const std::string out = (dir_ / "stdout").string(), err = (dir_ / "stderr").string();
    const std::string cmd = command + " > " + out + " 2> " + err;
    const int raw = std::system(cmd.c_str());
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, read(out), read(err)};
  }
  static std::string read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string golden(const std::string& c, const std::string& f) {
    return (fs::path(FFNLAB_GOLDEN_DIR) / c / f).string();
  }
  // A failed run: exit `status`, one line on stderr starting `prefix` and containing `what`.
  void expect_failure(const Outcome& r, int status, const std::string& prefix,
                      const std::string& what) {
    EXPECT_EQ(r.status, status) << r.err;
    EXPECT_EQ(r.err.rfind(prefix, 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  }
  // Bad input (exit 1) and a bad flag (exit 2); docs/hardening.md, "Exit status".
  void expect_error(const Outcome& r, const std::string& what) {
    expect_failure(r, 1, "ffnlab: error: ", what);
  }
  void expect_usage_error(const Outcome& r, const std::string& what) {
    expect_failure(r, 2, "ffnlab: usage error: ", what);
  }
  fs::path dir_;
};

}  // namespace ffnlab::test
