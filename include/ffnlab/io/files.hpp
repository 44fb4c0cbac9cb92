// Files read from outside and files written so that nothing half-written is ever seen.
//
// Reading: open_regular_file refuses what is not a regular file (a FIFO would block forever, a
// device never ends) and files above a size cap, before a byte is read.
// Writing: write_file_atomic writes a temporary file beside the target, fsyncs it, renames it
// over the target and fsyncs the folder, so that after a crash or power loss the target is the
// old file or the new one, whole. Temporary files are named `<target>.tmp.<pid>`;
// remove_stale_temporaries deletes those whose process is gone (a run that was killed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace ffnlab {

// 16 GiB: the largest text corpus or config file ffnlab reads into memory.
inline constexpr std::uint64_t kMaxReadBytes = std::uint64_t{16} << 30;

// The size of the regular file at path; Error "[scope] path: not a regular file (a FIFO)" or
// "... is N bytes, more than the limit M" otherwise.
std::uint64_t regular_file_size(const std::string& path, const char* scope,
                                std::uint64_t max_bytes = kMaxReadBytes);
// The whole regular file (checked as above).
std::vector<std::uint8_t> read_regular_file(const std::string& path, const char* scope,
                                            std::uint64_t max_bytes = kMaxReadBytes);

// Writes bytes to path atomically and durably (above). Throws SystemError on failure, leaving
// neither a temporary file nor a changed target. A write still running `write_stop_grace()`
// seconds after a stop request (ffnlab/interrupt.hpp) and after it began is abandoned the same
// way and throws Interrupted: the stop's own checkpoint, begun after the request, gets the whole
// grace, but a write that cannot finish soon does not hold the process (SIGTERM from `timeout`
// ends it).
void write_file_atomic(const std::string& path, const void* data, std::size_t size);
// Several files written together: every one is written to its temporary name and synced before
// any is renamed, so that a failure while writing (a full disk, a bad path) changes none of them.
struct FileContent {
  std::string path;
  const void* data;
  std::size_t size;
};
void write_files_atomic(const std::vector<FileContent>& files);
// One file of several pieces, written one after the other (no joined copy in memory).
struct FilePiece {
  const void* data;
  std::size_t size;
};
void write_file_atomic(const std::string& path, const std::vector<FilePiece>& pieces);
// The seconds a write may go on after a stop request (10 by default; at least 0).
double write_stop_grace();
void set_write_stop_grace(double seconds);
// Checks before any work that `path` can be written later: its folder exists and is writable,
// and path is not a folder. Error "[scope] path: ..." otherwise.
void check_output_path(const std::string& path, const char* scope);
// fsync of a file or folder (a folder's entries: the renames in it). Throws SystemError.
void sync_path(const std::string& path);
// fsync of every file and folder under dir, then dir itself.
void sync_tree(const std::string& dir);
// Deletes the leftovers of killed runs in dir: `<target>.tmp.<pid>` files and
// `.<target>.partial-<pid>` folders whose process no longer runs, for the targets `ours` accepts
// (so that another program's temporaries are never touched). A file named with this process's
// own pid is a leftover too unless this process is writing it now: an earlier process had the
// pid (in a container it repeats, often 1). Returns how many it removed.
int remove_stale_temporaries(const std::string& dir,
                             const std::function<bool(std::string_view target)>& ours);
// The name a temporary file of this process gets for path.
std::string temporary_name(const std::string& path);

// Checks, without creating anything, that dir could be created and written: it is a writable
// folder, or its nearest existing ancestor is. Error "[scope] cannot write into ..." otherwise.
void check_writable_dir(const std::string& dir, const char* scope);
// Creates dir (and its parents) if needed and checks that a file can be created in it;
// Error "[scope] cannot write into 'dir': ..." otherwise.
void ensure_writable_dir(const std::string& dir, const char* scope);

// The path against the working directory ("runs/x" -> "/home/me/runs/x", nothing resolved), or
// as given where the working directory cannot be read: a name another process, started
// elsewhere, still finds.
std::string absolute_or_as_given(const std::string& path);

// The absolute path with symbolic links, "." and ".." resolved (as far as the path exists), so
// that two names of one place compare equal: "precious/sub/.." is "precious".
std::string resolved_path(const std::string& path);
// Whether `inner` is `outer` or lies below it (both resolved).
bool path_within(const std::string& inner, const std::string& outer);
// Refuses an output place that is, contains or lies inside one of the inputs (a folder written
// into a corpus changes the corpus; one that replaces it deletes it): Error "[scope] --out
// 'out' ... the input 'in'". `flag` names the output in the message.
void check_output_apart(const std::string& out, const std::vector<std::string>& inputs,
                        const char* scope, const char* flag);

// A std::filesystem exception that reached a front end (a path the system refused where no
// ffnlab check names it), in ffnlab's words: "[io] 'path': No such file or directory" (and
// " and 'path2'" for an operation on two). The command line prints it, Python raises it
// (ValueError for a path that leads nowhere, OSError otherwise).
std::string filesystem_error_text(const std::filesystem::filesystem_error& e);
// Whether the exception is a path that leads nowhere (missing, a file where a folder should be, a
// loop of links, a name too long): refused input rather than the system failing.
bool path_leads_nowhere(const std::filesystem::filesystem_error& e);

}  // namespace ffnlab
