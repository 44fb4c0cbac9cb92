// ProcessGroup's point-to-point messages where a group has none (groups that only reduce).
#include "ffnlab/parallel/group.hpp"

#include "check.hpp"

namespace ffnlab {

void ProcessGroup::send(const std::string& /*bytes*/, int /*to*/, int /*tag*/, const char* what) {
  fail("[dist] this process group has no point-to-point messages ({})", what);
}

bool ProcessGroup::try_receive(std::string& /*bytes*/, int& /*from*/, int& /*tag*/,
                               const char* what) {
  fail("[dist] this process group has no point-to-point messages ({})", what);
}

}  // namespace ffnlab
