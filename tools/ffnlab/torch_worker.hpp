// A PyTorch process that times the same layers on request (bench/torch_ffn.py), so that
// `ffnlab bench` can alternate with it and report ratios measured in one run. Every wait on it
// has a deadline, every reply a length cap and a checked form (torch_reply.hpp), and the process
// is ended and reaped on every way out of bench; an interrupt while waiting stops bench.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "ffnlab/io/process.hpp"
#include "torch_reply.hpp"

namespace ffnlab::cli {

class TorchWorker {
 public:
  // Starts `python script threads` with OMP_WAIT_POLICY=PASSIVE (PyTorch's OpenMP threads then
  // sleep between calls instead of spinning against ffnlab's); the rest of the environment is
  // passed on as it is. It must say hello within `timeout` seconds, as must every later reply.
  // available() tells whether PyTorch answered; why_not() why it did not.
  TorchWorker(const std::string& python, const std::string& script, int threads, double timeout);
  ~TorchWorker();
  TorchWorker(const TorchWorker&) = delete;
  TorchWorker& operator=(const TorchWorker&) = delete;

  bool available() const { return available_; }
  const std::string& why_not() const { return why_not_; }
  const TorchHello& hello() const { return hello_; }

  // PyTorch's answer to one request. After the process failed (no reply in time, a reply of the
  // wrong form, an exit), a `skipped` reply saying why, and available() turns false.
  TorchReply ask(const nlohmann::json& request);

  // Ends the process (available() turns false; why_not() says `why`).
  void stop(const std::string& why);

  // The longest reply line read (1 MiB): a line without an end cannot grow without bound.
  static constexpr std::size_t kMaxReply = std::size_t{1} << 20;

 private:
  std::unique_ptr<ChildProcess> child_;
  std::string script_;
  double timeout_;
  bool available_ = false;
  std::string why_not_;
  TorchHello hello_;
};

// Where bench/torch_ffn.py is: beside the installed program (../share/ffnlab/torch_ffn.py) or in
// the source tree it was built from; "" when neither exists.
std::string default_torch_script();

}  // namespace ffnlab::cli
