// Confining the calling process: the steps that the executor's sandbox
// (drivers/executor/sandbox.h) and the cpu-c compiler's cage (drivers/cpu/cc_main.cc)
// share. Each applies to the calling process and to every process it starts afterwards,
// and none can be undone.
//
// Landlock needs Linux 5.13 with it enabled; where it is missing ConfineFiles restricts
// nothing and says so, and the caller decides whether to go on.
#ifndef REPLAYD_DRIVERS_CONFINEMENT_H_
#define REPLAYD_DRIVERS_CONFINEMENT_H_

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace replayd {

// The system's shared libraries and the loader's cache: what a dynamically linked program
// needs to start. Paths that do not exist on a host are skipped where they are used.
inline constexpr const char* kSystemLibraryPaths[] = {"/usr/lib", "/usr/lib64", "/lib", "/lib64",
                                                      "/etc/ld.so.cache"};

// What a confined process may do with files. Each path is a directory (the rule covers
// everything beneath it) or a single file; everything else may not be opened at all.
struct FileAccess {
  std::vector<std::filesystem::path> readable;  // read, list and execute
  std::vector<std::filesystem::path> writable;  // also write, create, rename and remove
};

// No new privileges (set-user-ID programs run as the caller), no core files, and an
// address space of at most `address_space` bytes (0 leaves it unlimited). The hard
// limit is `max_address_space` (at least `address_space`; 0: `address_space` itself):
// a process whose system calls allow it may raise its own limit that far, and its
// parent may move the limit within it (SetAddressSpaceOf). INTERNAL naming the step
// that failed.
absl::Status LimitProcess(uint64_t address_space, uint64_t max_address_space = 0);

// Sets the address-space limit of process `pid` (of the same user) to `bytes`, or to its
// hard limit where that is less. INTERNAL with the reason when the kernel refuses (the
// process gone).
absl::Status SetAddressSpaceOf(pid_t pid, uint64_t bytes);

// Restricts file access to `access` with Landlock. True when confined; false when this
// kernel has no Landlock (nothing is restricted); INTERNAL naming the path or the step
// that failed. A path that does not exist is skipped. Needs no new privileges first
// (LimitProcess) and, like LimitProcess, must be called while single-threaded for the
// rule to cover every thread.
absl::StatusOr<bool> ConfineFiles(const FileAccess& access);

// Whether this kernel has Landlock, asked without restricting anything.
bool LandlockAvailable();

}  // namespace replayd

#endif  // REPLAYD_DRIVERS_CONFINEMENT_H_
