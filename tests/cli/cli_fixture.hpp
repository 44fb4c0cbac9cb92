// The fixture of the command-line tests: runs the ffnlab program in a fresh folder per test and
// captures its exit status, stdout and stderr.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ffnlab::test {

namespace fs = std::filesystem;

struct Outcome {
  int status;
  std::string out, err;
};

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ffnlab_cli_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `ffnlab args`; `prefix` goes before it in the shell command (limits, environment).
  Outcome run(const std::string& args, const std::string& prefix = "") {
    const std::string out = (dir_ / "stdout").string(), err = (dir_ / "stderr").string();
    const std::string cmd =
        prefix + std::string(FFNLAB_BIN) + " " + args + " > " + out + " 2> " + err;
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
