// libFuzzer target: any bytes as a line from bench's PyTorch side (tools/ffnlab/torch_reply.cpp).
// A reply of a valid form or ffnlab::Error "[bench] ..."; anything else (a crash, another
// exception, a non-finite or non-positive time) is a finding.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ffnlab/error.hpp"
#include "torch_reply.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  try {
    const auto r = ffnlab::cli::parse_torch_reply(line, "fuzz.py");
    if (r.kind == ffnlab::cli::TorchReply::Kind::seconds &&
        !(std::isfinite(r.seconds) && r.seconds > 0))
      std::abort();
  } catch (const ffnlab::Error&) {
  }
  try {
    const auto h = ffnlab::cli::parse_torch_hello(line, "fuzz.py");
    if (h.ready && h.threads < 0) std::abort();
  } catch (const ffnlab::Error&) {
  }
  return 0;
}
