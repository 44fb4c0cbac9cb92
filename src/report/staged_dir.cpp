// Atomic replacement of a report directory.
#include "ffnlab/report/staged_dir.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "check.hpp"
#include "ffnlab/io/files.hpp"

namespace ffnlab {

namespace fs = std::filesystem;

namespace {

// Whether the resolved folder is where a file system is mounted (its device differs from its
// parent's, or it is its own parent: the root).
bool mount_point(const std::string& resolved) {
  struct stat here {
  }, up{};
  const std::string parent = fs::path(resolved).parent_path().string();
  if (::stat(resolved.c_str(), &here) != 0 || ::stat(parent.c_str(), &up) != 0) return false;
  return here.st_dev != up.st_dev || (here.st_dev == up.st_dev && here.st_ino == up.st_ino);
}

}  // namespace

void check_report_folder(const std::string& dir, const std::vector<std::string>& inputs) {
  check(!dir.empty(), "[report] the output folder name is empty");
  const std::string where = resolved_path(dir);
  std::error_code ec;
  check(where != "/", "[report] --out '{}' is the root folder: a report gets a folder of its own",
        dir);
  check(!path_within(resolved_path("."), where),
        "[report] --out '{}' is or contains the current directory ({}): a report gets a folder of "
        "its own; name a new one, e.g. --out report",
        dir, resolved_path("."));
  check_output_apart(dir, inputs, "report", "--out");
  const auto status = fs::symlink_status(where, ec);
  if (!fs::exists(status)) return;
  check(fs::is_directory(fs::status(where, ec)), "[report] --out '{}' exists and is not a folder",
        dir);
  check(!mount_point(where),
        "[report] --out '{}' is a mount point: a report replaces its folder, which would remove "
        "what is mounted there; name a folder inside it",
        dir);
  if (fs::is_empty(where, ec) && !ec) return;
  check(fs::exists(fs::path(where) / kReportMarker, ec),
        "[report] --out '{}' is a folder that holds other files and is not an earlier ffnlab "
        "report (it has no {} file); a report replaces its folder whole, so name a new or empty "
        "folder",
        dir, kReportMarker);
}

StagedDirectory::StagedDirectory(std::string final_dir, const std::vector<std::string>& inputs)
    : final_(std::move(final_dir)) {
  // Refused now, not after the work whose results would go there.
  check_report_folder(final_, inputs);
  fs::path f = fs::path(final_).lexically_normal();
  if (!f.has_filename()) f = f.parent_path();
  // "a/b/.." names "a": the folder that would be replaced, so use its real name.
  if (f.filename() == ".." || f.filename() == ".") f = fs::path(resolved_path(final_));
  final_ = f.string();
  const fs::path parent = f.has_parent_path() ? f.parent_path() : fs::path(".");
  std::error_code ec;
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
  const std::string marker =
      "This folder is a report written by ffnlab; the next report into it "
      "replaces it whole.\n";
  write_file_atomic((fs::path(staging_) / kReportMarker).string(), marker.data(), marker.size());
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
