// The lines bench/torch_ffn.py answers with, checked before any field is read: a hostile or
// broken script gives "[bench] SCRIPT: ..." naming what is wrong, never a raw JSON error.
// Kept apart from the process handling so that a fuzzer and a property test can drive it.
#pragma once

#include <string>
#include <string_view>

namespace ffnlab::cli {

// The first line: {"ready": true, "torch": VERSION, "threads": N, "runtime": WHAT} or
// {"ready": false, "error": WHY}. runtime (optional): what PyTorch runs with, in one line (its
// BLAS and kernels, oneDNN, the allocator; bench/torch_at_best.py).
struct TorchHello {
  bool ready = false;
  std::string torch, error, runtime;
  int threads = 0;
};

// Every later line: {"seconds": S} (finite, positive), {"skipped": WHY} or {"freed": true}.
struct TorchReply {
  enum class Kind { seconds, skipped, freed } kind = Kind::skipped;
  double seconds = 0;
  std::string skipped;
};

// Throw ffnlab::Error "[bench] SCRIPT: ..." for a line that is not one of the above.
TorchHello parse_torch_hello(std::string_view line, const std::string& script);
TorchReply parse_torch_reply(std::string_view line, const std::string& script);

}  // namespace ffnlab::cli
