// What a process and its children (a daemon's executors, a compiler running) hold, from
// /proc: for tests that check a daemon comes back to its footprint.
#ifndef REPLAYD_TESTS_SUPPORT_PROCESS_FOOTPRINT_H_
#define REPLAYD_TESTS_SUPPORT_PROCESS_FOOTPRINT_H_

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace replayd {

// What a process and its children hold: resident bytes and threads, from /proc.
struct Footprint {
  uint64_t rss_bytes = 0;
  int64_t threads = 0;
  int processes = 0;
};

inline void AddProcess(pid_t pid, Footprint& f) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  bool seen = false;
  while (std::getline(status, line)) {
    std::vector<std::string> words = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.size() < 2) continue;
    int64_t n = 0;
    if (words[0] == "VmRSS:" && absl::SimpleAtoi(words[1], &n)) f.rss_bytes += static_cast<uint64_t>(n) * 1024;
    if (words[0] == "Threads:" && absl::SimpleAtoi(words[1], &n)) f.threads += n;
    seen = true;
  }
  if (!seen) return;
  ++f.processes;
  // Its children (the executors, a compiler running): /proc/<pid>/task/<tid>/children.
  for (const auto& task : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"))) {
    std::ifstream children(task.path() / "children");
    pid_t child = 0;
    while (children >> child) AddProcess(child, f);
  }
}

inline Footprint FootprintOf(pid_t pid) {
  Footprint f;
  AddProcess(pid, f);
  return f;
}

// The footprint once the threads a burst of calls started have ended: the Session
// stream's workers (server/worker_pool.h) end after 10 s idle. Polled until the thread
// count is at most `threads`, for at most 20 s.
inline Footprint Settled(pid_t pid, int64_t threads) {
  Footprint f = FootprintOf(pid);
  for (const absl::Time end = absl::Now() + absl::Seconds(20); f.threads > threads && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(100));
    f = FootprintOf(pid);
  }
  return f;
}

// The threads of `pid` by name ("grpcpp_sync_ser x 2, replayd x 7, ..."), for a failure's
// message.
inline std::string ThreadNames(pid_t pid) {
  std::map<std::string, int> names;
  for (const auto& task : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"))) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    ++names[name];
  }
  std::string out;
  for (const auto& [name, n] : names) absl::StrAppend(&out, out.empty() ? "" : ", ", name, " x ", n);
  return out;
}

}  // namespace replayd

#endif  // REPLAYD_TESTS_SUPPORT_PROCESS_FOOTPRINT_H_
