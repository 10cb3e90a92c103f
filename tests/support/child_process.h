// Running the project's programs (replayd, replayctl) as child processes in tests: start
// one with its output in files, wait for its exit, read what it wrote.
#ifndef REPLAYD_TESTS_SUPPORT_CHILD_PROCESS_H_
#define REPLAYD_TESTS_SUPPORT_CHILD_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace replayd {

// Starts argv; with `log`, its stdout and stderr go there. -1 when it cannot start.
inline pid_t Spawn(const std::vector<std::string>& argv, const std::filesystem::path& log = {}) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

// The exit code of `pid` once it has ended; -1 when a signal ended it.
inline int WaitExit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

inline std::string ReadText(const std::filesystem::path& path) {
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

struct Finished {
  int code = -1;       // exit code; -1 when it could not start or a signal ended it
  std::string output;  // stdout and stderr together
};

// Runs argv to its end, its output in `log`.
inline Finished RunToEnd(const std::vector<std::string>& argv, const std::filesystem::path& log) {
  const pid_t pid = Spawn(argv, log);
  if (pid < 0) return {};
  Finished done;
  done.code = WaitExit(pid);
  done.output = ReadText(log);
  return done;
}

// Starts argv[0] with `argv`; its stdout goes to `out` and its stderr to `err`, or both to
// `out` when `err` is empty (and to the test's own when `out` is empty too). -1 when it
// cannot be started.
inline pid_t SpawnChild(const std::vector<std::string>& argv, const std::filesystem::path& out = {},
                        const std::filesystem::path& err = {}) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!out.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (err.empty()) posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  if (!err.empty()) posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

// The exit code of child `pid` once it ends; -1 when a signal ended it.
// A running child that is killed (SIGKILL) and reaped when the object goes, unless Stop
// reaped it first, so that a test that returns early leaves no process behind.
class RunningChild {
 public:
  explicit RunningChild(pid_t pid) : pid_(pid) {}
  ~RunningChild() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      WaitExit(pid_);
    }
  }
  RunningChild(const RunningChild&) = delete;
  RunningChild& operator=(const RunningChild&) = delete;
  pid_t pid() const { return pid_; }
  // Sends `signal` and returns the exit code once the child ends (-1: a signal ended it).
  int Stop(int signal) {
    if (pid_ <= 0 || kill(pid_, signal) != 0) return -1;
    const int code = WaitExit(pid_);
    pid_ = -1;
    return code;
  }

 private:
  pid_t pid_;
};

inline std::string ReadWholeFile(const std::filesystem::path& path) {
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

}  // namespace replayd

#endif  // REPLAYD_TESTS_SUPPORT_CHILD_PROCESS_H_
