// io/files: the leftovers of killed writes are removed, and a write in progress is not.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "ffnlab/error.hpp"
#include "ffnlab/io/files.hpp"
#include "../common/test_util.hpp"

namespace ffnlab {
namespace {

namespace fs = std::filesystem;

bool is_json(std::string_view target) {
  return target.ends_with(".json");
}

// A temporary named with this process's pid is an earlier process's (the pid repeats in a
// container) unless this process is writing it; another live process's is kept.
TEST(Files, RemovesLeftoversOfThisPidButNotOfLiveProcesses) {
  const test::ScratchDir dir("files-own-pid");
  const auto in_dir = [&](const std::string& name) { return (dir.path / name).string(); };
  const std::string mine = in_dir("a.json.tmp." + std::to_string(::getpid()));
  const std::string parents = in_dir("b.json.tmp." + std::to_string(::getppid()));
  const std::string not_ours = in_dir("c.txt.tmp." + std::to_string(::getpid()));
  for (const auto& f : {mine, parents, not_ours}) std::ofstream(f) << "half a file";

  EXPECT_EQ(remove_stale_temporaries(dir.path.string(), is_json), 1);
  EXPECT_FALSE(fs::exists(mine));
  EXPECT_TRUE(fs::exists(parents)) << "the parent process is alive: its write may be going on";
  EXPECT_TRUE(fs::exists(not_ours)) << "not a target of ours";
}

// A write of this process holds its temporary: here it waits in open() on a FIFO in the
// temporary's place, until this thread reads.
TEST(Files, KeepsTheTemporaryOfAWriteInProgress) {
  const test::ScratchDir dir("files-in-progress");
  const std::string target = (dir.path / "d.json").string();
  const std::string tmp = temporary_name(target);
  ASSERT_EQ(::mkfifo(tmp.c_str(), 0600), 0);
  std::string failure;
  std::thread writer([&] {
    try {
      const std::string text = "{}";
      write_file_atomic(target, text.data(), text.size());
    } catch (const std::exception& e) {
      failure = e.what();  // a FIFO cannot be synced: the write fails once it is read
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the writer is waiting in open()
  EXPECT_EQ(remove_stale_temporaries(dir.path.string(), is_json), 0);
  EXPECT_TRUE(fs::exists(tmp)) << "the write in progress lost its temporary";
  const int fd = ::open(tmp.c_str(), O_RDONLY);  // lets the writer go on
  ASSERT_GE(fd, 0);
  char buffer[16];
  while (::read(fd, buffer, sizeof buffer) > 0) {
  }
  ::close(fd);
  writer.join();
  EXPECT_NE(failure.find("d.json"), std::string::npos) << failure;
  EXPECT_FALSE(fs::exists(tmp)) << "a failed write removes its temporary";
  EXPECT_FALSE(fs::exists(target));
}

}  // namespace
}  // namespace ffnlab
