#include "drivers/executor/sandbox.h"

#include <fcntl.h>
#include <linux/landlock.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

// Linux 6.2's; older headers lack it.
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif

namespace replayd::executor {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat("sandbox: ", what, ": ", std::strerror(errno)));
}

// Every file-system access Landlock knows at `abi`.
uint64_t HandledAccess(long abi) {
  uint64_t access = (LANDLOCK_ACCESS_FS_MAKE_SYM << 1) - 1;  // ABI 1: execute ... make_sym
  if (abi >= 2) access |= LANDLOCK_ACCESS_FS_REFER;
  if (abi >= 3) access |= LANDLOCK_ACCESS_FS_TRUNCATE;
  return access;
}

// Read (and for libraries execute) access beneath `path`; a path that does not exist
// is skipped.
absl::Status AllowReading(int ruleset, const std::filesystem::path& path) {
  const int fd = open(path.c_str(), O_PATH | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? absl::OkStatus() : Errno(absl::StrCat("open ", path.string()));
  struct stat st;
  fstat(fd, &st);
  struct landlock_path_beneath_attr rule = {};
  rule.parent_fd = fd;
  rule.allowed_access = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE;
  if (S_ISDIR(st.st_mode)) rule.allowed_access |= LANDLOCK_ACCESS_FS_READ_DIR;
  const long r = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
  close(fd);
  if (r != 0) return Errno(absl::StrCat("landlock rule for ", path.string()));
  return absl::OkStatus();
}

// False when this kernel has no Landlock.
absl::StatusOr<bool> ConfineFiles(const std::vector<std::filesystem::path>& readable) {
  const long abi = syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi < 1) return false;
  struct landlock_ruleset_attr attr = {};
  attr.handled_access_fs = HandledAccess(abi);
  const int ruleset = static_cast<int>(syscall(SYS_landlock_create_ruleset, &attr, sizeof(attr), 0));
  if (ruleset < 0) return Errno("landlock ruleset");
  std::vector<std::filesystem::path> paths = readable;
  for (const char* system : {"/usr/lib", "/usr/lib64", "/lib", "/lib64", "/etc/ld.so.cache"}) paths.emplace_back(system);
  for (const std::filesystem::path& p : paths) {
    if (absl::Status s = AllowReading(ruleset, p); !s.ok()) {
      close(ruleset);
      return s;
    }
  }
  const long r = syscall(SYS_landlock_restrict_self, ruleset, 0);
  close(ruleset);
  if (r != 0) return Errno("landlock restrict");
  return true;
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
           SCMP_SYS(sched_yield), SCMP_SYS(sched_getaffinity), SCMP_SYS(rt_sigprocmask), SCMP_SYS(rt_sigaction),
           SCMP_SYS(rt_sigreturn), SCMP_SYS(sigaltstack),
           // time and randomness
           SCMP_SYS(clock_gettime), SCMP_SYS(clock_nanosleep), SCMP_SYS(nanosleep), SCMP_SYS(gettimeofday),
           SCMP_SYS(time), SCMP_SYS(getrandom),
           // the loader reading an artifact (where Landlock lets it)
           SCMP_SYS(fstat), SCMP_SYS(newfstatat), SCMP_SYS(statx), SCMP_SYS(lseek), SCMP_SYS(pread64),
           SCMP_SYS(faccessat), SCMP_SYS(faccessat2), SCMP_SYS(access), SCMP_SYS(readlink), SCMP_SYS(getcwd),
           SCMP_SYS(uname), SCMP_SYS(sysinfo), SCMP_SYS(prlimit64), SCMP_SYS(getrlimit)})
    allow(call);
  // Threads only: clone without CLONE_THREAD would be a new process.
  if (rc == 0)
    rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, CLONE_THREAD));
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
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
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return Errno("no_new_privs");
  const struct rlimit no_core = {0, 0};
  if (setrlimit(RLIMIT_CORE, &no_core) != 0) return Errno("RLIMIT_CORE");
  if (options.address_space > 0) {
    const struct rlimit as = {options.address_space, options.address_space};
    if (setrlimit(RLIMIT_AS, &as) != 0) return Errno("RLIMIT_AS");
  }
  SandboxReport report;
  absl::StatusOr<bool> files = ConfineFiles(options.readable);
  if (!files.ok()) return files.status();
  report.landlock = *files;
  if (absl::Status s = ConfineSystemCalls(); !s.ok()) return s;
  return report;
}

}  // namespace replayd::executor
