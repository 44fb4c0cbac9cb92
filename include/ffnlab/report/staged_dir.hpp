// A report directory written in full before it replaces the old one: everything goes into a
// hidden sibling, and commit() swaps it in with one atomic rename exchange (renameat2), so a
// reader sees the old report or the new one, never a mix, and a failed run leaves the old one.
#pragma once

#include <string>

namespace ffnlab {

class StagedDirectory {
 public:
  // Creates DIR's staging sibling (".DIR.partial-<pid>"), removing a stale one of that name.
  explicit StagedDirectory(std::string final_dir);
  // Removes the staging directory unless commit() ran.
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  const std::string& path() const { return staging_; }  // where to write
  const std::string& final_path() const { return final_; }
  // Puts the staging directory in DIR's place; the old DIR, if any, is removed after the swap.
  void commit();

 private:
  std::string final_, staging_;
  bool committed_ = false;
};

}  // namespace ffnlab
