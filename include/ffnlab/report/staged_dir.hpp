// A report directory written in full before it replaces the old one: everything goes into a
// hidden sibling, and commit() swaps it in with one atomic rename exchange (renameat2), so a
// reader sees the old report or the new one, never a mix, and a failed run leaves the old one.
//
// Only a report may be replaced. Every report carries a marker file (kReportMarker); a folder
// that exists, is not empty and has no marker is refused, and so is a place that is, contains
// or lies inside an input, the current directory, the root or a mount point — all before any
// work, so that a mistyped --out never deletes a user's folder.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ffnlab {

// The file that marks a folder as an ffnlab report (written into every report), and what it
// says: a file of that name with other contents, or a link or a folder of that name, is not one.
inline constexpr const char* kReportMarker = ".ffnlab-report";
inline constexpr std::string_view kReportMarkerText =
    "This folder is a report written by ffnlab; the next report into it replaces it whole.\n";

// Refuses DIR as a report folder (Error "[report] ..." saying why) unless it does not exist, is
// an empty folder or is an earlier report; `inputs` are the files and folders the run reads.
// `option`: how the messages name the option that gave DIR, and a good value of it, in the
// caller's words (the command line's by default; Python's "out" and "out='report'").
struct FolderOption {
  std::string name = "--out", example = "--out report";
};
void check_report_folder(const std::string& dir, const std::vector<std::string>& inputs,
                         const FolderOption& option = {});

class StagedDirectory {
 public:
  // Checks DIR (check_report_folder), then creates its staging sibling (".DIR.partial-<pid>",
  // removing a stale one of that name) with the marker in it.
  explicit StagedDirectory(std::string final_dir, const std::vector<std::string>& inputs = {},
                           FolderOption option = {});
  // Removes the staging directory unless commit() ran.
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  const std::string& path() const { return staging_; }      // where to write
  const std::string& final_path() const { return shown_; }  // as the user named it
  // Puts the staging directory in DIR's place; the old DIR, if any, is removed after the swap.
  // DIR is checked again first: if it changed during the run into something that is not
  // replaceable, Error, and the new report is kept under its staging name.
  void commit();

 private:
  std::string shown_, final_, staging_;  // DIR as named; DIR resolved; the staging folder
  FolderOption option_;                  // the option that named DIR, as messages say it
  bool committed_ = false, kept_ = false;
};

}  // namespace ffnlab
