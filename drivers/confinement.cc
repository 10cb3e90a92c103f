#include "drivers/confinement.h"

#include <fcntl.h>
#include <linux/landlock.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

// Linux 6.2's; older headers lack it.
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif

namespace replayd {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

long LandlockAbi() {
  return syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
}

// Every file-system access Landlock knows at `abi`.
uint64_t HandledAccess(long abi) {
  uint64_t access = (LANDLOCK_ACCESS_FS_MAKE_SYM << 1) - 1;  // ABI 1: execute ... make_sym
  if (abi >= 2) access |= LANDLOCK_ACCESS_FS_REFER;
  if (abi >= 3) access |= LANDLOCK_ACCESS_FS_TRUNCATE;
  return access;
}

constexpr uint64_t kReadAccess =
    LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;

// `access` beneath `path` (or on it, for a file: Landlock refuses a directory's rights on
// a file); a path that does not exist is skipped.
absl::Status Allow(int ruleset, const std::filesystem::path& path, uint64_t access) {
  const int fd = open(path.c_str(), O_PATH | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? absl::OkStatus() : Errno(absl::StrCat("open ", path.string()));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return Errno(absl::StrCat("stat ", path.string()));
  }
  if (!S_ISDIR(st.st_mode))
    access &= LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE |
              LANDLOCK_ACCESS_FS_TRUNCATE;
  struct landlock_path_beneath_attr rule = {};
  rule.parent_fd = fd;
  rule.allowed_access = access;
  const long r = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
  close(fd);
  if (r != 0) return Errno(absl::StrCat("landlock rule for ", path.string()));
  return absl::OkStatus();
}

}  // namespace

absl::Status LimitProcess(uint64_t address_space, uint64_t max_address_space) {
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return Errno("no_new_privs");
  const struct rlimit no_core = {0, 0};
  if (setrlimit(RLIMIT_CORE, &no_core) != 0) return Errno("RLIMIT_CORE");
  if (address_space > 0) {
    const struct rlimit as = {address_space, std::max(address_space, max_address_space)};
    if (setrlimit(RLIMIT_AS, &as) != 0) return Errno("RLIMIT_AS");
  }
  return absl::OkStatus();
}

absl::Status SetAddressSpaceOf(pid_t pid, uint64_t bytes) {
  struct rlimit now;
  if (prlimit(pid, RLIMIT_AS, nullptr, &now) != 0) return Errno("RLIMIT_AS of the process");
  const struct rlimit as = {std::min<rlim_t>(bytes, now.rlim_max), now.rlim_max};
  if (prlimit(pid, RLIMIT_AS, &as, nullptr) != 0) return Errno(absl::StrCat("RLIMIT_AS of the process to ", bytes));
  return absl::OkStatus();
}

absl::StatusOr<bool> ConfineFiles(const FileAccess& access) {
  const long abi = LandlockAbi();
  if (abi < 1) return false;
  struct landlock_ruleset_attr attr = {};
  attr.handled_access_fs = HandledAccess(abi);
  const int ruleset = static_cast<int>(syscall(SYS_landlock_create_ruleset, &attr, sizeof(attr), 0));
  if (ruleset < 0) return Errno("landlock ruleset");
  absl::Status added;
  for (const std::filesystem::path& p : access.readable)
    if (added.ok()) added = Allow(ruleset, p, kReadAccess);
  for (const std::filesystem::path& p : access.writable)
    if (added.ok()) added = Allow(ruleset, p, attr.handled_access_fs);
  if (!added.ok()) {
    close(ruleset);
    return added;
  }
  const long r = syscall(SYS_landlock_restrict_self, ruleset, 0);
  close(ruleset);
  if (r != 0) return Errno("landlock restrict");
  return true;
}

bool LandlockAvailable() { return LandlockAbi() >= 1; }

}  // namespace replayd
