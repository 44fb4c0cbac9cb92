// The PyTorch side process of ffnlab bench: pipes to a child python, one JSON line each way.
#include "torch_worker.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

namespace ffnlab::cli {

namespace {

std::string read_line(std::FILE* f) {
  std::string line;
  for (int c; (c = std::fgetc(f)) != EOF && c != '\n';) line.push_back(static_cast<char>(c));
  return line;
}

}  // namespace

std::string default_torch_script() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / "share/ffnlab/torch_ffn.py";
    if (fs::is_regular_file(installed, ec)) return installed.string();
  }
  const fs::path source = fs::path(FFNLAB_SOURCE_DIR) / "bench/torch_ffn.py";
  if (fs::is_regular_file(source, ec)) return source.string();
  return "";
}

TorchWorker::TorchWorker(const std::string& python, const std::string& script, int threads) {
  if (script.empty()) {
    why_not_ = "bench/torch_ffn.py not found (--torch-script)";
    return;
  }
  if (access(python.c_str(), X_OK) != 0) {
    why_not_ = python + " not found (--python)";
    return;
  }
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
    why_not_ = "no pipe";
    return;
  }
  const std::string thread_arg = std::to_string(threads);
  pid_ = fork();
  if (pid_ == 0) {  // the child: stdin from `in`, stdout to `out`, stderr kept
    dup2(in[0], 0);
    dup2(out[1], 1);
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execl(python.c_str(), python.c_str(), script.c_str(), thread_arg.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  if (pid_ < 0) {
    close(in[1]);
    close(out[0]);
    why_not_ = "fork failed";
    return;
  }
  // A dead child must not kill ffnlab with SIGPIPE on the next write.
  signal(SIGPIPE, SIG_IGN);
  to_ = fdopen(in[1], "w");
  from_ = fdopen(out[0], "r");
  const std::string line = read_line(from_);
  try {
    hello_ = nlohmann::json::parse(line);
  } catch (const std::exception&) {
    stop("no answer from " + script);
    return;
  }
  if (!hello_.value("ready", false)) {
    stop("PyTorch cannot be imported: " + hello_.value("error", std::string("?")));
    return;
  }
  available_ = true;
}

nlohmann::json TorchWorker::ask(const nlohmann::json& request) {
  if (!available_) return {{"skipped", why_not_}};
  const std::string text = request.dump() + "\n";
  if (std::fputs(text.c_str(), to_) < 0 || std::fflush(to_) != 0) {
    stop("the PyTorch process stopped");
    return {{"skipped", why_not_}};
  }
  const std::string line = read_line(from_);
  try {
    return nlohmann::json::parse(line);
  } catch (const std::exception&) {
    stop("the PyTorch process stopped");
    return {{"skipped", why_not_}};
  }
}

void TorchWorker::stop(const std::string& why) {
  available_ = false;
  why_not_ = why;
  if (to_) std::fclose(to_);
  if (from_) std::fclose(from_);
  to_ = from_ = nullptr;
  if (pid_ > 0) {
    int status = 0;
    kill(pid_, SIGTERM);
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
}

TorchWorker::~TorchWorker() {
  if (to_) std::fclose(to_);  // end of input: the script returns
  to_ = nullptr;
  if (from_) std::fclose(from_);
  from_ = nullptr;
  if (pid_ > 0) {
    int status = 0;
    waitpid(pid_, &status, 0);
  }
}

}  // namespace ffnlab::cli
