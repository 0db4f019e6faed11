// Files and directories that are whole or absent.
//
// Everything the engine writes for a later reader to trust (checkpoints, the final model, the
// metrics' summary, reports, figures, traces) is written beside its final name and renamed over
// it, the file and its directory fsynced: after a crash or a power cut the path holds the old
// content or the new, never a mix. Each failure throws a one-line gradaccum::Error naming the
// path and the system's reason, and leaves the old content in place and no temporary behind.
// A temporary that a killed process left carries kTemporaryPrefix; a run's start removes those
// in its output directory.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace gradaccum::base {

// The name of every temporary below starts so: ".tmp-<pid>-<name>" beside the file it becomes.
inline constexpr std::string_view kTemporaryPrefix = ".tmp-";

// Writes `bytes` to `path`: a temporary beside it, fsynced, renamed over it, the directory fsynced.
void write_file_atomically(const std::string& path, std::string_view bytes);

// The same for a file made of `pieces` in order, written without joining them (a checkpoint's
// tensors straight from their memory).
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces);

// The same for a file that another writer makes from a file name (libtorch's profiler, PLplot,
// a copy): `write_to(temporary)` writes it whole; it is then fsynced and renamed over `path`. An
// exception from `write_to` removes the temporary and passes on.
void write_file_atomically_with(const std::string& path,
                                const std::function<void(const std::string& temporary)>& write_to);

// `from` copied to `to` as write_file_atomically writes.
void copy_file_atomically(const std::string& from, const std::string& to);

// Puts the directory `staging` (written and fsynced by the caller) at `target` and removes what
// was there. Where the filesystem can (Linux's renameat2 RENAME_EXCHANGE), the two swap in one
// step, so `target` is never missing; elsewhere the old one is moved aside first (to a
// kTemporaryPrefix name) and put back if the second rename fails. The parent is fsynced.
void replace_directory(const std::string& staging, const std::string& target);

// fsyncs a file written by other code.
void fsync_file(const std::string& path);
// fsyncs a directory so that renames and creations inside it are durable.
void fsync_directory(const std::string& path);

}  // namespace gradaccum::base
