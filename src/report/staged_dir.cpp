// Atomic replacement of a report directory.
#include "ffnlab/report/staged_dir.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "check.hpp"
#include "ffnlab/io/files.hpp"

namespace ffnlab {

namespace fs = std::filesystem;

StagedDirectory::StagedDirectory(std::string final_dir) : final_(std::move(final_dir)) {
  check(!final_.empty(), "[report] the output directory name is empty");
  fs::path f = fs::path(final_).lexically_normal();
  if (!f.has_filename()) f = f.parent_path();
  final_ = f.string();
  const fs::path parent = f.has_parent_path() ? f.parent_path() : fs::path(".");
  std::error_code ec;
  // Refused now, not after the work whose results would go there.
  check(!fs::exists(final_, ec) || fs::is_directory(final_, ec),
        "[report] '{}' exists and is not a folder", final_);
  fs::create_directories(parent, ec);
  check(!ec, "[report] cannot create '{}': {}", parent.string(), ec.message());
  std::string name = ".";  // appended, not "." + ...: GCC 12 warns falsely (-Wrestrict) on that
  name.append(f.filename().string()).append(".partial-").append(std::to_string(getpid()));
  staging_ = (parent / name).string();
  // Staging folders of earlier runs into the same place that were killed.
  const std::string base = f.filename().string();
  remove_stale_temporaries(parent.string(), [&](std::string_view t) { return t == base; });
  fs::remove_all(staging_, ec);
  fs::create_directory(staging_, ec);
  check(!ec, "[report] cannot create '{}': {}", staging_, ec.message());
}

StagedDirectory::~StagedDirectory() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

void StagedDirectory::commit() {
  sync_tree(staging_);  // on disk before it becomes the report
  std::error_code ec;
  if (fs::exists(final_, ec)) {
    check(fs::is_directory(final_, ec), "[report] '{}' exists and is not a directory", final_);
    // Swap the two in one step, then remove the old report (now under the staging name).
    if (renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, final_.c_str(), RENAME_EXCHANGE) != 0)
      fail("[report] cannot replace '{}': {}", final_, std::strerror(errno));
    committed_ = true;
    fs::remove_all(staging_, ec);
  } else {
    fs::rename(staging_, final_, ec);
    check(!ec, "[report] cannot create '{}': {}", final_, ec.message());
    committed_ = true;
  }
  const fs::path parent = fs::path(final_).parent_path();
  sync_path(parent.empty() ? "." : parent.string());
}

}  // namespace ffnlab
