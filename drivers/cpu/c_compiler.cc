#include "drivers/cpu/c_compiler.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "drivers/client_text.h"
#include "drivers/cpu/trampoline.h"

extern char** environ;

namespace replayd {
namespace {

constexpr size_t kMaxOutput = 64 * 1024;

bool IsIdentifier(absl::string_view s) {
  if (s.empty() || absl::ascii_isdigit(s[0])) return false;
  for (char c : s)
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  return true;
}

bool IsMacroValue(absl::string_view s) {
  for (char c : s)
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != '-' && c != '+')
      return false;
  return true;
}

}  // namespace

absl::Status CCompiler::CheckOptions(const std::vector<std::string>& options) {
  static constexpr absl::string_view kAllowed[] = {
      "-O0", "-O1", "-O2", "-O3", "-Os", "-ffast-math", "-fno-fast-math", "-march=native"};
  for (const auto& option : options) {
    bool ok = false;
    for (auto allowed : kAllowed) ok = ok || option == allowed;
    if (!ok && absl::StartsWith(option, "-D")) {
      absl::string_view def = absl::string_view(option).substr(2);
      size_t eq = def.find('=');
      ok = IsIdentifier(def.substr(0, eq)) &&
           (eq == absl::string_view::npos || IsMacroValue(def.substr(eq + 1)));
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("option \"", Echo(option), "\" is not allowed for cpu-c"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                         absl::Duration time_limit) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);

  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::InternalError(absl::StrCat("cannot run ", argv[0], ": ", std::strerror(rc)));
  }

  ProcessResult result;
  absl::Time deadline = absl::Now() + time_limit;
  char chunk[4096];
  for (;;) {
    int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) {
      result.timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) continue;
    ssize_t got = read(fds[0], chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (result.output.size() < kMaxOutput)
      result.output.append(chunk, std::min<size_t>(got, kMaxOutput - result.output.size()));
  }
  close(fds[0]);
  if (result.timed_out) kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

absl::Status CCompiler::Compile(const ProgramSource& source,
                                const std::filesystem::path& output) const {
  if (absl::Status s = CheckOptions(source.options); !s.ok()) return s;
  std::filesystem::path c_file = output;
  c_file += ".c";
  {
    std::ofstream out(c_file, std::ios::binary | std::ios::trunc);
    out << source.code << GenerateTrampoline(source.entry, source.signature);
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", c_file.string()));
  }
  std::vector<std::string> argv = {options_.compiler, "-std=gnu11", kOptimization, "-fPIC",
                                   "-shared", "-pthread", "-fvisibility=hidden",
                                   "-Werror=implicit-function-declaration",
                                   "-Werror=int-conversion",
                                   "-Werror=incompatible-pointer-types",
                                   "-Werror=return-type"};
  argv.insert(argv.end(), source.options.begin(), source.options.end());
  argv.insert(argv.end(), {"-o", output.string(), c_file.string(), "-lm"});
  absl::StatusOr<ProcessResult> run = RunProcess(argv, options_.time_limit);
  std::error_code ignored;
  std::filesystem::remove(c_file, ignored);
  if (!run.ok()) return run.status();
  if (run->timed_out) {
    std::filesystem::remove(output, ignored);
    return absl::DeadlineExceededError(absl::StrCat(
        "cpu-c compile of ", source.entry, " exceeded ", absl::FormatDuration(options_.time_limit)));
  }
  if (run->exit_code != 0) {
    std::filesystem::remove(output, ignored);
    // Name the file as the client knows it, not by our temporary path.
    std::string diagnostics =
        absl::StrReplaceAll(run->output, {{c_file.string(), "program.c"}});
    return absl::InvalidArgumentError(
        absl::StrCat("cpu-c compile of ", source.entry, " failed:\n", diagnostics));
  }
  return absl::OkStatus();
}

std::string CCompiler::Identify() const {
  absl::StatusOr<ProcessResult> version =
      RunProcess({options_.compiler, "--version"}, absl::Seconds(10));
  absl::StatusOr<ProcessResult> machine =
      RunProcess({options_.compiler, "-dumpmachine"}, absl::Seconds(10));
  if (!version.ok() || !machine.ok() || version->exit_code != 0 || machine->exit_code != 0)
    return "";
  std::string first_line = version->output.substr(0, version->output.find('\n'));
  return absl::StrCat(absl::StripAsciiWhitespace(first_line), " ",
                      absl::StripAsciiWhitespace(machine->output));
}

}  // namespace replayd
