// A PyTorch process that times the same layers on request (bench/torch_ffn.py), so that
// `ffnlab bench` can alternate with it and report ratios measured in one run.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace ffnlab::cli {

class TorchWorker {
 public:
  // Starts `python script threads` with OMP_WAIT_POLICY=PASSIVE (PyTorch's OpenMP threads then
  // sleep between calls instead of spinning against ffnlab's); the rest of the environment is
  // passed on as it is. available() tells whether PyTorch answered; why_not() why it did not.
  TorchWorker(const std::string& python, const std::string& script, int threads);
  ~TorchWorker();
  TorchWorker(const TorchWorker&) = delete;
  TorchWorker& operator=(const TorchWorker&) = delete;

  bool available() const { return available_; }
  const std::string& why_not() const { return why_not_; }
  const nlohmann::json& hello() const { return hello_; }

  // PyTorch's answer to one request ({"seconds": s} or {"skipped": reason}); after the process
  // has failed, {"skipped": why} and available() turns false.
  nlohmann::json ask(const nlohmann::json& request);

 private:
  void stop(const std::string& why);
  pid_t pid_ = -1;
  std::FILE* to_ = nullptr;
  std::FILE* from_ = nullptr;
  bool available_ = false;
  std::string why_not_;
  nlohmann::json hello_;
};

// Where bench/torch_ffn.py is: beside the installed program (../share/ffnlab/torch_ffn.py) or in
// the source tree it was built from; "" when neither exists.
std::string default_torch_script();

}  // namespace ffnlab::cli
