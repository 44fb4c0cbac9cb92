// gnuplot figures.
#include "ffnlab/report/figure.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "check.hpp"
#include "ffnlab/io/safetensors.hpp"

namespace ffnlab {

namespace fs = std::filesystem;

namespace {

// 'text' as one shell word.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

bool gnuplot_available() {
  return std::system("command -v gnuplot > /dev/null 2>&1") == 0;
}

void render_figure(const std::string& dir, const std::string& name, const std::string& script) {
  const fs::path gp = fs::path(dir) / (name + ".gp"), png = fs::path(dir) / (name + ".png"),
                 log = fs::path(dir) / (name + ".log");
  write_file_atomic(gp.string(), script.data(), script.size());
  const std::string cmd = "cd " + quoted(dir) + " && gnuplot " + quoted(name + ".gp") + " > " +
                          quoted(name + ".log") + " 2>&1";
  const int status = std::system(cmd.c_str());
  std::string first_error;
  {
    std::ifstream in(log);
    std::string line;
    while (std::getline(in, line))
      if (first_error.empty() && line.find_first_not_of(" ^") != std::string::npos &&
          line.find("line") != std::string::npos)
        first_error = line;
  }
  check(status == 0, "[figure] {}: gnuplot failed ({})", name,
        first_error.empty() ? "exit status " + std::to_string(status) : first_error);
  std::error_code ec;
  check(fs::exists(png, ec) && fs::file_size(png, ec) > 0, "[figure] {}: gnuplot wrote no {}", name,
        png.string());
  fs::remove(log, ec);
}

}  // namespace ffnlab
