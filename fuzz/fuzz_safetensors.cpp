// libFuzzer target: the safetensors reader. Any bytes must give a SafeTensors whose every tensor
// reads back, or an ffnlab::Error; never a crash, a hang or a huge allocation.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ffnlab/error.hpp"
#include "ffnlab/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>(data[i]);
  try {
    const auto st = ffnlab::SafeTensors::parse(std::move(bytes), "fuzz");
    for (const auto& name : st.names()) {
      const auto& info = st.info(name);
      if (info.dtype == ffnlab::StDType::i32 || info.dtype == ffnlab::StDType::i64)
        (void)st.ints(name);
      else
        (void)st.f32(name);
    }
  } catch (const ffnlab::Error&) {
  }
  return 0;
}
