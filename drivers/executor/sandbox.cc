#include "drivers/executor/sandbox.h"

#include <fcntl.h>
#include <sched.h>
#include <seccomp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "drivers/confinement.h"

namespace replayd::executor {
namespace {

// A confinement step's failure, as the sandbox's.
absl::Status SandboxError(const absl::Status& failed) {
  return absl::InternalError(absl::StrCat("sandbox: ", failed.message()));
}

absl::Status ConfineSystemCalls() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
  if (!ctx) return absl::InternalError("sandbox: seccomp_init failed");
  int rc = 0;
  auto allow = [&](int call) {
    if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, call, 0);
  };
  for (int call : {
           // the loop, its channel and the descriptors it is passed
           SCMP_SYS(read), SCMP_SYS(write), SCMP_SYS(close), SCMP_SYS(recvmsg), SCMP_SYS(futex),
           SCMP_SYS(getppid), SCMP_SYS(getpid), SCMP_SYS(gettid), SCMP_SYS(fcntl),
           // memory
           SCMP_SYS(mmap), SCMP_SYS(munmap), SCMP_SYS(mprotect), SCMP_SYS(madvise), SCMP_SYS(mremap),
           SCMP_SYS(brk), SCMP_SYS(mincore), SCMP_SYS(membarrier),
           // threads
           SCMP_SYS(set_robust_list), SCMP_SYS(rseq), SCMP_SYS(exit), SCMP_SYS(exit_group),
           SCMP_SYS(sched_yield), SCMP_SYS(sched_getaffinity), SCMP_SYS(sched_getparam),
           SCMP_SYS(sched_getscheduler), SCMP_SYS(rt_sigprocmask), SCMP_SYS(rt_sigaction),
           SCMP_SYS(rt_sigreturn), SCMP_SYS(sigaltstack),
           // time and randomness
           SCMP_SYS(clock_gettime), SCMP_SYS(clock_nanosleep), SCMP_SYS(nanosleep), SCMP_SYS(gettimeofday),
           SCMP_SYS(time), SCMP_SYS(getrandom),
           // the loader reading an artifact (where Landlock lets it)
           SCMP_SYS(fstat), SCMP_SYS(newfstatat), SCMP_SYS(statx), SCMP_SYS(lseek), SCMP_SYS(pread64),
           SCMP_SYS(faccessat), SCMP_SYS(faccessat2), SCMP_SYS(access), SCMP_SYS(readlink), SCMP_SYS(getcwd),
           SCMP_SYS(uname), SCMP_SYS(sysinfo), SCMP_SYS(getrlimit)})
    allow(call);
  // Threads only: clone without CLONE_THREAD would be a new process.
  if (rc == 0)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, CLONE_THREAD));
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  // Limits are read, never set: the address-space limit is the daemon's to move.
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(prlimit64), 1, SCMP_A2(SCMP_CMP_EQ, 0));
  // Files open read-only (Landlock decides which).
  if (rc == 0)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(openat), 1,
                          SCMP_A2(SCMP_CMP_MASKED_EQ, O_ACCMODE | O_CREAT | O_TRUNC, O_RDONLY));
  // Signals to itself only (abort, raise).
  const auto self = static_cast<scmp_datum_t>(getpid());
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(tgkill), 1, SCMP_A0(SCMP_CMP_EQ, self));
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(kill), 1, SCMP_A0(SCMP_CMP_EQ, self));
  if (rc == 0) rc = seccomp_load(ctx);
  seccomp_release(ctx);
  if (rc != 0) return absl::InternalError(absl::StrCat("sandbox: seccomp: ", std::strerror(-rc)));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SandboxReport> Confine(const SandboxOptions& options) {
  if (absl::Status s = LimitProcess(options.address_space, options.max_address_space); !s.ok()) return SandboxError(s);
  if (!options.host_kernels) return SandboxReport{};
  FileAccess files;
  files.readable = options.readable;
  files.readable.insert(files.readable.end(), std::begin(kSystemLibraryPaths), std::end(kSystemLibraryPaths));
  absl::StatusOr<bool> confined = ConfineFiles(files);
  if (!confined.ok()) return SandboxError(confined.status());
  SandboxReport report;
  report.landlock = *confined;
  if (absl::Status s = ConfineSystemCalls(); !s.ok()) return s;
  return report;
}

}  // namespace replayd::executor
