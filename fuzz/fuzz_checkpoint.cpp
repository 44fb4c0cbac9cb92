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
// The input goes to checkpoint.json in a folder of this process, removed when the run ends (a
// crash keeps it, with the input that crashed).
struct Folder {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("ffnlab_fuzz_checkpoint_" + std::to_string(::getpid())))
                         .string();
  Folder() { std::filesystem::create_directories(path); }
  ~Folder() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
const std::string& folder() {
  static const Folder f;
  return f.path;
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
