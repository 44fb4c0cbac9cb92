// Atomic replacement of a report directory.
#include "ffnlab/report/staged_dir.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "check.hpp"
#include "ffnlab/io/files.hpp"

namespace ffnlab {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kMarkerText = kReportMarkerText;

// Whether the resolved folder is where a file system is mounted: statx says so where the kernel
// knows (bind mounts of one file system included); otherwise its device differs from its
// parent's, or it is its own parent (the root).
bool mount_point(const std::string& resolved) {
#ifdef STATX_ATTR_MOUNT_ROOT
  struct statx sx {};
  if (::statx(AT_FDCWD, resolved.c_str(), AT_NO_AUTOMOUNT, STATX_BASIC_STATS, &sx) == 0 &&
      (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) != 0)
    return (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
#endif
  struct stat here {
  }, up{};
  const std::string parent = fs::path(resolved).parent_path().string();
  if (::stat(resolved.c_str(), &here) != 0 || ::stat(parent.c_str(), &up) != 0) return false;
  return here.st_dev != up.st_dev || here.st_ino == up.st_ino;
}

// An earlier report: its marker is a regular file (not a link, not a folder) that says so.
bool is_report(const fs::path& dir) {
  std::error_code ec;
  const fs::path marker = dir / kReportMarker;
  if (!fs::is_regular_file(fs::symlink_status(marker, ec))) return false;
  std::ifstream in(marker, std::ios::binary);
  std::string head(kMarkerText.size(), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  return in.gcount() == static_cast<std::streamsize>(head.size()) && head == kMarkerText;
}

// What may be replaced: nothing there, an empty folder, or an earlier report. "" when it may;
// otherwise why not.
std::string why_not_replaceable(const std::string& resolved) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(resolved, ec))) return "";
  if (!fs::is_directory(fs::status(resolved, ec))) return "exists and is not a folder";
  if (fs::is_empty(resolved, ec) && !ec) return "";
  if (is_report(resolved)) return "";
  return fmt::format(
      "is a folder that holds other files and is not an earlier ffnlab report (it has no {} "
      "file written by ffnlab); a report replaces its folder whole, so name a new or empty folder",
      kReportMarker);
}

}  // namespace

void check_report_folder(const std::string& dir, const std::vector<std::string>& inputs,
                         const FolderOption& option) {
  check(!dir.empty(), "[report] the output folder name is empty");
  const std::string where = resolved_path(dir);
  check(where != "/", "[report] {} '{}' is the root folder: a report gets a folder of its own",
        option.name, dir);
  check(!path_within(resolved_path("."), where),
        "[report] {} '{}' is or contains the current directory ({}): a report gets a folder of "
        "its own; name a new one, e.g. {}",
        option.name, dir, resolved_path("."), option.example);
  check_output_apart(dir, inputs, "report", option.name.c_str());
  std::error_code ec;
  if (fs::is_directory(fs::status(where, ec)))
    check(!mount_point(where),
          "[report] {} '{}' is a mount point: a report replaces its folder, which would remove "
          "what is mounted there; name a folder inside it",
          option.name, dir);
  const std::string why = why_not_replaceable(where);
  check(why.empty(), "[report] {} '{}' {}", option.name, dir, why);
}

StagedDirectory::StagedDirectory(std::string final_dir, const std::vector<std::string>& inputs,
                                 FolderOption option)
    : shown_(std::move(final_dir)), option_(std::move(option)) {
  // Refused now, not after the work whose results would go there.
  check_report_folder(shown_, inputs, option_);
  // The place that was checked is the place replaced: the name resolved (links, "." and ".."),
  // so that "precious/link/.." can pass neither as another folder nor be replaced as one.
  const fs::path f = resolved_path(shown_);
  final_ = f.string();
  const fs::path parent = f.parent_path();
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
  write_file_atomic((fs::path(staging_) / kReportMarker).string(), kMarkerText.data(),
                    kMarkerText.size());
}

StagedDirectory::~StagedDirectory() {
  if (committed_ || kept_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

void StagedDirectory::commit() {
  sync_tree(staging_);  // on disk before it becomes the report
  // The place may have changed during the run (files put into a folder that was empty, a
  // folder created where there was none): checked again, right before the swap.
  auto refuse_if_changed = [&] {
    const std::string why = why_not_replaceable(final_);
    if (why.empty()) return;
    kept_ = true;  // the new report stays, under its staging name
    fail("[report] {} '{}' changed during the run and now {}; the new report was left in '{}'",
         option_.name, shown_, why, staging_);
  };
  refuse_if_changed();
  std::error_code ec;
  // Nothing there: the staging folder takes the name, unless something took it meanwhile.
  if (!fs::exists(fs::symlink_status(final_, ec))) {
    if (renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, final_.c_str(), RENAME_NOREPLACE) == 0) {
      committed_ = true;
    } else {
      const int error = errno;
      if (error != EEXIST) fail("[report] cannot create '{}': {}", shown_, std::strerror(error));
      refuse_if_changed();
    }
  }
  if (!committed_) {
    // Swap the two in one step, then remove the old report (now under the staging name).
    if (renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, final_.c_str(), RENAME_EXCHANGE) != 0) {
      const int error = errno;
      fail("[report] cannot replace '{}': {}", shown_, std::strerror(error));
    }
    committed_ = true;
    fs::remove_all(staging_, ec);
  }
  sync_path(fs::path(final_).parent_path().string());
}

}  // namespace ffnlab
