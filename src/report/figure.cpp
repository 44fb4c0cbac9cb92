// gnuplot figures.
#include "ffnlab/report/figure.hpp"

#include <sys/wait.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "check.hpp"
#include "ffnlab/io/files.hpp"
#include "ffnlab/io/process.hpp"

namespace ffnlab {

namespace fs = std::filesystem;

namespace {

// A figure that gnuplot could not write may be the disk's fault, not the script's: a small
// write into the folder tells (SystemError "[io] ...: No space left on device" if it fails).
void check_folder_writable(const fs::path& dir) {
  const std::string probe = (dir / ".write-check").string(), text = "ffnlab\n";
  write_file_atomic(probe, text.data(), text.size());
  std::error_code ec;
  fs::remove(probe, ec);
}

}  // namespace

bool gnuplot_available() {
  return program_on_path("gnuplot");
}

void render_figure(const std::string& dir, const std::string& name, const std::string& script) {
  const fs::path gp = fs::path(dir) / (name + ".gp"), png = fs::path(dir) / (name + ".png"),
                 log = fs::path(dir) / (name + ".log");
  write_file_atomic(gp.string(), script.data(), script.size());
  // No shell: an interrupt while gnuplot runs reaches this process (the wait watches it).
  ChildOptions options;
  options.dir = dir;
  options.output_file = log.string();
  ChildProcess gnuplot({"gnuplot", name + ".gp"}, options);
  const int status = gnuplot.wait(std::chrono::minutes(5));
  std::string first_error;
  {
    std::ifstream in(log);
    std::string line;
    while (std::getline(in, line))
      if (first_error.empty() && line.find_first_not_of(" ^") != std::string::npos &&
          line.find("line") != std::string::npos)
        first_error = line;
  }
  std::error_code ec;
  const bool written = fs::exists(png, ec) && fs::file_size(png, ec) > 0;
  if (status != 0 || !written) check_folder_writable(dir);
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ)
    fail_errno(EFBIG, "[figure] {}: gnuplot passed the file-size limit (writing {} or its log)",
               name, png.string());
  check(status == 0, "[figure] {}: gnuplot failed ({})", name,
        first_error.empty() ? describe_status(status) : first_error);
  check(written, "[figure] {}: gnuplot wrote no {}", name, png.string());
  fs::remove(log, ec);
}

}  // namespace ffnlab
