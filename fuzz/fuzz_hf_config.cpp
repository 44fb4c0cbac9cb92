// libFuzzer target: the Hugging Face config.json reader. Accepted configs must be costed without
// overflow; anything else must be an ffnlab::Error.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "ffnlab/analysis/costs.hpp"
#include "ffnlab/error.hpp"
#include "ffnlab/io/hf_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded() || !ffnlab::is_hf_config(j)) return 0;
  try {
    const ffnlab::FFNConfig c = ffnlab::hf_ffn_config(j);
    (void)ffnlab::ffn_cost(c, 1);
  } catch (const ffnlab::Error&) {
  }
  return 0;
}
