// The report layer: Markdown tables, gnuplot figures, and the staged report directory that
// replaces the old one atomically.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "../common/test_util.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/report/figure.hpp"
#include "ffnlab/report/markdown.hpp"
#include "ffnlab/report/staged_dir.hpp"

using namespace ffnlab;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST(Markdown, TablesAlignAndCheckTheirShape) {
  EXPECT_EQ(markdown_table({"a", "b"}, {{"x", "1"}, {"y", "22"}}, "lr"),
            "| a | b |\n|---|---:|\n| x | 1 |\n| y | 22 |\n");
  EXPECT_THROW(markdown_table({"a", "b"}, {{"x"}}, "lr"), Error);
  EXPECT_THROW(markdown_table({"a", "b"}, {}, "l"), Error);
}

// A run's length reads as a length, never as a time of day ("19:15").
TEST(Markdown, ACountTakesItsNounSingularOnlyForOne) {
  EXPECT_EQ(counted(1, "seed"), "1 seed");
  EXPECT_EQ(counted(0, "file"), "0 files");
  EXPECT_EQ(counted(2048, "thread"), "2,048 threads");
}

TEST(Markdown, ElapsedTimeInWords) {
  EXPECT_EQ(elapsed(42.7), "42 s");
  EXPECT_EQ(elapsed(19 * 60 + 15.2), "19 min 15 s");
  EXPECT_EQ(elapsed(3600 + 2 * 60 + 5), "1 h 02 min");
  EXPECT_EQ(duration(19 * 60 + 15), "19:15");  // the progress bar's ETA clock
}

TEST(StagedDirectory, ReplacesTheOldDirectoryWholeOnlyOnCommit) {
  const test::ScratchDir scratch_root("staged");
  const fs::path& root = scratch_root.path;
  const fs::path final_dir = root / "report";
  fs::create_directories(final_dir);
  std::ofstream(final_dir / "old.txt") << "old";
  std::ofstream(final_dir / kReportMarker) << kReportMarkerText;  // an earlier report
  {
    StagedDirectory s(final_dir.string());
    std::ofstream(fs::path(s.path()) / "new.txt") << "new";
    EXPECT_TRUE(fs::exists(final_dir / "old.txt"));  // nothing visible before commit
  }  // destroyed without commit: the staging folder goes, the old report stays
  EXPECT_TRUE(fs::exists(final_dir / "old.txt"));
  EXPECT_FALSE(fs::exists(final_dir / "new.txt"));
  {
    StagedDirectory s(final_dir.string());
    std::ofstream(fs::path(s.path()) / "new.txt") << "new";
    s.commit();
  }
  EXPECT_FALSE(fs::exists(final_dir / "old.txt"));
  EXPECT_EQ(slurp(final_dir / "new.txt"), "new");
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(root)) ++entries;
  EXPECT_EQ(entries, 1u) << "no staging or old directory left beside the report";
  // A directory that does not exist yet is created by the commit.
  {
    StagedDirectory s((root / "fresh").string());
    s.commit();
  }
  EXPECT_TRUE(fs::is_directory(root / "fresh"));
}

// The place checked is the place replaced: "precious/lnk/.." where lnk leads into a report is
// that report's folder, never "precious" (which a lexical reading of the name would give).
TEST(StagedDirectory, ReplacesThePlaceItCheckedWhateverTheNameWentThrough) {
  const test::ScratchDir scratch_root("through_link");
  const fs::path& root = scratch_root.path;
  fs::create_directories(root / "reports/r1/figures");
  std::ofstream(root / "reports/r1" / kReportMarker) << kReportMarkerText;
  std::ofstream(root / "reports/r1/old.txt") << "old";
  fs::create_directories(root / "precious");
  std::ofstream(root / "precious/mine.txt") << "mine";
  fs::create_directory_symlink(root / "reports/r1/figures", root / "precious/lnk");
  {
    StagedDirectory s((root / "precious/lnk/..").string());
    std::ofstream(fs::path(s.path()) / "new.txt") << "new";
    s.commit();
  }
  EXPECT_EQ(slurp(root / "precious/mine.txt"), "mine");
  EXPECT_EQ(slurp(root / "reports/r1/new.txt"), "new");
  EXPECT_FALSE(fs::exists(root / "reports/r1/old.txt"));
  // A marker that is a link or says something else does not make a folder a report.
  fs::create_directories(root / "user");
  std::ofstream(root / "user/data.txt") << "data";
  fs::create_symlink(root / "reports/r1" / kReportMarker, root / "user" / kReportMarker);
  EXPECT_THROW(StagedDirectory((root / "user").string()), Error);
  fs::remove(root / "user" / kReportMarker);
  std::ofstream(root / "user" / kReportMarker) << "something else";
  EXPECT_THROW(StagedDirectory((root / "user").string()), Error);
  EXPECT_EQ(slurp(root / "user/data.txt"), "data");
}

// A folder that was empty at the start and holds the user's files at the end is not replaced:
// the commit refuses and keeps the new report under its staging name.
TEST(StagedDirectory, AFolderThatChangedDuringTheRunIsNotReplaced) {
  const test::ScratchDir scratch_root("changed");
  const fs::path& root = scratch_root.path;
  fs::create_directories(root / "out");
  std::string staging;
  {
    StagedDirectory s((root / "out").string());
    staging = s.path();
    std::ofstream(fs::path(s.path()) / "new.txt") << "new";
    std::ofstream(root / "out/user.txt") << "written during the run";
    const std::string e = test::error_of([&] { s.commit(); });
    EXPECT_NE(e.find("changed during the run"), std::string::npos) << e;
    EXPECT_NE(e.find(staging), std::string::npos) << e;
  }
  EXPECT_EQ(slurp(root / "out/user.txt"), "written during the run");
  EXPECT_EQ(slurp(fs::path(staging) / "new.txt"), "new") << "the new report was kept";
  // And one created where there was nothing, likewise.
  {
    StagedDirectory s((root / "later").string());
    fs::create_directories(root / "later");
    std::ofstream(root / "later/user.txt") << "mine";
    EXPECT_THROW(s.commit(), Error);
  }
  EXPECT_EQ(slurp(root / "later/user.txt"), "mine");
}

TEST(Figure, RendersAPngOrNamesGnuplotsError) {
  // A dependency scripts/install-deps.sh installs: its absence is a failure, not a skip.
  ASSERT_TRUE(gnuplot_available()) << "gnuplot is not on the PATH";
  const test::ScratchDir scratch_dir("figure");
  const fs::path& dir = scratch_dir.path;
  std::ofstream(dir / "data.csv") << "x,y\n0,1\n1,3\n2,2\n";
  render_figure(dir.string(), "ok",
                "set terminal pngcairo size 300,200\nset output 'ok.png'\n"
                "set datafile separator ','\nplot 'data.csv' every ::1 using 1:2 with lines\n");
  EXPECT_GT(fs::file_size(dir / "ok.png"), 500u);
  const std::string err = test::error_of([&] {
    render_figure(dir.string(), "bad",
                  "set terminal pngcairo\nset output 'bad.png'\nplot 'data.csv' using (\n");
  });
  EXPECT_NE(err.find("[figure] bad: gnuplot failed"), std::string::npos) << err;
}

// Past a file-size limit gnuplot is ended by SIGXFSZ (the program itself ignores it, but a child
// starts with the default), and the figure fails as the system's error with EFBIG, not with a
// cut-off PNG taken as written. In a child process, which the limit binds alone.
TEST(Figure, AFileSizeLimitFailsTheFigureWithEFBIG) {
  ASSERT_TRUE(gnuplot_available()) << "gnuplot is not on the PATH";
  const test::ScratchDir scratch_dir("figure-limit");
  const fs::path& dir = scratch_dir.path;
  std::ofstream(dir / "data.csv") << "x,y\n0,1\n1,3\n2,2\n";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const rlimit limit{1024, 1024};  // bytes: the script fits, a PNG does not
    std::signal(SIGXFSZ, SIG_IGN);   // as the program (run_program)
    int code = 1;
    try {
      if (::setrlimit(RLIMIT_FSIZE, &limit) == 0)
        render_figure(dir.string(), "big",
                      "set terminal pngcairo size 300,200\nset output 'big.png'\n"
                      "set datafile separator ','\nplot 'data.csv' every ::1 using 1:2 with "
                      "lines\n");
      code = 2;  // no error
    } catch (const SystemError& e) {
      code = e.error_number() == EFBIG ? 0 : 3;
    } catch (...) {
      code = 4;
    }
    ::_exit(code);
  }
  int raw = 0;
  ASSERT_TRUE(test::wait_or_kill(child, raw, std::chrono::seconds(120)))
      << "the child did not end within 120 s";
  ASSERT_TRUE(WIFEXITED(raw)) << raw;
  EXPECT_EQ(WEXITSTATUS(raw), 0) << "1: no limit, 2: no error, 3: another errno, 4: another error";
}
