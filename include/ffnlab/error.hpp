// The one exception type of ffnlab. Messages start with the thing that failed, in brackets:
// "[moe] top_k = 9 exceeds num_experts = 8". The command line prints them as one line.
#pragma once

#include <stdexcept>
#include <string>

namespace ffnlab {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ffnlab
