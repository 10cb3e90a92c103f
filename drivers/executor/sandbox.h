// What an executor may do once it serves: confinement applied to the executor process
// before it creates its device and reads its first command, so that every thread it
// starts later (the device's workers, each context's server) and every kernel it runs
// inherits it.
//
// - no new privileges, no core files, an address space of at most `address_space` bytes
//   (which the daemon may move up to `max_address_space` as its tenant's quota and
//   contexts change; the executor itself may not);
// - Landlock: files may only be read, and only beneath `readable` (the compile cache,
//   where artifacts are) and the system's library directories (what a loaded artifact
//   links against); nothing may be written, made or removed anywhere;
// - seccomp: only the system calls the executor loop, its threads, the loader and
//   compiled kernels need. Everything else (exec, fork, sockets, ptrace, signals to other
//   processes, mounts, namespaces, ...) fails with EPERM; clone3 answers ENOSYS so that
//   the C library falls back to clone, which is allowed only for threads; prlimit64 may
//   read limits but not set them.
//
// The no-new-privileges, limit and Landlock steps are drivers/confinement.h's, shared with
// the cpu-c compiler's cage. Landlock needs Linux 5.13 with it enabled; where it is
// missing the rest still applies and the result says so.
#ifndef REPLAYD_DRIVERS_EXECUTOR_SANDBOX_H_
#define REPLAYD_DRIVERS_EXECUTOR_SANDBOX_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace replayd::executor {

struct SandboxOptions {
  std::vector<std::filesystem::path> readable;  // beside the library directories
  uint64_t address_space = 0;                   // bytes; 0 leaves it unlimited
  uint64_t max_address_space = 0;               // the hard limit; 0: address_space
  // Landlock and seccomp, for an executor whose kernels run on the host CPU (cpu). A GPU
  // executor's kernels run on the GPU, and its vendor driver opens device files, maps
  // and ioctls them as no filter here knows: it gets the no-new-privileges and limit
  // steps only.
  bool host_kernels = true;
};

struct SandboxReport {
  bool landlock = false;  // file access confined
};

// Confines the calling process (which must still be single-threaded). INTERNAL when a
// step that is always available fails (seccomp, rlimits).
absl::StatusOr<SandboxReport> Confine(const SandboxOptions& options);

}  // namespace replayd::executor

#endif  // REPLAYD_DRIVERS_EXECUTOR_SANDBOX_H_
