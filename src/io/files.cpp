// Checked reading and atomic, durable writing of files.
#include "ffnlab/io/files.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "check.hpp"
#include "ffnlab/interrupt.hpp"

namespace ffnlab {

namespace fs = std::filesystem;

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// An open descriptor that closes itself.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens a regular file for reading without blocking on a FIFO; returns its size.
std::uint64_t open_regular(Fd& f, const std::string& path, const char* scope,
                           std::uint64_t max_bytes) {
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  check(f.fd >= 0, "[{}] {}: cannot open ({})", scope, path, std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail_errno(errno, "[{}] {}: {}", scope, path, std::strerror(errno));
  check(S_ISREG(st.st_mode), "[{}] {}: {}, not a regular file", scope, path, file_kind(st.st_mode));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  check(size <= max_bytes, "[{}] {}: {} bytes is more than the limit of {} bytes", scope, path,
        size, max_bytes);
  return size;
}

bool process_alive(long pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

// The temporary files this process is writing now, by resolved path. A temporary named with this
// process's pid and not among them is a leftover of an earlier process that had the same pid (in
// a container the pid repeats, often 1), so it is stale although its pid is alive.
std::mutex g_writing_mutex;
std::multiset<std::string> g_writing;

// Registers temporaries as being written for its lifetime.
class Writing {
 public:
  explicit Writing(const std::vector<std::string>& tmps) {
    for (const auto& t : tmps) names_.push_back(resolved_path(t));
    const std::lock_guard lock(g_writing_mutex);
    for (const auto& n : names_) g_writing.insert(n);
  }
  ~Writing() {
    const std::lock_guard lock(g_writing_mutex);
    for (const auto& n : names_) g_writing.erase(g_writing.find(n));
  }
  Writing(const Writing&) = delete;
  Writing& operator=(const Writing&) = delete;

 private:
  std::vector<std::string> names_;
};

// Removes a temporary file of this process's pid unless a write of this process holds it; under
// the lock, so that a write cannot begin between the look and the removal.
bool remove_unless_written(const fs::path& tmp) {
  const std::string name = resolved_path(tmp.string());
  const std::lock_guard lock(g_writing_mutex);
  std::error_code ec;
  return g_writing.count(name) == 0 && fs::remove(tmp, ec);
}

// The pid at the end of name after `marker`, or 0.
long pid_after(const std::string& name, const std::string& marker) {
  const auto at = name.rfind(marker);
  if (at == std::string::npos) return 0;
  const std::string digits = name.substr(at + marker.size());
  if (digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return 0;
  return std::stol(digits);
}

}  // namespace

std::uint64_t regular_file_size(const std::string& path, const char* scope,
                                std::uint64_t max_bytes) {
  Fd f;
  return open_regular(f, path, scope, max_bytes);
}

std::vector<std::uint8_t> read_regular_file(const std::string& path, const char* scope,
                                            std::uint64_t max_bytes) {
  Fd f;
  const std::uint64_t size = open_regular(f, path, scope, max_bytes);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(size));
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(f.fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno(errno, "[{}] {}: read failed ({})", scope, path, std::strerror(errno));
    if (n == 0) break;  // the file shrank while we read it
    done += static_cast<std::size_t>(n);
  }
  out.resize(done);
  return out;
}

std::string temporary_name(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

void sync_path(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0 || ::fsync(f.fd) != 0)
    fail_errno(errno, "[io] {}: cannot sync to disk ({})", path, std::strerror(errno));
}

void sync_tree(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) sync_path(e.path().string());
  sync_path(dir);
}

namespace {

std::atomic<double> g_write_grace{10.0};

// Returned by write_synced when a stop request outlasted the grace (no errno has this value).
constexpr int kStopped = -1;

// Whether a stop request has waited the grace for this write: counted from the later of the
// request and the write's start (`start`), so that the checkpoint a stop asks for, which starts
// after it, gets the whole grace.
bool past_grace(std::chrono::steady_clock::time_point start) {
  if (!stop_requested()) return false;
  const double writing =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::min(writing, seconds_since_stop()) >= g_write_grace.load();
}

// Writes and syncs one temporary file; returns errno (0: done), or kStopped.
int write_synced(const std::string& tmp, const std::vector<FilePiece>& pieces) {
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd < 0) return errno;
  constexpr std::size_t kChunk = std::size_t{64} << 20;  // how much is written between looks
  const auto start = std::chrono::steady_clock::now();
  for (const FilePiece& piece : pieces) {
    const auto* p = static_cast<const char*>(piece.data);
    std::size_t done = 0;
    if (past_grace(start)) return kStopped;
    while (done < piece.size) {
      if (done > 0 && past_grace(start)) return kStopped;
      const ssize_t n = ::write(f.fd, p + done, std::min(piece.size - done, kChunk));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno;
      done += static_cast<std::size_t>(n);
    }
  }
  if (::fsync(f.fd) != 0) return errno;
  const int fd = f.fd;
  f.fd = -1;
  return ::close(fd) != 0 ? errno : 0;
}

std::string folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// Removes the temporaries, then throws: Interrupted for a stop, SystemError for errno `error`.
[[noreturn]] void abandon(const std::vector<std::string>& tmps, const std::string& path,
                          int error) {
  for (const auto& t : tmps) ::unlink(t.c_str());
  if (error == kStopped)
    throw Interrupted(
        fmt::format("{} while writing {} (still writing {:.0f} s after it and after "
                    "the write began); the earlier file is kept",
                    stop_reason(), path, g_write_grace.load()));
  fail_errno(error, "[io] {}: write failed ({})", path, std::strerror(error));
}

}  // namespace

double write_stop_grace() {
  return g_write_grace.load();
}

void set_write_stop_grace(double seconds) {
  check(seconds >= 0 && std::isfinite(seconds), "[io] the write grace must be at least 0 s, got {}",
        seconds);
  g_write_grace.store(seconds);
}

void write_files_atomic(const std::vector<FileContent>& files) {
  std::vector<std::string> tmps;
  for (const auto& f : files) tmps.push_back(temporary_name(f.path));
  const Writing writing(tmps);
  const auto give_up = [&](const std::string& path, int error) { abandon(tmps, path, error); };
  for (std::size_t i = 0; i < files.size(); ++i) {
    const FileContent& f = files[i];
    if (const int error = write_synced(tmps[i], {FilePiece{f.data, f.size}}))
      give_up(f.path, error);
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (::rename(tmps[i].c_str(), files[i].path.c_str()) != 0) {
      const int error = errno;
      tmps.erase(tmps.begin(), tmps.begin() + static_cast<std::ptrdiff_t>(i));
      give_up(files[i].path, error);
    }
  }
  for (const auto& f : files) sync_path(folder_of(f.path));
}

void write_file_atomic(const std::string& path, const void* data, std::size_t size) {
  write_files_atomic({FileContent{path, data, size}});
}

void write_file_atomic(const std::string& path, const std::vector<FilePiece>& pieces) {
  const std::string tmp = temporary_name(path);
  const Writing writing({tmp});
  const auto give_up = [&](int error) { abandon({tmp}, path, error); };
  if (const int error = write_synced(tmp, pieces)) give_up(error);
  if (::rename(tmp.c_str(), path.c_str()) != 0) give_up(errno);
  sync_path(folder_of(path));
}

void check_output_path(const std::string& path, const char* scope) {
  check(!path.empty(), "[{}] the output path is empty", scope);
  const std::string dir = folder_of(path);
  std::error_code ec;
  check(fs::is_directory(dir, ec), "[{}] {}: the folder '{}' does not exist", scope, path, dir);
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    const int error = errno;
    fail("[{}] {}: cannot write into '{}' ({})", scope, path, dir, std::strerror(error));
  }
  check(!fs::is_directory(path, ec), "[{}] {}: is a folder", scope, path);
}

int remove_stale_temporaries(const std::string& dir,
                             const std::function<bool(std::string_view target)>& ours) {
  int removed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::string target;
    long pid = pid_after(name, ".tmp.");
    const bool file = pid != 0;
    if (file) {
      target = name.substr(0, name.rfind(".tmp."));
    } else if (name.starts_with(".") && (pid = pid_after(name, ".partial-"))) {
      target = name.substr(1, name.rfind(".partial-") - 1);
    }
    if (pid == 0 || !ours(target)) continue;
    if (file && pid == ::getpid()) {
      removed += remove_unless_written(e.path()) ? 1 : 0;
      continue;
    }
    if (process_alive(pid)) continue;
    std::error_code rm;
    removed += fs::remove_all(e.path(), rm) > 0 ? 1 : 0;
  }
  return removed;
}

void check_writable_dir(const std::string& dir, const char* scope) {
  check(!dir.empty(), "[{}] the output folder name is empty", scope);
  fs::path p = fs::absolute(dir).lexically_normal();
  std::error_code ec;
  while (!fs::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  check(fs::is_directory(p, ec), "[{}] cannot create the folder '{}': '{}' is not a folder", scope,
        dir, p.string());
  if (::access(p.c_str(), W_OK | X_OK) != 0) {
    const int error = errno;
    fail("[{}] cannot write into '{}' ({})", scope, p.string(), std::strerror(error));
  }
}

void ensure_writable_dir(const std::string& dir, const char* scope) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  check(!ec, "[{}] cannot create the folder '{}' ({})", scope, dir, ec.message());
  check(fs::is_directory(dir, ec), "[{}] '{}' is not a folder", scope, dir);
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    const int error = errno;
    fail("[{}] cannot write into '{}' ({})", scope, dir, std::strerror(error));
  }
}

std::string absolute_or_as_given(const std::string& path) {
  std::error_code ec;
  const fs::path whole = fs::absolute(path, ec);
  return ec ? path : whole.string();
}

std::string resolved_path(const std::string& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) return fs::path(path).lexically_normal().string();
  fs::path r = fs::weakly_canonical(absolute, ec);
  if (ec) r = absolute.lexically_normal();  // a loop of links: the name as written
  std::string s = r.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

bool path_within(const std::string& inner, const std::string& outer) {
  const std::string i = resolved_path(inner), o = resolved_path(outer);
  if (o == "/") return true;
  return i == o || (i.size() > o.size() && i.compare(0, o.size(), o) == 0 && i[o.size()] == '/');
}

void check_output_apart(const std::string& out, const std::vector<std::string>& inputs,
                        const char* scope, const char* flag) {
  for (const auto& in : inputs) {
    if (in.empty()) continue;
    const char* how = path_within(out, in)
                          ? (resolved_path(out) == resolved_path(in) ? "is" : "lies inside")
                      : path_within(in, out) ? "contains"
                                             : nullptr;
    if (how)
      fail(
          "[{}] {} '{}' {} the input '{}': writing there would change or delete it; choose "
          "another place",
          scope, flag, out, how, in);
  }
}

std::string filesystem_error_text(const std::filesystem::filesystem_error& e) {
  std::string where;
  if (!e.path1().empty()) where = fmt::format(" '{}'", e.path1().string());
  if (!e.path2().empty()) where += fmt::format(" and '{}'", e.path2().string());
  return fmt::format("[io]{}: {}", where, e.code().message());
}

bool path_leads_nowhere(const std::filesystem::filesystem_error& e) {
  const int code = e.code().value();
  return code == ENOENT || code == ENOTDIR || code == ELOOP || code == ENAMETOOLONG;
}

}  // namespace ffnlab
