// libFuzzer target: checkpoint.json as `ffnlab train --resume` reads it (read_checkpoint_info,
// then the model and training configs in it). Anything it refuses must be an ffnlab::Error.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "ffnlab/error.hpp"
#include "ffnlab/layers/lm_config.hpp"
#include "ffnlab/train/trainer.hpp"

namespace {
const std::string& folder() {
  static const std::string dir = [] {
    const auto d = std::filesystem::temp_directory_path() /
                   ("ffnlab_fuzz_checkpoint_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d.string();
  }();
  return dir;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  {
    std::ofstream out(folder() + "/checkpoint.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const nlohmann::json info = ffnlab::read_checkpoint_info(folder());
    (void)ffnlab::lm_config_from_json(info["model"]);
    (void)ffnlab::train_config_from_json(info["train"]);
  } catch (const ffnlab::Error&) {
  }
  return 0;
}
