// The PyTorch side process of ffnlab bench: a child with pipes, one JSON line each way.
#include "torch_worker.hpp"

#include <algorithm>
#include <filesystem>

#include "ffnlab/error.hpp"
#include "ffnlab/interrupt.hpp"

namespace ffnlab::cli {

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

TorchWorker::TorchWorker(const std::string& python, const std::string& script, int threads,
                         double timeout)
    : script_(script), timeout_(timeout) {
  if (script.empty()) {
    why_not_ = "bench/torch_ffn.py not found (--torch-script)";
    return;
  }
  try {
    ChildOptions options;
    options.pipes = true;
    options.env["OMP_WAIT_POLICY"] = "PASSIVE";
    options.scope = "bench";
    options.name = script;
    child_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{python, script, std::to_string(threads)}, options);
    hello_ = parse_torch_hello(
        child_->read_line(std::chrono::duration<double>(timeout_), kMaxReply), script_);
  } catch (const Interrupted&) {
    throw;
  } catch (const Error& e) {  // could not start, no hello in time, a hello of the wrong form
    stop(e.what());
    return;
  }
  if (!hello_.ready) {
    stop("PyTorch cannot be imported: " + hello_.error);
    return;
  }
  available_ = true;
}

TorchReply TorchWorker::ask(const nlohmann::json& request) {
  if (available_) {
    try {
      // A child that no longer reads has exited or closed its input: the read below says which
      // (its exit status at the end of its output).
      const bool sent = child_->write_line(request.dump());
      const std::string line = child_->read_line(
          std::chrono::duration<double>(sent ? timeout_ : std::min(timeout_, 5.0)), kMaxReply);
      if (!sent) throw SystemError("[bench] " + script_ + ": the PyTorch process stopped reading");
      return parse_torch_reply(line, script_);
    } catch (const Interrupted&) {
      throw;
    } catch (const Error& e) {
      stop(e.what());
    }
  }
  TorchReply r;
  r.skipped = why_not_;
  return r;
}

void TorchWorker::stop(const std::string& why) {
  available_ = false;
  why_not_ = why;
  if (child_) child_->terminate();
}

TorchWorker::~TorchWorker() {
  if (!child_ || !child_->running()) return;
  // Its input closes, then SIGTERM, then SIGKILL after 5 s (terminate never throws).
  child_->terminate(std::chrono::seconds(5));
}

}  // namespace ffnlab::cli
