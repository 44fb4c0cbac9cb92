// The report layer: Markdown tables, gnuplot figures, and the staged report directory that
// replaces the old one atomically.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../common/test_util.hpp"
#include "ffnlab/report/figure.hpp"
#include "ffnlab/report/markdown.hpp"
#include "ffnlab/report/staged_dir.hpp"

using namespace ffnlab;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("ffnlab_report_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

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

TEST(StagedDirectory, ReplacesTheOldDirectoryWholeOnlyOnCommit) {
  const fs::path root = fresh_dir("staged");
  const fs::path final_dir = root / "report";
  fs::create_directories(final_dir);
  std::ofstream(final_dir / "old.txt") << "old";
  std::ofstream(final_dir / kReportMarker) << "";  // an earlier report
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
  fs::remove_all(root);
}

TEST(Figure, RendersAPngOrNamesGnuplotsError) {
  // A dependency scripts/install-deps.sh installs: its absence is a failure, not a skip.
  ASSERT_TRUE(gnuplot_available()) << "gnuplot is not on the PATH";
  const fs::path dir = fresh_dir("figure");
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
  fs::remove_all(dir);
}
