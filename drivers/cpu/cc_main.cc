// replayd-cc: the cage the cpu-c compiler runs in (drivers/cpu/c_compiler.h). The daemon
// starts it for each run of the compiler, with the compiler's environment, working
// directory and descriptors already set; it confines itself and then runs the compiler,
// which with everything it starts (cc1, as, ld) inherits every step:
//
// - no new privileges, no core files, an address space of at most kAddressSpace and no
//   file written larger than kFileSize (drivers/confinement.h);
// - Landlock: read and execute only beneath the toolchain's directories (kToolchainPaths)
//   and each --read path (the compiler itself, its include directories); read, write,
//   create and remove only beneath --work. Every other file cannot be opened. Where the
//   kernel has no Landlock the rest applies (the daemon logs it once);
// - seccomp: network sockets, tracing and reading other processes' memory, namespaces,
//   mounts, BPF and keyrings fail with EPERM. The compiler forks and execs, so the
//   executor's allow-list does not fit; this is a short deny-list.
//
// When a step fails it says why on standard error and exits with kCageFailed; the
// compiler has not run.
//
//   replayd-cc --work=DIR [--read=PATH]... -- COMPILER [ARG]...
#include <seccomp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "drivers/confinement.h"
#include "drivers/cpu/c_compiler.h"

namespace {

// cc1 at -O3 on a large kernel stays well under 1 GiB; 4 GiB leaves room and still stops a
// program built to exhaust the compiler's memory from taking the host's.
constexpr uint64_t kAddressSpace = uint64_t{4} << 30;
// A shared object or preprocessed program past 1 GiB is a program built to fill the disk.
constexpr rlim_t kFileSize = rlim_t{1} << 30;

// Where the compiler driver, its passes (cc1, collect2), the assembler and the linker
// live, and the libraries they load and link: read and execute, nothing more.
std::vector<std::filesystem::path> ToolchainPaths() {
  std::vector<std::filesystem::path> paths = {"/usr/bin", "/bin", "/usr/libexec"};
  paths.insert(paths.end(), std::begin(replayd::kSystemLibraryPaths), std::end(replayd::kSystemLibraryPaths));
  return paths;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "replayd-cc: %s\n", message.c_str());
  return replayd::kCageFailed;
}

// EPERM for what no compiler needs and a compromised one could use to reach beyond the
// cage. Other architectures' system calls kill the process (libseccomp's default).
int DenySystemCalls() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return -ENOMEM;
  int rc = 0;
  for (int call : {SCMP_SYS(socket), SCMP_SYS(socketpair), SCMP_SYS(ptrace), SCMP_SYS(process_vm_readv),
                   SCMP_SYS(process_vm_writev), SCMP_SYS(pidfd_getfd), SCMP_SYS(unshare), SCMP_SYS(setns),
                   SCMP_SYS(mount), SCMP_SYS(umount2), SCMP_SYS(pivot_root), SCMP_SYS(chroot), SCMP_SYS(bpf),
                   SCMP_SYS(perf_event_open), SCMP_SYS(userfaultfd), SCMP_SYS(io_uring_setup), SCMP_SYS(keyctl),
                   SCMP_SYS(add_key), SCMP_SYS(request_key)}) {
    if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), call, 0);
  }
  if (rc == 0) rc = seccomp_load(ctx);
  seccomp_release(ctx);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  replayd::FileAccess files;
  files.readable = ToolchainPaths();
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    absl::string_view value = arg;
    if (absl::ConsumePrefix(&value, "--work=") && !value.empty()) {
      files.writable.emplace_back(std::string(value));
    } else if (absl::ConsumePrefix(&value, "--read=") && !value.empty()) {
      files.readable.emplace_back(std::string(value));
    } else {
      return Fail("unknown or malformed argument " + arg);
    }
  }
  if (i >= argc || files.writable.size() != 1)
    return Fail("usage: replayd-cc --work=DIR [--read=PATH]... -- COMPILER [ARG]...");

  if (absl::Status s = replayd::LimitProcess(kAddressSpace); !s.ok()) return Fail(std::string(s.message()));
  const struct rlimit file_size = {kFileSize, kFileSize};
  if (setrlimit(RLIMIT_FSIZE, &file_size) != 0) return Fail(absl::StrCat("RLIMIT_FSIZE: ", std::strerror(errno)));
  absl::StatusOr<bool> confined = replayd::ConfineFiles(files);
  if (!confined.ok()) return Fail(std::string(confined.status().message()));
  if (int rc = DenySystemCalls(); rc != 0) return Fail(absl::StrCat("seccomp: ", std::strerror(-rc)));
  execvp(argv[i], argv + i);
  return Fail(absl::StrCat("cannot run ", argv[i], ": ", std::strerror(errno)));
}
